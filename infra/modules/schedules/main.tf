# EventBridge Scheduler schedules with an SQS target, one per schedule in the file that
# `conveyor schedules export` writes from the application's definitions (conveyor_schedule::export).
#
# EventBridge Scheduler cannot set SQS message attributes, so each schedule's input is Conveyor's body
# envelope ({"conveyor": {"type", "version", "key"}, "payload": ...}, opened by every Conveyor consumer
# before routing). Its key is `schedule:<name>@<aws.scheduler.scheduled-time>`, which Scheduler fills
# in per tick: a tick delivered twice is settled as a duplicate by the consumer's idempotency claim.

locals {
  file = jsondecode(file(var.schedules_file))
  # A map by name, so adding or removing one schedule leaves the others' addresses alone.
  schedules = { for schedule in local.file.schedules : schedule.name => schedule }
}

resource "aws_scheduler_schedule_group" "this" {
  name = var.name_prefix
  tags = var.tags

  lifecycle {
    precondition {
      condition     = try(local.file.format, 0) == 1
      error_message = "schedules_file is not a format-1 file from `conveyor schedules export`: write it again with this version of Conveyor."
    }
    precondition {
      condition     = length(local.schedules) == length(local.file.schedules)
      error_message = "schedules_file names a schedule twice; schedule names must be unique."
    }
  }
}

data "aws_iam_policy_document" "assume" {
  statement {
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

locals {
  # arn:<partition>:sqs:<region>:<account>:<name>
  account_id = split(":", var.queue_arn)[4]
}

resource "aws_iam_role" "scheduler" {
  name               = "${var.name_prefix}-scheduler"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "send" {
  # The schedules send to the queue (and, when set, to the scheduler's own DLQ).
  statement {
    sid       = "SendJobs"
    actions   = ["sqs:SendMessage"]
    resources = compact([var.queue_arn, var.dead_letter_arn])
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]

    content {
      sid       = "EncryptMessages"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "send" {
  name   = "send-jobs"
  role   = aws_iam_role.scheduler.id
  policy = data.aws_iam_policy_document.send.json
}

resource "aws_scheduler_schedule" "this" {
  for_each = local.schedules

  name                         = each.key
  group_name                   = aws_scheduler_schedule_group.this.name
  description                  = "Conveyor schedule ${each.key}: sends a ${each.value.job_type} job"
  schedule_expression          = each.value.expression
  schedule_expression_timezone = each.value.timezone
  start_date                   = each.value.start_date
  end_date                     = each.value.end_date
  state                        = var.enabled ? "ENABLED" : "DISABLED"
  kms_key_arn                  = var.kms_key_arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = var.queue_arn
    role_arn = aws_iam_role.scheduler.arn
    input    = each.value.input

    retry_policy {
      maximum_event_age_in_seconds = var.maximum_event_age_seconds
      maximum_retry_attempts       = var.maximum_retry_attempts
    }

    dynamic "dead_letter_config" {
      for_each = var.dead_letter_arn == null ? [] : [var.dead_letter_arn]

      content {
        arn = dead_letter_config.value
      }
    }
  }
}
