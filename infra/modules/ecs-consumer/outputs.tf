output "service_name" {
  description = "Name of the ECS service."
  value       = aws_ecs_service.this.name
}

output "service_arn" {
  description = "ARN of the ECS service."
  value       = aws_ecs_service.this.id
}

output "task_definition_arn" {
  description = "ARN of the task definition (with revision)."
  value       = aws_ecs_task_definition.this.arn
}

output "task_role_name" {
  description = "Name of the task role (attach further policies for the handlers' own needs)."
  value       = aws_iam_role.task.name
}

output "task_role_arn" {
  description = "ARN of the task role."
  value       = aws_iam_role.task.arn
}

output "log_group_name" {
  description = "Name of the task log group."
  value       = aws_cloudwatch_log_group.this.name
}

output "execution_role_log_policy_json" {
  description = "A policy granting logs:CreateLogStream and logs:PutLogEvents on this module's log group only; attach it to the execution role if that role does not already allow it."
  value       = data.aws_iam_policy_document.execution_logs.json
}

output "autoscaling_policy_arn" {
  description = "ARN of the backlog-per-task target-tracking policy."
  value       = aws_appautoscaling_policy.backlog_per_task.arn
}

output "running_tasks_alarm_arn" {
  description = "ARN of the running-tasks-below-minimum alarm (null when min_capacity is 0)."
  value       = one(aws_cloudwatch_metric_alarm.running_tasks_below_minimum[*].arn)
}
