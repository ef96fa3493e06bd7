variable "region" {
  description = "AWS region."
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Name of the queue, the cluster, the service and (with an -idempotency suffix) the table."
  type        = string
  default     = "conveyor-example"
}

variable "container_image" {
  description = "The worker image (linux/arm64), e.g. <account>.dkr.ecr.<region>.amazonaws.com/conveyor-worker:<tag>."
  type        = string
}

variable "execution_role_arn" {
  description = "An existing ECS task execution role (image pull and logs), e.g. the account's ecsTaskExecutionRole."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets with a route to SQS, DynamoDB, CloudWatch Logs and the registry."
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups of the tasks (outbound HTTPS)."
  type        = list(string)
}

variable "alarm_actions" {
  description = "ARNs (e.g. an SNS topic) notified by the queue alarms."
  type        = list(string)
  default     = []
}
