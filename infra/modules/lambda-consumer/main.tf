# A Conveyor consumer running as a Lambda function behind an SQS event source mapping.
#
# The package is a prebuilt zip (`package_path`), not an archive_file data source: the module then
# needs only the AWS provider, and the zip comes from `cargo lambda build --arm64 --output-format zip`.
#
# What the adapter knows about the queue it reads from the queue itself, not from this module: the
# queue from each record's event source ARN, FIFO from its name, the DLQ and maxReceiveCount from its
# redrive policy (GetQueueAttributes). The module passes only the idempotency table.

locals {
  log_group_name = "/aws/lambda/${var.function_name}"

  # arn:<partition>:sqs:<region>:<account>:<name>
  queue_arn_parts = split(":", var.queue_arn)
  partition       = local.queue_arn_parts[1]
  region          = local.queue_arn_parts[3]
  account_id      = local.queue_arn_parts[4]
  fifo            = endswith(var.queue_arn, ".fifo")

  # On-demand polling bounds concurrency at 10 unless told otherwise; provisioned mode has none.
  maximum_concurrency = var.provisioned_pollers == null ? coalesce(var.maximum_concurrency, 10) : var.maximum_concurrency

  # IAM role names are at most 64 characters; a name_prefix at most 38 (AWS appends 26).
  role_name_prefix = "${substr(var.function_name, 0, 37)}-"
}

resource "aws_cloudwatch_log_group" "this" {
  name              = local.log_group_name
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

# A role name is global to the account: without role_name the name is generated from a prefix, so the
# same function name in two regions (or two stacks) never collides.
resource "aws_iam_role" "this" {
  name               = var.role_name
  name_prefix        = var.role_name == null ? local.role_name_prefix : null
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
  payload_bucket_arn    = try(var.payload_bucket.arn, null)
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

  # X-Ray has no resource-level permissions: these two actions exist only on "*".
  dynamic "statement" {
    for_each = var.tracing_mode == "Active" ? [1] : []

    content {
      sid = "WriteTraces"
      actions = [
        "xray:PutTelemetryRecords",
        "xray:PutTraceSegments",
      ]
      resources = ["*"]
    }
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
      CONVEYOR_IDEMPOTENCY_TABLE = var.idempotency_table_name
      CONVEYOR_LOG_FORMAT        = "json"
      RUST_LOG                   = var.rust_log
      }, var.payload_bucket == null ? {} : {
      CONVEYOR_PAYLOAD_BUCKET = var.payload_bucket.name
    })
  }

  tracing_config {
    mode = var.tracing_mode
  }

  logging_config {
    log_format = "JSON"
    log_group  = aws_cloudwatch_log_group.this.name
  }

  tags = var.tags

  # The log group and the permissions exist before the first invocation.
  depends_on = [
    aws_cloudwatch_log_group.this,
    aws_iam_role_policy.this,
  ]

  lifecycle {
    precondition {
      condition     = var.queue_visibility_timeout_seconds >= 6 * var.timeout_seconds + var.maximum_batching_window_in_seconds
      error_message = "The queue's visibility timeout (queue_visibility_timeout_seconds) must be at least 6 times the function timeout (timeout_seconds) plus the batching window (maximum_batching_window_in_seconds), as AWS advises for SQS event sources: a record's visibility timeout starts while the mapping still gathers the batch, and otherwise a message can become visible again, and run twice, while an invocation (or its retries by the poller) still holds it. Raise the queue's visibility_timeout_seconds or lower timeout_seconds or the window."
    }

    precondition {
      condition     = var.reserved_concurrent_executions == -1 || local.maximum_concurrency == null || var.reserved_concurrent_executions >= coalesce(local.maximum_concurrency, 0)
      error_message = "reserved_concurrent_executions must be -1 (none reserved) or at least maximum_concurrency: with less, the event source mapping starts invocations that Lambda throttles, and throttled messages spend receives and reach the DLQ without having run."
    }
  }
}

# ReportBatchItemFailures: the function returns the ids of the messages to retry, so one failing
# message does not send the whole batch back to the queue.
resource "aws_lambda_event_source_mapping" "this" {
  event_source_arn                   = var.queue_arn
  function_name                      = aws_lambda_function.this.arn
  enabled                            = var.enabled
  batch_size                         = var.batch_size
  maximum_batching_window_in_seconds = var.maximum_batching_window_in_seconds
  function_response_types            = ["ReportBatchItemFailures"]

  # On demand: at most maximum_concurrency invocations. Provisioned mode: pollers kept ready instead
  # (AWS refuses both at once).
  dynamic "scaling_config" {
    for_each = local.maximum_concurrency == null ? [] : [local.maximum_concurrency]

    content {
      maximum_concurrency = scaling_config.value
    }
  }

  dynamic "provisioned_poller_config" {
    for_each = var.provisioned_pollers == null ? [] : [var.provisioned_pollers]

    content {
      minimum_pollers = provisioned_poller_config.value.minimum
      maximum_pollers = provisioned_poller_config.value.maximum
    }
  }

  dynamic "filter_criteria" {
    for_each = length(var.filter_patterns) > 0 ? [var.filter_patterns] : []

    content {
      dynamic "filter" {
        for_each = filter_criteria.value

        content {
          pattern = filter.value
        }
      }
    }
  }

  dynamic "metrics_config" {
    for_each = var.event_source_metrics ? [1] : []

    content {
      metrics = ["EventCount"]
    }
  }

  # AWS checks the role's SQS permissions when it creates the mapping.
  depends_on = [aws_iam_role_policy.this]

  lifecycle {
    precondition {
      condition     = var.provisioned_pollers == null || var.maximum_concurrency == null
      error_message = "provisioned_pollers and maximum_concurrency cannot be set together: AWS refuses a provisioned-mode event source mapping with a maximum concurrency. Bound the load with provisioned_pollers.maximum instead, or leave provisioned_pollers null to poll on demand."
    }

    precondition {
      condition     = !local.fifo || (var.batch_size <= 10 && var.maximum_batching_window_in_seconds == 0)
      error_message = "The queue is a FIFO queue: batch_size must be at most 10 and maximum_batching_window_in_seconds 0 (SQS FIFO event sources support neither larger batches nor a batching window)."
    }

    precondition {
      condition     = var.batch_size <= 10 || var.maximum_batching_window_in_seconds >= 1
      error_message = "batch_size above 10 needs maximum_batching_window_in_seconds of at least 1 (AWS refuses the event source mapping otherwise)."
    }
  }
}

