# EventBridge Scheduler schedules with an SQS target, one per schedule in the file that
# `conveyor schedules export` writes from the application's definitions (conveyor_schedule::export).
#
# EventBridge Scheduler cannot set SQS message attributes, so each schedule's input is Conveyor's body
# envelope ({"conveyor": {"type", "version", "key"}, "payload": ...}, opened by every Conveyor consumer
# before routing). Its key is `schedule:<name>@<aws.scheduler.scheduled-time>`, which Scheduler fills
# in per tick: a tick delivered twice is settled as a duplicate by the consumer's idempotency claim.
#
# A schedule with a tenant (format 2) gets a universal target instead: Scheduler calls SQS's SendMessage
# with {"QueueUrl", "MessageGroupId": tenant, "MessageBody": input}, because the templated target's
# MessageGroupId is documented for FIFO queues only, and a standard queue's tenant is its MessageGroupId
# (SQS fair queues; see conveyor-schedule's src/export.rs). The body comes as the file wrote it
# (`message_body_json`), not through jsonencode, which would escape the <aws.scheduler.scheduled-time>
# placeholder's < and > and hide it from Scheduler.

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
      condition     = contains([1, 2], try(local.file.format, 0))
      error_message = "schedules_file is not a format-1 or format-2 file from `conveyor schedules export`: write it again with this version of Conveyor."
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
  arn_parts  = split(":", var.queue_arn)
  partition  = local.arn_parts[1]
  account_id = local.arn_parts[4]
  # The queue's URL for the universal target, from its ARN unless given.
  queue_url = coalesce(
    var.queue_url,
    format(
      "https://sqs.%s.%s/%s/%s",
      local.arn_parts[3],
      local.partition == "aws-cn" ? "amazonaws.com.cn" : "amazonaws.com",
      local.account_id,
      local.arn_parts[5],
    ),
  )
  # Scheduler's universal target for SQS SendMessage.
  send_message_arn = "arn:${local.partition}:scheduler:::aws-sdk:sqs:sendMessage"
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
    # Templated target without a tenant; with one, the universal SendMessage target (see the top).
    arn      = try(each.value.tenant, null) == null ? var.queue_arn : local.send_message_arn
    role_arn = aws_iam_role.scheduler.arn
    input = try(each.value.tenant, null) == null ? each.value.input : format(
      "{\"QueueUrl\":%s,\"MessageGroupId\":%s,\"MessageBody\":%s}",
      jsonencode(local.queue_url),
      jsonencode(each.value.tenant),
      each.value.message_body_json,
    )

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
