# A queue, an idempotency table and a Lambda consumer: everything one Conveyor job type needs.

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

  # conveyor_core::runtime: QUEUE_VISIBILITY_TIMEOUT_SECS and MAX_RECEIVE_COUNT.
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

module "consumer" {
  source = "../../modules/lambda-consumer"

  function_name = var.name
  package_path  = var.package_path

  # The queue's visibility timeout (60 s) is 6x this: AWS's rule for SQS event sources.
  timeout_seconds                  = 10
  queue_visibility_timeout_seconds = module.queue.visibility_timeout_seconds

  queue_arn              = module.queue.queue_arn
  dlq_arn                = module.queue.dlq_arn
  idempotency_table_name = module.idempotency_table.name
  idempotency_table_arn  = module.idempotency_table.arn

  batch_size          = 10
  maximum_concurrency = 10

  # The application sends flows (chunked reports): no worker runs their deadline sweep here.
  flow_sweep = true

  alarm_actions = var.alarm_actions
}

# The application's schedules (examples/src/schedules.rs) as EventBridge Scheduler schedules: no worker
# runs all the time on Lambda. `worker --export-schedules schedules.json` (or `conveyor schedules
# export --app target/debug/worker --out schedules.json`) writes the file from the code.
module "schedules" {
  source = "../../modules/schedules"

  schedules_file = "${path.module}/schedules.json"
  queue_arn      = module.queue.queue_arn
  name_prefix    = var.name
}

# The transactional outbox (crates/conveyor-outbox): a table the application writes jobs into within its
# own transactions, and a relay function that sends them to the queue, triggered by the table's stream
# and swept every minute, with alarms on the oldest unsent job and on parked jobs. Deployed when
# outbox_relay_package_path is set (the example outbox_relay binary's zip); the table always.
module "outbox_relay" {
  source = "../../modules/outbox-relay"

  name          = "${var.name}-outbox-relay"
  table_name    = "${var.name}-outbox"
  queue_arns    = [module.queue.queue_arn]
  deploy_lambda = var.outbox_relay_package_path != null
  package_path  = var.outbox_relay_package_path

  alarm_actions = var.alarm_actions

  deletion_protection_enabled = false
}
