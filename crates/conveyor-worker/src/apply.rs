//! Applying an outcome to the queue: delete, re-time, defer with a delayed copy, or dead-letter then
//! delete. Every call is bounded by the time left before the message's visibility deadline
//! ([`crate::retry`]): past it the message reappears on its own, so nothing is gained by waiting longer.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::runtime::{DeferCause, DeferralError, deferred_copy, deferred_copy_for, retried_copy};
use conveyor_core::trace::Settlement;
use conveyor_core::{
    RejectMode,
    message::Message,
    port::{EntryError, OutgoingMessage, VisibilityChange},
    runtime::{
        AckReason, Disposition, Failure, Lease, Origin, Outcome, Processed, RetryPath, reject, retry_path,
        run_number,
    },
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::deleter::DeleteRequest;
use crate::report::add;
use crate::retry::{self, Attempts};
use crate::runtime::{Held, Runtime};
use crate::telemetry::{JobMetrics, seconds};

/// Whether the message left the queue (deleted, or dead-lettered and deleted) or went back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Gone from the queue: the next message of its FIFO group may run.
    Removed,
    /// Back in the queue: the rest of its FIFO group must go back too.
    Returned,
}

/// One received message, as the outcome step needs it.
pub(crate) struct Applying<'a> {
    pub(crate) queue: usize,
    pub(crate) message: &'a Message,
    pub(crate) lease: &'a Arc<Lease>,
    /// When SQS's 12 hours of visibility end: they count from the message's *first* receive
    /// (`ApproximateFirstReceiveTimestamp`), not from this receipt.
    pub(crate) visibility_cap: Instant,
}

impl Applying<'_> {
    /// The longest a visibility change may keep the message in flight within SQS's limit: counted
    /// from the latest the call may reach SQS (it is tried until the lease ends), not from now.
    pub(crate) fn room(&self) -> Duration {
        let latest_call = self.lease.latest_visible_until().max(Instant::now());
        self.visibility_cap.saturating_duration_since(latest_call)
    }
}

/// Applies the pipeline's outcome; `held` (heartbeat, slot) is released once the queue call answered.
/// Counts a failed run that the worker retries in place (a FIFO head whose group waits) as `apply`
/// counts a retry.
pub(crate) fn record_retry_in_place(runtime: &Runtime, queue: usize, processed: &Processed) {
    let job = runtime.metrics[queue].job(processed.job_type);
    if let Some(duration) = processed.handler_duration {
        job.duration.record(seconds(duration));
    }
    add(&runtime.status.counters().retried, 1);
    job.retried.increment(1);
}

pub(crate) async fn apply(
    runtime: &Runtime,
    target: Applying<'_>,
    processed: Processed,
    held: Held,
) -> Settled {
    // Inside the message's span (`job::run_message`): a failed run marks it an error now, and what
    // settlement did goes on it once the queue call answered.
    let span = tracing::Span::current();
    conveyor_core::trace::record_run_error(&span, &processed.outcome);
    let (settled, settlement) = settle(runtime, target, processed, held).await;
    conveyor_core::trace::record_settlement(&span, settlement);
    settled
}

