# A queue, an idempotency table and an ECS Fargate worker: everything one Conveyor job type needs.
# The network (subnets, security groups) and the task execution role come from outside.

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
  region = var.region
}

module "queue" {
  source = "../../modules/queue"

  name = var.name

  # conveyor_core::runtime: QUEUE_VISIBILITY_TIMEOUT_SECS and MAX_RECEIVE_COUNT. The worker's
  # heartbeats extend visibility for longer jobs.
  visibility_timeout_seconds = 60
  max_receive_count          = 5

  # 256 KiB: the AWS provider 5.x (what this repository is tested with) refuses more. With provider 6.8
  # or later remove this line for the module's default, 1 MiB (modules/queue/README.md).
  max_message_size = 262144

  alarm_actions = var.alarm_actions
}

module "idempotency_table" {
  source = "../../modules/idempotency-table"

  name = "${var.name}-idempotency"

  # An example is torn down with `terraform destroy`; a production table keeps the default (on).
  deletion_protection_enabled = false
}

# Container Insights provides RunningTaskCount, which the backlog-per-task scaling policy divides by.
resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

# FARGATE for the service by default; FARGATE_SPOT available for use_fargate_spot = true.
resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name       = aws_ecs_cluster.this.name
  capacity_providers = ["FARGATE", "FARGATE_SPOT"]
}

module "consumer" {
  source = "../../modules/ecs-consumer"

  name               = var.name
  cluster_arn        = aws_ecs_cluster.this.arn
  container_image    = var.container_image
  execution_role_arn = var.execution_role_arn
  subnet_ids         = var.subnet_ids
  security_group_ids = var.security_group_ids

  queue_arn              = module.queue.queue_arn
  queue_url              = module.queue.queue_url
  queue_name             = module.queue.queue_name
  dlq_arn                = module.queue.dlq_arn
  idempotency_table_name = module.idempotency_table.name
  idempotency_table_arn  = module.idempotency_table.arn

  # Checked against the worker's minimum (10 s); the worker itself reads it from the queue.
  queue_visibility_timeout_seconds = module.queue.visibility_timeout_seconds

  # The transactional outbox: the workers relay it from the outbox table (one at a time, by lease).
  environment = module.outbox_relay.ecs_environment

  # conveyor_core::runtime::ECS_STOP_TIMEOUT_SECS. The worker drains for what fits after its 7 s
  # shutdown reserve (23 s); drain_deadline_seconds can only shorten that.
  stop_timeout_seconds = 30

  desired_count    = 1
  min_capacity     = 1
  max_capacity     = 10
  backlog_per_task = 100

  alarm_actions = var.alarm_actions

  depends_on = [aws_ecs_cluster_capacity_providers.this]
}

# The transactional outbox (crates/conveyor-outbox): a table the application writes jobs into within its
# own transactions, relayed to the queue by the workers (their outbox poller, on with
# CONVEYOR_OUTBOX_TABLE): one at a time holds the lease item in the outbox table and polls its
# outbox-pending index. The backlog is on each worker's metrics endpoint
# (conveyor_outbox_oldest_unsent_seconds, conveyor_outbox_parked_jobs); alert on those.
module "outbox_relay" {
  source = "../../modules/outbox-relay"

  name          = "${var.name}-outbox-relay"
  table_name    = "${var.name}-outbox"
  queue_arns    = [module.queue.queue_arn]
  deploy_lambda = false

  deletion_protection_enabled = false
}

resource "aws_iam_role_policy" "outbox_relay" {
  name   = "conveyor-outbox-relay"
  role   = module.consumer.task_role_name
  policy = module.outbox_relay.ecs_policy_json
}
