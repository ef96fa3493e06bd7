variable "name" {
  description = "Name of the DynamoDB table."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]{3,255}$", var.name))
    error_message = "name must be 3-255 characters of letters, digits, '_', '-' or '.'."
  }
}

variable "kms_key_arn" {
  description = "Customer-managed KMS key for encryption at rest. null (the default) keeps DynamoDB's default encryption with an AWS-owned key. Consumers then need kms:Decrypt and kms:GenerateDataKey on this key (pass it in their kms_key_arns)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.kms_key_arn, "-")))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "point_in_time_recovery_enabled" {
  description = "Keep continuous backups (point-in-time recovery) of the table."
  type        = bool
  default     = true
}

variable "deletion_protection_enabled" {
  description = "Refuse to delete the table until this is turned off again. On by default: the table holds which jobs already ran, and losing it means running them again. Throwaway environments (the examples, tests) turn it off."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for the table."
  type        = map(string)
  default     = {}
}
