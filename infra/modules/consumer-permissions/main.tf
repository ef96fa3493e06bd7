# The permissions every Conveyor consumer needs, whatever runs it (the ECS task role, the Lambda role):
# one document, so the two runtimes cannot drift apart. Least privilege: every action is named and every
# resource is one ARN.
#
# The actions are the ones the code calls, listed in conveyor_sqs::iam and conveyor_dynamodb::iam; the
# Rust test tests/tests/infra.rs fails when this document and those lists (or the SDK calls behind
# them) drift apart.

locals {
  # arn:<partition>:sqs:<region>:<account>:<name>
  queue_arn_parts = split(":", var.queue_arn)
  region          = local.queue_arn_parts[3]
}

data "aws_iam_policy_document" "this" {
  # Receive, delete (Ack), change visibility (heartbeats, Retry), read attributes (visibility timeout,
  # redrive policy, depth), GetQueueUrl (the Lambda adapter resolves its queue from the event source
  # ARN) and SendMessage (a deferral sends a delayed copy to the same queue and deletes the original).
  statement {
    sid = "ConsumeQueue"
    actions = [
      "sqs:ChangeMessageVisibility",
      "sqs:DeleteMessage",
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
      "sqs:ReceiveMessage",
      "sqs:SendMessage",
    ]
    resources = [var.queue_arn]
  }

  # The Reject outcome sends a permanent failure to the DLQ with the reason attached. The DLQ's URL is
  # looked up from the redrive policy's ARN (GetQueueUrl); its depth is read for metrics.
  statement {
    sid = "SendToDeadLetterQueue"
    actions = [
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
      "sqs:SendMessage",
    ]
    resources = [var.dlq_arn]
  }

  # Claim, complete, release and extend (conditional UpdateItem), read a record (GetItem); flows: count
  # a child (TransactWriteItems of two UpdateItems), read a parent's children (BatchGetItem), list flows
  # past their deadline (Query on the jobs index), send a flow from a handler (PutItem).
  statement {
    sid = "IdempotencyRecords"
    actions = [
      "dynamodb:BatchGetItem",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [var.idempotency_table_arn, "${var.idempotency_table_arn}/index/conveyor-jobs-sharded"]
  }

  # Large payloads (claim check), only when the consumer has a payload bucket: fetch the object before
  # the job runs, delete it after the job succeeded (conveyor_s3::iam::CONSUMER).
  dynamic "statement" {
    for_each = var.payload_bucket_arn == null ? [] : [var.payload_bucket_arn]

    content {
      sid = "ReadAndDeletePayloads"
      actions = [
        "s3:DeleteObject",
        "s3:GetObject",
        "s3:PutObject", # a touch: CopyObject onto itself restarts the lifecycle's clock
      ]
      resources = ["${var.payload_bucket_arn}/*"]
    }
  }

  # ListBucket makes S3 answer a missing object with NoSuchKey (dead-letter the job, naming bucket and
  # key) instead of AccessDenied (which Conveyor must treat as a configuration problem and defer).
  dynamic "statement" {
    for_each = var.payload_bucket_arn == null ? [] : [var.payload_bucket_arn]

    content {
      sid       = "TellMissingPayloads"
      actions   = ["s3:ListBucket"]
      resources = [var.payload_bucket_arn]
    }
  }

  # Customer-managed keys, only when SQS, DynamoDB or S3 use them on the consumer's behalf.
  dynamic "statement" {
    for_each = length(var.kms_key_arns) > 0 ? [var.kms_key_arns] : []

    content {
      sid = "UseEncryptionKeys"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values = [
          "sqs.${local.region}.amazonaws.com",
          "dynamodb.${local.region}.amazonaws.com",
          "s3.${local.region}.amazonaws.com",
        ]
      }
    }
  }
}
