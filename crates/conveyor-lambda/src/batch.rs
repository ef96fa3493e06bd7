//! One `SqsEvent` → the pipeline → one `SqsBatchResponse`.
//!
//! # Design note: what is reported, and in which order things happen
//!
//! The event source mapping deletes every record that is *not* listed in `batchItemFailures` and leaves
//! the listed ones in flight until their visibility timeout. So:
//!
//! 1. **Ack** (done now, or a duplicate of a completed job): not listed; the mapping deletes it.
//! 2. **Retry**: listed, and *before* the response is returned its visibility is set to its backoff
//!    delay (one `ChangeMessageVisibilityBatch` per queue for the whole batch). Without this, every
//!    failed message would come back together at the queue's visibility timeout, which is the retry
//!    storm backoff exists to prevent. If that call fails the message still comes back, at the
//!    visibility timeout: later, never lost.
//! 3. **Reject**: sent to the DLQ with the failure recorded *during* the batch, then not listed, so the
//!    mapping deletes the original only after the DLQ holds the copy. If the DLQ send fails (or the
//!    queue has no DLQ), it is handled as a Retry with the fallback delay instead.
//! 4. **Defer** (not run: its key in progress elsewhere, the store unreachable): a delayed copy is sent
//!    (`conveyor-core/src/deferral.rs`) and the original is not listed, so the receive does not count toward
//!    `maxReceiveCount`; if the copy cannot be sent in time, handled as a Retry.
//! 5. **Not started** (too close to the invocation deadline): on a standard queue, deferred as in 4,
//!    without delay; on a FIFO queue, or when the copy does not go out in time, listed and untouched:
//!    it comes back at the queue's visibility timeout. Behind a failed message of its FIFO group: listed with that message's backoff,
//!    so the group comes back together, in order.
//! 6. **Lost** (the visibility renewal as the lanes start, `src/cover.rs`, was refused as no longer in
//!    flight under this receipt: received again elsewhere, deleted, or moved to the DLQ): never run and
//!    never touched (no backoff, no DLQ copy), listed so the mapping does not delete it. On a FIFO queue
//!    it blocks the rest of its group like a failure: another consumer may hold it, or may already have
//!    run the messages behind it, so running it here could reorder the group.
//! 7. **Handle never issued** (that renewal was refused as `ReceiptHandleIsInvalid`: the event is not
//!    Lambda's own, say a hand-written one under `cargo lambda invoke`): run and settled as any record,
//!    with no visibility call for it again (a retry is listed without its backoff); one warning per
//!    invocation says so (`src/cover.rs`).
//!
//! FIFO queues: each message group is a lane that runs one message at a time, in record order; lanes
//! (groups, or single messages on a standard queue) run concurrently up to `batch_concurrency`. Once a
//! message of a group is listed as a failure, the rest of that group is listed untouched, so no later
//! message of the group is processed before it. A message that reached the DLQ does not stop its group:
//! it is settled, exactly as when SQS's own redrive moves it after `maxReceiveCount`.
//!
//! Three more FIFO rules keep the group's receives for runs and its order through faults:
//! - A failed claimed run (or a deferral) is retried in the invocation after its backoff while the
//!   invocation has time and the budget lasts (the store counts the runs), instead of being listed
//!   with every message behind it, each spending a receive.
//! - A settled message with successors in the batch is deleted by the adapter before they run (cut at
//!   the cutoff): left to the mapping's delete after the invocation, a failed delete would bring it
//!   back after them. If that delete fails, the rest of the group goes back unrun, behind it.
//! - A message that could not run and is at its last allowed receive (behind a failed message, or
//!   past the cutoff) is dead-lettered with a reason starting `not run at its last allowed receive`,
//!   at the cutoff or after the lanes, instead of being redriven by SQS without one.
//!
//! The idempotency claim's lease ends at the invocation deadline (the [`Lease`]'s `visible_until`):
//! if the function dies, the claim lapses no later than the moment the invocation is over, and the
//! message cannot be delivered again before its visibility timeout, which is longer.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use crate::{FifoFailure, LambdaConfig};
use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use std::io::Write as _;

use conveyor_core::runtime::{
    DeferCause, GroupGates, NotRun, Origin, RetryPath, Turn, at_last_attempt, not_run_at_the_last_receive,
    retry_path, visibility_room,
};
use conveyor_core::{
    Pipeline,
    message::Message,
    port::{Queue, VisibilityChange},
    runtime::{AckReason, Budget, CANCEL_GRACE, Disposition, Lease, Outcome, Processed, reject},
    trace::Settlement,
};
use futures_util::{FutureExt, StreamExt, stream};
use tokio::time::Instant;
use tracing::Instrument;

use crate::cover;
use crate::metrics::BatchMetrics;
use crate::queues::{QueueResolver, queue_name};
use crate::record::{self, RecordError};
use crate::tenants::Tenants;

/// Runs SQS batches through the pipeline. Build one per cold start; cheap to share.
pub struct BatchProcessor {
    pipeline: Pipeline,
    config: LambdaConfig,
    queues: Arc<dyn QueueResolver>,
    emit_metrics: bool,
    /// Per-tenant limits and metrics ([`LambdaConfig::tenants`]).
    tenants: Arc<Tenants>,
    /// Source queues whose visibility timeout was checked against the function's time.
    checked: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// The process's record slots, shared by every invocation it runs at once (see
    /// `src/concurrency.rs`'s design note).
    slots: Arc<tokio::sync::Semaphore>,
    /// One batch of a FIFO group at a time across the invocations the process runs at once.
    fifo_gates: GroupGates,
}

impl std::fmt::Debug for BatchProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("pipeline", &self.pipeline)
            .field("config", &self.config)
            .field("emit_metrics", &self.emit_metrics)
            .finish()
    }
}

/// What a batch produced: the response for the event source mapping, and its metrics per queue.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchReport {
    /// The records to retry.
    pub response: SqsBatchResponse,
    /// One entry per source queue in the batch.
    pub metrics: Vec<BatchMetrics>,
    /// Set when the invocation must fail instead of answering: a record without a `messageId` (it
    /// cannot be listed, and answering would delete it), or, when configured, a batch whose every
    /// record failed.
    pub invocation_error: Option<String>,
}

/// The invocation fails instead of answering (see [`BatchReport::invocation_error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BatchFailed(pub String);

/// How one record ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Settled {
    /// Not listed: done now (or a duplicate of a completed job, or a cancelled one).
    Acked(AckReason),
    /// Not listed: a copy is in the DLQ.
    DeadLettered,
    /// Not listed: a delayed copy was sent (a deferral that spends no receive).
    Deferred,
    /// Listed, visible again after `delay`.
    Retry { delay: Duration },
    /// Listed, left as it is (visible again at the queue's visibility timeout).
    Untouched,
    /// Not started before the cutoff; becomes `Deferred` or `Untouched` before the response is built.
    NotStarted,
}

impl Settled {
    /// What the record's span says settlement did.
    fn settlement(self) -> Settlement {
        match self {
            Settled::Acked(reason) => Settlement::Acknowledged(reason),
            Settled::DeadLettered => Settlement::DeadLettered,
            Settled::Deferred => Settlement::Deferred,
            Settled::Retry { .. } => Settlement::Retried,
            Settled::Untouched | Settled::NotStarted => Settlement::Released,
        }
    }

    fn is_failure(self) -> bool {
        matches!(
            self,
            Settled::Retry { .. } | Settled::Untouched | Settled::NotStarted
        )
    }
}

/// One record, converted.
struct Item {
    index: usize,
    message: Arc<Message>,
    /// Who took the record: its lane (to run it) or the late deferrer (see [`LateDeferrer`]).
    taken: Arc<AtomicU8>,
    /// Taken by its first receive just before the invocation ([`cover::prompt`], decided once as the
    /// event arrives): it starts without waiting for the visibility cover, which skips it too.
    prompt: bool,
    /// Set by the visibility cover when SQS says it never issued the record's receipt handle
    /// (`src/cover.rs`): it runs, and no visibility call is made for it again.
    not_issued: Arc<AtomicBool>,
}

impl Item {
    /// True when SQS said it never issued the record's receipt handle (see [`Item::not_issued`]).
    fn handle_not_issued(&self) -> bool {
        self.not_issued.load(Ordering::Acquire)
    }
}

/// [`Item::taken`]: nobody yet.
const PENDING: u8 = 0;
/// [`Item::taken`]: its lane started it.
const STARTED: u8 = 1;
/// [`Item::taken`]: the late deferrer took it at the cutoff.
const DEFERRED_LATE: u8 = 2;
/// [`Item::taken`]: SQS refused its visibility cover as no longer ours (`src/cover.rs`; its lane
/// waited for that answer): nobody runs it or touches it again; it is listed.
const LOST: u8 = 3;

/// A standard-queue record the late deferrer may take at the cutoff.
struct LateCandidate {
    index: usize,
    message: Arc<Message>,
    queue: Arc<SourceQueue>,
    taken: Arc<AtomicU8>,
    /// The record's lane is a FIFO group: taken only at its last allowed receive, to dead-letter.
    fifo: bool,
    queue_name: Arc<str>,
}

/// Defers, at the cutoff, every standard-queue record no lane started yet, all at once.
///
/// # Design note: why at the cutoff, not after the lanes
///
/// Lanes run `batch_concurrency` at a time; the ones that never got a turn before the cutoff would
/// otherwise be deferred only once the running handlers returned (after their grace, close to
/// `settle_by`), and their copies would miss the deadline: listed, each receive spent unrun. So at the
/// cutoff this takes every record still pending (an atomic swap on [`Item::taken`], so a lane and the
/// deferrer never both handle one), sends their copies concurrently while the last handlers wind down,
/// and the lanes skip what it took. A FIFO record is taken only at its last allowed receive: a copy
/// would break its group's order, and listed, SQS's redrive would move it to the DLQ without a reason,
/// so it is dead-lettered now with one (it never ran, and why); the other FIFO records are left to
/// their lanes, which list them in order.
struct LateDeferrer {
    candidates: Vec<LateCandidate>,
    reject_mode: conveyor_core::RejectMode,
    pipeline: Pipeline,
}

