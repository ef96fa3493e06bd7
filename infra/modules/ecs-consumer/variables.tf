variable "role_name" {
  description = "Name of the task role. null (the default) generates a unique name from name, so the same service in two regions or stacks never collides (role names are global to the account)."
  type        = string
  default     = null

  validation {
    condition     = var.role_name == null || can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", coalesce(var.role_name, "-")))
    error_message = "role_name must be 1-64 characters of letters, digits and +=,.@_- (IAM's limits)."
  }
}

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

  validation {
    condition     = can(regex("^arn:[a-z-]+:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$", var.execution_role_arn))
    error_message = "execution_role_arn must be one IAM role ARN (arn:aws:iam::<account>:role/<name>), without wildcards."
  }
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

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.queue_arn))
    error_message = "queue_arn must be one SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>), without wildcards."
  }
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

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.dlq_arn))
    error_message = "dlq_arn must be one SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>), without wildcards."
  }
}

variable "idempotency_table_name" {
  description = "Name of the idempotency table (idempotency-table module output name); passed as CONVEYOR_IDEMPOTENCY_TABLE."
  type        = string
}

variable "idempotency_table_arn" {
  description = "ARN of the idempotency table (idempotency-table module output arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[A-Za-z0-9_.-]+$", var.idempotency_table_arn))
    error_message = "idempotency_table_arn must be one DynamoDB table ARN (arn:aws:dynamodb:<region>:<account>:table/<name>), without wildcards."
  }
}

variable "kms_key_arns" {
  description = "ARNs of customer-managed KMS keys that encrypt the queues or the table; the task role gets kms:Decrypt and kms:GenerateDataKey on exactly these, through SQS and DynamoDB only (kms:ViaService)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.kms_key_arns : can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", arn))])
    error_message = "kms_key_arns must list KMS key ARNs (arn:aws:kms:<region>:<account>:key/<id>); \"*\", aliases and wildcards are refused."
  }
}

variable "drain_deadline_seconds" {
  description = "How long the worker lets in-flight jobs finish after SIGTERM (CONVEYOR_DRAIN_DEADLINE_SECS). null (the default) leaves it to the worker: stop_timeout_seconds - 7, all the time that fits. Set, it must be at most stop_timeout_seconds - 7 (checked at plan, and by the worker at start-up)."
  type        = number
  default     = null

  validation {
    condition     = var.drain_deadline_seconds == null || (coalesce(var.drain_deadline_seconds, 0) >= 0 && floor(coalesce(var.drain_deadline_seconds, 0)) == coalesce(var.drain_deadline_seconds, 0))
    error_message = "drain_deadline_seconds must be null or a whole number of seconds, 0 or more."
  }
}

variable "stop_timeout_seconds" {
  description = "Seconds ECS waits after SIGTERM before SIGKILL (the container's stopTimeout); passed to the worker as CONVEYOR_STOP_TIMEOUT_SECS. Must hold drain_deadline_seconds plus 7 s so the worker can release what is left. Matches conveyor_core::runtime::ECS_STOP_TIMEOUT_SECS."
  type        = number
  default     = 30

  validation {
    condition     = var.stop_timeout_seconds >= 8 && var.stop_timeout_seconds <= 120 && floor(var.stop_timeout_seconds) == var.stop_timeout_seconds
    error_message = "stop_timeout_seconds must be a whole number from 8 to 120: Fargate allows at most 120, and the worker needs 7 s after the drain to cancel, release and flush, so it refuses a stop timeout of 7 s or less."
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
  description = "Fewest tasks autoscaling keeps. At least 1 unless scale_to_zero: the backlog-per-task metric divides by the running task count, which has no value at zero tasks."
  type        = number
  default     = 1

  validation {
    condition     = var.min_capacity >= 0
    error_message = "min_capacity must not be negative."
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

variable "queue_visibility_timeout_seconds" {
  description = "The queue's visibility timeout (queue module output visibility_timeout_seconds). The worker reads it from the queue itself; the module only checks it is at least 10 s, the shortest the worker accepts. null skips the check."
  type        = number
  default     = null
}

variable "visibility_timeout_seconds" {
  description = "Overrides the queue's visibility timeout in the worker (CONVEYOR_VISIBILITY_TIMEOUT_SECS): sent with every receive and extension. null (the default): the worker uses the queue's own, read at start-up."
  type        = number
  default     = null

  validation {
    condition     = var.visibility_timeout_seconds == null || (coalesce(var.visibility_timeout_seconds, 10) >= 10 && coalesce(var.visibility_timeout_seconds, 10) <= 43200)
    error_message = "visibility_timeout_seconds must be null or 10-43200: the worker's heartbeat needs at least 10 s, and SQS allows at most 12 hours."
  }
}

variable "log_kms_key_arn" {
  description = "KMS key ARN encrypting the task log group; null (the default) keeps CloudWatch Logs' own encryption. The key policy must allow the logs.<region>.amazonaws.com principal."
  type        = string
  default     = null

  validation {
    condition     = var.log_kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.log_kms_key_arn, "-")))
    error_message = "log_kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "use_fargate_spot" {
  description = "Run the tasks on FARGATE_SPOT (the cluster must have it among its capacity providers). A reclaimed task gets SIGTERM and shuts down like any other stop: jobs drain, the rest go back to the queue."
  type        = bool
  default     = false
}

variable "scale_to_zero" {
  description = "Allow min_capacity 0: a step policy starts the first task when messages are visible and none runs; target tracking scales in to zero when the backlog is gone."
  type        = bool
  default     = false
}

variable "alarm_actions" {
  description = "ARNs (SNS topics, ...) notified when the running-tasks alarm fires."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.alarm_actions : can(regex("^arn:[a-z-]+:[a-z0-9-]+:[a-z0-9-]*:[0-9]{12}:[^*]+$", arn))])
    error_message = "alarm_actions must list ARNs (an SNS topic, an Auto Scaling policy, ...) without wildcards."
  }
}

variable "ok_actions" {
  description = "ARNs notified when an alarm returns to OK."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.ok_actions : can(regex("^arn:[a-z-]+:[a-z0-9-]+:[a-z0-9-]*:[0-9]{12}:[^*]+$", arn))])
    error_message = "ok_actions must list ARNs (an SNS topic, an Auto Scaling policy, ...) without wildcards."
  }
}

variable "alarm_evaluation_periods" {
  description = "Consecutive one-minute periods with fewer running tasks than min_capacity before the alarm fires."
  type        = number
  default     = 5

  validation {
    condition     = var.alarm_evaluation_periods >= 1
    error_message = "alarm_evaluation_periods must be at least 1."
  }
}

variable "payload_bucket" {
  description = "The large-payload bucket (modules/payload-bucket: its name and arn outputs); null (the default) when jobs never exceed the queue's size limit. Sets CONVEYOR_PAYLOAD_BUCKET and grants s3:GetObject, s3:DeleteObject and s3:ListBucket on it."
  type = object({
    name = string
    arn  = string
  })
  default = null
}
