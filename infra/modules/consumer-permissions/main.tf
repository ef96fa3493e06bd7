# The permissions every Conveyor consumer needs, whatever runs it (the ECS task role, the Lambda role):
# one document, so the two runtimes cannot drift apart. Least privilege: every action is named and every
# resource is one ARN.
data "aws_iam_policy_document" "this" {
  # Receive, delete (Ack), change visibility (heartbeats, Retry), read attributes (redrive policy, depth),
  # and GetQueueUrl (the Lambda adapter resolves its queue from the event source ARN).
  statement {
    sid = "ConsumeQueue"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
    ]
    resources = [var.queue_arn]
  }

  # The Reject outcome sends a permanent failure to the DLQ with the reason attached. The DLQ's URL is
  # looked up from the redrive policy's ARN (GetQueueUrl); its depth is read for metrics.
  statement {
    sid       = "SendToDeadLetterQueue"
    actions   = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]
    resources = [var.dlq_arn]
  }

  # Claim (conditional PutItem), read, complete and extend (UpdateItem), release (DeleteItem).
  statement {
    sid = "IdempotencyRecords"
    actions = [
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:DeleteItem",
      "dynamodb:GetItem",
    ]
    resources = [var.idempotency_table_arn]
  }

  dynamic "statement" {
    for_each = length(var.kms_key_arns) > 0 ? [var.kms_key_arns] : []

    content {
      sid = "UseEncryptionKeys"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = statement.value
    }
  }
}
