locals {
  suffix     = var.fifo ? ".fifo" : ""
  queue_name = "${var.name}${local.suffix}"
  dlq_name   = "${var.name}-dlq${local.suffix}"

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

# Any message in the DLQ is a job that failed for good: someone should look.
resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  alarm_name        = "${var.name}-dlq-not-empty"
  alarm_description = "Messages are waiting in the dead-letter queue ${local.dlq_name}: jobs failed permanently or after ${var.max_receive_count} receives."

  namespace   = "AWS/SQS"
  metric_name = "ApproximateNumberOfMessagesVisible"
  dimensions = {
    QueueName = aws_sqs_queue.dlq.name
  }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"

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
