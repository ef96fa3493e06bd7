//! The names of the metrics the worker exports (Prometheus), kept here so the worker and the console,
//! which reads them from the workers' `/metrics`, agree without one depending on the other.

/// Messages received (label `queue`).
pub const MESSAGES_RECEIVED: &str = "conveyor_messages_received_total";
/// Messages whose handler succeeded and that were deleted (labels `queue`, `job_type`).
pub const MESSAGES_SUCCEEDED: &str = "conveyor_messages_succeeded_total";
/// Messages put back for a retry (labels `queue`, `job_type`).
pub const MESSAGES_RETRIED: &str = "conveyor_messages_retried_total";
/// Messages sent to the DLQ (labels `queue`, `job_type`).
pub const MESSAGES_DEAD_LETTERED: &str = "conveyor_messages_dead_lettered_total";
/// Duplicates acknowledged without running (labels `queue`, `job_type`).
pub const MESSAGES_DUPLICATES: &str = "conveyor_messages_duplicates_total";
/// Visibility extensions made by the heartbeat (label `queue`).
pub const HEARTBEAT_EXTENSIONS: &str = "conveyor_heartbeat_extensions_total";
/// Leases lost: a visibility extension or a claim extension was refused (label `queue`).
pub const LEASES_LOST: &str = "conveyor_leases_lost_total";
/// Messages put back unrun because a downstream's circuit was open (label `downstream`).
pub const CIRCUIT_DEFERRALS: &str = "conveyor_circuit_open_deferrals_total";
/// Cancelled jobs dropped without running when they came due (labels `queue`, `job_type`).
pub const MESSAGES_CANCELLED: &str = "conveyor_messages_cancelled_total";
/// Flows found past their deadline by the flow sweeper (their unfinished children counted as failed).
pub const FLOWS_OVERDUE: &str = "conveyor_flows_overdue_total";
/// How long handlers ran (label `job_type`).
pub const HANDLER_DURATION: &str = "conveyor_handler_duration_seconds";
/// A message's age when received, from `SentTimestamp` (label `queue`).
pub const MESSAGE_AGE: &str = "conveyor_message_age_seconds";
/// Messages in flight in this worker.
pub const IN_FLIGHT: &str = "conveyor_in_flight";
/// `ApproximateNumberOfMessages` (label `queue`).
pub const QUEUE_VISIBLE: &str = "conveyor_queue_visible";
/// `ApproximateNumberOfMessagesNotVisible` (label `queue`).
pub const QUEUE_IN_FLIGHT: &str = "conveyor_queue_in_flight";
/// `ApproximateNumberOfMessagesDelayed` (label `queue`).
pub const QUEUE_DELAYED: &str = "conveyor_queue_delayed";
/// Messages in a dead-letter queue the worker watches (label `queue`: the DLQ's name): visible, in
/// flight and delayed together. Only DLQs passed to
/// `Worker::watch_dead_letter_queue` are measured. Alert when
/// it is above zero: each message there is a job that will not run again until someone redrives it.
pub const DLQ_MESSAGES: &str = "conveyor_dlq_messages";
/// Log lines dropped because the log output failed (a closed pipe, a full disk): logging never
/// changes what happens to a job, so a failed write is counted here instead.
pub const LOG_WRITE_ERRORS: &str = "conveyor_log_write_errors_total";
/// Jobs started, by tenant (label `tenant`: one of the top tenants, `other` or `none`; see
/// `src/tenant_metrics.rs`).
pub const TENANT_JOBS_STARTED: &str = "conveyor_tenant_jobs_started_total";
/// Jobs deferred unrun because their tenant was at its limit (labels `tenant`, `limit`:
/// `concurrency` or `rate`).
pub const TENANT_DEFERRALS: &str = "conveyor_tenant_deferrals_total";
/// A job's dwell time when it starts, from its first send (label `tenant`).
pub const TENANT_DWELL: &str = "conveyor_tenant_dwell_seconds";

/// The CloudWatch metrics SQS emits for a fair queue (a standard queue whose messages carry a
/// `MessageGroupId`, Conveyor's tenant), in namespace `AWS/SQS`: the alarms and the dashboard of
/// `infra/modules/queue` use exactly these names (`tests/tests/infra.rs` holds them to it). A noisy
/// group is a tenant SQS holds back; the quiet groups are the others.
pub const FAIR_QUEUE_METRICS: [&str; 5] = [
    "ApproximateNumberOfNoisyGroups",
    "ApproximateNumberOfMessagesVisibleInQuietGroups",
    "ApproximateNumberOfMessagesNotVisibleInQuietGroups",
    "ApproximateNumberOfMessagesDelayedInQuietGroups",
    "ApproximateAgeOfOldestMessageInQuietGroups",
];
