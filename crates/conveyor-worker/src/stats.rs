//! Queue depth metrics, read every `stats_interval`.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::Queue;
use tokio_util::sync::CancellationToken;

use crate::telemetry::record_depth;

/// Reads each queue's depth (and any watched DLQ's) every `interval` until `stop`.
pub(crate) async fn run(
    queues: Vec<(Arc<str>, Arc<dyn Queue>)>,
    interval: Duration,
    stop: CancellationToken,
) {
    if interval.is_zero() {
        return;
    }
    loop {
        for (name, queue) in &queues {
            match queue.depth().await {
                Ok(depth) => record_depth(name, depth),
                Err(error) => tracing::debug!(%error, queue = %name, "cannot read the queue's depth"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
