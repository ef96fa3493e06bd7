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

output "function_name" {
  description = "The Lambda consumer."
  value       = module.consumer.function_name
}

output "log_group_name" {
  description = "The consumer's logs."
  value       = module.consumer.log_group_name
}

output "outbox_table_name" {
  description = "The outbox table (OutboxTable::new / CONVEYOR_OUTBOX_TABLE)."
  value       = module.outbox_relay.table_name
}
