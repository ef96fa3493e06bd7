# The transactional outbox's table and its relay (crates/conveyor-outbox).
#
# The application writes outbox jobs in its own TransactWriteItems (beside each aggregate's head item,
# which numbers the aggregate's jobs). The table is the truth: the relay queries an aggregate's unsent
# jobs in sequence order, sends them and deletes each with a conditional delete. What tells the relay
# where to look is either
# - a Lambda function (deploy_lambda): the table's KEYS_ONLY stream names the aggregates written, and an
#   EventBridge Scheduler schedule sweeps every minute what the stream did not bring (lost or expired
#   records, failed sends) and prints the backlog as EMF metrics, which two alarms watch; or
# - an ECS worker (Worker::with_background_task(poller), on with CONVEYOR_OUTBOX_TABLE; attach
#   ecs_policy_json, merge ecs_environment): it polls the outbox-pending index while it holds a lease
#   item in the same table, and exposes the backlog as Prometheus gauges.
# Permissions are what the relay calls, on outbox items only (leading key "outbox#", so it stays off the
# application's own items in a shared table).

locals {
  table_name = var.table_name
  # "" when unset (create_table = false without them): the precondition on the relay's policy says
  # what to set, and no other error hides it.
  table_arn  = var.create_table ? aws_dynamodb_table.this[0].arn : (var.table_arn == null ? "" : var.table_arn)
  stream_arn = var.create_table ? aws_dynamodb_table.this[0].stream_arn : (var.stream_arn == null ? "" : var.stream_arn)

  # conveyor_outbox::table: PENDING_INDEX over PENDING (S) and CREATED_AT (N), keys only.
  pending_index      = "outbox-pending"
  pending_attribute  = "outbox_pending"
  created_attribute  = "outbox_created_at"
  pending_index_arn  = "${local.table_arn}/index/${local.pending_index}"
  outbox_key_pattern = "outbox#*"

  # arn:<partition>:sqs:<region>:<account>:<name>
  account_id = split(":", var.queue_arns[0])[4]

  # The names crates/conveyor-outbox reads (OutboxTable::from_env); no TTL attribute, no state table.
  table_environment = {
    CONVEYOR_OUTBOX_TABLE         = local.table_name
    CONVEYOR_OUTBOX_PARTITION_KEY = var.partition_key
    CONVEYOR_OUTBOX_SORT_KEY      = var.sort_key
  }
  # The polling relay's settings (conveyor_outbox::poller_from_env), for the ECS worker only: the Lambda
  # relay holds no lease and uses the relay's default attempts.
  ecs_environment = merge(
    local.table_environment,
    var.lease_seconds == null ? {} : { CONVEYOR_OUTBOX_LEASE_SECONDS = tostring(var.lease_seconds) },
    var.max_attempts == null ? {} : { CONVEYOR_OUTBOX_MAX_ATTEMPTS = tostring(var.max_attempts) },
  )

  role_name_prefix     = "${substr(var.name, 0, 37)}-"
  schedule_role_prefix = "${substr(var.name, 0, 31)}-sweep-"
}

resource "aws_dynamodb_table" "this" {
  count = var.create_table ? 1 : 0

  name         = var.table_name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = var.partition_key
  range_key    = var.sort_key

  attribute {
    name = var.partition_key
    type = "S"
  }

  attribute {
    name = var.sort_key
    type = "S"
  }

  attribute {
    name = local.pending_attribute
    type = "S"
  }

  attribute {
    name = local.created_attribute
    type = "N"
  }

  # Unsent jobs oldest first (`pending#<bucket>` while waiting, `parked` once parked): the sweep, the
  # polling relay and `conveyor outbox backlog` query it. Sparse: only outbox jobs carry the attributes.
  global_secondary_index {
    name            = local.pending_index
    hash_key        = local.pending_attribute
    range_key       = local.created_attribute
    projection_type = "KEYS_ONLY"
  }

  # Only a trigger for the Lambda relay: a record's keys name the aggregate to look at.
  stream_enabled   = true
  stream_view_type = "KEYS_ONLY"

  # No TTL: a committed job stays until it was sent, or an operator removes it.

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
      error_message = "create_table is true, so the module creates the outbox table: leave table_arn and stream_arn unset, or set create_table = false to use an existing table."
    }
  }
}

