//! Default names and numbers shared by the code and by `infra/`.
//!
//! The Terraform modules in `infra/` use the same values; a test in `tests/` parses the
//! `.tf` files and fails when the two drift apart.

use std::time::Duration;

/// How many receives before SQS moves a message to the DLQ (the redrive policy's `maxReceiveCount`).
pub const MAX_RECEIVE_COUNT: u32 = 5;
/// The visibility timeout `infra/modules/queue` gives a queue, in seconds. The worker does not assume
/// it: it reads each queue's own `VisibilityTimeout` at connect and sends it with every receive.
pub const QUEUE_VISIBILITY_TIMEOUT_SECS: u64 = 60;
/// The shortest visibility timeout the worker's heartbeat can keep (it extends when half is left,
/// and each extension must answer within that half even when SQS is slow).
pub const MIN_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(10);
/// The platform's stop timeout: SIGTERM, then SIGKILL this long after (ECS's default `stopTimeout`).
pub const ECS_STOP_TIMEOUT_SECS: u64 = 30;
/// What shutdown needs after the drain: the handlers' cancel grace (2 s), releasing their claims and
/// messages (2 s), flushing pending deletes (2 s), and a second to exit.
pub const SHUTDOWN_RESERVE: Duration = Duration::from_secs(7);
/// How long a worker lets in-flight jobs finish after SIGTERM: what fits in ECS's default stop timeout
/// after [`SHUTDOWN_RESERVE`].
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(ECS_STOP_TIMEOUT_SECS - SHUTDOWN_RESERVE.as_secs());
/// How far apart the clocks of two consumers sharing an idempotency table may be.
///
/// A claim's lease is written as the holder's deadline *on its own clock*, and another consumer
/// decides it has lapsed by comparing it with *its* clock (Powertools' claim condition, unchanged).
/// Every lease Conveyor writes ends this much after the holder's deadline, so a consumer whose clock
/// runs up to this much ahead of the holder's still never takes over a claim whose holder is running.
/// Hosts kept by NTP or the Amazon Time Sync Service agree within milliseconds; the cost of a larger
/// value is only that a crashed holder's key stays locked this much longer.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(2);
/// How long a failing job keeps being retried, on average, before it reaches the DLQ.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(15 * 60);
/// The minimum ratio of a queue's visibility timeout to a Lambda consumer's timeout (AWS's advice).
pub const LAMBDA_VISIBILITY_RATIO: u64 = 6;
/// How long a completed idempotency record keeps suppressing duplicates.
pub const IDEMPOTENCY_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a tracked job's record keeps a final status (succeeded, dead-lettered, cancelled): SQS's
/// longest message retention, which a DLQ usually has, so a job's status lasts as long as its DLQ copy.
pub const STATUS_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);
/// The least time between two progress writes of one tracked run (`HandlerSettings::progress_interval`).
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_secs(3);
