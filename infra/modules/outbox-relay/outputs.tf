output "table_name" {
  description = "The outbox table's name (OutboxTable::new / CONVEYOR_OUTBOX_TABLE)."
  value       = local.table_name
}

output "table_arn" {
  description = "The outbox table's ARN: the application's role needs dynamodb:PutItem on it (within its TransactWriteItems)."
  value       = local.table_arn
}

output "stream_arn" {
  description = "The stream the relay reads."
  value       = local.stream_arn
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

output "ecs_policy_json" {
  description = "The permissions an ECS worker needs to relay (Worker::with_outbox_relay): attach to its task role (e.g. an aws_iam_role_policy on ecs-consumer's task_role_name)."
  value       = data.aws_iam_policy_document.ecs.json
}

output "ecs_environment" {
  description = "The environment that turns the relay on in the example worker: merge into ecs-consumer's environment."
  value       = local.environment
}

output "producer_policy_json" {
  description = "What the application needs to write outbox items in its transactions: PutItem of outbox items on the table."
  value       = data.aws_iam_policy_document.producer.json
}
