variable "region" {
  description = "AWS region."
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Name of the queue, the function and (with an -idempotency suffix) the table."
  type        = string
  default     = "conveyor-example"
}

variable "package_path" {
  description = "Zip with the arm64 `bootstrap` of the Lambda consumer (`cargo lambda build --release --arm64 --output-format zip` writes target/lambda/<bin>/bootstrap.zip)."
  type        = string
}

variable "outbox_relay_package_path" {
  description = "Zip with the arm64 `bootstrap` of the outbox relay (the example `outbox_relay` binary, `cargo lambda build --release --arm64 --bin outbox_relay --output-format zip`); null leaves the relay function out."
  type        = string
  default     = null
}

variable "alarm_actions" {
  description = "ARNs (e.g. an SNS topic) notified by the queue's, the function's and the outbox relay's alarms."
  type        = list(string)
  default     = []
}
