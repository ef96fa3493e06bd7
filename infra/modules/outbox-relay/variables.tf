variable "name" {
  description = "Name of the relay: the Lambda function's name (deploy_lambda) and the prefix of its role."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,64}$", var.name))
    error_message = "name must be 1 to 64 letters, digits, '-' or '_' (a Lambda function name)."
  }
}

variable "create_table" {
  description = "Create a dedicated outbox table (pk/sk strings, the outbox-pending index, a KEYS_ONLY stream, no TTL). false: the outbox lives in an existing table (the application's own, single-table design), given by table_name, table_arn and (for the Lambda relay) stream_arn; that table needs the outbox-pending index (see README)."
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
  description = "The existing table's stream ARN (create_table = false, deploy_lambda): any view type (the relay reads only the keys; KEYS_ONLY is enough)."
  type        = string
  default     = null
}

variable "partition_key" {
  description = "The table's partition key attribute (a string), as OutboxTable::partition_key / CONVEYOR_OUTBOX_PARTITION_KEY."
  type        = string
  default     = "pk"
}

variable "sort_key" {
  description = "The table's sort key attribute (a string), as OutboxTable::sort_key / CONVEYOR_OUTBOX_SORT_KEY. The outbox keys jobs by aggregate and sequence, so the table needs one."
  type        = string
  default     = "sk"

  validation {
    condition     = var.sort_key != ""
    error_message = "sort_key must name the table's sort key: outbox jobs are keyed by aggregate (partition key) and sequence (sort key)."
  }
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
  description = "Customer-managed KMS keys of the target queues and of the table (SSE-KMS): the relay encrypts sends and reads the table and its stream with them."
  type        = list(string)
  default     = []
}

variable "table_kms_key_arn" {
  description = "A customer-managed KMS key for a created table (default: DynamoDB's AWS-owned key)."
  type        = string
  default     = null
}

variable "deploy_lambda" {
  description = "Deploy the relay as a Lambda function on the stream, with the one-minute sweep schedule and the backlog alarms. false: an ECS worker relays (its outbox poller, on with CONVEYOR_OUTBOX_TABLE); attach ecs_policy_json to its task role and merge ecs_environment into its environment."
  type        = bool
  default     = true
}

variable "package_path" {
  description = "The relay function's zip (the example outbox_relay binary renamed bootstrap; cargo lambda build --arm64 --output-format zip). Required with deploy_lambda."
  type        = string
  default     = null
}

variable "timeout_seconds" {
  description = "The relay function's timeout (a sweep relays pass after pass until 10 s before it)."
  type        = number
  default     = 60
}

variable "memory_size_mb" {
  description = "The relay function's memory."
  type        = number
  default     = 256
}

