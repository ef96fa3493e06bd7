//! The Prometheus recorder behind `/metrics` (feature `prometheus`). Without the feature the worker
//! installs no recorder: its metrics go to whatever recorder the application installed, and `/metrics`
//! says so.

#[cfg(feature = "prometheus")]
pub(crate) use exporter::{MetricsHandle, install_recorder};

#[cfg(not(feature = "prometheus"))]
pub(crate) use none::{MetricsHandle, install_recorder};

#[cfg(feature = "prometheus")]
mod exporter {
    use std::sync::OnceLock;

    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

    use crate::telemetry::*;

    /// What `/metrics` renders from.
    pub(crate) type MetricsHandle = PrometheusHandle;

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
}

#[cfg(not(feature = "prometheus"))]
mod none {
    /// No exporter is built in: never constructed.
    #[derive(Clone, Copy, Debug)]
    pub(crate) enum MetricsHandle {}

    impl MetricsHandle {
        pub(crate) fn run_upkeep(&self) {
            match *self {}
        }

        pub(crate) fn render(&self) -> String {
            match *self {}
        }
    }

    /// The build has no Prometheus exporter.
    pub(crate) fn install_recorder() -> Option<MetricsHandle> {
        None
    }
}
