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

  # Tracked jobs (HandlerSettings::tracked): `conveyor jobs list --job-type T [--status S]` queries this
  # index. Partition key `job_shard` = "<type>#<shard>", the shard a stable hash (FNV-1a) of the record
  # key modulo 16 (conveyor_dynamodb::defaults::JOBS_INDEX_SHARDS), so one busy type's transitions
  # spread over 16 partitions (~16,000 writes/s before the index throttles, and its back-pressure
  # throttles the table's claims). Sort key `job_sort` = "<status>#<changed epoch ms, 13 digits>": one
  # Query per shard with begins_with for one status, newest first. Only the small job_* attributes
  # are projected (conveyor_dynamodb::defaults::JOBS_INDEX_PROJECTION): outputs and progress stay out,
  # so a progress report or a lease extension writes no index entry. Only tracked jobs' items carry
  # these keys, so the index is sparse: untracked idempotency records cost it nothing.
  #
  # Migration: this index replaced `conveyor-jobs` (job_index/job_changed, ALL projection). Applying
  # this version adds `conveyor-jobs-sharded` and drops `conveyor-jobs` (DynamoDB builds the new index
  # from existing items that carry job_shard: jobs tracked before the upgrade are listed once they change
  # status again; `jobs show` reads them by key meanwhile).
  attribute {
    name = "job_shard"
    type = "S"
  }

  attribute {
    name = "job_sort"
    type = "S"
  }

  global_secondary_index {
    name            = "conveyor-jobs-sharded"
    hash_key        = "job_shard"
    range_key       = "job_sort"
    projection_type = "INCLUDE"
    non_key_attributes = [
      "job_type",
      "job_status",
      "job_attempts",
      "job_error",
      "job_changed",
      "last_attempt",
      "job_sent_at",
      "job_running_at",
      "job_retrying_at",
      "job_succeeded_at",
      "job_dead_lettered_at",
      "job_cancelled_at",
    ]
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
  # `Producer::send_tracked` (the `sent` record), `Producer::cancel` (its marker, read back),
  # `FlowProducer` (the flow's items, written where none exist; a re-send reads the head).
  statement {
    sid = "TrackJobs"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.this.arn]
  }
}

data "aws_iam_policy_document" "operator" {
  # `conveyor jobs show|watch|list` (GetItem; Query on the conveyor-jobs-sharded index) and
  # `conveyor schedules pause|resume|trigger`, cancelling a job (UpdateItem).
  statement {
    sid = "OperateJobs"
    actions = [
      "dynamodb:BatchGetItem",
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.this.arn, "${aws_dynamodb_table.this.arn}/index/conveyor-jobs-sharded"]
  }
}