/// True when `candidate` is at the last receive its queue's redrive policy allows.
async fn at_the_last_receive(candidate: &LateCandidate) -> bool {
    let Some(queue) = candidate.queue.get().await else {
        return false;
    };
    queue
        .max_receive_count()
        .is_some_and(|max| candidate.message.receive_count.max(1) >= max)
}

/// Sends a message that never ran to the DLQ with `failure` (why), cut at `settle_by`: dead-lettered,
/// or left to be listed when the send did not land in time.
///
/// Then, in the time left, a tracked job's status becomes `dead_lettered` (see
/// `conveyor-core/src/unrun.rs`). The DLQ send goes first, unlike on a worker: an invocation's
/// deadline is short, and the copy's reason is what an operator needs; a job that had completed gets
/// a needless DLQ copy rather than a lost reason.
async fn dead_letter_unrun(
    pipeline: &Pipeline,
    queue: &dyn Queue,
    message: &Message,
    failure: &conveyor_core::runtime::Failure,
    mode: conveyor_core::RejectMode,
    settle_by: Instant,
) -> Settled {
    let rejecting = reject(queue, message, failure, mode, Duration::ZERO);
    match tokio::time::timeout_at(settle_by, rejecting).await {
        Ok(Disposition::Delete) => {
            pipeline
                .unrun_at_the_last_receive(message, failure, Some(settle_by))
                .await;
            Settled::DeadLettered
        }
        Ok(Disposition::Visible(_)) => Settled::Untouched,
        Err(_) => {
            tracing::warn!(message_id = %message.id, "the DLQ send of a message not run at its last allowed receive did not answer before the invocation deadline; listing it");
            Settled::Untouched
        }
    }
}

impl LateDeferrer {
    /// Waits for the cutoff (or for `lanes_done`), then defers what is still pending.
    async fn run(
        self,
        cutoff: Instant,
        settle_by: Instant,
        lanes_done: &tokio::sync::Notify,
    ) -> Vec<(usize, Settled)> {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(cutoff) => {}
            () = lanes_done.notified() => return Vec::new(),
        }
        let mut taken: Vec<LateCandidate> = Vec::new();
        for candidate in self.candidates {
            if candidate.fifo && !at_the_last_receive(&candidate).await {
                continue;
            }
            let took = candidate
                .taken
                .compare_exchange(PENDING, DEFERRED_LATE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if took {
                taken.push(candidate);
            }
        }
        if !taken.is_empty() {
            tracing::info!(
                records = taken.len(),
                "the invocation's cutoff: deferring the records not started yet"
            );
        }
        let mode = self.reject_mode;
        let pipeline = &self.pipeline;
        let deferrals = taken.into_iter().map(|candidate| async move {
            let settled = match candidate.queue.get().await {
                Some(queue) if candidate.fifo => {
                    let attempt = candidate.message.attempt();
                    let failure = not_run_at_the_last_receive(
                        NotRun::OutOfTime,
                        "the invocation's time ran out before it started, behind the messages ahead of it in \
                         its FIFO group, and each such receive counted (the messages ahead took the time: one \
                         waiting for its idempotency store, or a batch that does not fit in the function \
                         timeout, then lower the batch size or raise the timeout); redrive it once the \
                         group's earlier messages are settled",
                        attempt,
                        queue.max_receive_count().unwrap_or(attempt),
                        &candidate.queue_name,
                        candidate.message.job_type().unwrap_or(""),
                    );
                    dead_letter_unrun(pipeline, queue.as_ref(), &candidate.message, &failure, mode, settle_by).await
                }
                Some(queue) => defer_unrun(pipeline, queue.as_ref(), &candidate.message, settle_by).await,
                None => Settled::Untouched,
            };
            (candidate.index, settled)
        });
        futures_util::future::join_all(deferrals).await
    }
}

/// The records of one source queue.
struct Source {
    arn: String,
    name: Arc<str>,
    items: Vec<Item>,
    metrics: BatchMetrics,
}

/// A source's queue, resolved once per invocation (the resolver keeps it for the execution
/// environment: [`crate::SqsQueues`] calls SQS once per cold start): a queue that cannot be resolved
/// (an SQS brownout, a missing `sqs:GetQueueUrl` permission) fails only the records that need it.
struct SourceQueue {
    arn: String,
    resolver: Arc<dyn QueueResolver>,
    resolved: tokio::sync::OnceCell<Option<Arc<dyn Queue>>>,
    /// The invocation's whole time (deadline less its start), for the visibility check.
    invocation_time: Duration,
    /// The ARNs already checked in this execution environment.
    checked: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// True once the visibility cover of this source's records is over (landed, refused or given
    /// up): a later visibility change of a record waits for it, so the cover never overwrites it.
    covered: CoverDone,
}

/// A source's visibility cover is over ([`SourceQueue::cover_done`]): a flag and the lanes waiting
/// for it. Not a `watch` channel: its waiters sit in shards picked at random, so the order the lanes
/// wake in (and so a simulation's replay) would change from run to run.
#[derive(Debug, Default)]
struct CoverDone {
    done: AtomicBool,
    waiters: tokio::sync::Notify,
}

impl SourceQueue {
    /// The queue's `maxReceiveCount` when the queue was resolved already (no call made for it).
    fn known_max_receive_count(&self) -> Option<u32> {
        self.resolved
            .get()
            .and_then(Option::as_ref)
            .and_then(|queue| queue.max_receive_count())
    }

    /// The queue, resolved once; `None` (logged) when it cannot be.
    async fn get(&self) -> Option<Arc<dyn Queue>> {
        self.resolved
            .get_or_init(|| async {
                match self.resolver.resolve(&self.arn).await {
                    Ok(queue) => {
                        self.check_visibility(queue.as_ref());
                        Some(queue)
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot resolve the source queue; records that need it are listed as failures");
                        None
                    }
                }
            })
            .await
            .clone()
    }

    /// Marks the visibility cover of this source's records over.
    fn cover_done(&self) {
        self.covered.done.store(true, Ordering::Release);
        self.covered.waiters.notify_waiters();
    }

    /// Waits until the visibility cover of this source's records is over, at most until `until`.
    async fn cover_over(&self, until: Instant) {
        let notified = self.covered.waiters.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.covered.done.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout_at(until, notified).await;
    }

    /// The queue for the visibility cover as the lanes start (`src/cover.rs`): resolved now, but
    /// a failure is not kept (the records that need the queue later try again; the cover is skipped).
    async fn try_get(&self) -> Option<Arc<dyn Queue>> {
        if let Some(resolved) = self.resolved.get() {
            return resolved.clone();
        }
        match self.resolver.resolve(&self.arn).await {
            Ok(queue) => Some(
                self.resolved
                    .get_or_init(|| async {
                        self.check_visibility(queue.as_ref());
                        Some(queue)
                    })
                    .await
                    .clone()?,
            ),
            Err(error) => {
                tracing::warn!(%error, "cannot resolve the source queue to renew its records' visibility");
                None
            }
        }
    }

    /// Warns once per queue when its visibility timeout is too short for the function (see
    /// [`visibility_advice`]).
    fn check_visibility(&self, queue: &dyn Queue) {
        let first = self
            .checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(self.arn.clone());
        if !first {
            return;
        }
        let visibility = queue.visibility_timeout();
        let Some(advice) = visibility_advice(visibility, self.invocation_time) else {
            return;
        };
        // Below the invocation's own time, SQS certainly hands a message out again while it runs: a
        // configuration error, said at error level (an outage is never the cause).
        if visibility < self.invocation_time {
            tracing::error!(queue = %queue.name(), "configuration error: {advice}");
        } else {
            tracing::warn!(queue = %queue.name(), "{advice}");
        }
    }
}

/// Why a queue's visibility timeout is too short for a function that runs `function_time`, and what to
/// change; `None` when it is at least six times that (AWS's advice).
pub fn visibility_advice(visibility: Duration, function_time: Duration) -> Option<String> {
    let ratio = u32::try_from(conveyor_core::runtime::LAMBDA_VISIBILITY_RATIO).unwrap_or(6);
    let advised = function_time.saturating_mul(ratio);
    (visibility < advised).then(|| {
        format!(
            "the queue's visibility timeout ({visibility:?}) is under {ratio} times the function's time \
             ({function_time:?}), AWS's advice: a message can be delivered again while an invocation still runs \
             it; raise the queue's VisibilityTimeout to at least {}s (visibility_timeout_seconds in \
             infra/modules/queue) or lower the function timeout",
            advised.as_secs_f64().ceil()
        )
    })
}

/// Records that run one after another: a FIFO group, or one message of a standard queue.
struct Lane {
    source: usize,
    queue: Arc<SourceQueue>,
    name: Arc<str>,
    fifo: bool,
    items: Vec<Item>,
}

/// A record to cover, with its [`Item`]'s flags.
struct Covered {
    message: Arc<Message>,
    /// [`Item::taken`]: marked [`LOST`] when SQS refuses the renewal as no longer ours.
    taken: Arc<AtomicU8>,
    /// [`Item::prompt`].
    prompt: bool,
    /// [`Item::not_issued`]: set when SQS says it never issued the receipt handle.
    not_issued: Arc<AtomicBool>,
}