/// Applies the outcome; returns what it did for the FIFO group and for the message's span.
async fn settle(
    runtime: &Runtime,
    target: Applying<'_>,
    processed: Processed,
    held: Held,
) -> (Settled, Settlement) {
    let queue = target.queue;
    let job = runtime.metrics[queue].job(processed.job_type);
    if let Some(duration) = processed.handler_duration {
        job.duration.record(seconds(duration));
    }
    let counters = runtime.status.counters();
    let fallback = processed.fallback_delay();
    match processed.outcome {
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
                AckReason::Cancelled => {
                    job.cancelled.increment(1);
                    tracing::info!("cancelled job dropped without running");
                }
                AckReason::Ignored => tracing::info!("notice without a job acknowledged"),
            }
            // A large payload's object goes only once the message's delete is confirmed: a redelivery
            // before that must still find it.
            let discard =
                reason == AckReason::Completed && runtime.pipeline.discards_payload_of(target.message);
            let settled = delete(runtime, &target, held, discard).await;
            if discard && settled == Settled::Removed {
                runtime.pipeline.discard_payload(target.message).await;
            }
            let settlement = match settled {
                Settled::Removed => Settlement::Acknowledged(reason),
                Settled::Returned => Settlement::Released,
            };
            (settled, settlement)
        }
        Outcome::Retry { delay, reason } => {
            if runtime.hard_stop.is_cancelled() && target.lease.cancellation().is_cancelled() {
                add(&counters.released_at_shutdown, 1);
                tracing::info!("cancelled at shutdown; the message is visible again");
                set_visibility(runtime, &target, delay).await;
                drop(held);
                return (Settled::Returned, Settlement::Released);
            }
            let origin = Origin {
                queue: &runtime.names[queue],
                handler: processed.job_type.unwrap_or(""),
                attempt: run_number(target.message, processed.run),
                receive: target.message.receive_count.max(1),
                max_attempts: runtime.queues[queue].max_receive_count(),
            };
            let fifo = runtime.queues[queue].is_fifo();
            match retry_path(origin, &reason, fifo, delay, target.room()) {
                RetryPath::DeadLetter(failure) => {
                    tracing::info!(%reason, "retryable failure at the last allowed receive of a FIFO message; dead-lettered with the reason");
                    // The run's release said `retrying`: a tracked job's status says `dead_lettered`.
                    let until = Some(target.lease.latest_visible_until());
                    let pipeline = &runtime.pipeline;
                    pipeline
                        .unrun_at_the_last_receive(target.message, &failure, until)
                        .await;
                    dead_letter(runtime, &target, &failure, fallback, held, &job).await
                }
                RetryPath::Copy => {
                    add(&counters.retried, 1);
                    job.retried.increment(1);
                    // SQS would move the message to the DLQ at its next receive, or refuse to hold it
                    // that long (its 12 hours count from the first receive): the retry goes on a fresh
                    // copy, which carries the runs and starts its own receives and 12 hours.
                    tracing::info!(%reason, ?delay, runs = origin.attempt, "job will be retried on a fresh copy");
                    let copy = retried_copy(target.message, delay, false, origin.attempt);
                    continue_on_copy(runtime, &target, copy, delay, held).await;
                    (Settled::Returned, Settlement::Retried)
                }
                RetryPath::Visibility => {
                    add(&counters.retried, 1);
                    job.retried.increment(1);
                    tracing::info!(%reason, ?delay, "job will be retried");
                    set_visibility(runtime, &target, delay).await;
                    drop(held);
                    (Settled::Returned, Settlement::Retried)
                }
            }
        }
        Outcome::Defer { delay, reason, cause } => {
            defer(runtime, &target, delay, &reason, Some(cause), held).await
        }
        Outcome::Reject(failure) => dead_letter(runtime, &target, &failure, fallback, held, &job).await,
    }
}

/// Sends the message to the DLQ with `failure`, then deletes it (or, by the reject mode or when the
/// DLQ send fails, makes it visible after `fallback`).
async fn dead_letter(
    runtime: &Runtime,
    target: &Applying<'_>,
    failure: &Failure,
    fallback: Duration,
    held: Held,
    job: &JobMetrics,
) -> (Settled, Settlement) {
    let counters = runtime.status.counters();
    let queue = target.queue;
    let mode = runtime.config.reject_mode;
    let queue_ref = runtime.queues[queue].as_ref();
    let left = target
        .lease
        .latest_visible_until()
        .saturating_duration_since(Instant::now());
    let disposition =
        match tokio::time::timeout(left, reject(queue_ref, target.message, failure, mode, fallback)).await {
            Ok(disposition) => disposition,
            Err(_) => {
                tracing::warn!(
                    "dead-letter send did not answer before the visibility deadline; the message comes back"
                );
                Disposition::Visible(fallback)
            }
        };
    match disposition {
        Disposition::Delete => {
            add(&counters.dead_lettered, 1);
            job.dead_lettered.increment(1);
            let settled = delete(runtime, target, held, false).await;
            (settled, Settlement::DeadLettered)
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
            // Back in the queue, no copy in a DLQ (left to SQS's redrive, or no DLQ to
            // send to): its span says so.
            set_visibility(runtime, target, delay).await;
            drop(held);
            (Settled::Returned, Settlement::Retried)
        }
    }
}

