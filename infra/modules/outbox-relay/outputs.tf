output "table_name" {
  description = "The outbox table's name (OutboxTable::new / CONVEYOR_OUTBOX_TABLE)."
  value       = local.table_name
}

output "table_arn" {
  description = "The outbox table's ARN (producer_policy_json holds what the application needs on it)."
  value       = local.table_arn
}

output "stream_arn" {
  description = "The table's stream (KEYS_ONLY), the Lambda relay's trigger; \"\" for an existing table given without one."
  value       = local.stream_arn
}

output "pending_index_name" {
  description = "The index of unsent jobs (conveyor_outbox::table::PENDING_INDEX) the relay queries."
  value       = local.pending_index
}

output "function_arn" {
  description = "The relay function's ARN (deploy_lambda), else null."
  value       = var.deploy_lambda ? aws_lambda_function.this[0].arn : null
}

output "role_arn" {
  description = "The relay function's role (deploy_lambda), else null."
  value       = var.deploy_lambda ? aws_iam_role.this[0].arn : null
}

output "event_source_mapping_uuid" {
  description = "The stream's event source mapping (deploy_lambda), else null."
  value       = var.deploy_lambda ? aws_lambda_event_source_mapping.this[0].uuid : null
}

output "sweep_schedule_arn" {
  description = "The one-minute sweep's EventBridge Scheduler schedule (deploy_lambda), else null."
  value       = var.deploy_lambda ? aws_scheduler_schedule.sweep[0].arn : null
}

output "alarm_names" {
  description = "The oldest-unsent and parked-jobs alarms (deploy_lambda), else empty: an ECS relay reports the gauges conveyor_outbox_oldest_unsent_seconds and conveyor_outbox_parked_jobs instead."
  value       = var.deploy_lambda ? [aws_cloudwatch_metric_alarm.oldest_unsent[0].alarm_name, aws_cloudwatch_metric_alarm.parked_jobs[0].alarm_name] : []
}

output "ecs_policy_json" {
  description = "The permissions an ECS worker needs to relay (its outbox poller: the table, the outbox-pending index, SendMessage): attach to its task role (e.g. an aws_iam_role_policy on ecs-consumer's task_role_name)."
  value       = data.aws_iam_policy_document.relay.json
}

output "ecs_environment" {
  description = "The environment that turns the relay on in the example worker (CONVEYOR_OUTBOX_TABLE and its key names, lease_seconds and max_attempts when set): merge into ecs-consumer's environment."
  value       = local.ecs_environment
}

output "producer_policy_json" {
  description = "What the application needs to write outbox jobs in its transactions: GetItem (the head), PutItem (the job) and UpdateItem (the head) of outbox items on the table."
  value       = data.aws_iam_policy_document.producer.json
}