/// Renews the visibility of every record not known to be fresh, per source queue, while the lanes
/// start (see `src/cover.rs`'s design notes), and marks [`LOST`] the records SQS refused as no longer
/// ours and [`Item::not_issued`] those whose handle it never issued, before the source's cover is
/// over: a lane waits for that before it starts a record that is not prompt, and each source's later
/// visibility changes wait for it too. Handles never issued are warned of once for the invocation.
async fn cover_stale_records(
    sources: Vec<(Arc<SourceQueue>, Vec<Covered>)>,
    deadline: Instant,
    wait_until: Instant,
) {
    let covers = sources.into_iter().map(|(source_queue, records)| async move {
        let not_issued = cover_source(&source_queue, &records, deadline, wait_until).await;
        source_queue.cover_done();
        not_issued
    });
    let not_issued: Vec<String> = futures_util::future::join_all(covers)
        .await
        .into_iter()
        .flatten()
        .collect();
    if let Some(example) = not_issued.first() {
        cover::warn_not_issued(not_issued.len(), example);
    }
}

/// [`cover_stale_records`] for one source queue's records; returns the message ids of those whose
/// receipt handle SQS never issued.
async fn cover_source(
    source_queue: &SourceQueue,
    records: &[Covered],
    deadline: Instant,
    wait_until: Instant,
) -> Vec<String> {
    if records.iter().all(|record| record.prompt) {
        return Vec::new();
    }
    let Some(queue) = source_queue.try_get().await else {
        return Vec::new();
    };
    let needed = cover::needed_until(deadline, Instant::now());
    let now = conveyor_core::wall_clock::now();
    let visibility = queue.visibility_timeout();
    let stale: Vec<&Covered> = records
        .iter()
        .filter(|record| !cover::known_fresh(&record.message, visibility, needed, now))
        .collect();
    let messages: Vec<&Message> = stale.iter().map(|record| record.message.as_ref()).collect();
    let refused = cover::cover(queue.as_ref(), &messages, needed, wait_until).await;
    for record in refused.lost.iter().filter_map(|index| stale.get(*index)) {
        // A lane that started it already (a prompt record whose visibility was short) keeps it: its
        // claim decides; otherwise nobody runs it.
        let _ = record
            .taken
            .compare_exchange(PENDING, LOST, Ordering::AcqRel, Ordering::Acquire);
    }
    let mut not_issued = Vec::new();
    for record in refused.not_issued.iter().filter_map(|index| stale.get(*index)) {
        record.not_issued.store(true, Ordering::Release);
        not_issued.push(record.message.id.clone());
    }
    not_issued
}

/// Each source queue of `lanes` with its records (lanes of one source share its queue).
fn records_per_source(lanes: &[Lane]) -> Vec<(Arc<SourceQueue>, Vec<Covered>)> {
    let mut per_source: Vec<(usize, Arc<SourceQueue>, Vec<Covered>)> = Vec::new();
    for lane in lanes {
        let records = lane.items.iter().map(|item| Covered {
            message: Arc::clone(&item.message),
            taken: Arc::clone(&item.taken),
            prompt: item.prompt,
            not_issued: Arc::clone(&item.not_issued),
        });
        match per_source
            .iter_mut()
            .find(|(source, _, _)| *source == lane.source)
        {
            Some((_, _, covered)) => covered.extend(records),
            None => per_source.push((lane.source, Arc::clone(&lane.queue), records.collect())),
        }
    }
    per_source
        .into_iter()
        .map(|(_, queue, records)| (queue, records))
        .collect()
}

/// What the invocation keeps after its last call to build and return the response.
pub(crate) const RESPONSE_RESERVE: Duration = Duration::from_millis(100);

/// The time a FIFO deferral's wait in the invocation leaves before the cutoff, to try again.
const FIFO_WAIT_RESERVE: Duration = Duration::from_secs(1);

/// On a FIFO queue a deferral cannot go out as a copy, so it is listed and its receive counts. At the
/// last receive the redrive policy allows, that would let SQS's redrive move the message to the DLQ
/// without a reason: it is dead-lettered now instead, with a reason that says it could not run and why.
fn never_ran_at_the_last_attempt(outcome: Outcome, origin: Origin<'_>) -> Outcome {
    let Outcome::Defer { reason, cause, .. } = &outcome else {
        return outcome;
    };
    // Only the store's: a key in progress elsewhere is left to its holder.
    if !origin.is_last_receive() || !cause.is_the_store() {
        return outcome;
    }
    let why = format!(
        "{reason} at each try; a FIFO message cannot be deferred with a copy, so receives it could not run \
         in were spent; redrive it once the cause is fixed"
    );
    Outcome::Reject(not_run_at_the_last_receive(
        cause.not_run(),
        &why,
        origin.attempt,
        origin.max_attempts.unwrap_or(origin.attempt),
        origin.queue,
        origin.handler,
    ))
}

/// The share of the invocation kept after the handlers' cutoff for settling (completing the claim, a
/// DLQ send, a deferred copy, the backoff changes): a tenth of the invocation's time, at least the
/// configured `deadline_margin`. A completion cut by the deadline would let a duplicate run the job
/// again once the claim lapses, so the handler gives up that time, not the completion.
fn settle_reserve(deadline_margin: Duration, invocation_time: Duration) -> Duration {
    deadline_margin.max(invocation_time / SETTLE_SHARE)
}

/// The invocation's time is divided by this for the settle reserve (see [`settle_reserve`]).
const SETTLE_SHARE: u32 = 10;

/// How long a handler told to stop at the cutoff has to return a result that stands: as long as the
/// settle reserve (`settle`: a tenth of the invocation's time, at least the configured
/// `deadline_margin`), at most [`CANCEL_GRACE`], and at most half of what the invocation has after the
/// settle reserve and the response (`before_settling`), so that handlers keep the other half.
///
/// # Design note: the grace comes before the settle reserve, not out of it
///
/// A handler that returns `Ok` after its cutoff has done its work (an email on the wire when the
/// cutoff came cannot be taken back), so its result stands (conveyor-core's `run`). That is only safe
/// when its completion still lands: a record acknowledged with its claim never completed lets a
/// duplicate of the job run again once the claim lapses. So the phases of an invocation are, in
/// order: handlers run until the cutoff; a handler told to stop returns within the grace; settling
/// (completions, releases, DLQ sends, copies) has the whole settle reserve; the response has
/// [`RESPONSE_RESERVE`]. The grace never eats the settle reserve.
fn handler_grace(settle: Duration, before_settling: Duration) -> Duration {
    CANCEL_GRACE.min(settle).min(before_settling / 2)
}

/// The invocation's time limits, the same for every record of the batch.
#[derive(Debug, Clone, Copy)]
struct Invocation {
    /// When the invocation ends; the idempotency claim's lease ends here too.
    deadline: Instant,
    /// A handler told to stop at the cutoff returns by this, or is dropped (see [`handler_grace`]):
    /// the settle reserve begins here.
    grace_until: Instant,
    /// The last moment a message may start, and when handlers are told to stop: the deadline less the
    /// handlers' grace (see [`handler_grace`]), the settle reserve (see [`settle_reserve`]) and
    /// [`RESPONSE_RESERVE`].
    cutoff: Instant,
    /// Every store and SQS call ends by this: the deadline less [`RESPONSE_RESERVE`].
    settle_by: Instant,
}

/// A batch handler's call fills only when that many of its records run at once: warns when
/// `batch_concurrency` is below its batch size. (The event source mapping's batch size, which this
/// cannot see, must be at least as large too.)
fn warn_unfillable_batches(pipeline: &Pipeline, config: &LambdaConfig) {
    for (job_type, max_jobs) in pipeline.router().batch_sizes() {
        if max_jobs > config.batch_concurrency {
            tracing::warn!(
                job_type,
                max_jobs,
                batch_concurrency = config.batch_concurrency,
                "a batch handler takes more jobs per call than batch_concurrency runs at once: its batches never \
                 fill; raise CONVEYOR_BATCH_CONCURRENCY or lower BatchSettings::max_jobs"
            );
        }
    }
}

/// One record's result.
struct ItemResult {
    index: usize,
    source: usize,
    message: Arc<Message>,
    settled: Settled,
    handler_duration: Option<Duration>,
    /// The pipeline's reason and cause when the record was deferred (it did not run; on FIFO it is
    /// listed).
    deferred: Option<(String, DeferCause)>,
    /// Its backoff was set when its FIFO lane ended ([`BatchProcessor::apply_lane_backoff`]).
    backoff_set: bool,
    /// Its visibility had ended before the invocation ([`LOST`]): not ours, so never run or touched.
    lost: bool,
    /// SQS said it never issued its receipt handle ([`Item::not_issued`]): no visibility change is
    /// made for it (a retry is listed without its backoff).
    not_issued: bool,
}

/// How a record's run ended: its settlement, how long its handler ran (`None`: it did not run), and
/// the deferral's reason and cause when it was deferred.
type Ran = (Settled, Option<Duration>, Option<(String, DeferCause)>);