/// Puts the message back without spending a receive: a delayed copy, then the original's delete
/// (`Deferred`); when the copy cannot be made or sent, a visibility change (`Retried`).
pub(crate) async fn defer(
    runtime: &Runtime,
    target: &Applying<'_>,
    delay: Duration,
    reason: &str,
    cause: Option<DeferCause>,
    held: Held,
) -> (Settled, Settlement) {
    let counters = runtime.status.counters();
    let fifo = runtime.queues[target.queue].is_fifo();
    let copy = match cause {
        Some(cause) => deferred_copy_for(target.message, delay, fifo, cause, runtime.pipeline.now()),
        None => deferred_copy(target.message, delay, fifo),
    };
    match copy {
        Ok(copy) => {
            tracing::info!(%reason, ?delay, "deferring with a delayed copy");
            if continue_on_copy(runtime, target, Ok(copy), delay, held).await {
                add(&counters.deferred, 1);
                (Settled::Returned, Settlement::Deferred)
            } else {
                add(&counters.retried, 1);
                (Settled::Returned, Settlement::Retried)
            }
        }
        Err(why) => {
            add(&counters.retried, 1);
            tracing::warn!(%reason, %why, ?delay, "cannot defer with a copy; putting the message back (this receive counts toward maxReceiveCount)");
            set_visibility(runtime, target, delay).await;
            drop(held);
            (Settled::Returned, Settlement::Retried)
        }
    }
}

/// Sends `copy` (the job, to be received again after `delay`), then deletes this receipt: true. When
/// the copy cannot be built or sent, makes the message visible after `delay` instead (kept within
/// SQS's limit): false. Send first, delete second: a crash between leaves both, and the idempotency
/// record makes the second run a duplicate.
async fn continue_on_copy(
    runtime: &Runtime,
    target: &Applying<'_>,
    copy: Result<OutgoingMessage, DeferralError>,
    delay: Duration,
    held: Held,
) -> bool {
    let sent = match copy {
        Ok(copy) => send_while_held(runtime, target, &copy).await,
        Err(why) => Err(why.to_string()),
    };
    match sent {
        Ok(copy_id) => {
            tracing::info!(%copy_id, ?delay, "the copy was sent; deleting this receipt");
            delete(runtime, target, held, false).await;
            true
        }
        Err(error) => {
            tracing::warn!(%error, ?delay, "could not send the copy; putting the message back instead");
            set_visibility(runtime, target, delay).await;
            drop(held);
            false
        }
    }
}

/// How close to SQS's 12-hour visibility limit a copy's send is still tried while the message is held.
const HOLD_MARGIN: Duration = Duration::from_secs(120);
/// The longest pause between rounds of tries of a copy's send while the message is held.
const HOLD_PAUSE: Duration = Duration::from_secs(30);

/// Sends `copy`, holding the message in flight (its heartbeat goes on) while the sends fail, round after
/// round, until one lands, the lease ends (lost, or shutdown cancelled it), SQS's 12 hours of
/// visibility come within [`HOLD_MARGIN`], or SQS refuses the copy for good.
///
/// Design note: a failed copy used to fall back to a visibility change at once, and every receive counts
/// toward `maxReceiveCount`: a long enough `SendMessage` outage dead-lettered jobs that were only
/// hopping towards their due time (never run). Holding the message spends no receive; it keeps its
/// in-flight slot, so a worker that cannot send stops receiving more (backpressure).
async fn send_while_held(
    runtime: &Runtime,
    target: &Applying<'_>,
    copy: &OutgoingMessage,
) -> Result<String, String> {
    let queue = &runtime.queues[target.queue];
    let mut pause = Duration::from_secs(1);
    loop {
        let deadline = target.lease.latest_visible_until();
        let error = match retry::until(deadline, || queue.send(copy.clone())).await {
            Ok(id) => return Ok(id),
            Err(error) => error,
        };
        let room = target.visibility_cap.saturating_duration_since(Instant::now());
        let lease = target.lease.cancellation();
        if !error.is_retryable() || lease.is_cancelled() || room <= HOLD_MARGIN {
            return Err(error.to_string());
        }
        tracing::warn!(%error, pause_ms = pause.as_millis() as u64, "the copy's send failed; holding the message in flight and trying again");
        tokio::select! {
            biased;
            () = tokio::time::sleep(pause) => {}
            () = lease.cancelled() => return Err(error.to_string()),
        }
        pause = (pause * 2).min(HOLD_PAUSE);
    }
}

