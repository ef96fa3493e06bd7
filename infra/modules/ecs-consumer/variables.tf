variable "name" {
  description = "Name of the ECS service, the task definition family, the task role and the log group /ecs/<name>."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,64}$", var.name))
    error_message = "name must be 1-64 characters of letters, digits, '-' or '_'."
  }
}

variable "cluster_arn" {
  description = "ARN of the ECS cluster (arn:aws:ecs:<region>:<account>:cluster/<name>). Enable Container Insights on it: the autoscaling policy reads ECS/ContainerInsights RunningTaskCount."
  type        = string

  validation {
    condition     = can(regex("^arn:[^:]+:ecs:[^:]+:[0-9]+:cluster/.+$", var.cluster_arn))
    error_message = "cluster_arn must be an ECS cluster ARN such as arn:aws:ecs:us-east-1:123456789012:cluster/jobs."
  }
}

variable "container_image" {
  description = "Image of the worker, for example <account>.dkr.ecr.<region>.amazonaws.com/conveyor-worker:<tag>. Built for linux/arm64."
  type        = string
}

variable "execution_role_arn" {
  description = "ARN of an existing task execution role (used by ECS to pull the image and ship logs). Not created here: private ECR pulls need ecr:GetAuthorizationToken, which AWS only grants on resource \"*\". The role also needs logs:CreateLogStream and logs:PutLogEvents on this module's log group (see output execution_role_log_policy_json)."
  type        = string
}

variable "cpu" {
  description = "Task CPU units (256 = 0.25 vCPU). Must form a valid Fargate pair with memory."
  type        = number
  default     = 256
}

variable "memory" {
  description = "Task memory in MiB. Must form a valid Fargate pair with cpu."
  type        = number
  default     = 512
}

variable "desired_count" {
  description = "Tasks at creation. Autoscaling owns the count afterwards (the service ignores later changes to this value)."
  type        = number
  default     = 1
}

variable "subnet_ids" {
  description = "Subnets of the tasks. They need a route to SQS, DynamoDB, CloudWatch Logs and the image registry (NAT gateway or VPC endpoints)."
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups of the tasks. The worker needs outbound HTTPS only; port 9090 serves /healthz and /metrics."
  type        = list(string)
}

variable "assign_public_ip" {
  description = "Give tasks a public IP (only for public subnets without NAT)."
  type        = bool
  default     = false
}

variable "queue_arn" {
  description = "ARN of the queue the worker consumes (queue module output queue_arn)."
  type        = string
}

variable "queue_url" {
  description = "URL of the queue the worker consumes (queue module output queue_url); passed as CONVEYOR_QUEUE_URL."
  type        = string
}

variable "queue_name" {
  description = "Name of the queue (queue module output queue_name), the dimension of the backlog metric."
  type        = string
}

variable "dlq_arn" {
  description = "ARN of the queue's dead-letter queue (queue module output dlq_arn). Permanent failures are sent there directly."
  type        = string
}

variable "idempotency_table_name" {
  description = "Name of the idempotency table (idempotency-table module output name); passed as CONVEYOR_IDEMPOTENCY_TABLE."
  type        = string
}

variable "idempotency_table_arn" {
  description = "ARN of the idempotency table (idempotency-table module output arn)."
  type        = string
}

variable "kms_key_arns" {
  description = "ARNs of customer-managed KMS keys that encrypt the queues or the table; the task role gets kms:Decrypt and kms:GenerateDataKey on exactly these."
  type        = list(string)
  default     = []
}

variable "drain_deadline_seconds" {
  description = "How long the worker lets in-flight jobs finish after SIGTERM (CONVEYOR_DRAIN_DEADLINE_SECS). At most stop_timeout_seconds - 7. Matches conveyor_core::defaults::DRAIN_DEADLINE."
  type        = number
  default     = 23

  validation {
    condition     = var.drain_deadline_seconds >= 1
    error_message = "drain_deadline_seconds must be at least 1."
  }
}

variable "stop_timeout_seconds" {
  description = "Seconds ECS waits after SIGTERM before SIGKILL (the container's stopTimeout); passed to the worker as CONVEYOR_STOP_TIMEOUT_SECS. Must hold drain_deadline_seconds plus 7 s so the worker can release what is left. Matches conveyor_core::defaults::ECS_STOP_TIMEOUT_SECS."
  type        = number
  default     = 30

  validation {
    condition     = var.stop_timeout_seconds >= 2 && var.stop_timeout_seconds <= 120
    error_message = "stop_timeout_seconds must be between 2 and 120 (Fargate's limits)."
  }
}

variable "healthcheck_command" {
  description = "Container health check. The worker binary answers `--healthcheck` by requesting http://127.0.0.1:9090/healthz itself, so the image needs no curl."
  type        = list(string)
  default     = ["CMD", "/app/worker", "--healthcheck"]
}

variable "log_retention_days" {
  description = "Retention of the task log group."
  type        = number
  default     = 14
}

variable "rust_log" {
  description = "RUST_LOG filter for the worker."
  type        = string
  default     = "info"
}

variable "environment" {
  description = "Extra environment variables. The CONVEYOR_* variables and RUST_LOG set by the module win on a clash."
  type        = map(string)
  default     = {}
}

variable "min_capacity" {
  description = "Fewest tasks autoscaling keeps. At least 1: the backlog-per-task metric divides by the running task count, which has no value at zero tasks."
  type        = number
  default     = 1

  validation {
    condition     = var.min_capacity >= 1
    error_message = "min_capacity must be at least 1: backlog per task (visible messages / running tasks) is undefined at zero tasks, so the service could never scale out again."
  }
}

variable "max_capacity" {
  description = "Most tasks autoscaling starts."
  type        = number
  default     = 10
}

variable "backlog_per_task" {
  description = "Target of the scaling policy: visible messages per running task. Roughly (acceptable latency in s) / (average seconds per message) x (jobs a task runs at once)."
  type        = number
  default     = 100

  validation {
    condition     = var.backlog_per_task > 0
    error_message = "backlog_per_task must be positive."
  }
}

variable "scale_in_cooldown_seconds" {
  description = "Seconds after a scale-in before the next scale-in."
  type        = number
  default     = 300
}

variable "scale_out_cooldown_seconds" {
  description = "Seconds after a scale-out before the next scale-out."
  type        = number
  default     = 60
}

variable "tags" {
  description = "Tags for every resource of the module."
  type        = map(string)
  default     = {}
}
