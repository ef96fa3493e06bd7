# A Conveyor long-poll worker as an ECS service on Fargate (ARM64), scaled on backlog per task.
#
# What the worker knows about its queue it reads from the queue at start-up (GetQueueAttributes): the
# visibility timeout it sends with every receive, FIFO, the DLQ and maxReceiveCount. The module passes
# the queue URL, the table, and the stop timeout (CONVEYOR_STOP_TIMEOUT_SECS), so the worker fits its
# whole shutdown inside the SIGTERM-to-SIGKILL window ECS gives it.

locals {
  # arn:<partition>:ecs:<region>:<account>:cluster/<name>
  cluster_arn_parts = split(":", var.cluster_arn)
  partition         = local.cluster_arn_parts[1]
  region            = local.cluster_arn_parts[3]
  account_id        = local.cluster_arn_parts[4]
  cluster_name      = split("/", var.cluster_arn)[1]

  log_group_name = "/ecs/${var.name}"
  container_name = "worker"
  listen_port    = 9090
  # What the worker's shutdown needs after the drain (cancel grace, releases, delete flush, exit):
  # conveyor_core::runtime::SHUTDOWN_RESERVE. The worker refuses a drain that leaves less.
  shutdown_reserve_seconds = 7
  # The shortest visibility timeout the worker's heartbeat can keep:
  # conveyor_core::runtime::MIN_VISIBILITY_TIMEOUT. The worker refuses a queue with less.
  min_visibility_timeout_seconds = 10

  # IAM role names are at most 64 characters; a name_prefix at most 38 (AWS appends 26).
  role_name_prefix = "${substr(var.name, 0, 32)}-task-"

  # Fargate's CPU units and the task memory (MiB) each allows.
  fargate_memory = {
    "256"   = [512, 1024, 2048]
    "512"   = [for gb in range(1, 5) : gb * 1024]
    "1024"  = [for gb in range(2, 9) : gb * 1024]
    "2048"  = [for gb in range(4, 17) : gb * 1024]
    "4096"  = [for gb in range(8, 31) : gb * 1024]
    "8192"  = [for gb in range(16, 61, 4) : gb * 1024]
    "16384" = [for gb in range(32, 121, 8) : gb * 1024]
  }

  # Unset settings are left to the worker, which derives them (the drain deadline from the stop
  # timeout, the visibility timeout from the queue), so nothing is decided twice.
  environment = merge(
    var.environment,
    {
      CONVEYOR_QUEUE_URL         = var.queue_url
      CONVEYOR_IDEMPOTENCY_TABLE = var.idempotency_table_name
      CONVEYOR_STOP_TIMEOUT_SECS = tostring(var.stop_timeout_seconds)
      CONVEYOR_LISTEN_ADDR       = "0.0.0.0:${local.listen_port}"
      CONVEYOR_LOG_FORMAT        = "json"
      RUST_LOG                   = var.rust_log
    },
    var.drain_deadline_seconds == null ? {} : {
      CONVEYOR_DRAIN_DEADLINE_SECS = tostring(var.drain_deadline_seconds)
    },
    var.visibility_timeout_seconds == null ? {} : {
      CONVEYOR_VISIBILITY_TIMEOUT_SECS = tostring(var.visibility_timeout_seconds)
    },
    var.payload_bucket == null ? {} : {
      CONVEYOR_PAYLOAD_BUCKET = var.payload_bucket.name
    },
  )
}

resource "aws_cloudwatch_log_group" "this" {
  name              = local.log_group_name
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

# The task role: what the worker itself may do. Same actions as the Lambda consumer.
data "aws_iam_policy_document" "assume_role" {
  statement {
    sid     = "EcsTasksAssumeRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    # Only tasks of this account's ECS in this region may take the role (confused deputy).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:ecs:${local.region}:${local.account_id}:*"]
    }
  }
}

# A role name is global to the account: without role_name the name is generated from a prefix, so the
# same service name in two regions (or two stacks) never collides.
resource "aws_iam_role" "task" {
  name               = var.role_name
  name_prefix        = var.role_name == null ? local.role_name_prefix : null
  assume_role_policy = data.aws_iam_policy_document.assume_role.json
  tags               = var.tags
}

module "permissions" {
  source                = "../consumer-permissions"
  queue_arn             = var.queue_arn
  dlq_arn               = var.dlq_arn
  idempotency_table_arn = var.idempotency_table_arn
  kms_key_arns          = var.kms_key_arns
  payload_bucket_arn    = try(var.payload_bucket.arn, null)
}

data "aws_iam_policy_document" "task" {
  # The consumer's queue, DLQ, table and key permissions, shared with the other runtime.
  source_policy_documents = [module.permissions.json]
}