impl BatchProcessor {
    /// A processor running `pipeline` with `config`, finding each record's queue through `queues`.
    /// Prints EMF metrics to stdout after each batch (see [`BatchProcessor::without_metrics`]).
    ///
    /// Share one processor between the invocations a process runs at once: its record slots
    /// ([`LambdaConfig::process_concurrency`], else `batch_concurrency`) bound them all together.
    pub fn new(pipeline: Pipeline, config: LambdaConfig, queues: Arc<dyn QueueResolver>) -> Self {
        warn_unfillable_batches(&pipeline, &config);
        let slots = config
            .process_concurrency
            .unwrap_or(config.batch_concurrency)
            .max(1);
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(slots)),
            fifo_gates: GroupGates::default(),
            tenants: Arc::new(Tenants::new(&config.tenants)),
            pipeline,
            config,
            queues,
            emit_metrics: true,
            checked: Arc::default(),
        }
    }

    /// Does not print EMF lines (tests, benchmarks); [`BatchProcessor::process_batch_report`] still
    /// returns the metrics.
    pub fn without_metrics(mut self) -> Self {
        self.emit_metrics = false;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &LambdaConfig {
        &self.config
    }

    /// The pipeline it runs.
    pub(crate) fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The cold start's check of the idempotency store ([`Pipeline::check_store`]): `Err` when the store
    /// is misconfigured (a table that does not exist, access denied), with what to fix; an outage is
    /// not a configuration error and passes.
    pub async fn check_store(&self) -> Result<(), conveyor_core::port::StoreError> {
        self.pipeline.check_store().await
    }

    /// Processes one event whose invocation ends at `deadline`; returns the records to retry, and
    /// prints the batch's metrics as EMF. An `Err` fails the invocation (see
    /// [`BatchReport::invocation_error`]).
    pub async fn process_batch(
        &self,
        event: SqsEvent,
        deadline: Instant,
    ) -> Result<SqsBatchResponse, BatchFailed> {
        self.process_invocation(event, deadline, None).await
    }

    /// [`BatchProcessor::process_batch`] for the invocation `request_id`: its EMF lines carry it
    /// (`requestId`), so the lines of invocations that run at once in one process stay apart.
    pub(crate) async fn process_invocation(
        &self,
        event: SqsEvent,
        deadline: Instant,
        request_id: Option<&str>,
    ) -> Result<SqsBatchResponse, BatchFailed> {
        let report = self.process_batch_report(event, deadline).await;
        if self.emit_metrics {
            let now = conveyor_core::wall_clock::now();
            let lines: String = report
                .metrics
                .iter()
                .flat_map(|metrics| metrics.emf_lines_of(now, request_id))
                .map(|line| line + "\n")
                .collect();
            // One write for the batch's lines, so they never interleave with another invocation's;
            // a closed stdout must not fail the invocation: the lines are dropped (and counted).
            let _ = conveyor_core::runtime::stdout().write_all(lines.as_bytes());
        }
        match report.invocation_error {
            Some(reason) => {
                tracing::error!(%reason, "failing the invocation");
                Err(BatchFailed(reason))
            }
            None => Ok(report.response),
        }
    }

    /// [`BatchProcessor::process_batch`] without printing: the response and the metrics.
    pub async fn process_batch_report(&self, event: SqsEvent, deadline: Instant) -> BatchReport {
        let mut sources: Vec<Source> = Vec::new();
        let mut failures: Vec<(usize, String)> = Vec::new();
        let mut invocation_error = None;
        let records = event.records.len();
        let arrived = conveyor_core::wall_clock::now();
        for (index, record) in event.records.into_iter().enumerate() {
            let source = source_for(
                &mut sources,
                record.event_source_arn.as_deref().unwrap_or_default(),
            );
            sources[source].metrics.received += 1;
            let message = match record::into_message(record) {
                Ok(message) if sources[source].arn.is_empty() => Err(RecordError::MissingSource(message.id)),
                other => other,
            };
            match message {
                Ok(message) => sources[source].items.push(Item {
                    index,
                    prompt: cover::prompt(&message, arrived),
                    message: Arc::new(message),
                    taken: Arc::new(AtomicU8::new(PENDING)),
                    not_issued: Arc::new(AtomicBool::new(false)),
                }),
                Err(error) => {
                    tracing::error!(index, %error, "cannot process a record");
                    let (RecordError::MissingReceiptHandle(id) | RecordError::MissingSource(id)) = error
                    else {
                        // No message id: it cannot be listed, and answering would delete it.
                        invocation_error = Some(format!(
                            "record {index} has no messageId; failing the invocation so the event source \
                             mapping returns the batch instead of deleting it"
                        ));
                        continue;
                    };
                    sources[source].metrics.retried += 1;
                    failures.push((index, id));
                }
            }
        }

        let invocation_time = deadline.saturating_duration_since(Instant::now());
        let lanes = self.lanes(&mut sources, invocation_time);
        let to_cover = records_per_source(&lanes);
        let concurrency = self.config.batch_concurrency.max(1);
        // The response's reserve comes on top of the settle reserve, not out of it: settling gets its
        // whole share (a DLQ send as slow as a tenth of the invocation still lands); the handlers'
        // grace comes before both (see `handler_grace`).
        let settle = settle_reserve(self.config.deadline_margin, invocation_time);
        let settle_from = deadline
            .checked_sub(settle + RESPONSE_RESERVE)
            .unwrap_or(deadline);
        let before_settling = settle_from.saturating_duration_since(Instant::now());
        let invocation = Invocation {
            deadline,
            grace_until: settle_from,
            cutoff: settle_from
                .checked_sub(handler_grace(settle, before_settling))
                .unwrap_or(settle_from),
            settle_by: deadline.checked_sub(RESPONSE_RESERVE).unwrap_or(deadline),
        };
        let late = LateDeferrer {
            candidates: lanes
                .iter()
                .flat_map(|lane| {
                    lane.items.iter().map(|item| LateCandidate {
                        index: item.index,
                        message: Arc::clone(&item.message),
                        queue: Arc::clone(&lane.queue),
                        taken: Arc::clone(&item.taken),
                        fifo: lane.fifo,
                        queue_name: Arc::clone(&lane.name),
                    })
                })
                .collect(),
            reject_mode: self.config.reject_mode,
            pipeline: self.pipeline.clone(),
        };
        let lanes_done = tokio::sync::Notify::new();
        let running = async {
            let results: Vec<(Lane, Vec<ItemResult>)> = stream::iter(lanes)
                .map(|lane| self.run_lane(lane, invocation))
                .buffer_unordered(concurrency)
                .collect()
                .await;
            lanes_done.notify_one();
            results
        };
        let (mut results, deferred_late, ()) = tokio::join!(
            running,
            late.run(invocation.cutoff, invocation.settle_by, &lanes_done),
            cover_stale_records(to_cover, deadline, invocation.cutoff)
        );
        for (lane_results_index, settled) in deferred_late {
            let found = results
                .iter_mut()
                .flat_map(|(_, lane_results)| lane_results.iter_mut())
                .find(|result| result.index == lane_results_index);
            if let Some(result) = found {
                result.settled = settled;
            }
        }

        self.defer_not_started(&mut results, invocation.settle_by).await;
        self.dead_letter_unrun_at_the_last_receive(&mut results, invocation.settle_by)
            .await;
        self.apply_backoff(&results, invocation.settle_by).await;
        for (_, lane_results) in &results {
            for result in lane_results {
                let metrics = &mut sources[result.source].metrics;
                if let Some(duration) = result.handler_duration {
                    metrics.handler_durations.push(duration);
                }
                match result.settled {
                    Settled::Acked(AckReason::Completed) => metrics.succeeded += 1,
                    Settled::Acked(AckReason::Duplicate) => metrics.duplicates += 1,
                    Settled::Acked(AckReason::Cancelled) => metrics.cancelled += 1,
                    Settled::Acked(AckReason::Ignored) => {}
                    Settled::DeadLettered => metrics.dead_lettered += 1,
                    Settled::Deferred => metrics.deferred += 1,
                    Settled::Retry { .. } | Settled::Untouched | Settled::NotStarted => {
                        metrics.retried += 1;
                        failures.push((result.index, result.message.id.clone()));
                    }
                }
                count_for_tenant(metrics, &self.tenants.label(&result.message), result);
            }
        }
        failures.sort_unstable_by_key(|(index, _)| *index);
        if invocation_error.is_none()
            && self.config.fail_invocation_when_all_fail
            && records > 0
            && failures.len() == records
        {
            invocation_error = Some(format!(
                "all {records} records failed; failing the invocation so Lambda's Errors metric shows it \
                 (fail_invocation_when_all_fail)"
            ));
        }
        if invocation_error.is_none() {
            self.discard_payloads(&results, invocation.settle_by).await;
        }
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = failures
            .into_iter()
            .map(|(_, item_identifier)| {
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = item_identifier;
                failure
            })
            .collect();
        BatchReport {
            response,
            metrics: sources.into_iter().map(|source| source.metrics).collect(),
            invocation_error,
        }
    }

    /// Deletes the large-payload objects of the jobs done for good: completed claims of idempotent
    /// handlers ([`Pipeline::discards_payload_of`]), never a duplicate's or a cancelled copy's (another
    /// copy may still point at the object). It runs before the response, so before the event source
    /// mapping deletes the messages; that is safe only because the completed record answers for every
    /// copy that comes back (acknowledged as a duplicate without its object). Anything else is left to
    /// the bucket's lifecycle rule.
    async fn discard_payloads(&self, results: &[(Lane, Vec<ItemResult>)], settle_by: Instant) {
        let discards = results
            .iter()
            .flat_map(|(_, lane_results)| lane_results)
            .filter(|result| matches!(result.settled, Settled::Acked(AckReason::Completed)))
            .filter(|result| self.pipeline.discards_payload_of(&result.message))
            .map(|result| self.pipeline.discard_payload(&result.message));
        if tokio::time::timeout_at(settle_by, futures_util::future::join_all(discards))
            .await
            .is_err()
        {
            tracing::warn!(
                "payload objects not all deleted before the invocation deadline; the bucket's lifecycle rule removes them"
            );
        }
    }

    /// Splits each source's records into lanes (its queue is resolved later, on first need).
    fn lanes(&self, sources: &mut [Source], invocation_time: Duration) -> Vec<Lane> {
        let mut lanes = Vec::new();
        for (source_index, source) in sources.iter_mut().enumerate() {
            if source.items.is_empty() {
                continue;
            }
            let items = std::mem::take(&mut source.items);
            let queue = Arc::new(SourceQueue {
                arn: source.arn.clone(),
                resolver: Arc::clone(&self.queues),
                resolved: tokio::sync::OnceCell::new(),
                invocation_time,
                checked: Arc::clone(&self.checked),
                covered: CoverDone::default(),
            });
            // FIFO queue names (and so their ARNs) end in `.fifo`.
            let fifo = source.arn.ends_with(".fifo");
            let lane = |items: Vec<Item>| Lane {
                source: source_index,
                queue: Arc::clone(&queue),
                name: Arc::clone(&source.name),
                fifo,
                items,
            };
            if !fifo {
                lanes.extend(items.into_iter().map(|item| lane(vec![item])));
                continue;
            }
            if self.config.fifo_failure == FifoFailure::Batch {
                // One lane in record order: a failure holds back everything after it (Powertools).
                lanes.push(lane(items));
                continue;
            }
            let mut groups: Vec<(Option<String>, Vec<Item>)> = Vec::new();
            for item in items {
                let group = item.message.group_id.clone();
                match groups.iter_mut().find(|(id, _)| *id == group) {
                    Some((_, members)) => members.push(item),
                    None => groups.push((group, vec![item])),
                }
            }
            lanes.extend(groups.into_iter().map(|(_, members)| lane(members)));
        }
        lanes
    }

    /// Runs a lane; a FIFO group's lane only while it holds its group's gate in the process
    /// ([`GroupGates`]): concurrent invocations of one execution environment (Lambda Managed Instances,
    /// or any process that runs `process_batch` in parallel) run one batch of a group at a time, in the
    /// order their lanes asked, whatever the queue handed out (an emulator that unlocks a group early, a
    /// visibility that lapsed). A lane that did not get the gate by the cutoff starts nothing; one
    /// received before an earlier batch of its group went back goes back unrun too.
    async fn run_lane(&self, lane: Lane, invocation: Invocation) -> (Lane, Vec<ItemResult>) {
        let Some(group) = self.gated_group(&lane) else {
            return self.run_lane_in_order(lane, invocation).await;
        };
        let ticket = self.fifo_gates.ticket(&lane.queue.arn, &group);
        let (lane, results) = match tokio::time::timeout_at(invocation.cutoff, ticket.wait()).await {
            Ok((_held, Turn::Run)) => self.run_lane_in_order(lane, invocation).await,
            Ok((_held, _)) => unrun_lane(
                lane,
                Settled::Untouched,
                "not started: an earlier batch of its FIFO group went back after this one was received",
            ),
            Err(_) => unrun_lane(
                lane,
                Settled::NotStarted,
                "not started: another invocation of this process held its FIFO group until the cutoff",
            ),
        };
        if results.iter().any(|result| result.settled.is_failure()) {
            ticket.gate().returned();
        }
        self.fifo_gates.done(&lane.queue.arn, &group, ticket);
        (lane, results)
    }

    /// The FIFO group a lane holds (one group per lane, unless [`FifoFailure::Batch`] puts the whole
    /// batch in one lane, which is not gated: two such lanes could wait on each other's groups).
    fn gated_group(&self, lane: &Lane) -> Option<String> {
        if !lane.fifo || self.config.fifo_failure == FifoFailure::Batch {
            return None;
        }
        lane.items.first()?.message.group_id.clone()
    }

    /// Runs a lane's records in order. After a failure on a FIFO queue the rest of the group is not
    /// started: it gets the failed message's backoff, so the group comes back together and in order
    /// (untouched, back at the visibility timeout, when the failed one was untouched itself).
    async fn run_lane_in_order(&self, lane: Lane, invocation: Invocation) -> (Lane, Vec<ItemResult>) {
        let mut results = Vec::with_capacity(lane.items.len());
        let mut blocked: Option<Settled> = None;
        for (position, item) in lane.items.iter().enumerate() {
            // A record that is not prompt waits for its source's cover (`src/cover.rs`): SQS may
            // refuse its renewal as no longer ours, and then it must not run.
            if !item.prompt {
                lane.queue.cover_over(invocation.cutoff).await;
            }
            let lost = item.taken.load(Ordering::Acquire) == LOST;
            let (settled, handler_duration, deferred) = if lost {
                // Not ours any more (`src/cover.rs`): listed untouched; on a FIFO queue it blocks the
                // rest of its group, which must not run before it.
                tracing::info!(
                    message_id = %item.message.id,
                    "not started: its visibility ended before the invocation; it is no longer ours"
                );
                (Settled::Untouched, None, None)
            } else if let Some(head) = blocked {
                tracing::info!(
                    message_id = %item.message.id,
                    "not started: an earlier message of its FIFO group failed; it follows that one's backoff"
                );
                (head, None, None)
            } else {
                self.run_one(&lane, item, invocation).await
            };
            if lane.fifo && settled.is_failure() && blocked.is_none() {
                blocked = Some(settled);
            }
            // Past the cutoff no successor starts: the mapping's delete after the invocation suffices.
            let removed = matches!(settled, Settled::Acked(_) | Settled::DeadLettered);
            let successors = position + 1 < lane.items.len();
            // A record whose handle SQS never issued cannot be deleted (nor be received again):
            // its successors run without that delete.
            if lane.fifo
                && removed
                && successors
                && blocked.is_none()
                && !item.handle_not_issued()
                && Instant::now() < invocation.cutoff
                && !self
                    .delete_before_successors(&lane, &item.message, invocation.cutoff)
                    .await
            {
                // The rest goes back now, unless its next receive would be the last one: then it is
                // saved, as for a store outage (the store may be why the group is slow).
                let next = &lane.items[position + 1].message;
                let max = lane.queue.known_max_receive_count();
                blocked = Some(Settled::Retry {
                    delay: self.fifo_wait(&lane, next, Duration::ZERO, max),
                });
            }
            results.push(ItemResult {
                index: item.index,
                source: lane.source,
                message: Arc::clone(&item.message),
                settled,
                handler_duration,
                deferred,
                backoff_set: false,
                lost,
                not_issued: item.handle_not_issued(),
            });
        }
        if lane.fifo {
            self.apply_lane_backoff(&lane, &mut results, invocation.settle_by)
                .await;
        }
        (lane, results)
    }

    /// How long a FIFO message that could not run stays away (no copy can defer it: it comes back by its
    /// visibility, and each receive counts). When the next receive of it, or of a message behind it in its
    /// group (they follow its wait), would be the last the redrive policy allows, the wait is the longer
    /// [`LambdaConfig::fifo_last_receive_wait`]: the last receive is saved for after the outage rather than
    /// spent inside it.
    fn fifo_wait(
        &self,
        lane: &Lane,
        message: &Message,
        delay: Duration,
        max_receives: Option<u32>,
    ) -> Duration {
        let Some(max_receives) = max_receives else {
            return delay;
        };
        let from = lane
            .items
            .iter()
            .position(|item| item.message.id == message.id)
            .unwrap_or(0);
        let next_is_last = lane.items[from..]
            .iter()
            .any(|item| item.message.receive_count.saturating_add(1) >= max_receives);
        if !next_is_last {
            return delay;
        }
        delay.max(conveyor_core::runtime::equal_jitter(
            self.config.fifo_last_receive_wait,
        ))
    }

    /// True when a failed FIFO run is retried in the invocation: it was claimed (the store counts its
    /// runs) and it was not the last run the redrive policy allows.
    async fn retries_in_place(&self, lane: &Lane, message: &Message, processed: &Processed) -> bool {
        if processed.run.is_none() {
            return false;
        }
        let Some(queue) = lane.queue.get().await else {
            return false;
        };
        let origin = Origin {
            queue: &lane.name,
            handler: processed.job_type.unwrap_or(""),
            attempt: processed.attempt(message),
            receive: message.receive_count.max(1),
            max_attempts: queue.max_receive_count(),
        };
        !origin.is_last_attempt()
    }

    /// Deletes a settled FIFO message before the next one of its group runs. Left to the event source
    /// mapping's delete after the invocation, a delete that fails would bring it back after its
    /// successors ran. False when the delete failed or did not answer by the cutoff: the rest of the
    /// group then goes back unrun, behind it.
    async fn delete_before_successors(&self, lane: &Lane, message: &Message, cutoff: Instant) -> bool {
        let Some(queue) = lane.queue.get().await else {
            return false;
        };
        let receipt = [message.receipt_handle.clone()];
        let Ok(deleted) = tokio::time::timeout_at(cutoff, queue.delete_batch(&receipt)).await else {
            tracing::warn!(message_id = %message.id, "the delete before the rest of its FIFO group did not answer before the cutoff; the rest goes back unrun");
            return false;
        };
        match deleted {
            Ok(failures) if failures.is_empty() => true,
            Ok(failures) => {
                let reason = failures.first().map(|failure| failure.error.to_string());
                tracing::warn!(message_id = %message.id, reason, "the delete before the rest of its FIFO group failed; the rest goes back unrun");
                false
            }
            Err(error) => {
                tracing::warn!(message_id = %message.id, %error, "the delete before the rest of its FIFO group failed; the rest goes back unrun");
                false
            }
        }
    }

    /// One message, in its span, with panics caught (the pipeline catches the handler's; this catches
    /// anything else, so one message never fails the batch).
    async fn run_one(&self, lane: &Lane, item: &Item, invocation: Invocation) -> Ran {
        let message = &item.message;
        let span = self.pipeline.message_span(message, &lane.name);
        let run = AssertUnwindSafe(self.settle(lane, item, invocation, span.clone())).catch_unwind();
        match run.instrument(span).await {
            Ok(result) => result,
            Err(_) => {
                tracing::error!(message_id = %message.id, "processing panicked; reporting the message as a failure");
                (Settled::Untouched, None, None)
            }
        }
    }

    /// A record slot of the process (see `src/concurrency.rs`), waited for until `cutoff`: `None` when
    /// the invocation's time to start records ran out first.
    async fn record_slot(&self, cutoff: Instant) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let waiting = Arc::clone(&self.slots).acquire_owned();
        match tokio::time::timeout_at(cutoff, waiting).await {
            Ok(Ok(permit)) => Some(permit),
            // The semaphore is never closed; the cutoff passed while the process's slots were busy.
            Ok(Err(_)) | Err(_) => None,
        }
    }

    async fn settle(&self, lane: &Lane, item: &Item, invocation: Invocation, span: tracing::Span) -> Ran {
        let message = &item.message;
        // The slot first, then the start: a record still waiting for a slot at the cutoff is pending,
        // so the late deferrer takes it like any record its lane did not reach.
        let Some(slot) = self.record_slot(invocation.cutoff).await else {
            tracing::info!("not started: the process's record slots were busy until the cutoff");
            return (Settled::NotStarted, None, None);
        };
        let started = item
            .taken
            .compare_exchange(PENDING, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !started {
            // The late deferrer took it at the cutoff; its result replaces this one.
            return (Settled::NotStarted, None, None);
        }
        if Instant::now() >= invocation.cutoff {
            tracing::info!("not started: too close to the invocation deadline");
            return (Settled::NotStarted, None, None);
        }
        let lease = Lease::new(invocation.deadline);
        // The budget counts runs in the store (issue 51, rule 3), and a delivery may find its key's
        // runs spent: a redelivery (its last run's reject landed in the DLQ, the mapping's delete did
        // not), a deferred copy, or another send of the job under its producer key. Without the
        // budget the pipeline ran such a claim once more (simulator seed 65: "attempt 4 of the 2 the
        // redrive policy allows", a deferred copy on its first receive). So the queue is resolved for
        // them (once per execution environment: the resolver caches it); a tracked job's status needs
        // it too (the last attempt's rejection says `dead_lettered`, not `retrying`). Only a plain
        // message's first receive, keyed by its own new message id, cannot find runs spent: it runs
        // without an SQS call.
        let tracked = self
            .pipeline
            .router()
            .settings()
            .iter()
            .any(|(_, settings)| settings.tracked);
        let may_find_runs_spent = message.attempt() > 1
            || message
                .string_attribute(conveyor_core::message::DEFERRAL_ATTRIBUTE)
                .is_some()
            || message
                .string_attribute(conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE)
                .is_some();
        let max_attempts = match lane.queue.known_max_receive_count() {
            Some(max) => Some(max),
            None if may_find_runs_spent || tracked => {
                lane.queue.get().await.and_then(|queue| queue.max_receive_count())
            }
            None => None,
        };
        let budget = Budget::default()
            .with_run_deadline(Some(invocation.cutoff))
            .with_max_attempts(max_attempts)
            .with_settle_deadline(Some(invocation.settle_by))
            .with_grace_until(Some(invocation.grace_until))
            // A rejected run's release gives up its tries where the settle reserve begins: the reserve
            // is the DLQ send's (see `release` in conveyor-core's pipeline).
            .with_release_retries_until(Some(invocation.grace_until));
        let job_type = self.pipeline.router().job_type_for(message);
        let process = || {
            let run = self
                .pipeline
                .process(Arc::clone(message), Arc::clone(&lane.name), &lease, budget);
            self.tenants.run(message, job_type, run)
        };
        let mut processed = process().await;
        // The settlement's SQS calls and a FIFO record's waits below hold no slot.
        drop(slot);
        // A FIFO message cannot be deferred with a copy (it would break its group's order), so a
        // deferral (the store unreachable, its key in progress elsewhere) waits here while the
        // invocation has time, as the worker waits in flight: listing it would spend a receive of it
        // and of every message behind it in its group. A failed claimed run is retried here the same
        // way, after its backoff, while its budget lasts (the store counts the runs): the last run's
        // retry becomes the reject below.
        if lane.fifo {
            loop {
                let left = invocation.cutoff.saturating_duration_since(Instant::now());
                let Some(room) = left.checked_sub(FIFO_WAIT_RESERVE) else {
                    break;
                };
                let (wait, reason) = match &processed.outcome {
                    Outcome::Defer { delay, reason, .. } => ((*delay).min(room), reason),
                    Outcome::Retry { delay, reason }
                        if *delay <= room && self.retries_in_place(lane, message, &processed).await =>
                    {
                        (*delay, reason)
                    }
                    _ => break,
                };
                if wait.is_zero() && matches!(processed.outcome, Outcome::Defer { .. }) {
                    // Nothing to wait for (a cancelled run's deferral): listed as it is.
                    break;
                }
                tracing::info!(%reason, wait_ms = wait.as_millis() as u64, "the FIFO message waits in the invocation, then tries again");
                tokio::time::sleep(wait).await;
                let Some(_slot) = self.record_slot(invocation.cutoff).await else {
                    break;
                };
                processed = process().await;
            }
        }
        // Untyped messages learn their job type from the default route.
        if message.job_type().is_none()
            && let Some(job_type) = processed.job_type
        {
            conveyor_core::trace::record_job_type(&span, job_type);
        }
        let duration = processed.handler_duration;
        let fallback = processed.fallback_delay();
        if let Outcome::Ack(reason) = &processed.outcome {
            conveyor_core::trace::record_settlement(&span, Settlement::Acknowledged(*reason));
            tracing::debug!(?reason, "acknowledged");
            return (Settled::Acked(*reason), duration, None);
        }
        let deferred = match &processed.outcome {
            Outcome::Defer { reason, cause, .. } => Some((reason.clone(), *cause)),
            _ => None,
        };
        let Some(queue) = lane.queue.get().await else {
            return (Settled::Untouched, duration, deferred);
        };
        let origin = Origin {
            queue: &lane.name,
            handler: processed.job_type.unwrap_or(""),
            attempt: processed.attempt(message),
            receive: message.receive_count.max(1),
            max_attempts: queue.max_receive_count(),
        };
        let outcome = at_last_attempt(processed.outcome, origin);
        let outcome = if lane.fifo && duration.is_none() {
            never_ran_at_the_last_attempt(outcome, origin)
        } else {
            outcome
        };
        conveyor_core::trace::record_run_error(&span, &outcome);
        let settled = match &outcome {
            Outcome::Ack(reason) => {
                tracing::debug!(?reason, "acknowledged");
                Settled::Acked(*reason)
            }
            Outcome::Retry { delay, reason } => {
                let room = visibility_room(message, invocation.settle_by);
                let path = retry_path(origin, reason, lane.fifo, *delay, room);
                let settle_by = invocation.settle_by;
                match path {
                    // A record whose receipt handle SQS never issued (a hand-written event) gets no
                    // queue call at all; it is listed, as Lambda would list it.
                    _ if item.handle_not_issued() => Settled::Retry { delay: *delay },
                    RetryPath::Copy => {
                        let runs = origin.attempt;
                        retry_on_copy(
                            queue.as_ref(),
                            &self.pipeline,
                            message,
                            *delay,
                            reason,
                            runs,
                            settle_by,
                        )
                        .await
                    }
                    RetryPath::DeadLetter(failure) => {
                        tracing::info!(%reason, "retryable failure at the last allowed receive of a FIFO message; dead-lettered with the reason");
                        // The run's release said `retrying`: a tracked job's status says `dead_lettered`.
                        let pipeline = &self.pipeline;
                        pipeline
                            .unrun_at_the_last_receive(message, &failure, Some(settle_by))
                            .await;
                        self.dead_letter(queue.as_ref(), message, &failure, fallback, settle_by)
                            .await
                    }
                    RetryPath::Visibility => {
                        tracing::info!(delay_ms = delay.as_millis() as u64, %reason, "retrying after backoff");
                        Settled::Retry { delay: *delay }
                    }
                }
            }
            Outcome::Defer { delay, reason, cause } => {
                let delay = if lane.fifo {
                    self.fifo_wait(lane, message, *delay, queue.max_receive_count())
                } else {
                    *delay
                };
                let settle_by = invocation.settle_by;
                let cause = Some(*cause);
                defer(
                    queue.as_ref(),
                    &self.pipeline,
                    message,
                    delay,
                    reason,
                    cause,
                    settle_by,
                )
                .await
            }
            Outcome::Reject(failure) => {
                let settle_by = invocation.settle_by;
                self.dead_letter(queue.as_ref(), message, failure, fallback, settle_by)
                    .await
            }
        };
        conveyor_core::trace::record_settlement(&span, settled.settlement());
        (settled, duration, deferred)
    }

    /// Sends `message` to the DLQ with `failure` (the event source mapping deletes it when it is not
    /// listed), by `settle_by`.
    async fn dead_letter(
        &self,
        queue: &dyn Queue,
        message: &Message,
        failure: &conveyor_core::runtime::Failure,
        fallback: Duration,
        settle_by: Instant,
    ) -> Settled {
        let mode = self.config.reject_mode;
        let rejecting = reject(queue, message, failure, mode, fallback);
        match tokio::time::timeout_at(settle_by, rejecting).await {
            Ok(Disposition::Delete) => Settled::DeadLettered,
            Ok(Disposition::Visible(delay)) => Settled::Retry { delay },
            Err(_) => {
                // The copy may or may not have reached the DLQ: listed, the message comes back
                // and is rejected again (at worst a second copy, never none).
                tracing::warn!(
                    "the DLQ send did not answer before the invocation deadline; listing the message"
                );
                Settled::Untouched
            }
        }
    }

    /// Defers the messages the invocation had no time left to start. Listing them would spend one of
    /// their receives without a run (SQS counts every receive toward `maxReceiveCount`, so a batch too
    /// big for the function timeout would dead-letter its tail unrun): on a standard queue each is
    /// deferred with a copy instead (no delay; the mapping deletes the original), all copies sent at
    /// once and cut at `settle_by`. On a FIFO queue a copy would break the group's order, so they are
    /// listed; so is a message whose copy did not go out in time.
    async fn defer_not_started(&self, results: &mut [(Lane, Vec<ItemResult>)], settle_by: Instant) {
        let mut deferrals = Vec::new();
        let pipeline = &self.pipeline;
        for (lane_index, (lane, lane_results)) in results.iter().enumerate() {
            for (item_index, result) in lane_results.iter().enumerate() {
                if result.settled != Settled::NotStarted {
                    continue;
                }
                let message = Arc::clone(&result.message);
                let queue = Arc::clone(&lane.queue);
                deferrals.push(async move {
                    let settled = match queue.get().await {
                        Some(queue) if !queue.is_fifo() => {
                            defer_unrun(pipeline, queue.as_ref(), &message, settle_by).await
                        }
                        _ => Settled::Untouched,
                    };
                    (lane_index, item_index, settled)
                });
            }
        }
        // A copy that did not go leaves the message away for a while (see `stay_away`).
        for (lane_index, item_index, settled) in futures_util::future::join_all(deferrals).await {
            results[lane_index].1[item_index].settled = settled;
        }
    }

    /// On a FIFO queue the messages behind a failed one in their group, or left when the invocation's
    /// time ran out, go back unrun, and their receive counts: at the last receive the redrive policy
    /// allows, SQS's redrive would move them to the DLQ without a reason. Those are dead-lettered now
    /// instead, with a reason that says they never ran and why. (The worker holds such messages in
    /// flight instead; an invocation cannot outlive its timeout.)
    async fn dead_letter_unrun_at_the_last_receive(
        &self,
        results: &mut [(Lane, Vec<ItemResult>)],
        settle_by: Instant,
    ) {
        let mut rejects = Vec::new();
        for (lane_index, (lane, lane_results)) in results.iter().enumerate() {
            if !lane.fifo {
                continue;
            }
            let mut ahead: Option<&str> = None;
            for (item_index, result) in lane_results.iter().enumerate() {
                if result.lost {
                    // Not ours: no DLQ copy of it; the messages behind it did not run because of it.
                    ahead.get_or_insert(&result.message.id);
                    continue;
                }
                let unrun = result.settled.is_failure() && result.handler_duration.is_none();
                if !unrun {
                    if result.settled.is_failure() && ahead.is_none() {
                        ahead = Some(&result.message.id);
                    }
                    continue;
                }
                let Some(queue) = lane.queue.get().await else {
                    continue;
                };
                let Some(max) = queue.max_receive_count() else {
                    continue;
                };
                let attempt = result.message.attempt();
                if result.message.receive_count.max(1) < max {
                    continue;
                }
                let (cause, why) = match (&result.deferred, ahead) {
                    (Some((reason, cause)), _) => (
                        cause.not_run(),
                        format!("{reason} at each try, and each receive counted"),
                    ),
                    (None, Some(head)) => (
                        NotRun::BehindItsGroup,
                        format!(
                            "message {head} ahead of it in its FIFO group had not finished, and each receive \
                             behind it counted"
                        ),
                    ),
                    (None, None) => (
                        NotRun::OutOfTime,
                        "the invocation's time ran out before it started, and each such receive counted (a \
                         batch should fit in the function timeout: lower the batch size or raise the timeout)"
                            .to_owned(),
                    ),
                };
                let why = format!("{why}; redrive it once the group's earlier messages are settled");
                let failure = not_run_at_the_last_receive(
                    cause,
                    &why,
                    attempt,
                    max,
                    &lane.name,
                    result.message.job_type().unwrap_or(""),
                );
                let message = Arc::clone(&result.message);
                let mode = self.config.reject_mode;
                rejects.push(async move {
                    let settled = dead_letter_unrun(
                        &self.pipeline,
                        queue.as_ref(),
                        &message,
                        &failure,
                        mode,
                        settle_by,
                    )
                    .await;
                    (lane_index, item_index, settled)
                });
            }
        }
        for (lane_index, item_index, settled) in futures_util::future::join_all(rejects).await {
            if settled == Settled::DeadLettered {
                results[lane_index].1[item_index].settled = settled;
            }
        }
    }

    /// Sets every retried message's visibility to its backoff delay: one batch call per queue, all
    /// of them cut at `settle_by` (a message whose change did not land comes back at the visibility
    /// timeout: later, never lost).
    async fn apply_backoff(&self, results: &[(Lane, Vec<ItemResult>)], settle_by: Instant) {
        let mut per_source: Vec<Backoffs<'_>> = Vec::new();
        for (lane, lane_results) in results {
            for result in lane_results
                .iter()
                .filter(|result| !result.backoff_set && !result.not_issued)
            {
                let Settled::Retry { delay } = result.settled else {
                    continue;
                };
                let position = match per_source.iter().position(|group| group.source == lane.source) {
                    Some(position) => position,
                    None => {
                        // Resolved already: a retry got here through `settle`, which needed the queue.
                        let Some(queue) = lane.queue.get().await else {
                            continue;
                        };
                        per_source.push(Backoffs {
                            source: lane.source,
                            source_queue: Arc::clone(&lane.queue),
                            queue,
                            changes: Vec::new(),
                            ids: Vec::new(),
                        });
                        per_source.len() - 1
                    }
                };
                let group = &mut per_source[position];
                group.changes.push(VisibilityChange {
                    receipt_handle: result.message.receipt_handle.clone(),
                    timeout: delay.min(visibility_room(&result.message, settle_by)),
                });
                group.ids.push(&result.message.id);
            }
        }
        for group in per_source {
            group.source_queue.cover_over(settle_by).await;
            set_backoffs(group.queue.as_ref(), &group.changes, &group.ids, settle_by).await;
        }
    }

    /// Sets a FIFO lane's backoffs as soon as the lane ends, not after the slowest lane: a group's wait
    /// (a head that failed, a store outage saved for, see [`BatchProcessor::fifo_wait`]) must not
    /// depend on time left after other lanes' handlers and completions took theirs, or the group comes
    /// back at the visibility timeout and spends its receives.
    async fn apply_lane_backoff(&self, lane: &Lane, results: &mut [ItemResult], settle_by: Instant) {
        if !results
            .iter()
            .any(|result| matches!(result.settled, Settled::Retry { .. }))
        {
            return;
        }
        let Some(queue) = lane.queue.get().await else {
            return;
        };
        // A message that did not run and is at its last allowed receive is dead-lettered after the
        // lanes (`dead_letter_unrun_at_the_last_receive`, or the late deferrer at the cutoff): a
        // visibility change first could leave that delete a stale receipt. Its backoff, if still
        // needed, is set with the others at the end.
        let last = queue.max_receive_count().unwrap_or(u32::MAX);
        let mut positions = Vec::new();
        let mut changes = Vec::new();
        let mut ids = Vec::new();
        for (position, result) in results.iter().enumerate() {
            let Settled::Retry { delay } = result.settled else {
                continue;
            };
            if result.handler_duration.is_none() && result.message.receive_count.max(1) >= last {
                continue;
            }
            if result.not_issued {
                // SQS would refuse it: listed without its backoff.
                continue;
            }
            positions.push(position);
            changes.push(VisibilityChange {
                receipt_handle: result.message.receipt_handle.clone(),
                timeout: delay.min(visibility_room(&result.message, settle_by)),
            });
            ids.push(result.message.id.as_str());
        }
        if !changes.is_empty() {
            lane.queue.cover_over(settle_by).await;
        }
        if changes.is_empty() || !set_backoffs(queue.as_ref(), &changes, &ids, settle_by).await {
            // Nothing to set, or not answered: the end of the invocation tries them with the others.
            return;
        }
        for position in positions {
            results[position].backoff_set = true;
        }
    }
}

