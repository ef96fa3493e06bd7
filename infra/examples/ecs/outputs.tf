output "queue_url" {
  description = "Send jobs here (CONVEYOR_QUEUE_URL)."
  value       = module.queue.queue_url
}

output "dlq_url" {
  description = "Dead-letter queue, for `conveyor dlq peek` and `conveyor dlq redrive`."
  value       = module.queue.dlq_url
}

output "idempotency_table_name" {
  description = "The idempotency table (CONVEYOR_IDEMPOTENCY_TABLE)."
  value       = module.idempotency_table.name
}

output "cluster_name" {
  description = "The ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "service_name" {
  description = "The worker service."
  value       = module.consumer.service_name
}

output "log_group_name" {
  description = "The workers' logs."
  value       = module.consumer.log_group_name
}

output "execution_role_log_policy_json" {
  description = "Attach to the execution role if it cannot yet write to the workers' log group."
  value       = module.consumer.execution_role_log_policy_json
}

output "outbox_table_name" {
  description = "The outbox table (OutboxTable::new / CONVEYOR_OUTBOX_TABLE)."
  value       = module.outbox_relay.table_name
}
