variable "schedules_file" {
  description = "Path of the JSON file `conveyor schedules export` (conveyor_schedule::export) wrote from the application's schedule definitions."
  type        = string
}

variable "queue_arn" {
  description = "ARN of the queue the schedules send their jobs to (the Lambda consumer's queue)."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]+$", var.queue_arn))
    error_message = "queue_arn must be a standard SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>); EventBridge Scheduler cannot send to FIFO queues without a message group, which the export does not set."
  }
}

variable "queue_url" {
  description = "URL of the queue, for the schedules with a tenant (their universal target calls SendMessage with it). Derived from queue_arn when null (https://sqs.<region>.amazonaws.com[.cn]/<account>/<name>); set it in other partitions."
  type        = string
  default     = null
}

variable "name_prefix" {
  description = "Names the schedule group and the scheduler's IAM role."
  type        = string
  default     = "conveyor"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]{1,40}$", var.name_prefix))
    error_message = "name_prefix must be 1-40 characters of letters, digits, '-', '_' or '.' (it prefixes the role name, which IAM limits to 64)."
  }
}

variable "enabled" {
  description = "false creates the schedules DISABLED (they send nothing until enabled)."
  type        = bool
  default     = true
}

variable "maximum_event_age_seconds" {
  description = "How long EventBridge Scheduler keeps retrying a tick it could not deliver (60-86400). Past it the tick is dropped, or sent to dead_letter_arn."
  type        = number
  default     = 3600

  validation {
    condition     = var.maximum_event_age_seconds >= 60 && var.maximum_event_age_seconds <= 86400
    error_message = "maximum_event_age_seconds must be between 60 and 86400, EventBridge Scheduler's limits."
  }
}

variable "maximum_retry_attempts" {
  description = "Delivery retries per tick (0-185)."
  type        = number
  default     = 185

  validation {
    condition     = var.maximum_retry_attempts >= 0 && var.maximum_retry_attempts <= 185
    error_message = "maximum_retry_attempts must be between 0 and 185, EventBridge Scheduler's limits."
  }
}

variable "dead_letter_arn" {
  description = "Optional SQS queue ARN for ticks EventBridge Scheduler could not deliver (the scheduler's own DLQ, not the consumer's)."
  type        = string
  default     = null
}

variable "kms_key_arn" {
  description = "Optional customer-managed KMS key for the schedules' stored input (EventBridge uses an AWS-owned key by default). Also given to the role when the queue is encrypted with it."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "tags" {
  description = "Tags for the schedule group and the role."
  type        = map(string)
  default     = {}
}