/// Sets the visibility of retried messages to their backoff in one batch call, cut at `settle_by`; a
/// change that does not land leaves its message to come back at the visibility timeout (later, never
/// lost). False when the call itself got no answer (an entry SQS refused is logged and counts as
/// answered).
async fn set_backoffs(
    queue: &dyn Queue,
    changes: &[VisibilityChange],
    ids: &[&str],
    settle_by: Instant,
) -> bool {
    let changing = queue.change_visibility_batch(changes);
    let answer = tokio::time::timeout_at(settle_by, changing)
        .await
        .unwrap_or_else(|_| {
            Err(conveyor_core::port::QueueError::Unavailable {
                message: "no answer before the invocation deadline".to_owned(),
            })
        });
    match answer {
        Ok(entry_failures) => {
            for failure in entry_failures {
                let message_id = ids.get(failure.index).copied().unwrap_or("?");
                tracing::warn!(
                    message_id,
                    error = %failure.error,
                    "could not set the retry's backoff; it comes back at the visibility timeout"
                );
            }
            true
        }
        Err(error) => {
            tracing::warn!(
                queue = %queue.name(),
                %error,
                messages = changes.len(),
                "could not set the retries' backoff; they come back at the visibility timeout"
            );
            false
        }
    }
}

/// The visibility changes for one source queue's retries, with their message ids for logs.
struct Backoffs<'a> {
    source: usize,
    /// The source's queue as the invocation holds it (for the visibility cover's end).
    source_queue: Arc<SourceQueue>,
    queue: Arc<dyn Queue>,
    changes: Vec<VisibilityChange>,
    ids: Vec<&'a str>,
}

