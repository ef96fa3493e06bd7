variable "name" {
  description = "Base name of the queue. FIFO queues get the `.fifo` suffix appended; the DLQ is named `<name>-dlq` (plus `.fifo`)."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,76}$", var.name))
    error_message = "name must be 1-76 characters of letters, digits, '-' or '_' (71 for a FIFO queue): the module appends '-dlq' (and '.fifo'), and SQS allows 80 characters."
  }
}

variable "fifo" {
  description = "Create a FIFO queue (and a FIFO DLQ). Messages of one group then run in order, one at a time."
  type        = bool
  default     = false
}

variable "content_based_deduplication" {
  description = "FIFO only: let SQS derive the deduplication id from a SHA-256 of the body, so producers need not set one."
  type        = bool
  default     = false
}

variable "visibility_timeout_seconds" {
  description = "Visibility timeout of the main queue. Must match conveyor_core::runtime::QUEUE_VISIBILITY_TIMEOUT_SECS unless the consumer is configured otherwise; a Lambda consumer needs at least 6x its function timeout."
  type        = number
  default     = 60

  validation {
    condition     = var.visibility_timeout_seconds >= 0 && var.visibility_timeout_seconds <= 43200
    error_message = "visibility_timeout_seconds must be between 0 and 43200 (12 hours), SQS's limits."
  }
}

variable "max_receive_count" {
  description = "Receives before SQS moves a message to the DLQ (the redrive policy's maxReceiveCount). Matches conveyor_core::runtime::MAX_RECEIVE_COUNT."
  type        = number
  default     = 5

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be between 1 and 1000."
  }
}

variable "max_message_size" {
  description = "Largest message, in bytes, the queue and its DLQ accept (SQS's MaximumMessageSize, 1 KiB to 1 MiB; default 1 MiB, SQS's maximum since August 2025). The DLQ gets the same value, so a message that fits the queue fits its DLQ with its failure record. The AWS provider accepts more than 262144 only from 6.8 on (hashicorp/terraform-provider-aws#43692): on 5.x set 262144 (256 KiB), and producers with large payloads on offload above it."
  type        = number
  default     = 1048576

  validation {
    condition     = var.max_message_size >= 1024 && var.max_message_size <= 1048576
    error_message = "max_message_size must be between 1024 and 1048576 bytes (1 KiB to 1 MiB), SQS's limits; with the AWS provider 5.x, at most 262144."
  }
}

variable "message_retention_seconds" {
  description = "How long the main queue keeps a message (default 4 days)."
  type        = number
  default     = 345600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds must be between 60 seconds and 1209600 seconds (14 days)."
  }
}

variable "dlq_message_retention_seconds" {
  description = "How long the DLQ keeps a message (default 14 days, the SQS maximum). Keep it longer than the main queue's retention: a message's age counts from its first enqueue, not from its move to the DLQ."
  type        = number
  default     = 1209600

  validation {
    condition     = var.dlq_message_retention_seconds >= 60 && var.dlq_message_retention_seconds <= 1209600
    error_message = "dlq_message_retention_seconds must be between 60 seconds and 1209600 seconds (14 days)."
  }
}

variable "receive_wait_time_seconds" {
  description = "Default long-poll wait for receives that do not set one. Conveyor's worker always asks for 20 s itself."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20
    error_message = "receive_wait_time_seconds must be between 0 and 20."
  }
}

variable "kms_master_key_id" {
  description = "KMS key ARN for server-side encryption of both queues. null (the default) uses SQS-managed encryption (SSE-SQS). Consumers then need kms:Decrypt and kms:GenerateDataKey on this key (pass it in their kms_key_arns)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_master_key_id == null || can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.kms_master_key_id, "-")))
    error_message = "kms_master_key_id must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), so the consumers' and producers' policies can name it."
  }
}

