variable "name" {
  description = "Name of the S3 bucket large job payloads are stored in (CONVEYOR_PAYLOAD_BUCKET)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.name))
    error_message = "name must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "expiration_days" {
  description = "Days after which every payload object expires (the backstop behind the consumers' delete after success). Keep it above the queues' and the DLQ's message retention, or a message can outlive its payload; the default (29) is the longest a message can still point at an object without a touch: the source queue's longest retention (14 days), then a redrive from the DLQ with 14 fresh days, plus a day."
  type        = number
  default     = 29

  validation {
    condition     = var.expiration_days >= 1 && floor(var.expiration_days) == var.expiration_days
    error_message = "expiration_days must be a whole number of days, at least 1."
  }
}

variable "kms_key_arn" {
  description = "Customer-managed KMS key for the objects (SSE-KMS). null (the default) uses S3-managed keys (SSE-S3). With a key, producers and consumers also need kms:GenerateDataKey / kms:Decrypt on it (the producer policy output includes them; pass the key in the consumers' kms_key_arns)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.kms_key_arn, "-")))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete a bucket that still holds objects (throwaway environments)."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags for the bucket."
  type        = map(string)
  default     = {}
}
