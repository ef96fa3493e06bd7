locals {
  suffix     = var.fifo ? ".fifo" : ""
  queue_name = "${var.name}${local.suffix}"
  dlq_name   = "${var.name}-dlq${local.suffix}"
  # SQS's limit on a queue name, suffixes included.
  max_queue_name_length = 80

  # SSE-SQS and SSE-KMS exclude each other in the provider: set exactly one of them.
  use_kms = var.kms_master_key_id != null
}

# The dead-letter queue. It has the same FIFO-ness as the main queue (SQS requires it) and keeps
# messages for the longest retention SQS allows, so someone has time to look at them.
resource "aws_sqs_queue" "dlq" {
  name                        = local.dlq_name
  fifo_queue                  = var.fifo
  content_based_deduplication = var.fifo && var.content_based_deduplication
  message_retention_seconds   = var.dlq_message_retention_seconds
  max_message_size            = var.max_message_size

  sqs_managed_sse_enabled           = local.use_kms ? null : true
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = local.use_kms ? var.kms_data_key_reuse_period_seconds : null

  tags = var.tags
}

resource "aws_sqs_queue" "this" {
  name                        = local.queue_name
  fifo_queue                  = var.fifo
  content_based_deduplication = var.fifo && var.content_based_deduplication
  visibility_timeout_seconds  = var.visibility_timeout_seconds
  message_retention_seconds   = var.message_retention_seconds
  receive_wait_time_seconds   = var.receive_wait_time_seconds
  max_message_size            = var.max_message_size

  sqs_managed_sse_enabled           = local.use_kms ? null : true
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = local.use_kms ? var.kms_data_key_reuse_period_seconds : null

  # Conveyor reads the DLQ from this policy: permanent failures go straight there, and SQS moves a
  # message there itself after max_receive_count receives.
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.fifo || !var.content_based_deduplication
      error_message = "content_based_deduplication applies only to FIFO queues: set fifo = true or content_based_deduplication = false."
    }

    precondition {
      condition     = length(local.dlq_name) <= local.max_queue_name_length
      error_message = "name is too long: the dead-letter queue's name (name + \"-dlq\" + \".fifo\" for FIFO queues) must stay within SQS's 80 characters; shorten name to at most 71 characters for a FIFO queue, 76 for a standard one."
    }

    precondition {
      condition     = var.dlq_message_retention_seconds >= var.message_retention_seconds
      error_message = "dlq_message_retention_seconds must be at least message_retention_seconds: a message's age counts from its first enqueue, so a shorter DLQ retention deletes dead letters on arrival."
    }
  }
}

# Only the main queue may use this queue as its dead-letter queue.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.this.arn]
  })
}

