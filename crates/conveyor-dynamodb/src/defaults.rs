//! The idempotency table's default attribute and index names (as in AWS Lambda Powertools where they
//! overlap), shared with `infra/modules/idempotency-table`: a test in `tests/` parses the `.tf` files and
//! fails when the two drift apart. [`AttributeNames`](crate::AttributeNames) can rename the attributes.

/// Partition key attribute of the idempotency table (as in AWS Lambda Powertools).
pub const IDEMPOTENCY_KEY_ATTRIBUTE: &str = "id";
/// Record status attribute: `INPROGRESS` or `COMPLETED` (as in Powertools).
pub const STATUS_ATTRIBUTE: &str = "status";
/// Record expiry in epoch seconds; also the table's TTL attribute (as in Powertools).
pub const EXPIRATION_ATTRIBUTE: &str = "expiration";
/// In-progress lease end in epoch milliseconds (as in Powertools).
pub const IN_PROGRESS_EXPIRATION_ATTRIBUTE: &str = "in_progress_expiration";
/// The handler's output as JSON text, on completed records (as in Powertools).
pub const DATA_ATTRIBUTE: &str = "data";
/// Hash of the payload when payload validation is on (as in Powertools).
pub const VALIDATION_ATTRIBUTE: &str = "validation";
/// Conveyor's fencing token, a number (N) each claim increases; Powertools ignores it. (Named anew when
/// the token became a number: the random strings older releases wrote under `fencing_token` are left
/// alone.)
pub const TOKEN_ATTRIBUTE: &str = "fence";
/// Conveyor's run count, a number (N) each claim increases and a dead-lettering removes; Powertools
/// ignores it.
pub const RUNS_ATTRIBUTE: &str = "runs";

/// The secondary index that lists tracked jobs by type and status (`conveyor jobs list`): partition
/// key `job_shard` (`<job type>#<shard>`, S), sort key `job_sort` (`<status>#<epoch ms, 13 digits>`,
/// S), the small `job_*` attributes projected ([`JOBS_INDEX_PROJECTION`]). It replaced `conveyor-jobs`
/// (`<type>#<status>` partitions, every attribute projected), which put every transition of a busy
/// type on one partition; an old table gets this index added, and `conveyor-jobs` can be dropped.
pub const JOBS_INDEX: &str = "conveyor-jobs-sharded";

/// How many index partitions one job type's writes are spread over (a stable hash of the record key,
/// modulo this). DynamoDB takes about 1,000 writes/s per partition key, so one type takes about 16,000
/// transitions/s before its index throttles; `jobs list` reads this many partitions. Changing it moves
/// records between partitions: the Terraform module documents the same number.
pub const JOBS_INDEX_SHARDS: u32 = 16;

/// The attributes the jobs index projects besides its keys and the table's: what `jobs list` prints,
/// never the output (`data`) or progress, so a progress report or a lease extension writes no index
/// entry.
pub const JOBS_INDEX_PROJECTION: [&str; 12] = [
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
];
