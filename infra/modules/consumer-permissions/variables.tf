variable "queue_arn" {
  description = "ARN of the queue the consumer reads."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.queue_arn))
    error_message = "queue_arn must be one SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>), without wildcards."
  }
}

variable "dlq_arn" {
  description = "ARN of the queue's dead-letter queue (Reject sends there)."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.dlq_arn))
    error_message = "dlq_arn must be one SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>), without wildcards."
  }
}

variable "idempotency_table_arn" {
  description = "ARN of the idempotency table."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[A-Za-z0-9_.-]+$", var.idempotency_table_arn))
    error_message = "idempotency_table_arn must be one DynamoDB table ARN (arn:aws:dynamodb:<region>:<account>:table/<name>), without wildcards."
  }
}

variable "kms_key_arns" {
  description = "KMS keys encrypting the queues or the table; empty when they use AWS-owned or SQS-managed keys. Used only through SQS and DynamoDB (kms:ViaService)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.kms_key_arns : can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", arn))])
    error_message = "kms_key_arns must list KMS key ARNs (arn:aws:kms:<region>:<account>:key/<id>); \"*\", aliases and wildcards are refused."
  }
}

variable "payload_bucket_arn" {
  description = "ARN of the large-payload bucket (modules/payload-bucket); null (the default) when the consumer takes no large payloads."
  type        = string
  default     = null

  validation {
    condition     = var.payload_bucket_arn == null || can(regex("^arn:[a-z-]+:s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", coalesce(var.payload_bucket_arn, "-")))
    error_message = "payload_bucket_arn must be one S3 bucket ARN (arn:aws:s3:::<bucket>), without wildcards or a key."
  }
}
