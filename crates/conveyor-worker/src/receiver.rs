//! Receive loops: long polls gated by free capacity, with backoff on errors.
//!
//! # How many loops
//!
//! Each queue gets one loop per 20 in-flight slots of its share of `max_in_flight` (its weight's share
//! in weighted mode; in strict mode too, so the urgent queue has the most loops), at least 1 and at
//! most 4. One loop brings up to 10 messages per round trip (10–30 ms on SQS in-region), a few hundred
//! messages a second, more than most handlers finish; extra loops matter only to refill a large
//! capacity quickly after a burst. Beyond 4, loops only add empty long polls (each one a billed
//! request every 20 s when the queue is idle) and contend for the same messages.
//!
//! A loop receives only when it holds free slots: it waits for one, takes up to `batch - 1` more that
//! are free without waiting, and asks for that many messages (`MaxNumberOfMessages = min(10, free)`).
//! While the queue may have a backlog (the last receive brought messages), a loop that holds fewer than a
//! full batch waits a moment for more slots to free up (the time the missing slots take at the rate
//! slots free, at most [`RECEIVE_LINGER`]), and a queue's loops gather in turns (see [`gather`]), so
//! receives come back full instead of carrying one or two messages each, without leaving slots idle
//! for long.
//! After an empty receive it asks for one message only, so idle loops hold one slot each, not ten,
//! and a busy queue elsewhere keeps the rest. Each message runs in its own task with its slot; the
//! loop goes straight back to receiving, so receiving and processing overlap.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::WorkerConfig;
use conveyor_core::limits::MAX_RECEIVE_MESSAGES;
use conveyor_core::runtime::{doubling, equal_jitter, visibility_cap};
use conveyor_core::{
    message::Message,
    port::{Queue, QueueError},
    runtime::Lease,
};
use tokio::time::Instant;

use crate::apply::release_in_order;
use crate::capacity::Permit;
use crate::job::{Received, run_group, run_message};
use crate::report::add;
use crate::runtime::{Held, InFlight, Runtime};
use crate::telemetry::seconds;

/// The longest a loop waits for a fuller batch while the queue has a backlog.
pub(crate) const RECEIVE_LINGER: Duration = Duration::from_millis(20);

/// In-flight slots per receive loop.
const SLOTS_PER_LOOP: usize = 20;
/// The most loops one queue gets.
const MAX_LOOPS_PER_QUEUE: usize = 4;

/// The receive loops to run: (queue index, messages per receive), one entry per loop.
pub(crate) fn plan_loops(config: &WorkerConfig) -> Vec<(usize, usize)> {
    let total_weight: u64 = config
        .queues
        .iter()
        .map(|queue| u64::from(queue.weight.max(1)))
        .sum();
    let mut loops = Vec::new();
    for (index, queue) in config.queues.iter().enumerate() {
        let share =
            (config.max_in_flight as u64 * u64::from(queue.weight.max(1)) / total_weight.max(1)) as usize;
        let count = share.div_ceil(SLOTS_PER_LOOP).clamp(1, MAX_LOOPS_PER_QUEUE);
        loops.extend(std::iter::repeat_n(index, count));
    }
    let batch = (config.max_in_flight / loops.len().max(1)).clamp(1, MAX_RECEIVE_MESSAGES);
    loops.into_iter().map(|queue| (queue, batch)).collect()
}