# Alarms: errors (an invocation failed as a whole: a crash, a timeout, or every record failing with
# CONVEYOR_FAIL_WHEN_ALL_FAIL), throttles (messages wait and spend receives), and invocations close to
# the timeout (the next ones will time out).
resource "aws_cloudwatch_metric_alarm" "errors" {
  alarm_name        = "${var.function_name}-errors"
  alarm_description = "Invocations of ${var.function_name} failed as a whole (crash, timeout, or every record failed)."

  namespace           = "AWS/Lambda"
  metric_name         = "Errors"
  dimensions          = { FunctionName = aws_lambda_function.this.function_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = var.alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

resource "aws_cloudwatch_metric_alarm" "throttles" {
  alarm_name        = "${var.function_name}-throttles"
  alarm_description = "Invocations of ${var.function_name} were throttled: messages wait, and their receives count toward the DLQ."

  namespace           = "AWS/Lambda"
  metric_name         = "Throttles"
  dimensions          = { FunctionName = aws_lambda_function.this.function_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = var.alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

resource "aws_cloudwatch_metric_alarm" "duration" {
  alarm_name        = "${var.function_name}-duration-near-timeout"
  alarm_description = "The longest invocation of ${var.function_name} took more than ${var.duration_alarm_percent}% of its ${var.timeout_seconds} s timeout."

  namespace           = "AWS/Lambda"
  metric_name         = "Duration"
  dimensions          = { FunctionName = aws_lambda_function.this.function_name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.timeout_seconds * 1000 * var.duration_alarm_percent / 100
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# Scheduled invocations, each every minute with its own payload, sharing one role:
# - the flows' deadline sweep (flow_sweep = true), {"conveyor": "sweep_flows"}: described below;
# - the timer table's relay (timer_relay = true), {"conveyor": "relay_timers"}: one relay pass of the
#   pipeline's timers (conveyor_lambda's timer_relay module); the long-delayed jobs due within two
#   minutes are sent with the rest of their wait as DelaySeconds, so a missed tick delays nothing, and
#   the timers stay in the table until a pass sends them.
locals {
  invocations = merge(
    var.flow_sweep ? {
      flow-sweep = {
        event       = "sweep_flows"
        description = "Conveyor flow sweep: ends flows past their deadline by their policy"
      }
    } : {},
    var.timer_relay ? {
      timer-relay = {
        event       = "relay_timers"
        description = "Conveyor timer relay: sends the long-delayed jobs that are due"
      }
    } : {},
  )
  scheduled_invocations = length(local.invocations) > 0
}

# The flows' deadline sweep (flow_sweep = true): every minute, the function with {"conveyor":
# "sweep_flows"}, which it answers with one pass of the sweep instead of a batch (conveyor_lambda's
# flow_sweep module). Past a flow's deadline its children dead-lettered by SQS's redrive or never sent
# are counted and the policy ends the flow. A missed tick is not retried: the next comes a minute later.
data "aws_iam_policy_document" "flow_sweep_assume_role" {
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

resource "aws_iam_role" "flow_sweep" {
  count = local.scheduled_invocations ? 1 : 0

  name_prefix        = "${substr(var.function_name, 0, 31)}-flows-"
  assume_role_policy = data.aws_iam_policy_document.flow_sweep_assume_role.json
  tags               = var.tags
}

data "aws_iam_policy_document" "flow_sweep" {
  count = local.scheduled_invocations ? 1 : 0

  statement {
    sid       = "InvokeTheConsumer"
    actions   = ["lambda:InvokeFunction"]
    resources = [aws_lambda_function.this.arn]
  }
}

resource "aws_iam_role_policy" "flow_sweep" {
  count = local.scheduled_invocations ? 1 : 0

  name   = "conveyor-flow-sweep"
  role   = aws_iam_role.flow_sweep[0].id
  policy = data.aws_iam_policy_document.flow_sweep[0].json
}

resource "aws_scheduler_schedule" "invocations" {
  for_each = local.invocations

  name                = "${substr(var.function_name, 0, 52)}-${each.key}"
  description         = each.value.description
  schedule_expression = "rate(1 minute)"
  state               = "ENABLED"
  kms_key_arn         = var.flow_sweep_kms_key_arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_lambda_function.this.arn
    role_arn = aws_iam_role.flow_sweep[0].arn
    input    = jsonencode({ conveyor = each.value.event })

    retry_policy {
      maximum_event_age_in_seconds = 60
      maximum_retry_attempts       = 0
    }
  }
}

# The flow sweep's schedule before the timer relay shared the resource: moved, not replaced.
moved {
  from = aws_scheduler_schedule.flow_sweep[0]
  to   = aws_scheduler_schedule.invocations["flow-sweep"]
}
