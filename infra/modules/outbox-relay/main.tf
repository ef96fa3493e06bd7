# The transactional outbox's table stream and its relay (crates/conveyor-outbox).
#
# The application writes outbox items in its own TransactWriteItems; the relay reads the table's stream
# (NEW_IMAGE), sends each item's job to its queue and deletes the item. Either a Lambda function on the
# stream (deploy_lambda, partial batch responses) or an ECS worker (Worker::with_outbox_relay, given
# ecs_policy_json and ecs_environment). The relay's permissions are exactly what it calls: stream reads
# on this one stream, SendMessage on the listed queues, deletes of outbox items only (the leading key
# condition keeps it off the application's own items in a shared table).

locals {
  table_name = var.table_name
  # "" when unset (create_table = false without them): the precondition on the relay's policy says
  # what to set, and no other error hides it.
  table_arn  = var.create_table ? aws_dynamodb_table.this[0].arn : (var.table_arn == null ? "" : var.table_arn)
  stream_arn = var.create_table ? aws_dynamodb_table.this[0].stream_arn : (var.stream_arn == null ? "" : var.stream_arn)
  sort_key   = var.sort_key == "" ? null : var.sort_key

  # arn:<partition>:sqs:<region>:<account>:<name>
  queue_arn_parts = split(":", var.queue_arns[0])
  partition       = local.queue_arn_parts[1]
  account_id      = local.queue_arn_parts[4]

  # The names crates/conveyor-outbox reads (OutboxTable::from_env); tests/tests/infra.rs holds them equal.
  environment = merge(
    {
      CONVEYOR_OUTBOX_TABLE         = local.table_name
      CONVEYOR_OUTBOX_PARTITION_KEY = var.partition_key
      CONVEYOR_OUTBOX_SORT_KEY      = var.sort_key
    },
    var.create_table ? { CONVEYOR_OUTBOX_TTL_ATTRIBUTE = var.ttl_attribute } : {},
  )

  role_name_prefix = "${substr(var.name, 0, 37)}-"
}

resource "aws_dynamodb_table" "this" {
  count = var.create_table ? 1 : 0

  name         = var.table_name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = var.partition_key
  range_key    = local.sort_key

  attribute {
    name = var.partition_key
    type = "S"
  }

  dynamic "attribute" {
    for_each = local.sort_key == null ? [] : [local.sort_key]

    content {
      name = attribute.value
      type = "S"
    }
  }

  # The relay reads new items from here. NEW_IMAGE is all it needs (REMOVE records carry the keys).
  stream_enabled   = true
  stream_view_type = "NEW_IMAGE"

  # A backstop only: sent items are deleted by the relay; an item whose delete failed expires.
  ttl {
    enabled        = true
    attribute_name = var.ttl_attribute
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery_enabled
  }

  server_side_encryption {
    enabled     = var.table_kms_key_arn != null
    kms_key_arn = var.table_kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection_enabled

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.table_arn == null && var.stream_arn == null
      error_message = "create_table is true, so the module creates the outbox table: leave table_arn and stream_arn unset, or set create_table = false to use an existing table's stream."
    }
  }
}

# What every relay needs, in either runtime.
data "aws_iam_policy_document" "relay" {
  lifecycle {
    precondition {
      condition     = var.create_table || (var.table_arn != null && var.stream_arn != null)
      error_message = "create_table is false, so the outbox lives in an existing table: set table_arn and stream_arn (the table's stream, with NEW_IMAGE or NEW_AND_OLD_IMAGES; enable it with stream_enabled = true on that table)."
    }
  }

  statement {
    sid = "ReadTheOutboxStream"
    actions = [
      "dynamodb:DescribeStream",
      "dynamodb:GetRecords",
      "dynamodb:GetShardIterator",
    ]
    resources = [local.stream_arn]
  }

  # Lambda's event source mapping lists the table's streams; ListStreams takes the table's stream ARNs.
  statement {
    sid       = "ListTheTablesStreams"
    actions   = ["dynamodb:ListStreams"]
    resources = ["${local.table_arn}/stream/*"]
  }

  # Sent items are deleted with BatchWriteItem; only outbox items (keys "outbox#...") may be.
  statement {
    sid = "DeleteSentOutboxItems"
    actions = [
      "dynamodb:BatchWriteItem",
      "dynamodb:DeleteItem",
    ]
    resources = [local.table_arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["outbox#*"]
    }
  }

  statement {
    sid       = "SendTheJobs"
    actions   = ["sqs:SendMessage"]
    resources = var.queue_arns
  }

  dynamic "statement" {
    for_each = length(var.kms_key_arns) > 0 ? [1] : []

    content {
      sid = "UseTheQueuesAndTablesKeys"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = var.kms_key_arns
    }
  }
}

# The ECS worker's extra permissions: it finds the stream from the table and keeps its lease and
# checkpoints in the state table (the idempotency table, whose other rights the consumer already has).
data "aws_iam_policy_document" "ecs" {
  source_policy_documents = [data.aws_iam_policy_document.relay.json]

  statement {
    sid       = "FindTheStream"
    actions   = ["dynamodb:DescribeTable"]
    resources = [local.table_arn]
  }

  dynamic "statement" {
    for_each = var.state_table_arn == null ? [] : [var.state_table_arn]

    content {
      sid = "KeepLeaseAndCheckpoints"
      actions = [
        "dynamodb:DeleteItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
      ]
      resources = [statement.value]

      condition {
        test     = "ForAllValues:StringLike"
        variable = "dynamodb:LeadingKeys"
        values   = ["conveyor-outbox#*"]
      }
    }
  }
}

