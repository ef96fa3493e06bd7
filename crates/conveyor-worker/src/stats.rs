//! Queue depth metrics, read every `stats_interval`: the worker's queues and the dead-letter queues it
//! was asked to watch.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::port::Queue;
use tokio_util::sync::CancellationToken;

use crate::telemetry::{record_depth, record_dlq_depth};

/// Reads each queue's depth, and each watched DLQ's, every `interval` until `stop`.
pub(crate) async fn run(
    queues: Vec<(Arc<str>, Arc<dyn Queue>)>,
    dead_letter_queues: Vec<Arc<dyn Queue>>,
    interval: Duration,
    stop: CancellationToken,
) {
    if interval.is_zero() {
        return;
    }
    let dead_letter_queues: Vec<(Arc<str>, Arc<dyn Queue>)> = dead_letter_queues
        .into_iter()
        .map(|queue| (Arc::from(queue.name()), queue))
        .collect();
    loop {
        for (name, queue) in &queues {
            match queue.depth().await {
                Ok(depth) => record_depth(name, depth),
                Err(error) => tracing::debug!(%error, queue = %name, "cannot read the queue's depth"),
            }
        }
        for (name, dlq) in &dead_letter_queues {
            match dlq.depth().await {
                Ok(depth) => record_dlq_depth(name, depth),
                Err(error) => {
                    tracing::debug!(%error, dlq = %name, "cannot read the dead-letter queue's depth")
                }
            }
        }
        tokio::select! {
            biased;
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
