variable "role_name" {
  description = "Name of the function's IAM role. null (the default) generates a unique name from the function name, so the same function in two regions or stacks never collides (role names are global to the account)."
  type        = string
  default     = null

  validation {
    condition     = var.role_name == null || can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", coalesce(var.role_name, "-")))
    error_message = "role_name must be 1-64 characters of letters, digits and +=,.@_- (IAM's limits)."
  }
}

variable "function_name" {
  description = "Name of the Lambda function; also names its IAM role and its log group /aws/lambda/<function_name>."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,64}$", var.function_name))
    error_message = "function_name must be 1-64 characters of letters, digits, '-' or '_'."
  }
}

variable "package_path" {
  description = "Path to a zip file holding the `bootstrap` executable at its root, built for arm64 (for example `cargo lambda build --release --arm64 --output-format zip`, which writes target/lambda/<bin>/bootstrap.zip)."
  type        = string
}

variable "timeout_seconds" {
  description = "Function timeout. The queue's visibility timeout must be at least 6x this (AWS's advice, conveyor_core::runtime::LAMBDA_VISIBILITY_RATIO)."
  type        = number
  default     = 10

  validation {
    condition     = var.timeout_seconds >= 1 && var.timeout_seconds <= 900
    error_message = "timeout_seconds must be between 1 and 900 (Lambda's 15 minute limit)."
  }
}

variable "memory_size_mb" {
  description = "Memory of the function in MB (CPU grows with it)."
  type        = number
  default     = 256

  validation {
    condition     = var.memory_size_mb >= 128 && var.memory_size_mb <= 10240
    error_message = "memory_size_mb must be between 128 and 10240."
  }
}

variable "reserved_concurrent_executions" {
  description = "Concurrency reserved for this function; -1 (the default) reserves none. Otherwise at least maximum_concurrency, or the mapping's invocations are throttled and messages reach the DLQ without running. maximum_concurrency is the tool to protect downstream services."
  type        = number
  default     = -1

  validation {
    condition     = var.reserved_concurrent_executions >= -1
    error_message = "reserved_concurrent_executions must be -1 (none) or a number of executions."
  }
}

variable "queue_arn" {
  description = "ARN of the queue the function consumes (queue module output queue_arn). A name ending in .fifo makes the module apply FIFO's event source limits."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.queue_arn))
    error_message = "queue_arn must be one SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>), without wildcards."
  }
}

variable "queue_visibility_timeout_seconds" {
  description = "The queue's visibility timeout (queue module output visibility_timeout_seconds), checked against timeout_seconds."
  type        = number
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
  description = "ARNs of customer-managed KMS keys that encrypt the queues or the table; the role gets kms:Decrypt and kms:GenerateDataKey on exactly these. Empty when they use SQS-managed or AWS-owned keys."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.kms_key_arns : can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", arn))])
    error_message = "kms_key_arns must list KMS key ARNs (arn:aws:kms:<region>:<account>:key/<id>); \"*\", aliases and wildcards are refused."
  }
}

variable "batch_size" {
  description = "Most records per invocation. Up to 10 for FIFO queues; above 10 needs maximum_batching_window_in_seconds >= 1 (both checked at plan). An upper bound: Lambda passes a batch whole only within the 6 MB synchronous payload, so with 1 MiB messages an invocation carries about five full-size records, and ten always fit at 256 KiB."
  type        = number
  default     = 10

  validation {
    condition     = var.batch_size >= 1 && var.batch_size <= 10000
    error_message = "batch_size must be between 1 and 10000."
  }
}

variable "maximum_batching_window_in_seconds" {
  description = "How long the event source mapping gathers records before invoking (standard queues only; 0 for FIFO queues). Counts toward the visibility timeout: visibility >= 6 x timeout_seconds + this."
  type        = number
  default     = 0

  validation {
    condition     = var.maximum_batching_window_in_seconds >= 0 && var.maximum_batching_window_in_seconds <= 300
    error_message = "maximum_batching_window_in_seconds must be between 0 and 300."
  }
}

variable "maximum_concurrency" {
  description = "Most concurrent invocations the event source mapping starts (scaling_config). Limits the load on downstream services without the throttling and early DLQ moves that reserved concurrency causes. null (the default) means 10 in on-demand mode; provisioned mode (provisioned_pollers) excludes it."
  type        = number
  default     = null

  validation {
    condition     = var.maximum_concurrency == null || (coalesce(var.maximum_concurrency, 10) >= 2 && coalesce(var.maximum_concurrency, 10) <= 1000)
    error_message = "maximum_concurrency must be between 2 and 1000 (AWS's limits)."
  }
}

