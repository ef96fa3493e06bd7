variable "name" {
  description = "Base name of the queue, the DLQ, the table and the role: unique per test run."
  type        = string
}

variable "localstack_endpoint" {
  description = "LocalStack with SQS, IAM, STS and CloudWatch, and an SQS endpoint strategy the provider accepts (not path)."
  type        = string
}

variable "dynamodb_endpoint" {
  description = "DynamoDB Local."
  type        = string
}

variable "visibility_timeout_seconds" {
  description = "The queue's visibility timeout; the worker reads it at start-up."
  type        = number
  default     = 30
}

variable "max_receive_count" {
  description = "The redrive policy's maxReceiveCount."
  type        = number
  default     = 3
}

variable "max_message_size" {
  description = "MaximumMessageSize of the queue and its DLQ. At most 262144: the provider mirror here is 5.x (modules/queue/README.md)."
  type        = number
  default     = 262144
}
