# What the emulators can apply of the modules, for tests/tests/terraform.rs: the queue module (against
# LocalStack's SQS and CloudWatch), the idempotency table (against DynamoDB Local), and a consumer role
# carrying the consumer-permissions policy (against LocalStack's IAM). The test then runs the example
# worker on the applied queue and table, and destroys everything.
#
# Not for AWS: the provider talks to the endpoints below with dummy credentials.

terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.80"
    }
  }
}

provider "aws" {
  region                      = "us-east-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_requesting_account_id  = true
  skip_region_validation      = true

  endpoints {
    cloudwatch = var.localstack_endpoint
    dynamodb   = var.dynamodb_endpoint
    iam        = var.localstack_endpoint
    sqs        = var.localstack_endpoint
    sts        = var.localstack_endpoint
  }
}

module "queue" {
  source = "../../modules/queue"

  name                       = var.name
  visibility_timeout_seconds = var.visibility_timeout_seconds
  max_receive_count          = var.max_receive_count
  # The provider mirror here is 5.x, which refuses more than 256 KiB (modules/queue/README.md).
  max_message_size = var.max_message_size
}

module "idempotency_table" {
  source = "../../modules/idempotency-table"

  name = "${var.name}-idempotency"

  # DynamoDB Local implements neither continuous backups nor needs protecting.
  point_in_time_recovery_enabled = false
  deletion_protection_enabled    = false
}

module "permissions" {
  source = "../../modules/consumer-permissions"

  queue_arn             = module.queue.queue_arn
  dlq_arn               = module.queue.dlq_arn
  idempotency_table_arn = module.idempotency_table.arn
}

data "aws_iam_policy_document" "assume_role" {
  statement {
    sid     = "EcsTasksAssumeRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "consumer" {
  name_prefix        = "${substr(var.name, 0, 30)}-"
  assume_role_policy = data.aws_iam_policy_document.assume_role.json
}

resource "aws_iam_role_policy" "consumer" {
  name   = "conveyor-consumer"
  role   = aws_iam_role.consumer.id
  policy = data.aws_iam_policy_document.consumer.json
}

data "aws_iam_policy_document" "consumer" {
  source_policy_documents = [module.permissions.json]
}