# ---------------------------------------------------------------------------------------------------
# The Lambda relay
# ---------------------------------------------------------------------------------------------------

resource "aws_cloudwatch_log_group" "this" {
  count = var.deploy_lambda ? 1 : 0

  name              = "/aws/lambda/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
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

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "this" {
  count = var.deploy_lambda ? 1 : 0

  name_prefix        = local.role_name_prefix
  assume_role_policy = data.aws_iam_policy_document.assume_role.json
  tags               = var.tags
}

data "aws_iam_policy_document" "lambda" {
  count = var.deploy_lambda ? 1 : 0

  source_policy_documents = [data.aws_iam_policy_document.relay.json]

  statement {
    sid = "WriteLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
    ]
    resources = ["${aws_cloudwatch_log_group.this[0].arn}:*"]
  }

  # The event source mapping sends the description of a batch it gives up with the function's role.
  dynamic "statement" {
    for_each = var.on_failure_destination_arn == null ? [] : [var.on_failure_destination_arn]

    content {
      sid       = "ReportGivenUpBatches"
      actions   = [strcontains(statement.value, ":sns:") ? "sns:Publish" : "sqs:SendMessage"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "this" {
  count = var.deploy_lambda ? 1 : 0

  name   = "conveyor-outbox-relay"
  role   = aws_iam_role.this[0].id
  policy = data.aws_iam_policy_document.lambda[0].json
}

resource "aws_lambda_function" "this" {
  count = var.deploy_lambda ? 1 : 0

  function_name    = var.name
  role             = aws_iam_role.this[0].arn
  filename         = var.package_path
  source_code_hash = var.package_path == null ? null : filebase64sha256(var.package_path)
  runtime          = "provided.al2023"
  architectures    = ["arm64"]
  handler          = "bootstrap"
  timeout          = var.timeout_seconds
  memory_size      = var.memory_size_mb

  # One invocation per shard at a time (the mapping's parallelization factor is 1), so a few suffice.
  reserved_concurrent_executions = -1

  environment {
    variables = merge(local.environment, {
      CONVEYOR_LOG_FORMAT = "json"
      RUST_LOG            = var.rust_log
    })
  }

  tracing_config {
    mode = "PassThrough"
  }

  logging_config {
    log_format = "JSON"
    log_group  = aws_cloudwatch_log_group.this[0].name
  }

  tags = var.tags

  depends_on = [
    aws_cloudwatch_log_group.this,
    aws_iam_role_policy.this,
  ]

  lifecycle {
    precondition {
      condition     = var.package_path != null
      error_message = "deploy_lambda is true: set package_path to the relay's zip (the example outbox_relay binary, renamed bootstrap), or set deploy_lambda = false to relay from an ECS worker."
    }
  }
}

# ReportBatchItemFailures: the handler returns the first record it could not relay and every record
# after it; Lambda checkpoints before the first and retries from there. Parallelization factor 1: with
# more, records of different items (one aggregate's jobs are different items) would be relayed
# concurrently and lose their order.
resource "aws_lambda_event_source_mapping" "this" {
  count = var.deploy_lambda ? 1 : 0

  event_source_arn                   = local.stream_arn
  function_name                      = aws_lambda_function.this[0].arn
  starting_position                  = var.starting_position
  batch_size                         = var.batch_size
  maximum_batching_window_in_seconds = var.maximum_batching_window_in_seconds
  function_response_types            = ["ReportBatchItemFailures"]
  parallelization_factor             = 1
  bisect_batch_on_function_error     = var.bisect_batch_on_function_error
  maximum_retry_attempts             = var.maximum_retry_attempts
  maximum_record_age_in_seconds      = -1

  # Only inserts of outbox items invoke the function: the application's own items, its updates and the
  # relay's own deletes never do.
  filter_criteria {
    filter {
      pattern = jsonencode({
        eventName = ["INSERT"]
        dynamodb  = { NewImage = { outbox_version = { N = [{ exists = true }] } } }
      })
    }
  }

  dynamic "destination_config" {
    for_each = var.on_failure_destination_arn == null ? [] : [var.on_failure_destination_arn]

    content {
      on_failure {
        destination_arn = destination_config.value
      }
    }
  }

  depends_on = [aws_iam_role_policy.this]

  lifecycle {
    precondition {
      condition     = var.maximum_retry_attempts == -1 || (var.maximum_retry_attempts >= 0 && var.maximum_retry_attempts <= 10000)
      error_message = "maximum_retry_attempts must be -1 (until the record leaves the stream) or 0 to 10000."
    }
  }
}

# The application's side: TransactWriteItems needs the Put's own permission (PutItem) on outbox items.
data "aws_iam_policy_document" "producer" {
  statement {
    sid       = "WriteOutboxItems"
    actions   = ["dynamodb:PutItem"]
    resources = [local.table_arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["outbox#*"]
    }
  }
}