# What every relay calls, in either runtime (the ECS worker's whole policy).
data "aws_iam_policy_document" "relay" {
  lifecycle {
    precondition {
      condition     = var.create_table || (var.table_arn != null && (var.stream_arn != null || !var.deploy_lambda))
      error_message = "create_table is false, so the outbox lives in an existing table: set table_arn, and stream_arn when deploy_lambda (the table's stream, any view type; enable it with stream_enabled = true on that table). The table also needs the outbox-pending index (see the module's README)."
    }
  }

  # An aggregate's jobs (Query), the lease item (GetItem, PutItem, UpdateItem), a failed send's attempts
  # and parking (UpdateItem), the conditional deletes of sent jobs (DeleteItem, inside
  # TransactWriteItems, which needs no action of its own).
  statement {
    sid = "RelayOutboxItems"
    actions = [
      "dynamodb:DeleteItem",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [local.table_arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = [local.outbox_key_pattern]
    }
  }

  # The unsent jobs, oldest first (keys only; only outbox jobs are in the index).
  statement {
    sid       = "FindPendingJobs"
    actions   = ["dynamodb:Query"]
    resources = [local.pending_index_arn]
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

  # The event source mapping reads the stream with the function's role.
  statement {
    sid = "ReadTheOutboxStream"
    actions = [
      "dynamodb:DescribeStream",
      "dynamodb:GetRecords",
      "dynamodb:GetShardIterator",
    ]
    resources = [local.stream_arn]
  }

  # ListStreams takes the table's stream ARNs; a stream's ARN ends in its creation time, so no narrower
  # ARN exists before the stream does.
  statement {
    sid       = "ListTheTablesStreams"
    actions   = ["dynamodb:ListStreams"]
    resources = ["${local.table_arn}/stream/*"]
  }

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

  # Invocations: up to parallelization_factor per stream shard, plus the sweep's. Concurrent relays are
  # safe (conditional deletes), so none is reserved.
  reserved_concurrent_executions = -1

  environment {
    variables = merge(local.table_environment, {
      CONVEYOR_LOG_FORMAT = "json"
      RUST_LOG            = var.rust_log
    })
  }

  tracing_config {
    mode = "PassThrough"
  }

  # The function's own JSON lines (its logs and the sweep's EMF line) reach the log group as written;
  # CloudWatch extracts the EMF metrics from there.
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

# The stream is only a trigger: a record names an aggregate, and the relay reads that aggregate's
# unsent jobs from the table. So a record may be retried a few times and then dropped (bounded
# maximum_retry_attempts and maximum_record_age_in_seconds): the one-minute sweep relays whatever a
# dropped, lost or expired record named. The handler reports a batch for retry
# (ReportBatchItemFailures) only when the table could not be read.
#
# Order does not come from the stream either, so parallelization_factor may be above 1: an aggregate's
# jobs carry its sequence numbers (allocated in the application's transaction through the head item),
# the relay sends them in that order, and sends the next only after its conditional delete of the
# previous succeeded. Concurrent invocations, retried batches and the sweep can race for an aggregate;
# the loser's delete fails and it stops, so none reorders it (at worst a job is sent twice, which the
# consumer's idempotency key settles once).
resource "aws_lambda_event_source_mapping" "this" {
  count = var.deploy_lambda ? 1 : 0

  event_source_arn                   = local.stream_arn
  function_name                      = aws_lambda_function.this[0].arn
  starting_position                  = var.starting_position
  batch_size                         = var.batch_size
  maximum_batching_window_in_seconds = var.maximum_batching_window_in_seconds
  function_response_types            = ["ReportBatchItemFailures"]
  parallelization_factor             = var.parallelization_factor
  bisect_batch_on_function_error     = var.bisect_batch_on_function_error
  maximum_retry_attempts             = var.maximum_retry_attempts
  maximum_record_age_in_seconds      = var.maximum_record_age_seconds

  # Only new outbox jobs invoke the function (sort key "outbox#job#<sequence>"): head items, the lease,
  # the relay's own deletes and updates, and the application's items never do.
  filter_criteria {
    filter {
      pattern = jsonencode({
        eventName = ["INSERT"]
        dynamodb  = { Keys = { (var.sort_key) = { S = [{ prefix = "outbox#job#" }] } } }
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
}

# The sweep: every minute, the same function with an event that has no Records (the handler treats any
# such event as a sweep). It relays jobs older than 30 s that are still in the table, and prints
# OldestUnsentSeconds and ParkedJobs (EMF). A missed tick is not retried: the next one comes a minute
# later.
data "aws_iam_policy_document" "schedule_assume_role" {
  statement {
    sid     = "SchedulerAssumesRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["scheduler.amazonaws.com"]
    }

    # Only this account's schedules may use the role (confused-deputy protection).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "schedule" {
  count = var.deploy_lambda ? 1 : 0

  name_prefix        = local.schedule_role_prefix
  assume_role_policy = data.aws_iam_policy_document.schedule_assume_role.json
  tags               = var.tags
}

data "aws_iam_policy_document" "schedule" {
  count = var.deploy_lambda ? 1 : 0

  statement {
    sid       = "InvokeTheRelay"
    actions   = ["lambda:InvokeFunction"]
    resources = [aws_lambda_function.this[0].arn]
  }
}

resource "aws_iam_role_policy" "schedule" {
  count = var.deploy_lambda ? 1 : 0

  name   = "conveyor-outbox-sweep"
  role   = aws_iam_role.schedule[0].id
  policy = data.aws_iam_policy_document.schedule[0].json
}

resource "aws_scheduler_schedule" "sweep" {
  count = var.deploy_lambda ? 1 : 0

  name                = "${substr(var.name, 0, 58)}-sweep"
  description         = "Conveyor outbox sweep: relays what the stream did not bring, reports the backlog"
  schedule_expression = "rate(1 minute)"
  state               = "ENABLED"
  kms_key_arn         = var.sweep_kms_key_arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_lambda_function.this[0].arn
    role_arn = aws_iam_role.schedule[0].arn
    input    = jsonencode({ conveyor_outbox = "sweep" })

    retry_policy {
      maximum_event_age_in_seconds = 60
      maximum_retry_attempts       = 0
    }
  }
}

# The backlog's alarms, from the sweep's EMF line (namespace Conveyor/Outbox, no dimensions). An ECS
# relay has no sweep: alert on its gauges conveyor_outbox_oldest_unsent_seconds and
# conveyor_outbox_parked_jobs instead.
resource "aws_cloudwatch_metric_alarm" "oldest_unsent" {
  count = var.deploy_lambda ? 1 : 0

  alarm_name        = "${var.name}-oldest-unsent"
  alarm_description = "The oldest unsent job in the outbox table ${local.table_name} is older than ${var.oldest_unsent_alarm_threshold_seconds} s (or the sweep of ${var.name} reports nothing): jobs are committed but do not reach their queue."

  namespace           = "Conveyor/Outbox"
  metric_name         = "OldestUnsentSeconds"
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.oldest_unsent_alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.oldest_unsent_alarm_threshold_seconds
  # The sweep prints a value every minute, 0 for an empty outbox. No value means no sweep ran or it
  # could not read the table, and then nothing relays lost triggers or watches the backlog: breaching.
  treat_missing_data = "breaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

resource "aws_cloudwatch_metric_alarm" "parked_jobs" {
  count = var.deploy_lambda ? 1 : 0

  alarm_name        = "${var.name}-parked-jobs"
  alarm_description = "Outbox jobs in ${local.table_name} are parked: SQS refused them for a reason that needs a person (missing queue, denied access, too large). Their aggregates wait. `conveyor outbox backlog` lists them; fix the cause, then `conveyor outbox resend --aggregate <id>`."

  namespace           = "Conveyor/Outbox"
  metric_name         = "ParkedJobs"
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  # A parked job stays until someone resends it, so the alarm keeps its state until a sweep reports
  # again; a sweep that stopped reporting is the oldest-unsent alarm's to say.
  treat_missing_data = "ignore"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# The application's side: the head's consistent read (GetItem), and in its TransactWriteItems the job's
# Put (PutItem) and the head's conditional Update (UpdateItem), on outbox keys only.
data "aws_iam_policy_document" "producer" {
  statement {
    sid = "WriteOutboxItems"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
    ]
    resources = [local.table_arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = [local.outbox_key_pattern]
    }
  }
}
