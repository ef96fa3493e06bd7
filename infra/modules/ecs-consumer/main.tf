# A Conveyor long-poll worker as an ECS service on Fargate (ARM64), scaled on backlog per task.

data "aws_region" "current" {}

locals {
  # arn:aws:ecs:<region>:<account>:cluster/<name>
  cluster_name   = split("/", var.cluster_arn)[1]
  log_group_name = "/ecs/${var.name}"
  container_name = "worker"
  listen_port    = 9090
  # What the worker's shutdown needs after the drain (cancel grace, releases, delete flush, exit):
  # conveyor_core::defaults::SHUTDOWN_RESERVE. The worker refuses a drain that leaves less.
  shutdown_reserve_seconds = 7

  environment = merge(var.environment, {
    CONVEYOR_QUEUE_URL           = var.queue_url
    CONVEYOR_IDEMPOTENCY_TABLE   = var.idempotency_table_name
    CONVEYOR_DRAIN_DEADLINE_SECS = tostring(var.drain_deadline_seconds)
    CONVEYOR_STOP_TIMEOUT_SECS   = tostring(var.stop_timeout_seconds)
    CONVEYOR_LISTEN_ADDR         = "0.0.0.0:${local.listen_port}"
    RUST_LOG                     = var.rust_log
  })
}

resource "aws_cloudwatch_log_group" "this" {
  name              = local.log_group_name
  retention_in_days = var.log_retention_days
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
  }
}

resource "aws_iam_role" "task" {
  name               = "${var.name}-task"
  assume_role_policy = data.aws_iam_policy_document.assume_role.json
  tags               = var.tags
}

module "permissions" {
  source                = "../consumer-permissions"
  queue_arn             = var.queue_arn
  dlq_arn               = var.dlq_arn
  idempotency_table_arn = var.idempotency_table_arn
  kms_key_arns          = var.kms_key_arns
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
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = local.container_name
        }
      }
    }
  ])

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.drain_deadline_seconds + local.shutdown_reserve_seconds <= var.stop_timeout_seconds
      error_message = "drain_deadline_seconds plus 7 s (the worker's cancel grace, releases and delete flush after the drain) must fit in stop_timeout_seconds: after SIGTERM the worker drains, then cancels what is left, releases its claims and makes its messages visible again; ECS's SIGKILL at stop_timeout_seconds must come after that. The worker refuses the same combination at start-up."
    }
  }
}

resource "aws_ecs_service" "this" {
  name            = var.name
  cluster         = var.cluster_arn
  task_definition = aws_ecs_task_definition.this.arn
  desired_count   = var.desired_count
  launch_type     = "FARGATE"
  propagate_tags  = "SERVICE"

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