variable "provisioned_pollers" {
  description = "Provisioned mode for the event source mapping (SQS, November 2025): event pollers kept ready, from minimum (at least 2) to maximum, each about 5 MB/s. It scales faster than on-demand polling and is billed per poller-hour whether or not messages arrive. null (the default) polls on demand. It cannot be combined with maximum_concurrency; see docs/running.md for when each fits."
  type = object({
    minimum = number
    maximum = number
  })
  default = null

  validation {
    condition = var.provisioned_pollers == null || (
      try(var.provisioned_pollers.minimum, 0) >= 2 && try(var.provisioned_pollers.minimum, 0) <= 200 &&
      try(var.provisioned_pollers.maximum, 0) >= 2 && try(var.provisioned_pollers.maximum, 0) <= 2000 &&
      try(var.provisioned_pollers.minimum <= var.provisioned_pollers.maximum, false)
    )
    error_message = "provisioned_pollers needs 2 <= minimum <= 200, 2 <= maximum <= 2000 and minimum <= maximum (AWS's limits for SQS event sources)."
  }
}

variable "log_retention_days" {
  description = "Retention of the function's log group."
  type        = number
  default     = 14
}

variable "rust_log" {
  description = "RUST_LOG filter for the function."
  type        = string
  default     = "info"
}

variable "environment" {
  description = "Extra environment variables. The CONVEYOR_* variables and RUST_LOG set by the module win on a clash."
  type        = map(string)
  default     = {}
}

variable "tags" {
  description = "Tags for every resource of the module."
  type        = map(string)
  default     = {}
}

variable "log_kms_key_arn" {
  description = "KMS key ARN encrypting the function's log group; null (the default) keeps CloudWatch Logs' own encryption. The key policy must allow the logs.<region>.amazonaws.com principal."
  type        = string
  default     = null

  validation {
    condition     = var.log_kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.log_kms_key_arn, "-")))
    error_message = "log_kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "tracing_mode" {
  description = "X-Ray tracing of the function: Active (the default; the role gets xray:PutTraceSegments and xray:PutTelemetryRecords, which exist only on \"*\") or PassThrough."
  type        = string
  default     = "Active"

  validation {
    condition     = contains(["Active", "PassThrough"], var.tracing_mode)
    error_message = "tracing_mode must be Active or PassThrough."
  }
}

variable "enabled" {
  description = "Whether the event source mapping polls the queue. false pauses consumption without deleting anything."
  type        = bool
  default     = true
}

variable "filter_patterns" {
  description = "Event filtering patterns (JSON strings, https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html). Messages that match none are deleted from the queue without invoking the function. Empty (the default): no filter."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.filter_patterns) <= 5 && alltrue([for pattern in var.filter_patterns : can(jsondecode(pattern))])
    error_message = "filter_patterns must hold at most 5 patterns, each a JSON document."
  }
}

variable "event_source_metrics" {
  description = "Turn on the event source mapping's EventCount metrics (polled, filtered, invoked, failed events) in CloudWatch."
  type        = bool
  default     = true
}

variable "alarm_actions" {
  description = "ARNs (SNS topics, ...) notified when one of the function's alarms fires."
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
  description = "Consecutive one-minute periods in breach before the errors, throttles and duration alarms fire."
  type        = number
  default     = 3

  validation {
    condition     = var.alarm_evaluation_periods >= 1
    error_message = "alarm_evaluation_periods must be at least 1."
  }
}

variable "duration_alarm_percent" {
  description = "The duration alarm fires when the longest invocation of a minute takes more than this percentage of the timeout."
  type        = number
  default     = 80

  validation {
    condition     = var.duration_alarm_percent > 0 && var.duration_alarm_percent <= 100
    error_message = "duration_alarm_percent must be in (0, 100]."
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

variable "flow_sweep" {
  description = "Invoke the function once a minute with {\"conveyor\": \"sweep_flows\"} (EventBridge Scheduler), so flows past their deadline end by their policy when no ECS worker runs the sweep. Needs flows on in the function's pipeline (Pipeline::with_flows); an ECS worker sweeps by itself."
  type        = bool
  default     = false
}

variable "timer_relay" {
  description = "Invoke the function once a minute with {\"conveyor\": \"relay_timers\"} (EventBridge Scheduler), so the long-delayed jobs kept in the timer table (Producer::with_timers) are sent when due when no ECS worker relays them. Needs timers on in the function's pipeline (Pipeline::with_timers); an ECS worker with them relays by itself."
  type        = bool
  default     = false
}

variable "flow_sweep_kms_key_arn" {
  description = "Optional customer managed KMS key ARN for the flow sweep and timer relay schedules (null: an AWS owned key)."
  type        = string
  default     = null

  validation {
    condition     = var.flow_sweep_kms_key_arn == null || can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", var.flow_sweep_kms_key_arn))
    error_message = "flow_sweep_kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), or null."
  }
}