/// Hands the delete to the batcher. On FIFO queues, and when `confirmed_only` (a large payload's object
/// is deleted next), waits until it is confirmed: the next message of the group may run only once its
/// predecessor is gone (a failed delete sends the rest of the group back).
async fn delete(runtime: &Runtime, target: &Applying<'_>, held: Held, confirmed_only: bool) -> Settled {
    let fifo = runtime.queues[target.queue].is_fifo();
    let (confirm, confirmed) = if fifo || confirmed_only {
        let (sender, receiver) = oneshot::channel();
        (Some(sender), Some(receiver))
    } else {
        (None, None)
    };
    let Some(pending) = runtime.deleter.slot().await else {
        return Settled::Returned;
    };
    let Held { registration, .. } = held;
    runtime.deleter.delete(DeleteRequest {
        queue: target.queue,
        receipt: target.message.receipt_handle.clone(),
        message_id: target.message.id.clone(),
        lease: Arc::clone(target.lease),
        registration,
        pending,
        confirm,
    });
    match confirmed {
        None => Settled::Removed,
        Some(receiver) => match receiver.await {
            Ok(true) => Settled::Removed,
            _ => Settled::Returned,
        },
    }
}

/// Makes one message visible again after `delay` (kept within SQS's 12 hours from its first receive),
/// retrying transient failures until its visibility deadline. If it still fails, the message comes
/// back when its current visibility timeout ends: later, never lost.
pub(crate) async fn set_visibility(runtime: &Runtime, target: &Applying<'_>, delay: Duration) {
    if past_the_limit(target.visibility_cap) {
        tracing::debug!(
            "past SQS's 12 hours from the first receive: no visibility change; the message comes back when its visibility timeout ends"
        );
        return;
    }
    let room = target.room();
    let change = VisibilityChange {
        receipt_handle: target.message.receipt_handle.clone(),
        timeout: delay.min(room),
    };
    // Tried no later than the limit either: a try reaching SQS past it would be refused.
    let deadline = target.lease.latest_visible_until().min(target.visibility_cap);
    change_visibility(runtime, target.queue, vec![change], deadline).await;
}

/// Whether SQS's 12 hours from the message's first receive have passed: no visibility change at all
/// is then asked for (not even to 0: SQS may refuse any change past its limit), and the message comes
/// back when the visibility timeout its receive gave it ends.
pub(crate) fn past_the_limit(visibility_cap: Instant) -> bool {
    visibility_cap <= Instant::now()
}

/// Makes messages visible again at once, in the given order (one batch call; the queue splits it
/// into calls of 10 in order), trying until `deadline`.
pub(crate) async fn release_in_order(
    runtime: &Runtime,
    queue: usize,
    messages: &[&Message],
    deadline: Instant,
) {
    let changes: Vec<VisibilityChange> = messages
        .iter()
        .map(|message| VisibilityChange {
            receipt_handle: message.receipt_handle.clone(),
            timeout: Duration::ZERO,
        })
        .collect();
    change_visibility(runtime, queue, changes, deadline).await;
}

async fn change_visibility(
    runtime: &Runtime,
    queue: usize,
    mut remaining: Vec<VisibilityChange>,
    deadline: Instant,
) {
    let target = &runtime.queues[queue];
    let mut attempts = Attempts::until(deadline);
    while let Some(left) = attempts.next().await {
        let failures = match attempts
            .run(left, target.change_visibility_batch(&remaining))
            .await
        {
            Ok(failures) => failures,
            Err(error) if error.is_retryable() => {
                if attempts.tries() == 1 {
                    tracing::warn!(%error, queue = %target.name(), "visibility change failed; retrying");
                }
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
                EntryError::LeaseLost(reason) | EntryError::NotIssued(reason) => {
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
        "visibility change still failing at the deadline; the messages come back when their visibility timeout ends"
    );
}