/// One record's result in its tenant label's figures (see `crate::metrics`).
fn count_for_tenant(metrics: &mut BatchMetrics, label: &str, result: &ItemResult) {
    let tenant = metrics.tenant(label);
    tenant.received += 1;
    if let Some(duration) = result.handler_duration {
        tenant.handler_durations.push(duration);
    }
    match result.settled {
        Settled::Acked(AckReason::Completed) => tenant.succeeded += 1,
        Settled::DeadLettered => tenant.dead_lettered += 1,
        Settled::Deferred => tenant.deferred += 1,
        Settled::Retry { .. } | Settled::Untouched | Settled::NotStarted => tenant.retried += 1,
        Settled::Acked(_) => {}
    }
}

/// The index of the source for `arn`, added when new.
fn source_for(sources: &mut Vec<Source>, arn: &str) -> usize {
    if let Some(position) = sources.iter().position(|source| source.arn == arn) {
        return position;
    }
    let name = if arn.is_empty() {
        "unknown"
    } else {
        queue_name(arn)
    };
    sources.push(Source {
        arn: arn.to_owned(),
        name: Arc::from(name),
        items: Vec::new(),
        metrics: BatchMetrics::new(name),
    });
    sources.len() - 1
}

/// Every record of `lane` settled as `settled` without starting (the lane did not get its FIFO
/// group's turn), `why` logged for each.
fn unrun_lane(lane: Lane, settled: Settled, why: &str) -> (Lane, Vec<ItemResult>) {
    let results = lane
        .items
        .iter()
        .map(|item| {
            tracing::info!(message_id = %item.message.id, "{why}");
            ItemResult {
                index: item.index,
                source: lane.source,
                message: Arc::clone(&item.message),
                settled,
                handler_duration: None,
                deferred: None,
                backoff_set: false,
                lost: false,
                not_issued: item.handle_not_issued(),
            }
        })
        .collect();
    (lane, results)
}