variable "kms_data_key_reuse_period_seconds" {
  description = "With a KMS key: how long SQS reuses a data key before calling KMS again."
  type        = number
  default     = 300

  validation {
    condition     = var.kms_data_key_reuse_period_seconds >= 60 && var.kms_data_key_reuse_period_seconds <= 86400
    error_message = "kms_data_key_reuse_period_seconds must be between 60 and 86400."
  }
}

variable "oldest_message_age_alarm_threshold_seconds" {
  description = "Alarm when the main queue's oldest message is older than this many seconds (the queue is backing up)."
  type        = number
  default     = 900

  validation {
    condition     = var.oldest_message_age_alarm_threshold_seconds > 0
    error_message = "oldest_message_age_alarm_threshold_seconds must be positive."
  }
}

variable "oldest_message_age_alarm_evaluation_periods" {
  description = "Consecutive one-minute periods above the age threshold before the alarm fires."
  type        = number
  default     = 3

  validation {
    condition     = var.oldest_message_age_alarm_evaluation_periods >= 1
    error_message = "oldest_message_age_alarm_evaluation_periods must be at least 1."
  }
}

variable "alarm_actions" {
  description = "ARNs (SNS topics, ...) notified when an alarm fires. Empty: the alarms exist but notify no one."
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

variable "tags" {
  description = "Tags for every resource of the module."
  type        = map(string)
  default     = {}
}

variable "sns_topic_arns" {
  description = "SNS topics whose subscriptions deliver to the queue (the queue policy lets sns.amazonaws.com send for these topics only)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.sns_topic_arns : can(regex("^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[^*]+$", arn))])
    error_message = "sns_topic_arns must list SNS topic ARNs without wildcards."
  }
}

variable "eventbridge_rule_arns" {
  description = "EventBridge rules with the queue as a target (the queue policy lets events.amazonaws.com send for these rules only)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.eventbridge_rule_arns : can(regex("^arn:[a-z-]+:events:[a-z0-9-]+:[0-9]{12}:rule/[^*]+$", arn))])
    error_message = "eventbridge_rule_arns must list EventBridge rule ARNs (arn:aws:events:<region>:<account>:rule/<name>) without wildcards."
  }
}

variable "s3_bucket_arns" {
  description = "S3 buckets whose event notifications go to the queue (the queue policy lets s3.amazonaws.com send for these buckets only)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.s3_bucket_arns : can(regex("^arn:[a-z-]+:s3:::[a-z0-9.-]+$", arn))])
    error_message = "s3_bucket_arns must list bucket ARNs (arn:aws:s3:::<bucket>) without wildcards."
  }
}

variable "fair_queue_alarms" {
  description = "Create the fair-queue alarms (noisy tenants, quiet tenants' oldest message age) and the tenants dashboard. The metrics exist for standard queues whose producers set a tenant (MessageGroupId)."
  type        = bool
  default     = true
}

variable "noisy_groups_alarm_threshold" {
  description = "Alarm when more than this many tenants (message groups) are noisy: SQS holds them back."
  type        = number
  default     = 0

  validation {
    condition     = var.noisy_groups_alarm_threshold >= 0
    error_message = "noisy_groups_alarm_threshold must be 0 or more."
  }
}

variable "quiet_groups_age_alarm_threshold_seconds" {
  description = "Alarm when the oldest message of a quiet tenant is older than this many seconds: tenants that are not flooding the queue are waiting."
  type        = number
  default     = 300

  validation {
    condition     = var.quiet_groups_age_alarm_threshold_seconds > 0
    error_message = "quiet_groups_age_alarm_threshold_seconds must be positive."
  }
}

variable "fair_queue_alarm_evaluation_periods" {
  description = "Consecutive one-minute periods over a fair-queue threshold before its alarm fires."
  type        = number
  default     = 5

  validation {
    condition     = var.fair_queue_alarm_evaluation_periods >= 1
    error_message = "fair_queue_alarm_evaluation_periods must be at least 1."
  }
}
