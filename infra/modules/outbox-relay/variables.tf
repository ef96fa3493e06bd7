variable "name" {
  description = "Name of the relay: the Lambda function's name (deploy_lambda) and the prefix of its role."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,64}$", var.name))
    error_message = "name must be 1 to 64 letters, digits, '-' or '_' (a Lambda function name)."
  }
}

variable "create_table" {
  description = "Create a dedicated outbox table (pk/sk strings, NEW_IMAGE stream, TTL). false: the outbox lives in an existing table (the application's own, single-table design), given by table_name, table_arn and stream_arn."
  type        = bool
  default     = true
}

variable "table_name" {
  description = "The outbox table's name (created when create_table, else existing)."
  type        = string
}

variable "table_arn" {
  description = "The existing table's ARN (create_table = false)."
  type        = string
  default     = null
}

variable "stream_arn" {
  description = "The existing table's stream ARN (create_table = false). Its view type must include new images (NEW_IMAGE or NEW_AND_OLD_IMAGES)."
  type        = string
  default     = null
}

variable "partition_key" {
  description = "The table's partition key attribute (a string), as OutboxTable::partition_key / CONVEYOR_OUTBOX_PARTITION_KEY."
  type        = string
  default     = "pk"
}

variable "sort_key" {
  description = "The table's sort key attribute (a string); \"\" for a table without one."
  type        = string
  default     = "sk"
}

variable "ttl_attribute" {
  description = "The TTL attribute of a created table (the backstop for sent items whose delete failed)."
  type        = string
  default     = "expires_at"
}

variable "queue_arns" {
  description = "The queues the outbox's jobs go to: the relay may send to these and no other."
  type        = list(string)

  validation {
    condition     = length(var.queue_arns) > 0 && alltrue([for arn in var.queue_arns : can(regex("^arn:[^:]+:sqs:[^:]+:[0-9]{12}:[A-Za-z0-9_-]+(\\.fifo)?$", arn))])
    error_message = "queue_arns must list at least one SQS queue ARN (arn:<partition>:sqs:<region>:<account>:<name>)."
  }
}

variable "kms_key_arns" {
  description = "Customer-managed KMS keys of the target queues and of the table (SSE-KMS): the relay encrypts sends and decrypts the stream with them."
  type        = list(string)
  default     = []
}

variable "table_kms_key_arn" {
  description = "A customer-managed KMS key for a created table (default: DynamoDB's AWS-owned key)."
  type        = string
  default     = null
}

variable "deploy_lambda" {
  description = "Deploy the relay as a Lambda function on the stream. false: an ECS worker relays (Worker::with_outbox_relay); attach ecs_policy_json to its task role and merge ecs_environment into its environment."
  type        = bool
  default     = true
}

variable "package_path" {
  description = "The relay function's zip (the example outbox_relay binary renamed bootstrap; cargo lambda build --arm64 --output-format zip). Required with deploy_lambda."
  type        = string
  default     = null
}

variable "timeout_seconds" {
  description = "The relay function's timeout."
  type        = number
  default     = 60
}

variable "memory_size_mb" {
  description = "The relay function's memory."
  type        = number
  default     = 256
}

variable "batch_size" {
  description = "Stream records per invocation (1 to 10000)."
  type        = number
  default     = 100

  validation {
    condition     = var.batch_size >= 1 && var.batch_size <= 10000
    error_message = "batch_size must be 1 to 10000 (DynamoDB stream event sources)."
  }
}

variable "maximum_batching_window_in_seconds" {
  description = "How long the mapping gathers records before invoking (0 to 300): latency against invocations."
  type        = number
  default     = 0
}

variable "starting_position" {
  description = "Where a new mapping starts: TRIM_HORIZON (every record the stream holds: nothing written before the relay existed is missed) or LATEST."
  type        = string
  default     = "TRIM_HORIZON"

  validation {
    condition     = contains(["TRIM_HORIZON", "LATEST"], var.starting_position)
    error_message = "starting_position must be TRIM_HORIZON or LATEST."
  }
}

variable "maximum_retry_attempts" {
  description = "Retries of a failing batch before it is given up to on_failure_destination_arn; -1 retries until the record leaves the stream (24 h). The relay fails a batch only when SQS refuses a send (queue missing, access denied, throttled), so the default keeps retrying while someone fixes it."
  type        = number
  default     = -1
}

variable "bisect_batch_on_function_error" {
  description = "Split a failing batch in two and retry the halves. The handler already reports the exact record to retry from (ReportBatchItemFailures), so this only matters when the function itself crashes or times out."
  type        = bool
  default     = true
}

variable "on_failure_destination_arn" {
  description = "An SQS queue or SNS topic that receives the description of a batch given up (maximum_retry_attempts). The outbox items themselves stay in the table until their TTL."
  type        = string
  default     = null
}

variable "state_table_arn" {
  description = "ECS relays (deploy_lambda = false): the table of the relay's lease and checkpoints, usually the consumers' idempotency table (CONVEYOR_IDEMPOTENCY_TABLE)."
  type        = string
  default     = null
}

variable "log_retention_days" {
  description = "Retention of the relay function's log group."
  type        = number
  default     = 14
}

variable "log_kms_key_arn" {
  description = "A KMS key for the log group (default: CloudWatch's own encryption)."
  type        = string
  default     = null
}

variable "rust_log" {
  description = "RUST_LOG of the relay function."
  type        = string
  default     = "info"
}

variable "point_in_time_recovery_enabled" {
  description = "Point-in-time recovery of a created table."
  type        = bool
  default     = true
}

variable "deletion_protection_enabled" {
  description = "Deletion protection of a created table."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
