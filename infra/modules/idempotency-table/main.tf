# One item per idempotency key, laid out like AWS Lambda Powertools' idempotency table so that
# Python, TypeScript and Rust consumers can share it. The names below are the ones in
# conveyor_dynamodb::defaults (IDEMPOTENCY_KEY_ATTRIBUTE, EXPIRATION_ATTRIBUTE); the Rust test
# tests/tests/infra.rs fails if they drift apart. They are literals on purpose: there is
# nothing to configure here without breaking the record format.
resource "aws_dynamodb_table" "this" {
  name         = var.name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "id"

  attribute {
    name = "id"
    type = "S"
  }

  # Tracked jobs (HandlerSettings::tracked): `conveyor jobs list --type T --status S` queries this
  # index, one partition per job type and status (`job_index` = "<type>#<status>"), newest change
  # first (`job_changed`, epoch ms). Only tracked jobs' items carry these attributes, so the index is
  # sparse: untracked idempotency records cost it nothing. Names as in conveyor_dynamodb::defaults::JOBS_INDEX
  # and conveyor_dynamodb::jobs.
  attribute {
    name = "job_index"
    type = "S"
  }

  attribute {
    name = "job_changed"
    type = "N"
  }

  global_secondary_index {
    name            = "conveyor-jobs"
    hash_key        = "job_index"
    range_key       = "job_changed"
    projection_type = "ALL"
  }

  # TTL only cleans up: DynamoDB deletes expired items lazily (often hours late), so Conveyor never
  # relies on it for correctness and compares `expiration` with the clock itself.
  ttl {
    enabled        = true
    attribute_name = "expiration"
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery_enabled
  }

  # DynamoDB always encrypts at rest. Without a key this is the AWS-owned key; with one, the
  # customer-managed key.
  server_side_encryption {
    enabled     = var.kms_key_arn != null
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection_enabled

  tags = var.tags
}

# Ready-made policies for the people and services around the table (outputs producer_policy_json and
# operator_policy_json; consumers get theirs from consumer-permissions). The actions are
# conveyor_dynamodb::iam's PRODUCER_TABLE and OPERATOR_TABLE lists; tests/tests/infra.rs holds them equal.
data "aws_iam_policy_document" "producer" {
  # `Producer::send_tracked` (the `sent` record), `Producer::cancel`, `FlowProducer` (the flow's item).
  statement {
    sid       = "TrackJobs"
    actions   = ["dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.this.arn]
  }
}

data "aws_iam_policy_document" "operator" {
  # `conveyor jobs show|watch|list` (GetItem; Query on the conveyor-jobs index) and
  # `conveyor schedules pause|resume|trigger`, cancelling a job (UpdateItem).
  statement {
    sid = "OperateJobs"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.this.arn, "${aws_dynamodb_table.this.arn}/index/conveyor-jobs"]
  }
}
