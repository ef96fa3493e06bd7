output "queue_url" {
  description = "The applied queue (CONVEYOR_QUEUE_URL for the worker)."
  value       = module.queue.queue_url
}

output "dlq_url" {
  description = "The applied dead-letter queue."
  value       = module.queue.dlq_url
}

output "visibility_timeout_seconds" {
  description = "The queue's visibility timeout as Terraform set it."
  value       = module.queue.visibility_timeout_seconds
}

output "max_receive_count" {
  description = "The redrive policy's maxReceiveCount as Terraform set it."
  value       = module.queue.max_receive_count
}

output "idempotency_table_name" {
  description = "The applied table (CONVEYOR_IDEMPOTENCY_TABLE for the worker)."
  value       = module.idempotency_table.name
}

output "consumer_role_name" {
  description = "The role carrying the consumer policy."
  value       = aws_iam_role.consumer.name
}