variable "batch_size" {
  description = "Stream records per invocation (1 to 10000); each names an aggregate, relayed once per invocation."
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

variable "parallelization_factor" {
  description = "Concurrent invocations per stream shard (1 to 10). Order comes from the table (each aggregate's sequence and the relay's conditional deletes), not from the stream, so any value keeps each aggregate's order."
  type        = number
  default     = 1

  validation {
    condition     = var.parallelization_factor >= 1 && var.parallelization_factor <= 10
    error_message = "parallelization_factor must be 1 to 10."
  }
}

variable "maximum_retry_attempts" {
  description = "Retries of a batch the relay reported (it does only when the table could not be read) or that crashed, before the mapping skips it (0 to 10000). Records only trigger: the one-minute sweep relays whatever a skipped record named."
  type        = number
  default     = 3

  validation {
    condition     = var.maximum_retry_attempts >= 0 && var.maximum_retry_attempts <= 10000
    error_message = "maximum_retry_attempts must be 0 to 10000: the stream only triggers the relay and the sweep covers a skipped batch, so retrying until the record expires only holds up the shard."
  }
}

variable "maximum_record_age_seconds" {
  description = "Records older than this are skipped, not sent to the function (60 to 86400). The sweep relays their jobs (it takes any job unsent after 30 s)."
  type        = number
  default     = 600

  validation {
    condition     = var.maximum_record_age_seconds >= 60 && var.maximum_record_age_seconds <= 86400
    error_message = "maximum_record_age_seconds must be 60 to 86400: the stream only triggers the relay, so a record never needs to be kept until it expires."
  }
}

variable "bisect_batch_on_function_error" {
  description = "Split a batch whose invocation crashed or timed out and retry the halves. Off by default: a record only names an aggregate, so no single record is poison, and the sweep covers a skipped batch."
  type        = bool
  default     = false
}

variable "on_failure_destination_arn" {
  description = "An SQS queue or SNS topic that receives the description of a batch the mapping skipped. Informational only: the jobs stay in the table and the sweep relays them."
  type        = string
  default     = null
}

variable "sweep_kms_key_arn" {
  description = "Optional customer-managed KMS key for the sweep schedule's stored input (a constant without data; EventBridge Scheduler uses an AWS-owned key by default). Its key policy must let EventBridge Scheduler use it."
  type        = string
  default     = null

  validation {
    condition     = var.sweep_kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:", var.sweep_kms_key_arn))
    error_message = "sweep_kms_key_arn must be a KMS key ARN."
  }
}

variable "oldest_unsent_alarm_threshold_seconds" {
  description = "Alarm (deploy_lambda) when the oldest unsent outbox job is older than this (the sweep's OldestUnsentSeconds)."
  type        = number
  default     = 300

  validation {
    condition     = var.oldest_unsent_alarm_threshold_seconds > 0
    error_message = "oldest_unsent_alarm_threshold_seconds must be positive."
  }
}

variable "oldest_unsent_alarm_evaluation_periods" {
  description = "Consecutive one-minute periods above the threshold (or without a sweep's report) before the oldest-unsent alarm fires."
  type        = number
  default     = 3

  validation {
    condition     = var.oldest_unsent_alarm_evaluation_periods >= 1
    error_message = "oldest_unsent_alarm_evaluation_periods must be at least 1."
  }
}

variable "alarm_actions" {
  description = "ARNs (SNS topics, ...) notified when the oldest-unsent or parked-jobs alarm fires (deploy_lambda). Empty: the alarms exist but notify no one."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.alarm_actions : can(regex("^arn:[a-z-]+:[a-z0-9-]+:[a-z0-9-]*:[0-9]{12}:[^*]+$", arn))])
    error_message = "alarm_actions must list ARNs (an SNS topic, ...) without wildcards."
  }
}

variable "ok_actions" {
  description = "ARNs notified when an alarm returns to OK."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.ok_actions : can(regex("^arn:[a-z-]+:[a-z0-9-]+:[a-z0-9-]*:[0-9]{12}:[^*]+$", arn))])
    error_message = "ok_actions must list ARNs (an SNS topic, ...) without wildcards."
  }
}

variable "lease_seconds" {
  description = "ECS relays (deploy_lambda = false): the polling relay's lease (CONVEYOR_OUTBOX_LEASE_SECONDS, at least 3); null: the worker's default (30 s)."
  type        = number
  default     = null

  validation {
    condition     = var.lease_seconds == null || try(var.lease_seconds >= 3 && floor(var.lease_seconds) == var.lease_seconds, false)
    error_message = "lease_seconds must be null or whole seconds, at least 3."
  }
}

variable "max_attempts" {
  description = "ECS relays (deploy_lambda = false): failed sends of a job SQS refuses for a reason that needs a person before it is parked (CONVEYOR_OUTBOX_MAX_ATTEMPTS, at least 1); null: the default (8)."
  type        = number
  default     = null

  validation {
    condition     = var.max_attempts == null || try(var.max_attempts >= 1 && floor(var.max_attempts) == var.max_attempts, false)
    error_message = "max_attempts must be null or a whole number, at least 1."
  }
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
