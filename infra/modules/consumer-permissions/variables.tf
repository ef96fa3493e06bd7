variable "queue_arn" {
  description = "ARN of the queue the consumer reads."
  type        = string
}

variable "dlq_arn" {
  description = "ARN of the queue's dead-letter queue (Reject sends there)."
  type        = string
}

variable "idempotency_table_arn" {
  description = "ARN of the idempotency table."
  type        = string
}

variable "kms_key_arns" {
  description = "KMS keys encrypting the queues or the table; empty when they use AWS-owned keys."
  type        = list(string)
  default     = []
}
