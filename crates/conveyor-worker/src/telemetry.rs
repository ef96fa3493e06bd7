//! Metric names and the per-queue metric handles the hot path uses (the Prometheus recorder is in
//! `prometheus`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

pub use conveyor_core::metric_names::{
    CIRCUIT_DEFERRALS, DLQ_MESSAGES, HANDLER_DURATION, HEARTBEAT_EXTENSIONS, IN_FLIGHT, LEASES_LOST,
    LOG_WRITE_ERRORS, MESSAGE_AGE, MESSAGES_CANCELLED, MESSAGES_DEAD_LETTERED, MESSAGES_DUPLICATES,
    MESSAGES_RECEIVED, MESSAGES_RETRIED, MESSAGES_SUCCEEDED, QUEUE_DELAYED, QUEUE_IN_FLIGHT, QUEUE_VISIBLE,
};

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
pub(crate) fn record_depth(queue: &Arc<str>, depth: conveyor_core::port::QueueDepth) {
    metrics::gauge!(QUEUE_VISIBLE, "queue" => Arc::clone(queue)).set(depth.visible as f64);
    metrics::gauge!(QUEUE_IN_FLIGHT, "queue" => Arc::clone(queue)).set(depth.in_flight as f64);
    metrics::gauge!(QUEUE_DELAYED, "queue" => Arc::clone(queue)).set(depth.delayed as f64);
}

/// Records a watched dead-letter queue's depth: [`DLQ_MESSAGES`], and the same gauges as a queue.
pub(crate) fn record_dlq_depth(dlq: &Arc<str>, depth: conveyor_core::port::QueueDepth) {
    let total = depth.visible + depth.in_flight + depth.delayed;
    metrics::gauge!(DLQ_MESSAGES, "queue" => Arc::clone(dlq)).set(total as f64);
    record_depth(dlq, depth);
}

/// Copies the process's count of dropped log writes into its counter (before each `/metrics` render).
pub(crate) fn record_log_write_errors() {
    metrics::counter!(LOG_WRITE_ERRORS).absolute(conveyor_core::runtime::write_errors());
}

/// Records a circuit deferral.
pub(crate) fn record_deferral(downstream: &Arc<str>) {
    metrics::counter!(CIRCUIT_DEFERRALS, "downstream" => Arc::clone(downstream)).increment(1);
}

/// Seconds as f64 for histograms.
pub(crate) fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
