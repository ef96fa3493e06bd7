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
  description = "Function timeout. The queue's visibility timeout must be at least 6x this (AWS's advice, conveyor_core::defaults::LAMBDA_VISIBILITY_RATIO)."
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
  description = "Concurrency reserved for this function; -1 (the default) reserves none. scaling_config's maximum_concurrency is the better tool to protect downstream services."
  type        = number
  default     = -1
}

variable "queue_arn" {
  description = "ARN of the queue the function consumes (queue module output queue_arn)."
  type        = string
}

variable "queue_url" {
  description = "URL of the queue the function consumes (queue module output queue_url); passed as CONVEYOR_QUEUE_URL."
  type        = string
}

variable "queue_visibility_timeout_seconds" {
  description = "The queue's visibility timeout (queue module output visibility_timeout_seconds), checked against timeout_seconds."
  type        = number
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
  description = "ARNs of customer-managed KMS keys that encrypt the queues or the table; the role gets kms:Decrypt and kms:GenerateDataKey on exactly these. Empty when they use SQS-managed or AWS-owned keys."
  type        = list(string)
  default     = []
}

variable "batch_size" {
  description = "Most records per invocation. Up to 10 for FIFO queues; above 10 needs maximum_batching_window_in_seconds >= 1."
  type        = number
  default     = 10

  validation {
    condition     = var.batch_size >= 1 && var.batch_size <= 10000
    error_message = "batch_size must be between 1 and 10000."
  }
}

variable "maximum_batching_window_in_seconds" {
  description = "How long the event source mapping gathers records before invoking (standard queues only; keep 0 for FIFO queues)."
  type        = number
  default     = 0

  validation {
    condition     = var.maximum_batching_window_in_seconds >= 0 && var.maximum_batching_window_in_seconds <= 300
    error_message = "maximum_batching_window_in_seconds must be between 0 and 300."
  }
}

variable "maximum_concurrency" {
  description = "Most concurrent invocations the event source mapping starts (scaling_config). Limits the load on downstream services without the throttling and early DLQ moves that reserved concurrency causes."
  type        = number
  default     = 10

  validation {
    condition     = var.maximum_concurrency >= 2 && var.maximum_concurrency <= 1000
    error_message = "maximum_concurrency must be between 2 and 1000 (AWS's limits)."
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
