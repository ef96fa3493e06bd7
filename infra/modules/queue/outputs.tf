output "queue_url" {
  description = "URL of the main queue (CONVEYOR_QUEUE_URL)."
  value       = aws_sqs_queue.this.url
}

output "queue_arn" {
  description = "ARN of the main queue."
  value       = aws_sqs_queue.this.arn
}

output "queue_name" {
  description = "Name of the main queue (with `.fifo` for FIFO queues)."
  value       = aws_sqs_queue.this.name
}

output "dlq_url" {
  description = "URL of the dead-letter queue."
  value       = aws_sqs_queue.dlq.url
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue."
  value       = aws_sqs_queue.dlq.arn
}

output "dlq_name" {
  description = "Name of the dead-letter queue."
  value       = aws_sqs_queue.dlq.name
}

output "visibility_timeout_seconds" {
  description = "Visibility timeout of the main queue; pass it to lambda-consumer (the 6x rule) and ecs-consumer (the worker reads it from the queue at start-up; the module checks it is at least 10 s)."
  value       = aws_sqs_queue.this.visibility_timeout_seconds
}

output "max_receive_count" {
  description = "The redrive policy's maxReceiveCount."
  value       = var.max_receive_count
}

output "fifo" {
  description = "Whether the queues are FIFO queues."
  value       = var.fifo
}

output "dlq_alarm_arn" {
  description = "ARN of the DLQ-not-empty alarm (visible plus in-flight messages in the DLQ)."
  value       = aws_cloudwatch_metric_alarm.dlq_not_empty.arn
}

output "oldest_message_age_alarm_arn" {
  description = "ARN of the oldest-message-age alarm."
  value       = aws_cloudwatch_metric_alarm.oldest_message_age.arn
}

output "producer_policy_json" {
  description = "An IAM policy for producers: sqs:SendMessage and sqs:GetQueueUrl on the main queue (plus the KMS key through SQS when one is set). Attach it with aws_iam_role_policy."
  value       = data.aws_iam_policy_document.producer.json
}

output "operator_policy_json" {
  description = "An IAM policy for operators running `conveyor stats`, `dlq peek`, `dlq redrive` (StartMessageMoveTask and the filtered move loop) and `purge` on both queues."
  value       = data.aws_iam_policy_document.operator.json
}

output "noisy_tenants_alarm_arn" {
  description = "ARN of the noisy-tenants alarm (ApproximateNumberOfNoisyGroups), or null when fair_queue_alarms is false."
  value       = one(aws_cloudwatch_metric_alarm.noisy_groups[*].arn)
}

output "quiet_tenants_age_alarm_arn" {
  description = "ARN of the quiet tenants' oldest-message-age alarm (ApproximateAgeOfOldestMessageInQuietGroups), or null when fair_queue_alarms is false."
  value       = one(aws_cloudwatch_metric_alarm.quiet_groups_oldest_message_age[*].arn)
}

output "tenants_dashboard_name" {
  description = "Name of the CloudWatch dashboard with the queue's depth and the fair-queue metrics, or null when fair_queue_alarms is false."
  value       = one(aws_cloudwatch_dashboard.this[*].dashboard_name)
}

output "max_message_size" {
  description = "Largest message the queue and its DLQ accept, in bytes (MaximumMessageSize)."
  value       = aws_sqs_queue.this.max_message_size
}