# Any message in the DLQ is a job that failed for good: someone should look. Visible and in-flight
# messages count, so looking at them (`conveyor dlq peek` receives them for a moment) does not clear
# the alarm.
resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  alarm_name        = "${var.name}-dlq-not-empty"
  alarm_description = "Messages are waiting in the dead-letter queue ${local.dlq_name}: jobs failed permanently or after ${var.max_receive_count} receives."

  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  evaluation_periods  = 1
  treat_missing_data  = "notBreaching"

  metric_query {
    id          = "visible"
    return_data = false

    metric {
      namespace   = "AWS/SQS"
      metric_name = "ApproximateNumberOfMessagesVisible"
      dimensions  = { QueueName = aws_sqs_queue.dlq.name }
      stat        = "Maximum"
      period      = 60
    }
  }

  metric_query {
    id          = "in_flight"
    return_data = false

    metric {
      namespace   = "AWS/SQS"
      metric_name = "ApproximateNumberOfMessagesNotVisible"
      dimensions  = { QueueName = aws_sqs_queue.dlq.name }
      stat        = "Maximum"
      period      = 60
    }
  }

  metric_query {
    id          = "dead_letters"
    expression  = "visible + in_flight"
    label       = "Messages in ${local.dlq_name} (visible and in flight)"
    return_data = true
  }

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# The oldest message getting old means consumers are down, too slow, or stuck.
resource "aws_cloudwatch_metric_alarm" "oldest_message_age" {
  alarm_name        = "${var.name}-oldest-message-age"
  alarm_description = "The oldest message in ${local.queue_name} is older than ${var.oldest_message_age_alarm_threshold_seconds} s: the queue is backing up."

  namespace   = "AWS/SQS"
  metric_name = "ApproximateAgeOfOldestMessage"
  dimensions = {
    QueueName = aws_sqs_queue.this.name
  }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.oldest_message_age_alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.oldest_message_age_alarm_threshold_seconds
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# Fair queues (a standard queue whose producers set a MessageGroupId, Conveyor's `NewJob::tenant`):
# SQS emits five more metrics, named in conveyor_core::metric_names::FAIR_QUEUE_METRICS. A noisy group
# is a tenant SQS holds back (over 10% of the in-flight messages and at least 30 of them, or over 10%
# of the consumers' processing time); the quiet groups are everyone else, whose dwell time fair queues
# keep low. Created when fair_queue_alarms is true (the default); without tenants the metrics stay 0.

# A tenant flooding the queue: SQS is holding it back. Informational (its own jobs wait); the quiet
# tenants' age alarm below is the one that says fairness is not enough.
resource "aws_cloudwatch_metric_alarm" "noisy_groups" {
  count             = var.fair_queue_alarms ? 1 : 0
  alarm_name        = "${var.name}-noisy-tenants"
  alarm_description = "More than ${var.noisy_groups_alarm_threshold} tenants (message groups) of ${local.queue_name} are noisy: SQS is holding them back so the quiet tenants keep moving."

  namespace   = "AWS/SQS"
  metric_name = "ApproximateNumberOfNoisyGroups"
  dimensions = {
    QueueName = aws_sqs_queue.this.name
  }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.fair_queue_alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.noisy_groups_alarm_threshold
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# The quiet tenants are waiting: the consumers are short of capacity even for them, or their in-flight
# share is inflated (heartbeats, slow deletes; see docs/tenants.md).
resource "aws_cloudwatch_metric_alarm" "quiet_groups_oldest_message_age" {
  count             = var.fair_queue_alarms ? 1 : 0
  alarm_name        = "${var.name}-quiet-tenants-oldest-message-age"
  alarm_description = "The oldest message of a quiet tenant in ${local.queue_name} is older than ${var.quiet_groups_age_alarm_threshold_seconds} s: tenants that are not flooding the queue are waiting."

  namespace   = "AWS/SQS"
  metric_name = "ApproximateAgeOfOldestMessageInQuietGroups"
  dimensions = {
    QueueName = aws_sqs_queue.this.name
  }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.fair_queue_alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.quiet_groups_age_alarm_threshold_seconds
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}

# One dashboard per queue: depth and age, and the fair-queue metrics beside them.
resource "aws_cloudwatch_dashboard" "this" {
  count          = var.fair_queue_alarms ? 1 : 0
  dashboard_name = "${var.name}-tenants"
  dashboard_body = jsonencode({
    widgets = [
      {
        type   = "metric"
        x      = 0
        y      = 0
        width  = 12
        height = 6
        properties = {
          title   = "${local.queue_name}: messages, all tenants and quiet tenants"
          region  = local.region
          stat    = "Maximum"
          period  = 60
          metrics = [for name in ["ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesVisibleInQuietGroups", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesNotVisibleInQuietGroups", "ApproximateNumberOfMessagesDelayedInQuietGroups"] : ["AWS/SQS", name, "QueueName", aws_sqs_queue.this.name]]
        }
      },
      {
        type   = "metric"
        x      = 12
        y      = 0
        width  = 12
        height = 6
        properties = {
          title   = "${local.queue_name}: oldest message age (s), all tenants and quiet tenants"
          region  = local.region
          stat    = "Maximum"
          period  = 60
          metrics = [for name in ["ApproximateAgeOfOldestMessage", "ApproximateAgeOfOldestMessageInQuietGroups"] : ["AWS/SQS", name, "QueueName", aws_sqs_queue.this.name]]
        }
      },
      {
        type   = "metric"
        x      = 0
        y      = 6
        width  = 12
        height = 6
        properties = {
          title   = "${local.queue_name}: noisy tenants (message groups SQS holds back)"
          region  = local.region
          stat    = "Maximum"
          period  = 60
          metrics = [["AWS/SQS", "ApproximateNumberOfNoisyGroups", "QueueName", aws_sqs_queue.this.name]]
        }
      },
    ]
  })
}

# Both queues refuse requests that do not use TLS, whoever sends them.
# The queue's policy: TLS only, and the AWS services that may put messages on it (an SNS topic's
# subscription, an EventBridge rule's target, an S3 bucket's notifications; see docs/events.md), each only
# for the topics, rules and buckets named.
locals {
  service_senders = [
    for sender in [
      { sid = "SnsTopicsSend", service = "sns.amazonaws.com", arns = var.sns_topic_arns },
      { sid = "EventBridgeRulesSend", service = "events.amazonaws.com", arns = var.eventbridge_rule_arns },
      { sid = "S3BucketsSend", service = "s3.amazonaws.com", arns = var.s3_bucket_arns },
    ] : sender if length(sender.arns) > 0
  ]
}

data "aws_iam_policy_document" "queue_tls_only" {
  dynamic "statement" {
    for_each = local.service_senders

    content {
      sid       = statement.value.sid
      actions   = ["sqs:SendMessage"]
      resources = [aws_sqs_queue.this.arn]

      principals {
        type        = "Service"
        identifiers = [statement.value.service]
      }

      condition {
        test     = "ArnEquals"
        variable = "aws:SourceArn"
        values   = statement.value.arns
      }
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.this.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

data "aws_iam_policy_document" "dlq_tls_only" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.dlq.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "queue" {
  queue_url = aws_sqs_queue.this.id
  policy    = data.aws_iam_policy_document.queue_tls_only.json
}

resource "aws_sqs_queue_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id
  policy    = data.aws_iam_policy_document.dlq_tls_only.json
}

# Ready-made policies for the people and services around the queue (outputs producer_policy_json and
# operator_policy_json). The actions are conveyor_sqs::iam's PRODUCER and OPERATOR lists.
locals {
  kms_key_arns = var.kms_master_key_id == null ? [] : [var.kms_master_key_id]
  region       = split(":", aws_sqs_queue.this.arn)[3]
}

data "aws_iam_policy_document" "producer" {
  # `Producer::send` / `send_batch`, resolving a queue name (`conveyor send --queue-url NAME`), and
  # reading the queue's retention once before the first job delayed past 15 minutes and its
  # MaximumMessageSize once when large payloads are on (the S3 side: modules/payload-bucket).
  statement {
    sid = "SendJobs"
    actions = [
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
      "sqs:SendMessage",
    ]
    resources = [aws_sqs_queue.this.arn]
  }

  dynamic "statement" {
    for_each = length(local.kms_key_arns) > 0 ? [local.kms_key_arns] : []

    content {
      sid = "EncryptJobs"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["sqs.${local.region}.amazonaws.com"]
      }
    }
  }
}

data "aws_iam_policy_document" "operator" {
  # `conveyor stats`, `dlq peek` (receives and puts back at once), `dlq redrive` (StartMessageMoveTask,
  # or the filtered move loop: receive from the DLQ, send to the queue, delete), `dlq tasks --cancel`
  # (CancelMessageMoveTask) and `purge`.
  statement {
    sid = "OperateQueues"
    actions = [
      "sqs:CancelMessageMoveTask",
      "sqs:ChangeMessageVisibility",
      "sqs:DeleteMessage",
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
      "sqs:ListDeadLetterSourceQueues",
      "sqs:ListMessageMoveTasks",
      "sqs:PurgeQueue",
      "sqs:ReceiveMessage",
      "sqs:SendMessage",
      "sqs:StartMessageMoveTask",
    ]
    resources = [aws_sqs_queue.this.arn, aws_sqs_queue.dlq.arn]
  }

  # The console's fair-queue view (conveyor_console::iam::CLOUDWATCH). GetMetricData has no resource-level
  # permission: AWS grants it on "*" only, and it reads metrics, never messages.
  statement {
    sid       = "ReadFairQueueMetrics"
    actions   = ["cloudwatch:GetMetricData"]
    resources = ["*"]
  }

  dynamic "statement" {
    for_each = length(local.kms_key_arns) > 0 ? [local.kms_key_arns] : []

    content {
      sid = "ReadAndMoveEncryptedJobs"
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["sqs.${local.region}.amazonaws.com"]
      }
    }
  }
}