/// Receives from queue `queue` until shutdown.
pub(crate) async fn receive_loop(runtime: Arc<Runtime>, queue: usize, batch: usize) {
    let target = Arc::clone(&runtime.queues[queue]);
    let stop = runtime.stop_receiving.clone();
    let wait = runtime.config.receive_wait;
    let mut failures: u32 = 0;
    let mut last_was_empty = false;
    // Whether the last receive suggested a backlog (it brought messages): then a loop short of slots
    // waits a moment for a fuller batch. SQS (and LocalStack) may return fewer messages than asked
    // even with thousands waiting, so a partial batch still counts.
    let mut last_brought_some = false;
    loop {
        let wanted = if last_was_empty { 1 } else { batch };
        let Some(mut permits) = gather(&runtime, queue, wanted, last_brought_some).await else {
            return;
        };

        let visibility = runtime.visibility[queue];
        let requested_at = Instant::now();
        let receive = target.receive_with_visibility(permits.len(), wait, visibility);
        tokio::pin!(receive);
        let result = tokio::select! {
            biased;
            result = &mut receive => result,
            () = stop.cancelled() => {
                release_late(&runtime, queue, receive, permits).await;
                return;
            }
        };
        let received_at = Instant::now();
        match result {
            Ok(messages) => {
                if failures > 0 {
                    tracing::info!(queue = %target.name(), failures, "receiving again");
                }
                failures = 0;
                runtime.status.set_receiving(queue, true);
                last_was_empty = messages.is_empty();
                last_brought_some = !messages.is_empty();
                runtime
                    .capacity
                    .set_backlogged(queue, messages.len() == permits.len());
                permits.truncate(messages.len());
                let times = ReceiveTimes {
                    requested_at,
                    received_at,
                };
                dispatch(&runtime, queue, messages, permits, times);
                if last_was_empty && wait.is_zero() {
                    // Short polls that find nothing would otherwise spin.
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
            Err(error) => {
                drop(permits);
                last_brought_some = false;
                runtime.capacity.set_backlogged(queue, false);
                failures = failures.saturating_add(1);
                runtime.status.set_receiving(queue, false);
                let pause = backoff(&error, failures);
                if error.is_retryable() {
                    tracing::warn!(%error, queue = %target.name(), failures, ?pause, "receive failed; backing off");
                } else {
                    tracing::error!(
                        %error,
                        queue = %target.name(),
                        failures,
                        ?pause,
                        "cannot receive from the queue; retrying slowly until it is fixed"
                    );
                }
                tokio::select! {
                    biased;
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// Gathers the slots for one receive of queue `queue`, in this loop's turn: waits for one, takes up to
/// `wanted` that are free, and while the queue may have a backlog (`backlogged`: the last receive
/// brought messages) waits up to [`Runtime::linger`] for the rest. `None` at shutdown. The wait only
/// happens when the worker is full (free slots are taken at once), so a lone message on a quiet worker
/// never waits.
///
/// # Design note: one loop gathers at a time
///
/// A queue's loops (up to 4) take turns (`Runtime::gathering`, a FIFO lock): the loop whose turn it
/// is gets every slot that frees, fills its batch and leaves to receive while the next one gathers.
/// Without turns, each slot that freed went to whichever loop asked first, every loop held a few, and
/// at 100 in flight with idempotency on a receive carried 6 of 10 messages. It cannot starve: the
/// lock is fair, a turn lasts at most one linger (20 ms) once the first slot is there, and receives
/// still overlap (the turn ends before the long poll). It adds no latency on an idle queue: without a
/// backlog a loop takes what is free and receives at once.
async fn gather(runtime: &Runtime, queue: usize, wanted: usize, backlogged: bool) -> Option<Vec<Permit>> {
    let stop = &runtime.stop_receiving;
    let _turn = tokio::select! {
        biased;
        () = stop.cancelled() => return None,
        turn = runtime.gathering[queue].lock() => turn,
    };
    let first = tokio::select! {
        biased;
        () = stop.cancelled() => return None,
        permit = runtime.capacity.acquire(queue) => permit,
    };
    let mut permits = vec![first];
    permits.extend(runtime.capacity.try_acquire(queue, wanted - 1));
    if !backlogged || permits.len() >= wanted {
        return Some(permits);
    }
    let until = Instant::now() + runtime.linger(permits.len(), wanted);
    while permits.len() < wanted {
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            permit = runtime.capacity.acquire(queue) => permits.push(permit),
            () = tokio::time::sleep_until(until) => break,
        }
        permits.extend(runtime.capacity.try_acquire(queue, wanted - permits.len()));
    }
    Some(permits)
}

/// A message a late receive brought at the last receive its redrive policy allows would reach the
/// DLQ by SQS's redrive, unrun and without a reason, once made visible. On a standard queue it goes
/// on as a deferred copy (unrun, this receive not counted as a run); on a FIFO queue, where a copy
/// would break the group's order, or when the copy could not be sent, it is dead-lettered now with a
/// reason (a tracked job's status says
/// so), or deleted when its job had completed (see `conveyor-core/src/unrun.rs`). Returns the
/// others, in order.
async fn settle_at_the_last_receive(
    runtime: &Runtime,
    queue: usize,
    messages: Vec<Message>,
    deadline: Instant,
) -> Vec<Message> {
    let source = runtime.queues[queue].as_ref();
    let Some(max) = source.max_receive_count() else {
        return messages;
    };
    let mut back = Vec::with_capacity(messages.len());
    for message in messages {
        if message.receive_count.max(1) < max {
            back.push(message);
            continue;
        }
        let attempt = message.attempt();
        if !source.is_fifo() {
            // Half the time for the copy, the rest to dead-letter it if the copy is not sent.
            let copy_by = deadline - deadline.saturating_duration_since(Instant::now()) / 2;
            let _ = tokio::time::timeout_at(copy_by, runtime.pipeline.before_unrun_copy(&message)).await;
            match sent_as_a_copy(source, &message, copy_by).await {
                CopySent::Sent => continue,
                CopySent::SentNotDeleted => {
                    back.push(message);
                    continue;
                }
                // Made visible, SQS's redrive would move it to the DLQ at its next receive, unrun,
                // with its status still "retrying" (simulator seeds 670, 1383): dead-letter it now
                // with its reason, as on a FIFO queue.
                CopySent::NotSent => {}
            }
        }
        let job_type = runtime.pipeline.router().job_type_for(&message).unwrap_or("");
        let failure = conveyor_core::runtime::not_run_at_the_last_receive(
            conveyor_core::runtime::NotRun::ShutDown,
            "the worker shut down as it was received, and each receive counted; redrive it when a worker \
             runs (on a FIFO queue, once the group's earlier messages are settled)",
            attempt,
            max,
            &runtime.names[queue],
            job_type,
        );
        let asked = runtime
            .pipeline
            .unrun_at_the_last_receive(&message, &failure, Some(deadline))
            .await;
        let disposition = if asked == conveyor_core::runtime::UnrunJob::Completed {
            Some(conveyor_core::runtime::Disposition::Delete)
        } else {
            let rejecting = conveyor_core::runtime::reject(
                source,
                &message,
                &failure,
                runtime.config.reject_mode,
                Duration::ZERO,
            );
            tokio::time::timeout_at(deadline, rejecting).await.ok()
        };
        let deleted = match disposition {
            Some(conveyor_core::runtime::Disposition::Delete) => {
                let receipt = [message.receipt_handle.clone()];
                matches!(
                    tokio::time::timeout_at(deadline, source.delete_batch(&receipt)).await,
                    Ok(Ok(failures)) if failures.is_empty()
                )
            }
            _ => false,
        };
        if !deleted {
            back.push(message);
        }
    }
    back
}

/// What became of a message sent on as a copy.
enum CopySent {
    /// The copy was sent and the message deleted.
    Sent,
    /// The copy was sent, the message not deleted: both exist, and the idempotency record makes the
    /// second a duplicate.
    SentNotDeleted,
    /// No copy was sent.
    NotSent,
}

/// Sends `message` on as a deferred copy due at once, then deletes it, by `deadline` (send first).
async fn sent_as_a_copy(source: &dyn Queue, message: &Message, deadline: Instant) -> CopySent {
    let Ok(copy) = conveyor_core::runtime::deferred_copy(message, Duration::ZERO, false) else {
        return CopySent::NotSent;
    };
    if !matches!(
        tokio::time::timeout_at(deadline, source.send(copy)).await,
        Ok(Ok(_))
    ) {
        return CopySent::NotSent;
    }
    let receipt = [message.receipt_handle.clone()];
    match tokio::time::timeout_at(deadline, source.delete_batch(&receipt)).await {
        Ok(Ok(failures)) if failures.is_empty() => CopySent::Sent,
        _ => CopySent::SentNotDeleted,
    }
}

/// How long shutdown waits, at least, for the long polls in flight (from the moment it begins; longer
/// only while jobs still drain, which costs nothing more).
///
/// # Design note: shutdown abandons the long poll in flight
///
/// A long poll waits up to `WaitTimeSeconds` (20 s) for a message, and SQS cannot be told to end
/// one early. Waiting for it made an idle worker's shutdown take up to 20 s. So shutdown waits for the
/// polls in flight only while jobs still drain (free: the worker waits anyway), and at least
/// [`POLL_GRACE`]; then it drops the request futures.
///
/// What SQS does with a dropped `ReceiveMessage`: it is not told. It keeps the long poll open until
/// its wait ends (reported against SQS in aws-sdk-java-v2#1395, aws-sdk-js#2350, aws-sdk-go-v2#2068;
/// measured on LocalStack by `an_idle_worker_stops_within_about_a_second`: a message sent just after
/// the stop came back 31.6 s later, after the queue's 30 s visibility timeout). A message it hands
/// that request (one already chosen as the answer was on its way, or one that arrives during the
/// rest of the poll's wait) is in flight
/// under a receipt nobody holds: it stays invisible for the visibility timeout the receive sent, then
/// comes back with `ApproximateReceiveCount` one higher (an idle loop asks for one message, so that is
/// at most one message per loop). It is not lost, only late, and it spends
/// one receive of its redrive policy without running: at the queue's `maxReceiveCount` that receive
/// can send it to the DLQ unrun (the same as any consumer that crashes with a message in flight). On
/// a FIFO queue its group waits behind it for that visibility timeout.
///
/// The grace covers the likeliest case: a poll that SQS was answering as the signal came (a long poll
/// answers as soon as a message is there; its answer is in transit for milliseconds, a few hundred
/// at worst). Its messages then land and are made visible again at once instead of after a visibility
/// timeout. One second covers that with room and still lets an idle worker stop within about a
/// second. Waiting longer buys little: what is at stake is a message that arrives in the poll's
/// remaining wait (at most one per idle loop, up to 4 per queue), and only the whole 20 s would cover
/// every one. A fleet that must not delay such a message by a visibility timeout can set a shorter
/// `receive_wait` (the exposure is that wait; each empty poll is a billed request).
pub(crate) const POLL_GRACE: Duration = Duration::from_secs(1);

/// How long settling a late receive's messages may take from its answer, at least. It may take as
/// long as shutdown waits for the receive loops anyway ([`Runtime::late_settle_by`]): with SQS and
/// the store answering in 4 s, two seconds settled nothing, and a message at its last allowed
/// receive reached the DLQ by SQS's redrive with its status still "retrying" (simulator seed 670).
pub(crate) const LATE_RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits for a receive that was in flight when shutdown began, until shutdown abandons it
/// ([`Runtime::abandon_polls`], see [`POLL_GRACE`]), and makes what it brought visible again at once.
async fn release_late(
    runtime: &Arc<Runtime>,
    queue: usize,
    receive: impl std::future::Future<Output = Result<Vec<Message>, QueueError>>,
    permits: Vec<Permit>,
) {
    let messages = tokio::select! {
        biased;
        result = receive => match result {
            Ok(messages) => messages,
            Err(_) => return,
        },
        () = runtime.abandon_polls.cancelled() => {
            tracing::debug!(
                queue = %runtime.names[queue],
                "shutdown abandons the long poll in flight; a message SQS hands it comes back after its \
                 visibility timeout"
            );
            return;
        }
    };
    if messages.is_empty() {
        return;
    }
    let answered = Instant::now();
    let shutdown_waits_until = runtime.late_settle_by.get().copied().unwrap_or(answered);
    let deadline = (answered + LATE_RELEASE_TIMEOUT)
        .max(shutdown_waits_until)
        .min(answered + runtime.visibility[queue]);
    let messages = settle_at_the_last_receive(runtime, queue, messages, deadline).await;
    let late: Vec<&Message> = messages.iter().collect();
    release_in_order(runtime, queue, &late, deadline).await;
    add(
        &runtime.status.counters().released_at_shutdown,
        messages.len() as u64,
    );
    tracing::info!(
        queue = %runtime.names[queue],
        messages = messages.len(),
        "a receive in flight at shutdown brought messages; they are visible again"
    );
    drop(permits);
}

/// The pause after the `failures`-th failed receive in a row: exponential with "equal jitter" (half
/// fixed, half random, so a fleet does not retry in step, and no pause is near zero). Transient
/// errors start at 200 ms and cap at 20 s; a missing queue or denied access starts at 1 s and caps
/// at 60 s: nothing will change until someone fixes it, but the worker must notice when they do.
pub(crate) fn backoff(error: &QueueError, failures: u32) -> Duration {
    let (base, cap) = if error.is_retryable() {
        (Duration::from_millis(200), Duration::from_secs(20))
    } else {
        (Duration::from_secs(1), Duration::from_secs(60))
    };
    equal_jitter(doubling(base, failures, cap))
}

/// When a receive was sent and when its answer arrived.
///
/// # Design note: the visibility deadline of a receive that answered late
///
/// SQS starts a message's visibility timeout when it hands the message out, somewhere between the
/// request and the answer: at once for a backlog, later in a long poll, and long before the answer
/// when the answer is slow to arrive (a stalled process, a slow network). Counting from the answer
/// would plan the heartbeat's first extension too late in that case, and the message could come back
/// to another consumer while it runs. So the lease is planned from the *request* (the earliest the
/// deadline may be: extensions come early, never late), while the claim is held, and an extension may
/// still be tried, until the deadline counted from the *answer* (the latest it may be). The first
/// extension makes it exact. The cost: a message that waited more than half the visibility timeout in
/// a long poll is extended once even when its job is short.
#[derive(Debug, Clone, Copy)]
struct ReceiveTimes {
    requested_at: Instant,
    received_at: Instant,
}

/// Starts a task per message (standard queues) or per message group (FIFO queues).
fn dispatch(
    runtime: &Arc<Runtime>,
    queue: usize,
    messages: Vec<Message>,
    permits: Vec<Permit>,
    times: ReceiveTimes,
) {
    let at = times.received_at;
    if messages.is_empty() {
        return;
    }
    let metrics = &runtime.metrics[queue];
    add(&runtime.status.counters().received, messages.len() as u64);
    metrics.received.increment(messages.len() as u64);
    let now = conveyor_core::wall_clock::now();
    let visible_until = times.requested_at + runtime.visibility[queue];
    let latest_visible_until = times.received_at + runtime.visibility[queue];
    let fifo = runtime.queues[queue].is_fifo();
    let mut groups: HashMap<String, Vec<Received>> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    for (message, permit) in messages.into_iter().zip(permits) {
        if let Some(age) = message.sent_at.and_then(|sent| now.duration_since(sent).ok()) {
            metrics.age.record(seconds(age));
        }
        let lease = Arc::new(
            Lease::with_token(visible_until, runtime.hard_stop.child_token())
                .with_process_stop(runtime.hard_stop.clone()),
        );
        lease.set_latest_visible_until(latest_visible_until);
        let visibility_cap = visibility_cap(&message, at, now);
        let registration =
            runtime
                .heartbeats
                .register(queue, &message, Arc::clone(&lease), at, visibility_cap);
        let received = Received {
            message,
            lease,
            held: Held {
                registration,
                permit,
                in_flight: InFlight::new(runtime),
            },
            visibility_cap,
        };
        if !fifo {
            runtime
                .tracker
                .spawn(run_message(Arc::clone(runtime), queue, received));
            continue;
        }
        let group = received
            .message
            .group_id
            .clone()
            .unwrap_or_else(|| received.message.id.clone());
        if !groups.contains_key(&group) {
            order.push(group.clone());
        }
        groups.entry(group).or_default().push(received);
    }
    for group in order {
        if let Some(members) = groups.remove(&group) {
            // The ticket is taken now, in receive order (see `conveyor_core::runtime::GroupGates`).
            let ticket = runtime.fifo_gates.ticket(&queue.to_string(), &group);
            runtime
                .tracker
                .spawn(run_group(Arc::clone(runtime), queue, group, ticket, members));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{PriorityMode, QueueConfig};

    use super::*;

    fn config(max_in_flight: usize, weights: &[u32]) -> WorkerConfig {
        WorkerConfig {
            queues: weights
                .iter()
                .map(|weight| QueueConfig {
                    url: "http://localhost/q".into(),
                    weight: *weight,
                })
                .collect(),
            max_in_flight,
            priority: PriorityMode::Weighted,
            ..WorkerConfig::default()
        }
    }

    #[test]
    fn loops_follow_capacity_and_weights() {
        assert_eq!(plan_loops(&config(1, &[1])), vec![(0, 1)]);
        assert_eq!(plan_loops(&config(10, &[1])), vec![(0, 10)]);
        assert_eq!(plan_loops(&config(100, &[1])), vec![(0, 10); 4]);
        let plan = plan_loops(&config(100, &[3, 1]));
        let per_queue = |queue| plan.iter().filter(|(q, _)| *q == queue).count();
        assert_eq!((per_queue(0), per_queue(1)), (4, 2));
        assert!(plan.iter().all(|(_, batch)| *batch == 10));
        let small = plan_loops(&config(4, &[1, 1, 1]));
        assert_eq!(small.len(), 3);
        assert!(small.iter().all(|(_, batch)| *batch == 1));
    }

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let transient = QueueError::Unavailable {
            message: "503".into(),
        };
        let first = backoff(&transient, 1);
        assert!(
            (Duration::from_millis(100)..=Duration::from_millis(200)).contains(&first),
            "{first:?}"
        );
        let late = backoff(&transient, 30);
        assert!(
            (Duration::from_secs(10)..=Duration::from_secs(20)).contains(&late),
            "{late:?}"
        );
        let missing = QueueError::QueueMissing { queue: "q".into() };
        assert!(backoff(&missing, 1) >= Duration::from_millis(500));
        assert!(backoff(&missing, 30) <= Duration::from_secs(60));
    }
}
