//! Metric names, the Prometheus recorder, and the per-queue metric handles the hot path uses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

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
/// [`Worker::watch_dead_letter_queue`](crate::Worker::watch_dead_letter_queue) are measured. Alert when
/// it is above zero: each message there is a job that will not run again until someone redrives it.
pub const DLQ_MESSAGES: &str = "conveyor_dlq_messages";
/// Log lines dropped because the log output failed (a closed pipe, a full disk): logging never
/// changes what happens to a job, so a failed write is counted here instead.
pub const LOG_WRITE_ERRORS: &str = "conveyor_log_write_errors_total";

const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];
const AGE_BUCKETS: &[f64] = &[
    0.1,
    0.5,
    1.0,
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4.0 * 3600.0,
    24.0 * 3600.0,
];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process and returns its handle; `None` when the
/// application installed another recorder first (then metrics go there, and `/metrics` says so).
pub(crate) fn install_recorder() -> Option<PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HANDLER_DURATION.to_owned()), DURATION_BUCKETS)
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Full(MESSAGE_AGE.to_owned()), AGE_BUCKETS)
                });
            let installed = builder.and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "another metrics recorder is installed; /metrics will be empty");
                    None
                }
            }
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(MESSAGES_RECEIVED, "Messages received.");
    metrics::describe_counter!(MESSAGES_SUCCEEDED, "Messages processed successfully and deleted.");
    metrics::describe_counter!(MESSAGES_RETRIED, "Messages put back in the queue for a retry.");
    metrics::describe_counter!(MESSAGES_DEAD_LETTERED, "Messages sent to the dead-letter queue.");
    metrics::describe_counter!(MESSAGES_DUPLICATES, "Duplicates acknowledged without running.");
    metrics::describe_counter!(HEARTBEAT_EXTENSIONS, "Visibility extensions by the heartbeat.");
    metrics::describe_counter!(LEASES_LOST, "Leases lost while a job ran.");
    metrics::describe_counter!(CIRCUIT_DEFERRALS, "Messages deferred unrun by an open circuit.");
    metrics::describe_histogram!(HANDLER_DURATION, metrics::Unit::Seconds, "Handler run time.");
    metrics::describe_histogram!(MESSAGE_AGE, metrics::Unit::Seconds, "Message age at receive.");
    metrics::describe_gauge!(IN_FLIGHT, "Messages in flight in this worker.");
    metrics::describe_gauge!(QUEUE_VISIBLE, "Approximate visible messages.");
    metrics::describe_gauge!(QUEUE_IN_FLIGHT, "Approximate in-flight messages.");
    metrics::describe_gauge!(QUEUE_DELAYED, "Approximate delayed messages.");
    metrics::describe_gauge!(DLQ_MESSAGES, "Messages in a watched dead-letter queue.");
    metrics::describe_counter!(LOG_WRITE_ERRORS, "Log writes that failed and were dropped.");
}

/// One queue's metric handles, resolved once so the hot path does not build keys per message.
#[derive(Debug)]
pub(crate) struct QueueMetrics {
    queue: Arc<str>,
    pub(crate) received: Counter,
    pub(crate) extensions: Counter,
    pub(crate) leases_lost: Counter,
    pub(crate) age: Histogram,
    by_job_type: Mutex<HashMap<&'static str, Arc<JobMetrics>>>,
}

/// One (queue, job type)'s outcome counters and duration histogram.
#[derive(Debug)]
pub(crate) struct JobMetrics {
    pub(crate) succeeded: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) duplicates: Counter,
    pub(crate) cancelled: Counter,
    pub(crate) duration: Histogram,
}

impl QueueMetrics {
    pub(crate) fn new(queue: Arc<str>) -> Self {
        Self {
            received: metrics::counter!(MESSAGES_RECEIVED, "queue" => Arc::clone(&queue)),
            extensions: metrics::counter!(HEARTBEAT_EXTENSIONS, "queue" => Arc::clone(&queue)),
            leases_lost: metrics::counter!(LEASES_LOST, "queue" => Arc::clone(&queue)),
            age: metrics::histogram!(MESSAGE_AGE, "queue" => Arc::clone(&queue)),
            by_job_type: Mutex::new(HashMap::new()),
            queue,
        }
    }

    /// The handles for `job_type` (`unknown` when no handler matched).
    pub(crate) fn job(&self, job_type: Option<&'static str>) -> Arc<JobMetrics> {
        let job_type = job_type.unwrap_or("unknown");
        let mut map = self.by_job_type.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(job_type).or_insert_with(|| {
            let queue = Arc::clone(&self.queue);
            Arc::new(JobMetrics {
                succeeded: metrics::counter!(MESSAGES_SUCCEEDED, "queue" => Arc::clone(&queue), "job_type" => job_type),
                retried: metrics::counter!(MESSAGES_RETRIED, "queue" => Arc::clone(&queue), "job_type" => job_type),
                dead_lettered: metrics::counter!(MESSAGES_DEAD_LETTERED, "queue" => Arc::clone(&queue), "job_type" => job_type),
                duplicates: metrics::counter!(MESSAGES_DUPLICATES, "queue" => Arc::clone(&queue), "job_type" => job_type),
                cancelled: metrics::counter!(MESSAGES_CANCELLED, "queue" => queue, "job_type" => job_type),
                duration: metrics::histogram!(HANDLER_DURATION, "job_type" => job_type),
            })
        });
        Arc::clone(entry)
    }
}

/// The worker-wide in-flight gauge.
pub(crate) fn in_flight_gauge() -> Gauge {
    metrics::gauge!(IN_FLIGHT)
}

/// Records a queue's depth.
pub(crate) fn record_depth(queue: &Arc<str>, depth: conveyor_core::QueueDepth) {
    metrics::gauge!(QUEUE_VISIBLE, "queue" => Arc::clone(queue)).set(depth.visible as f64);
    metrics::gauge!(QUEUE_IN_FLIGHT, "queue" => Arc::clone(queue)).set(depth.in_flight as f64);
    metrics::gauge!(QUEUE_DELAYED, "queue" => Arc::clone(queue)).set(depth.delayed as f64);
}

/// Records a watched dead-letter queue's depth: [`DLQ_MESSAGES`], and the same gauges as a queue.
pub(crate) fn record_dlq_depth(dlq: &Arc<str>, depth: conveyor_core::QueueDepth) {
    let total = depth.visible + depth.in_flight + depth.delayed;
    metrics::gauge!(DLQ_MESSAGES, "queue" => Arc::clone(dlq)).set(total as f64);
    record_depth(dlq, depth);
}

/// Copies the process's count of dropped log writes into its counter (before each `/metrics` render).
pub(crate) fn record_log_write_errors() {
    metrics::counter!(LOG_WRITE_ERRORS).absolute(conveyor_core::log_output::write_errors());
}

/// Records a circuit deferral.
pub(crate) fn record_deferral(downstream: &Arc<str>) {
    metrics::counter!(CIRCUIT_DEFERRALS, "downstream" => Arc::clone(downstream)).increment(1);
}

/// Seconds as f64 for histograms.
pub(crate) fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
