//! Applying an outcome to the queue: delete, re-time, or dead-letter then delete.

use std::time::Duration;

use conveyor_core::limits::MAX_VISIBILITY_TIMEOUT;
use conveyor_core::{
    AckReason, Disposition, EntryError, Lease, Message, Outcome, Processed, RejectMode, VisibilityChange,
    reject,
};

use crate::deleter::DeleteRequest;
use crate::heartbeat::Registration;
use crate::report::add;
use crate::runtime::Runtime;
use crate::telemetry::seconds;

/// Tries for a visibility change that fails transiently.
const VISIBILITY_ATTEMPTS: u32 = 3;
/// The first pause between tries; doubles each time.
const VISIBILITY_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether the message left the queue (deleted, or dead-lettered and deleted) or went back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Gone from the queue (or being deleted): the next message of its FIFO group may run.
    Removed,
    /// Back in the queue: the rest of its FIFO group must go back too.
    Returned,
}

/// Applies the pipeline's outcome for `message` of queue `queue`; the heartbeat registration ends
/// once the queue call answered.
pub(crate) async fn apply(
    runtime: &Runtime,
    queue: usize,
    message: &Message,
    processed: Processed,
    lease: &Lease,
    registration: Registration,
) -> Settled {
    let job = runtime.metrics[queue].job(processed.job_type);
    if let Some(duration) = processed.handler_duration {
        job.duration.record(seconds(duration));
    }
    let counters = runtime.status.counters();
    match &processed.outcome {
        Outcome::Ack(reason) => {
            match reason {
                AckReason::Completed => {
                    add(&counters.succeeded, 1);
                    job.succeeded.increment(1);
                    tracing::debug!("job succeeded");
                }
                AckReason::Duplicate => {
                    add(&counters.duplicates, 1);
                    job.duplicates.increment(1);
                    tracing::info!("duplicate acknowledged without running");
                }
            }
            delete(runtime, queue, message, registration);
            Settled::Removed
        }
        Outcome::Retry { delay, reason } => {
            if runtime.hard_stop.is_cancelled() && lease.cancellation().is_cancelled() {
                add(&counters.released_at_shutdown, 1);
                tracing::info!("cancelled at shutdown; the message is visible again");
            } else {
                add(&counters.retried, 1);
                job.retried.increment(1);
                tracing::info!(%reason, ?delay, "job will be retried");
            }
            set_visibility(runtime, queue, message, *delay).await;
            drop(registration);
            Settled::Returned
        }
        Outcome::Reject(failure) => {
            let mode = runtime.config.reject_mode;
            let target = runtime.queues[queue].as_ref();
            match reject(target, message, failure, mode, processed.fallback_delay()).await {
                Disposition::Delete => {
                    add(&counters.dead_lettered, 1);
                    job.dead_lettered.increment(1);
                    delete(runtime, queue, message, registration);
                    Settled::Removed
                }
                Disposition::Visible(delay) => {
                    if mode == RejectMode::LeaveToRedrive {
                        add(&counters.dead_lettered, 1);
                        job.dead_lettered.increment(1);
                        tracing::info!(reason = %failure.error, "permanent failure; left to the queue's redrive");
                    } else {
                        add(&counters.retried, 1);
                        job.retried.increment(1);
                    }
                    set_visibility(runtime, queue, message, delay).await;
                    drop(registration);
                    Settled::Returned
                }
            }
        }
    }
}

fn delete(runtime: &Runtime, queue: usize, message: &Message, registration: Registration) {
    runtime.deleter.delete(DeleteRequest {
        queue,
        receipt: message.receipt_handle.clone(),
        message_id: message.id.clone(),
        registration,
    });
}

/// Makes one message visible again after `delay`, retrying transient failures a few times. If it
/// still fails, the message comes back when its current visibility timeout ends: later, never lost.
pub(crate) async fn set_visibility(runtime: &Runtime, queue: usize, message: &Message, delay: Duration) {
    let change = VisibilityChange {
        receipt_handle: message.receipt_handle.clone(),
        timeout: delay.min(MAX_VISIBILITY_TIMEOUT),
    };
    change_visibility(runtime, queue, vec![change]).await;
}

/// Makes messages visible again at once, in the given order (one batch call; the queue splits it
/// into calls of 10 in order).
pub(crate) async fn release_in_order(runtime: &Runtime, queue: usize, messages: &[&Message]) {
    let changes: Vec<VisibilityChange> = messages
        .iter()
        .map(|message| VisibilityChange {
            receipt_handle: message.receipt_handle.clone(),
            timeout: Duration::ZERO,
        })
        .collect();
    change_visibility(runtime, queue, changes).await;
}

async fn change_visibility(runtime: &Runtime, queue: usize, mut remaining: Vec<VisibilityChange>) {
    let target = &runtime.queues[queue];
    for attempt in 0..VISIBILITY_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(VISIBILITY_RETRY_PAUSE * 2u32.pow(attempt - 1)).await;
        }
        let failures = match target.change_visibility_batch(&remaining).await {
            Ok(failures) => failures,
            Err(error) if error.is_retryable() => {
                tracing::warn!(%error, queue = %target.name(), "visibility change failed; retrying");
                continue;
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    queue = %target.name(),
                    "visibility change refused; the message comes back when its visibility timeout ends"
                );
                return;
            }
        };
        let mut retry = Vec::new();
        for failure in failures {
            let Some(change) = remaining.get(failure.index) else {
                continue;
            };
            match failure.error {
                EntryError::LeaseLost(reason) => {
                    tracing::debug!(%reason, "visibility change skipped: the message is no longer ours");
                }
                EntryError::Failed {
                    sender_fault: false, ..
                } => retry.push(change.clone()),
                EntryError::Failed { code, message, .. } => {
                    tracing::warn!(%code, %message, "visibility change refused; the message comes back later");
                }
            }
        }
        if retry.is_empty() {
            return;
        }
        remaining = retry;
    }
    tracing::warn!(
        queue = %target.name(),
        messages = remaining.len(),
        "visibility change still failing; the messages come back when their visibility timeout ends"
    );
}
