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

/// The secondary index that lists tracked jobs by type and status (`conveyor jobs list`).
pub const JOBS_INDEX: &str = "conveyor-jobs";
