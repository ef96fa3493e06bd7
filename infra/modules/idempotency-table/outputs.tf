output "name" {
  description = "Name of the table (CONVEYOR_IDEMPOTENCY_TABLE)."
  value       = aws_dynamodb_table.this.name
}

output "arn" {
  description = "ARN of the table, for IAM policies."
  value       = aws_dynamodb_table.this.arn
}
