output "name" {
  description = "Name of the table (CONVEYOR_IDEMPOTENCY_TABLE)."
  value       = aws_dynamodb_table.this.name
}

output "arn" {
  description = "ARN of the table, for IAM policies."
  value       = aws_dynamodb_table.this.arn
}

output "producer_policy_json" {
  description = "IAM policy (JSON) for producers that track jobs, cancel delayed jobs or start flows (Producer::send_tracked, cancel, FlowProducer): UpdateItem on this table."
  value       = data.aws_iam_policy_document.producer.json
}

output "operator_policy_json" {
  description = "IAM policy (JSON) for operators: conveyor jobs show|list|watch and conveyor schedules pause|resume|trigger (GetItem, Query on the conveyor-jobs-sharded index, UpdateItem)."
  value       = data.aws_iam_policy_document.operator.json
}
