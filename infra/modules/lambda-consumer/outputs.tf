output "function_name" {
  description = "Name of the Lambda function."
  value       = aws_lambda_function.this.function_name
}

output "function_arn" {
  description = "ARN of the Lambda function."
  value       = aws_lambda_function.this.arn
}

output "role_name" {
  description = "Name of the function's IAM role (attach further policies for the handlers' own needs)."
  value       = aws_iam_role.this.name
}

output "role_arn" {
  description = "ARN of the function's IAM role."
  value       = aws_iam_role.this.arn
}

output "log_group_name" {
  description = "Name of the function's log group."
  value       = aws_cloudwatch_log_group.this.name
}

output "event_source_mapping_uuid" {
  description = "UUID of the SQS event source mapping."
  value       = aws_lambda_event_source_mapping.this.uuid
}

output "alarm_arns" {
  description = "ARNs of the function's alarms: errors, throttles, duration near the timeout."
  value = {
    errors    = aws_cloudwatch_metric_alarm.errors.arn
    throttles = aws_cloudwatch_metric_alarm.throttles.arn
    duration  = aws_cloudwatch_metric_alarm.duration.arn
  }
}

output "flow_sweep_schedule_arn" {
  description = "The flow sweep's EventBridge schedule (flow_sweep = true), or null."
  value       = try(aws_scheduler_schedule.invocations["flow-sweep"].arn, null)
}

output "timer_relay_schedule_arn" {
  description = "The timer relay's EventBridge schedule (timer_relay = true), or null."
  value       = try(aws_scheduler_schedule.invocations["timer-relay"].arn, null)
}
