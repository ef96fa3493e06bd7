output "schedule_arns" {
  description = "ARN of each schedule, by name."
  value       = { for name, schedule in aws_scheduler_schedule.this : name => schedule.arn }
}

output "schedule_group_name" {
  description = "The schedule group holding them."
  value       = aws_scheduler_schedule_group.this.name
}

output "role_arn" {
  description = "The role EventBridge Scheduler assumes to send the jobs."
  value       = aws_iam_role.scheduler.arn
}