resource "aws_iam_role_policy" "task" {
  name   = "conveyor-consumer"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
}

# What the (caller's) execution role needs for this module's logs; exported, not attached, because
# the module does not own that role. ":*" addresses the streams of this one log group.
data "aws_iam_policy_document" "execution_logs" {
  statement {
    sid = "WriteLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
    ]
    resources = ["${aws_cloudwatch_log_group.this.arn}:*"]
  }
}

resource "aws_ecs_task_definition" "this" {
  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  execution_role_arn       = var.execution_role_arn
  task_role_arn            = aws_iam_role.task.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "ARM64"
  }

  container_definitions = jsonencode([
    {
      name      = local.container_name
      image     = var.container_image
      essential = true

      # The worker writes nothing to disk; tini-like init reaps children and forwards SIGTERM.
      readonlyRootFilesystem = true
      linuxParameters        = { initProcessEnabled = true }

      environment = [for key, value in local.environment : { name = key, value = value }]

      # /healthz and /metrics.
      portMappings = [{ containerPort = local.listen_port, protocol = "tcp" }]

      # The worker binary checks its own /healthz (`--healthcheck`), so the image needs no curl.
      healthCheck = {
        command     = var.healthcheck_command
        interval    = 30
        timeout     = 5
        retries     = 3
        startPeriod = 10
      }

      # SIGTERM, then this long to drain (drain_deadline_seconds) and release the rest, then SIGKILL.
      stopTimeout = var.stop_timeout_seconds

      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.this.name
          awslogs-region        = local.region
          awslogs-stream-prefix = local.container_name
        }
      }
    }
  ])

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.drain_deadline_seconds == null || coalesce(var.drain_deadline_seconds, 0) + local.shutdown_reserve_seconds <= var.stop_timeout_seconds
      error_message = "drain_deadline_seconds plus 7 s (the worker's cancel grace, releases and delete flush after the drain) must fit in stop_timeout_seconds: after SIGTERM the worker drains, then cancels what is left, releases its claims and makes its messages visible again; ECS's SIGKILL at stop_timeout_seconds must come after that. Lower drain_deadline_seconds to at most stop_timeout_seconds - 7, or leave it null (the worker then drains for exactly that long). The worker refuses the same combination at start-up."
    }

    precondition {
      condition     = contains(lookup(local.fargate_memory, tostring(var.cpu), []), var.memory)
      error_message = "cpu and memory must form a Fargate pair: 256 CPU with 512, 1024 or 2048 MiB; 512 with 1024-4096; 1024 with 2048-8192; 2048 with 4096-16384; 4096 with 8192-30720 (1024 steps); 8192 with 16384-61440 (4096 steps); 16384 with 32768-122880 (8192 steps)."
    }

    precondition {
      condition     = var.queue_visibility_timeout_seconds == null || coalesce(var.queue_visibility_timeout_seconds, 0) >= local.min_visibility_timeout_seconds || var.visibility_timeout_seconds != null
      error_message = "The queue's visibility timeout (queue_visibility_timeout_seconds) is below 10 s, the shortest the worker's heartbeat can keep: the worker refuses such a queue at start-up. Raise the queue's visibility_timeout_seconds, or set visibility_timeout_seconds here to override it."
    }
  }
}

resource "aws_ecs_service" "this" {
  name            = var.name
  cluster         = var.cluster_arn
  task_definition = aws_ecs_task_definition.this.arn
  desired_count   = var.desired_count
  launch_type     = var.use_fargate_spot ? null : "FARGATE"
  propagate_tags  = "SERVICE"

  # Spot tasks get SIGTERM two minutes before they are reclaimed: the same shutdown as a deployment.
  # The cluster needs FARGATE_SPOT among its capacity providers.
  dynamic "capacity_provider_strategy" {
    for_each = var.use_fargate_spot ? [1] : []

    content {
      capacity_provider = "FARGATE_SPOT"
      weight            = 1
    }
  }

  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = var.security_group_ids
    assign_public_ip = var.assign_public_ip
  }

  tags = var.tags

  lifecycle {
    # Autoscaling owns the task count once the service exists.
    ignore_changes = [desired_count]

    precondition {
      condition     = var.min_capacity <= var.desired_count && var.desired_count <= var.max_capacity
      error_message = "desired_count must lie between min_capacity and max_capacity."
    }

    precondition {
      condition     = var.min_capacity >= 1 || var.scale_to_zero
      error_message = "min_capacity 0 needs scale_to_zero = true: backlog per task (visible messages / running tasks) is undefined at zero tasks, so only the scale-to-zero step policy can start the first task again."
    }
  }
}