/// Defers a record of a standard queue the invocation had no time to start: its large-payload object
/// touched when due ([`Pipeline::before_unrun_copy`]: the copy must not outlive it), then a copy without
/// delay. A copy that does not go leaves the message away for a while (see [`stay_away`]).
async fn defer_unrun(
    pipeline: &Pipeline,
    queue: &dyn Queue,
    message: &Message,
    settle_by: Instant,
) -> Settled {
    // Bounded like the copy: a slow S3 must not cost the invocation.
    let _ = tokio::time::timeout_at(settle_by, pipeline.before_unrun_copy(message)).await;
    let reason = "not started: too close to the invocation deadline";
    defer(queue, pipeline, message, Duration::ZERO, reason, None, settle_by).await
}

/// Defers a message without spending a receive: sends a delayed copy (see `conveyor-core/src/deferral.rs`) and
/// leaves the original out of `batchItemFailures`, so the event source mapping deletes it. When the copy
/// cannot be built or sent before `settle_by`, the message is retried instead (that receive counts).
async fn defer(
    queue: &dyn conveyor_core::port::Queue,
    pipeline: &Pipeline,
    message: &Message,
    delay: Duration,
    reason: &str,
    cause: Option<DeferCause>,
    settle_by: Instant,
) -> Settled {
    let fifo = queue.is_fifo();
    let copy = match cause {
        Some(cause) => conveyor_core::runtime::deferred_copy_for(message, delay, fifo, cause, pipeline.now()),
        None => conveyor_core::runtime::deferred_copy(message, delay, fifo),
    };
    continue_on_copy(queue, pipeline, message, copy, delay, reason, settle_by).await
}

