# A Conveyor consumer running as a Lambda function behind an SQS event source mapping.
#
# The package is a prebuilt zip (`package_path`), not an archive_file data source: the module then
# needs only the AWS provider, and the zip comes from `cargo lambda build --arm64 --output-format zip`.

locals {
  log_group_name = "/aws/lambda/${var.function_name}"
}

resource "aws_cloudwatch_log_group" "this" {
  name              = local.log_group_name
  retention_in_days = var.log_retention_days
  tags              = var.tags
}

data "aws_iam_policy_document" "assume_role" {
  statement {
    sid     = "LambdaAssumesRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "this" {
  name               = var.function_name
  assume_role_policy = data.aws_iam_policy_document.assume_role.json
  tags               = var.tags
}

# Least privilege: every action is named and every resource is one ARN. No managed policy (AWS's
# AWSLambdaBasicExecutionRole and AWSLambdaSQSQueueExecutionRole use "*" resources).
module "permissions" {
  source                = "../consumer-permissions"
  queue_arn             = var.queue_arn
  dlq_arn               = var.dlq_arn
  idempotency_table_arn = var.idempotency_table_arn
  kms_key_arns          = var.kms_key_arns
}

data "aws_iam_policy_document" "permissions" {
  # The consumer's queue, DLQ, table and key permissions, shared with the other runtime.
  source_policy_documents = [module.permissions.json]

  # ":*" addresses the log streams inside this one log group; it is not a wildcard over groups.
  statement {
    sid = "WriteLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
    ]
    resources = ["${aws_cloudwatch_log_group.this.arn}:*"]
  }
}

resource "aws_iam_role_policy" "this" {
  name   = "conveyor-consumer"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.permissions.json
}

resource "aws_lambda_function" "this" {
  function_name    = var.function_name
  role             = aws_iam_role.this.arn
  filename         = var.package_path
  source_code_hash = filebase64sha256(var.package_path)
  runtime          = "provided.al2023"
  architectures    = ["arm64"]
  handler          = "bootstrap"
  timeout          = var.timeout_seconds
  memory_size      = var.memory_size_mb

  reserved_concurrent_executions = var.reserved_concurrent_executions

  environment {
    variables = merge(var.environment, {
      CONVEYOR_QUEUE_URL         = var.queue_url
      CONVEYOR_IDEMPOTENCY_TABLE = var.idempotency_table_name
      RUST_LOG                   = var.rust_log
    })
  }

  tags = var.tags

  # The log group and the permissions exist before the first invocation.
  depends_on = [
    aws_cloudwatch_log_group.this,
    aws_iam_role_policy.this,
  ]

  lifecycle {
    precondition {
      condition     = var.queue_visibility_timeout_seconds >= 6 * var.timeout_seconds
      error_message = "The queue's visibility timeout (queue_visibility_timeout_seconds) must be at least 6 times the function timeout (timeout_seconds), as AWS advises for SQS event sources: otherwise a message can become visible again, and run twice, while an invocation (or its retries by the poller) still holds it. Raise the queue's visibility_timeout_seconds or lower timeout_seconds."
    }
  }
}

# ReportBatchItemFailures: the function returns the ids of the messages to retry, so one failing
# message does not send the whole batch back to the queue.
resource "aws_lambda_event_source_mapping" "this" {
  event_source_arn                   = var.queue_arn
  function_name                      = aws_lambda_function.this.arn
  batch_size                         = var.batch_size
  maximum_batching_window_in_seconds = var.maximum_batching_window_in_seconds
  function_response_types            = ["ReportBatchItemFailures"]

  scaling_config {
    maximum_concurrency = var.maximum_concurrency
  }

  # AWS checks the role's SQS permissions when it creates the mapping.
  depends_on = [aws_iam_role_policy.this]
}