resource "aws_appautoscaling_target" "this" {
  service_namespace  = "ecs"
  resource_id        = "service/${local.cluster_name}/${aws_ecs_service.this.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_capacity
  max_capacity       = var.max_capacity
}

# Target tracking on backlog per task: visible messages / running tasks, kept near backlog_per_task.
# RunningTaskCount comes from Container Insights, which must be enabled on the cluster.
resource "aws_appautoscaling_policy" "backlog_per_task" {
  name               = "${var.name}-backlog-per-task"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.this.service_namespace
  resource_id        = aws_appautoscaling_target.this.resource_id
  scalable_dimension = aws_appautoscaling_target.this.scalable_dimension

  target_tracking_scaling_policy_configuration {
    target_value       = var.backlog_per_task
    scale_in_cooldown  = var.scale_in_cooldown_seconds
    scale_out_cooldown = var.scale_out_cooldown_seconds

    customized_metric_specification {
      metrics {
        id          = "m1"
        label       = "Visible messages in ${var.queue_name}"
        return_data = false

        metric_stat {
          stat = "Sum"

          metric {
            namespace   = "AWS/SQS"
            metric_name = "ApproximateNumberOfMessagesVisible"

            dimensions {
              name  = "QueueName"
              value = var.queue_name
            }
          }
        }
      }

      metrics {
        id          = "m2"
        label       = "Running tasks of ${var.name}"
        return_data = false

        metric_stat {
          stat = "Average"

          metric {
            namespace   = "ECS/ContainerInsights"
            metric_name = "RunningTaskCount"

            dimensions {
              name  = "ClusterName"
              value = local.cluster_name
            }

            dimensions {
              name  = "ServiceName"
              value = aws_ecs_service.this.name
            }
          }
        }
      }

      metrics {
        id          = "e1"
        label       = "Backlog per task"
        expression  = "m1 / m2"
        return_data = true
      }
    }
  }

  lifecycle {
    precondition {
      condition     = var.min_capacity <= var.max_capacity
      error_message = "min_capacity must not exceed max_capacity."
    }
  }
}

# Scale to zero: with no task running, target tracking has nothing to divide by, so a step policy starts
# the first task as soon as a message is visible.
resource "aws_appautoscaling_policy" "wake_up" {
  count = var.scale_to_zero ? 1 : 0

  name               = "${var.name}-wake-up"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.this.service_namespace
  resource_id        = aws_appautoscaling_target.this.resource_id
  scalable_dimension = aws_appautoscaling_target.this.scalable_dimension

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = var.scale_out_cooldown_seconds
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_lower_bound = 0
      scaling_adjustment          = 1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "wake_up" {
  count = var.scale_to_zero ? 1 : 0

  alarm_name        = "${var.name}-wake-up"
  alarm_description = "Messages are visible in ${var.queue_name} and no task of ${var.name} runs: start one."

  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  evaluation_periods  = 1
  treat_missing_data  = "notBreaching"

  metric_query {
    id          = "visible"
    return_data = false

    metric {
      namespace   = "AWS/SQS"
      metric_name = "ApproximateNumberOfMessagesVisible"
      dimensions  = { QueueName = var.queue_name }
      stat        = "Maximum"
      period      = 60
    }
  }

  metric_query {
    id          = "running"
    return_data = false

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "RunningTaskCount"
      dimensions = {
        ClusterName = local.cluster_name
        ServiceName = aws_ecs_service.this.name
      }
      stat   = "Maximum"
      period = 60
    }
  }

  metric_query {
    id          = "idle_with_work"
    expression  = "IF(visible > 0 AND FILL(running, 0) == 0, 1, 0)"
    label       = "Visible messages and no running task"
    return_data = true
  }

  alarm_actions = [aws_appautoscaling_policy.wake_up[0].arn]
  tags          = var.tags
}

# Fewer tasks than min_capacity for several minutes: tasks crash at start (configuration, image,
# permissions) or cannot be placed.
resource "aws_cloudwatch_metric_alarm" "running_tasks_below_minimum" {
  count = var.min_capacity >= 1 ? 1 : 0

  alarm_name        = "${var.name}-running-tasks-below-minimum"
  alarm_description = "Fewer than ${var.min_capacity} tasks of ${var.name} run: tasks fail at start-up or cannot be placed."

  namespace = "ECS/ContainerInsights"
  dimensions = {
    ClusterName = local.cluster_name
    ServiceName = aws_ecs_service.this.name
  }
  metric_name         = "RunningTaskCount"
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = var.alarm_evaluation_periods
  comparison_operator = "LessThanThreshold"
  threshold           = var.min_capacity
  # No data points: no task reports, so none runs.
  treat_missing_data = "breaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.ok_actions
  tags          = var.tags
}