/// Retries a message of a standard queue on a fresh copy after `delay`, when SQS's 12 hours from its
/// first receive leave too little to hold it that long ([`visibility_room`]): the copy starts its own
/// 12 hours and carries this run in its history (see `conveyor-core/src/deferral.rs`), as the worker
/// does. When the copy cannot be built or sent, the message is retried within the room it has.
async fn retry_on_copy(
    queue: &dyn conveyor_core::port::Queue,
    pipeline: &Pipeline,
    message: &Message,
    delay: Duration,
    reason: &str,
    runs: u32,
    settle_by: Instant,
) -> Settled {
    tracing::info!(%reason, delay_ms = delay.as_millis() as u64, runs, "retrying on a fresh copy: its last allowed receive, or SQS's 12 hours from the first receive leave too little to wait");
    let copy = conveyor_core::runtime::retried_copy(message, delay, false, runs);
    continue_on_copy(queue, pipeline, message, copy, delay, reason, settle_by).await
}

/// Sends `copy` and leaves the original out of `batchItemFailures`, so the event source mapping
/// deletes it; when the copy cannot be built or sent before `settle_by`, the message is retried
/// instead (that receive counts).
async fn continue_on_copy(
    queue: &dyn conveyor_core::port::Queue,
    pipeline: &Pipeline,
    message: &Message,
    copy: Result<conveyor_core::port::OutgoingMessage, conveyor_core::runtime::DeferralError>,
    delay: Duration,
    reason: &str,
    settle_by: Instant,
) -> Settled {
    let copy = match copy {
        Ok(copy) => copy,
        Err(why) => {
            tracing::info!(%reason, %why, "cannot defer with a copy; retrying after the delay");
            return Settled::Retry { delay };
        }
    };
    let mut pause = Duration::from_millis(100);
    let error = loop {
        let error = match tokio::time::timeout_at(settle_by, queue.send(copy.clone())).await {
            Ok(Ok(copy_id)) => {
                tracing::info!(%reason, delay_ms = delay.as_millis() as u64, %copy_id, "deferred: a delayed copy was sent");
                return Settled::Deferred;
            }
            Ok(Err(error)) if error.is_retryable() => error.to_string(),
            Ok(Err(error)) => break error.to_string(),
            Err(_) => break "no answer before the invocation deadline".to_owned(),
        };
        if Instant::now() + pause >= settle_by {
            break error;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    };
    let delay = stay_away(pipeline, queue, message, delay);
    tracing::warn!(%error, %reason, delay_ms = delay.as_millis() as u64, "could not send the deferred copy; this receive counts, the message stays away as long as it may");
    Settled::Retry { delay }
}

/// How long a message whose copy could not be sent stays away (its receive is spent either way): a job
/// not due yet until it is due; any other the longer of its own delay and a stay that doubles with each
/// receive, from the queue's visibility timeout, so a long `SendMessage` outage spends few receives
/// (five span 31 visibility timeouts) where coming back at each timeout would dead-letter records the
/// function never had time to start. Both within [`Pipeline::longest_stay_away`] (SQS's 12 hours; a
/// touch period for a large payload, so its object outlives the stay).
fn stay_away(
    pipeline: &Pipeline,
    queue: &dyn conveyor_core::port::Queue,
    message: &Message,
    delay: Duration,
) -> Duration {
    let longest = pipeline.longest_stay_away(message);
    let until_due = conveyor_core::runtime::due_at(message)
        .and_then(|due| due.duration_since(pipeline.now()).ok())
        .filter(|remaining| !remaining.is_zero());
    if let Some(remaining) = until_due {
        return remaining.max(delay).min(longest);
    }
    // SQS counts receives per message: this one's count, not the job's runs across copies.
    let doublings = message.receive_count.saturating_sub(1).min(16);
    let doubling = queue.visibility_timeout().saturating_mul(1 << doublings);
    doubling.max(delay).min(longest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor_core::message::AttributeValue;
    use conveyor_core::port::{PayloadPointer, size_attribute};
    use conveyor_core::runtime::{DUE_ATTRIBUTE, due_value};
    use conveyor_core::{Payloads, Router};
    use conveyor_testing::{MemoryPayloadStore, MemoryQueue};
    use std::time::SystemTime;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A pipeline with payloads (a touch a day) on a clock stopped at `now`.
    fn pipeline(now: SystemTime) -> Pipeline {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        Pipeline::new(Router::new())
            .with_payloads(Payloads::new(store).touch_every(DAY))
            .with_clock(Arc::new(move || now))
    }

    fn message(receive_count: u32, due: Option<SystemTime>, large: bool) -> Message {
        let body = if large {
            PayloadPointer::new("payloads", "job").to_body()
        } else {
            "{}".to_owned()
        };
        let mut message = Message::new("m", body);
        message.receive_count = receive_count;
        if large {
            let (name, value) = size_attribute(2 * 1024 * 1024);
            message.attributes.insert(name, value);
        }
        if let Some(due) = due {
            message
                .attributes
                .insert(DUE_ATTRIBUTE.to_owned(), AttributeValue::number(due_value(due)));
        }
        message
    }

    #[test]
    fn a_record_whose_copy_did_not_go_stays_away_longer_at_each_receive() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pipeline = pipeline(now);
        let queue = MemoryQueue::standard("jobs").with_visibility_timeout(Duration::from_secs(180));
        let stay = |receive_count| {
            stay_away(
                &pipeline,
                &queue,
                &message(receive_count, None, false),
                Duration::ZERO,
            )
        };
        assert_eq!(stay(1), Duration::from_secs(180), "the visibility timeout first");
        assert_eq!(stay(3), Duration::from_secs(720), "doubled at each receive");
        assert_eq!(stay(40), Duration::from_secs(12 * 3600), "within SQS's 12 hours");
        // A retry's own longer delay is kept.
        let long = stay_away(
            &pipeline,
            &queue,
            &message(1, None, false),
            Duration::from_secs(600),
        );
        assert_eq!(long, Duration::from_secs(600));
    }

    #[test]
    fn a_job_not_due_stays_until_due_and_a_large_one_at_most_a_touch_period() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pipeline = pipeline(now);
        let queue = MemoryQueue::standard("jobs").with_visibility_timeout(Duration::from_secs(180));
        let in_an_hour = Some(now + Duration::from_secs(3600));
        let small = stay_away(&pipeline, &queue, &message(1, in_an_hour, false), Duration::ZERO);
        assert_eq!(
            small,
            Duration::from_secs(3600),
            "until due, by the pipeline's clock"
        );
        let in_ten_days = Some(now + 10 * DAY);
        let far = stay_away(&pipeline, &queue, &message(1, in_ten_days, false), Duration::ZERO);
        assert_eq!(far, Duration::from_secs(12 * 3600));
        // A large job: a touch period (here shorter than 12 hours) bounds the stay, so its object,
        // touched at most that long ago, outlives it.
        let short_touch = Pipeline::new(Router::new())
            .with_payloads(
                Payloads::new(Arc::new(MemoryPayloadStore::with_bucket("payloads")))
                    .touch_every(Duration::from_secs(2 * 3600)),
            )
            .with_clock(Arc::new(move || now));
        let large = stay_away(
            &short_touch,
            &queue,
            &message(1, in_ten_days, true),
            Duration::ZERO,
        );
        assert_eq!(large, Duration::from_secs(2 * 3600));
        let large_due = stay_away(&short_touch, &queue, &message(9, None, true), Duration::ZERO);
        assert_eq!(large_due, Duration::from_secs(2 * 3600));
    }

    #[test]
    fn a_visibility_timeout_under_six_function_timeouts_is_advised_against() {
        let advice = visibility_advice(Duration::from_secs(30), Duration::from_secs(10)).unwrap();
        assert!(
            advice.contains("at least 60s") && advice.contains("VisibilityTimeout"),
            "{advice}"
        );
        assert_eq!(
            visibility_advice(Duration::from_secs(60), Duration::from_secs(10)),
            None
        );
    }
}
