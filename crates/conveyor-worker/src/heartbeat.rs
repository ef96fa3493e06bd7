//! The heartbeat: keeps every in-flight message invisible while its job runs.
//!
//! # Design note: ordering and time budgets
//!
//! Each received message is registered here (with its [`Lease`]) *before* anything else happens to it,
//! and unregistered only *after* its outcome was applied to the queue. Between those two points its
//! visibility deadline is tracked in the lease and extended when less than half of its queue's
//! visibility timeout remains (more when extension calls have been slow: twice the slowest recent
//! call plus a second, up to three quarters), by that visibility timeout, in
//! `ChangeMessageVisibilityBatch` calls of up to 10 entries. Half, not a third: an SQS that answers in
//! more than a third of the visibility timeout must still be able to extend a message before its
//! deadline, and the first extension happens before any latency was observed.
//!
//! 1. **Register at receipt, not at start.** A message can wait for a FIFO predecessor, a job-type slot
//!    or a rate-limit token before its job starts; it is in flight all that time and must not reappear.
//! 2. **The deadline is the one SQS applies.** Every receive sends the visibility timeout the worker
//!    uses here (the queue's own, read at connect, or the configured override), and the deadline is
//!    counted from when the receive returned. An extension's new deadline is counted from when the
//!    request was *sent*, so the tracked deadline is never later than the real one.
//! 3. **No call can stall the heartbeat.** The loop only decides what is due; each batch's extension runs
//!    in its own task, retried promptly with jitter (`retry.rs`) and each try cut at the earliest
//!    deadline in the batch. One hung request delays nothing else; an entry is not sent again while its
//!    call is out.
//! 4. **Visibility first, then the claim, independently.** The idempotency claim's lease is extended only
//!    after the message's visibility extension succeeded, to the new visibility deadline, in a task of
//!    its own (one at a time per message): a DynamoDB brownout never holds up visibility extensions. The
//!    claim must never outlive the message's invisibility: if this worker dies, the claim lapses exactly
//!    when SQS hands the message to someone else. The claim is read from the lease at that moment: the
//!    pipeline takes it out of the lease before completing or releasing it, so a settled record is never
//!    extended; a `Fenced` answer for a claim the lease no longer holds is that benign race and is
//!    ignored. A `Fenced` answer for the claim still held means it was taken over: the handler is
//!    cancelled.
//! 5. **A lease is lost only when it is.** `LeaseLost` (receipt no longer valid: received again elsewhere
//!    or deleted), a permanent refusal, or transient failures that last until the deadline itself: then
//!    the handler's token is cancelled (the pipeline releases the claim and the message comes back).
//! 6. **Limits.** Extensions stop at `max_processing_time` after the receipt, and never go past SQS's
//!    12 hours counted from the message's *first* receive (`receiver::visibility_cap`). SQS checks the
//!    limit when a call arrives, so each try asks for what the limit leaves after the call's latency
//!    allowance (a retry asks for less), and an extension that would not outlast the margin is not
//!    made. Then the message is left to expire: the handler's token is cancelled (the pipeline gives it
//!    a grace period, releases the claim and the message goes back at once).
//! 7. **Unregister after the outcome is applied.** A delete is retried until shortly before the receipt
//!    expires; the `Registration` travels with the delete request and is dropped once `DeleteMessageBatch`
//!    answered, so the message stays invisible until its delete is confirmed. An extension sent while
//!    the delete is out can reach SQS after it and be refused: the deleter marks the registration
//!    first (`Registration::deleting`), and such a refusal only ends the extensions (no cancel, no lost
//!    lease counted, no warning).
//! 8. **At shutdown the heartbeat stops last**, after the drain, the releases and the final delete flush.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use conveyor_core::CancelReason;
use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_VISIBILITY_TIMEOUT};
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{EntryError, IdempotencyStore, Queue, QueueError, StoreError, VisibilityChange},
    runtime::{CANCEL_GRACE, Lease},
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::report::{WorkerStatus, add};
use crate::retry::{Attempts, errors_by_entry};
use crate::telemetry::QueueMetrics;

/// Claim extensions run at most this many at once.
const CLAIM_EXTENSION_CONCURRENCY: usize = 16;
/// The loop looks again at least this often (new registrations, finished calls).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// What the heartbeat needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeartbeatSettings {
    /// No extension past this long after the receipt.
    pub(crate) max_processing_time: Duration,
}

/// One queue the heartbeat extends messages of.
#[derive(Clone)]
pub(crate) struct HeartbeatQueue {
    /// The queue.
    pub(crate) queue: Arc<dyn Queue>,
    /// The visibility timeout each receive sent and each extension sends.
    pub(crate) visibility_timeout: Duration,
}

/// A queue as the heartbeat tracks it: its settings and how slow its extension calls have been.
struct Tracked {
    target: HeartbeatQueue,
    /// A decaying maximum of recent extension call durations, in microseconds.
    slowest_micros: AtomicU64,
}

impl Tracked {
    /// Extend when less than this remains: half the visibility timeout, or twice the slowest recent
    /// call plus a second when that is more (at most three quarters).
    fn margin(&self) -> Duration {
        let visibility = self.target.visibility_timeout;
        (visibility / 2).max(self.latency_allowance().min(visibility * 3 / 4))
    }

    /// How late a call may reach SQS after it is sent: twice the slowest recent call plus a second.
    /// An extension near the processing limit asks for that much less than the limit leaves, since
    /// SQS checks the limit when the call arrives.
    fn latency_allowance(&self) -> Duration {
        let slowest = Duration::from_micros(self.slowest_micros.load(Ordering::Relaxed));
        slowest.saturating_mul(2) + Duration::from_secs(1)
    }

    /// Records how long one extension call took.
    fn observe(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let old = self.slowest_micros.load(Ordering::Relaxed);
        self.slowest_micros
            .store(micros.max(old - old / 8), Ordering::Relaxed);
    }
}

/// The heartbeat's registry of in-flight messages. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Heartbeats {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Mutex<BTreeMap<u64, Entry>>,
    next_id: AtomicU64,
    settings: HeartbeatSettings,
    queues: Vec<Tracked>,
    store: Option<Arc<dyn IdempotencyStore>>,
    claim_slots: Arc<Semaphore>,
    status: WorkerStatus,
    metrics: Vec<Arc<QueueMetrics>>,
}

struct Entry {
    queue: usize,
    receipt: ReceiptHandle,
    message_id: String,
    lease: Arc<Lease>,
    /// No extension past this.
    stop_at: Instant,
    /// False once the lease is lost or the limit is reached.
    extending: bool,
    /// An extension call for this entry is out.
    in_call: bool,
    /// A claim extension for this entry is out.
    claim_in_call: bool,
    /// The message's delete has been sent (see [`Registration::deleting`]).
    deleting: bool,
}

/// A message's place in the heartbeat; dropping it ends the message's heartbeat.
pub(crate) struct Registration {
    id: u64,
    inner: Arc<Inner>,
}

impl Registration {
    /// Says the message's delete is being sent. From then on an extension refused for this receipt
    /// was most likely refused because the delete landed first (the registration lives until the
    /// delete's answer is applied), so it is not a lost lease: the entry stops being extended, but
    /// nothing is cancelled, counted or warned about. A delete that really lost the lease says so itself.
    pub(crate) fn deleting(&self) {
        if let Some(entry) = self.inner.lock().get_mut(&self.id) {
            entry.deleting = true;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.inner.lock().remove(&self.id);
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("id", &self.id).finish()
    }
}

struct Due {
    id: u64,
    receipt: ReceiptHandle,
    message_id: String,
    lease: Arc<Lease>,
    timeout: Duration,
    /// No extension past this (see [`Due::timeout_at`]).
    stop_at: Instant,
    /// How late a try may reach SQS (see [`Tracked::latency_allowance`]).
    allowance: Duration,
}

impl Due {
    /// The timeout a try sent at `now` asks for: no more than leaves the limit, counted from the
    /// latest the try may reach SQS (a retry comes later than the first try, so it asks for less).
    fn timeout_at(&self, now: Instant) -> Duration {
        self.timeout
            .min(self.stop_at.saturating_duration_since(now + self.allowance))
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn name(&self, queue: usize) -> &str {
        self.queues[queue].target.queue.name()
    }

    /// Marks entries as no longer in a call.
    fn calls_done(&self, ids: &[u64]) {
        let mut entries = self.lock();
        for id in ids {
            if let Some(entry) = entries.get_mut(id) {
                entry.in_call = false;
            }
        }
    }
}

impl Heartbeats {
    pub(crate) fn new(
        settings: HeartbeatSettings,
        queues: Vec<HeartbeatQueue>,
        store: Option<Arc<dyn IdempotencyStore>>,
        status: WorkerStatus,
        metrics: Vec<Arc<QueueMetrics>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                entries: Mutex::new(BTreeMap::new()),
                next_id: AtomicU64::new(0),
                settings,
                queues: queues
                    .into_iter()
                    .map(|target| Tracked {
                        target,
                        slowest_micros: AtomicU64::new(0),
                    })
                    .collect(),
                store,
                claim_slots: Arc::new(Semaphore::new(CLAIM_EXTENSION_CONCURRENCY)),
                status,
                metrics,
            }),
        }
    }

    /// Starts tracking `message` of queue `queue`, received at `received_at` with `lease`. Extensions
    /// stop at the processing limit (counted from this receipt) or at `visibility_cap`, SQS's 12 hours
    /// from the message's first receive, whichever comes first.
    pub(crate) fn register(
        &self,
        queue: usize,
        message: &Message,
        lease: Arc<Lease>,
        received_at: Instant,
        visibility_cap: Instant,
    ) -> Registration {
        let settings = &self.inner.settings;
        let stop_at =
            (received_at + settings.max_processing_time.min(MAX_VISIBILITY_TIMEOUT)).min(visibility_cap);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.lock().insert(
            id,
            Entry {
                queue,
                receipt: message.receipt_handle.clone(),
                message_id: message.id.clone(),
                lease,
                stop_at,
                extending: true,
                in_call: false,
                claim_in_call: false,
                deleting: false,
            },
        );
        Registration {
            id,
            inner: Arc::clone(&self.inner),
        }
    }

    /// Messages tracked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().len()
    }

    /// Runs until `stop` is cancelled.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut calls = JoinSet::new();
        loop {
            let next = self.dispatch_due(&mut calls);
            // Biased (a seed of the simulator replays exactly): the stop first, so it is never
            // starved by the others.
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    calls.abort_all();
                    return;
                }
                () = tokio::time::sleep_until(next) => {}
                Some(_) = calls.join_next(), if !calls.is_empty() => {}
            }
        }
    }

    /// Starts an extension call for each queue's due entries; returns when to look again.
    fn dispatch_due(&self, calls: &mut JoinSet<()>) -> Instant {
        let now = Instant::now();
        for (queue, held) in self.lagging_claims(now) {
            extend_claim(&self.inner, queue, held);
        }
        let (due, next) = self.collect_due(now);
        for (queue, due) in due.into_iter().enumerate() {
            let mut due = due;
            while !due.is_empty() {
                let rest = due.split_off(due.len().min(MAX_BATCH_ENTRIES));
                let batch = std::mem::replace(&mut due, rest);
                calls.spawn(extend_batch(Arc::clone(&self.inner), queue, batch));
            }
        }
        next
    }

    /// The claims that lag behind their message's visibility ([`claim_lags`]), to extend now.
    fn lagging_claims(&self, now: Instant) -> Vec<(usize, ClaimHolder)> {
        if self.inner.store.is_none() {
            return Vec::new();
        }
        let entries = self.inner.lock();
        entries
            .iter()
            .filter(|(_, entry)| entry.extending && !entry.claim_in_call)
            .filter(|(_, entry)| claim_lags(&entry.lease, now, self.inner.queues[entry.queue].margin()))
            .map(|(id, entry)| {
                let held = ClaimHolder {
                    id: *id,
                    lease: Arc::clone(&entry.lease),
                    message_id: entry.message_id.clone(),
                };
                (entry.queue, held)
            })
            .collect()
    }

    /// The entries due for an extension, by queue, marked as in a call; stops (and cancels) the ones
    /// past their limit. Also returns when the next entry falls due.
    fn collect_due(&self, now: Instant) -> (Vec<Vec<Due>>, Instant) {
        let inner = &self.inner;
        let mut due: Vec<Vec<Due>> = inner.queues.iter().map(|_| Vec::new()).collect();
        let mut next = now + MAX_SLEEP;
        let mut entries = inner.lock();
        for (id, entry) in entries
            .iter_mut()
            .filter(|(_, entry)| entry.extending && !entry.in_call)
        {
            let tracked = &inner.queues[entry.queue];
            let margin = tracked.margin();
            let visible_until = entry.lease.visible_until();
            let due_at = visible_until.checked_sub(margin).unwrap_or(now);
            if due_at > now {
                next = next.min(due_at);
                continue;
            }
            let room = entry.stop_at.saturating_duration_since(now);
            // SQS checks the limit when the call reaches it: an extension asks for what the limit
            // leaves after the call's latency, and one that would not outlast the margin is not made.
            let allowance = tracked.latency_allowance();
            if room <= margin + allowance {
                entry.extending = false;
                tracing::warn!(
                    message_id = %entry.message_id,
                    queue = %tracked.target.queue.name(),
                    max_processing_time = ?inner.settings.max_processing_time,
                    "message reached its processing limit (max_processing_time from this receipt, or SQS's 12 \
                     hours from its first receive, whichever is sooner): no more visibility extensions; \
                     cancelling its handler and leaving it to expire"
                );
                entry.lease.cancel(CancelReason::ProcessingTimeLimit);
                continue;
            }
            entry.in_call = true;
            due[entry.queue].push(Due {
                id: *id,
                receipt: entry.receipt.clone(),
                message_id: entry.message_id.clone(),
                lease: Arc::clone(&entry.lease),
                // Cut to what the limit leaves at each try (`Due::timeout_at`).
                timeout: tracked.target.visibility_timeout,
                stop_at: entry.stop_at,
                allowance,
            });
        }
        (due, next)
    }
}

/// Extends one batch of one queue, retrying transient failures until the earliest deadline in the
/// batch; what still fails then has lost its lease.
async fn extend_batch(inner: Arc<Inner>, queue: usize, batch: Vec<Due>) {
    let ids: Vec<u64> = batch.iter().map(|due| due.id).collect();
    let mut remaining = batch;
    // Tried until the latest deadline of the batch's earliest: a message whose receive answered late
    // is planned by the earliest its deadline may be, but its receipt may hold until the latest.
    let deadline = remaining
        .iter()
        .map(|due| due.lease.latest_visible_until())
        .min()
        .unwrap_or_else(Instant::now);
    let mut attempts = Attempts::until(deadline);
    let mut last_error = String::new();
    while let Some(left) = attempts.next().await {
        // Each try asks for what the limit still leaves; an entry it leaves nothing is not extended
        // (the next look stops it).
        let now = Instant::now();
        for due in &mut remaining {
            due.timeout = due.timeout_at(now);
        }
        remaining.retain(|due| !due.timeout.is_zero());
        if remaining.is_empty() {
            break;
        }
        let changes: Vec<VisibilityChange> = remaining
            .iter()
            .map(|due| VisibilityChange {
                receipt_handle: due.receipt.clone(),
                timeout: due.timeout,
            })
            .collect();
        let sent_at = Instant::now();
        let tracked = &inner.queues[queue];
        let target = &tracked.target.queue;
        let answer = attempts.run(left, target.change_visibility_batch(&changes)).await;
        tracked.observe(sent_at.elapsed());
        let failures = match answer {
            Ok(failures) => failures,
            Err(error) if error.is_retryable() => {
                if attempts.tries() == 1 {
                    tracing::warn!(%error, queue = %target.name(), messages = remaining.len(), "visibility extension failed; retrying");
                }
                last_error = error.to_string();
                continue;
            }
            Err(error) => {
                lose_all(&inner, queue, &remaining, &error);
                remaining.clear();
                break;
            }
        };
        remaining = settle_batch(&inner, queue, remaining, failures, sent_at);
        if remaining.is_empty() {
            break;
        }
        last_error = "an entry failed with a server fault".to_owned();
    }
    for due in &remaining {
        if mark_lost(&inner, due.id, queue, &due.lease, CancelReason::VisibilityLost) {
            tracing::error!(
                message_id = %due.message_id,
                queue = %inner.name(queue),
                error = %last_error,
                "visibility extension kept failing until the deadline: lease lost; cancelling its handler"
            );
        }
    }
    inner.calls_done(&ids);
}

/// Applies one answer: successful entries get their new deadline (and a claim extension), lost ones
/// are cancelled; returns the entries to try again.
fn settle_batch(
    inner: &Arc<Inner>,
    queue: usize,
    batch: Vec<Due>,
    failures: Vec<conveyor_core::port::EntryFailure>,
    sent_at: Instant,
) -> Vec<Due> {
    let errors = errors_by_entry(batch.len(), failures);
    let mut retry = Vec::new();
    for (due, error) in batch.into_iter().zip(errors) {
        match error {
            None => {
                due.lease.set_visible_until(sent_at + due.timeout);
                add(&inner.status.counters().heartbeat_extensions, 1);
                inner.metrics[queue].extensions.increment(1);
                extend_claim(inner, queue, ClaimHolder::of(&due));
            }
            Some(EntryError::Failed {
                sender_fault: false, ..
            }) => retry.push(due),
            Some(error) => {
                if mark_lost(inner, due.id, queue, &due.lease, CancelReason::VisibilityLost) {
                    tracing::warn!(
                        message_id = %due.message_id,
                        queue = %inner.name(queue),
                        %error,
                        "lease lost: the message is no longer in flight for this worker; cancelling its handler"
                    );
                }
            }
        }
    }
    retry
}

fn lose_all(inner: &Inner, queue: usize, batch: &[Due], error: &QueueError) {
    for due in batch {
        if mark_lost(inner, due.id, queue, &due.lease, CancelReason::VisibilityLost) {
            tracing::error!(
                message_id = %due.message_id,
                queue = %inner.name(queue),
                %error,
                "visibility extension refused: lease lost; cancelling its handler"
            );
        }
    }
}

/// The message whose claim to extend.
struct ClaimHolder {
    id: u64,
    lease: Arc<Lease>,
    message_id: String,
}

impl ClaimHolder {
    fn of(due: &Due) -> Self {
        Self {
            id: due.id,
            lease: Arc::clone(&due.lease),
            message_id: due.message_id.clone(),
        }
    }
}

/// True when `lease`'s claim lags behind its message's visibility deadline and could be taken over
/// within `margin` of `now`: a claim acquired while a visibility extension was out (it was written
/// to the deadline before that extension), which the next visibility extension would come too late
/// for.
fn claim_lags(lease: &Lease, now: Instant, margin: Duration) -> bool {
    // No clone of the claim: this runs for every message in flight at every look of the loop.
    lease
        .claim_open_to_takeover_at()
        .is_some_and(|takeover| takeover < lease.latest_visible_until() && takeover <= now + margin)
}

/// Extends the message's claim (if it holds one) to its new visibility deadline, in a task of its own,
/// one at a time per message.
///
/// A run holds its claim as it holds its message. The tries go on until the claim could be taken over
/// by another delivery of the job ([`Lease::claim_open_to_takeover_at`]). The handler is cancelled
/// ([`CancelReason::ClaimNotRenewed`]) when a try fails within [`CANCEL_GRACE`] of that moment (the
/// store is failing: the handler gets its grace before anyone could take the claim), or, when the
/// tries are only slow, once none has landed by [`CLAIM_CANCEL_MARGIN`] before it. Tries go on through
/// the handler's grace: one that lands then keeps the claim held while the handler winds down.
fn extend_claim(inner: &Arc<Inner>, queue: usize, held: ClaimHolder) {
    let Some(store) = inner.store.clone() else {
        return;
    };
    let Some(claim) = held.lease.claim() else {
        return;
    };
    {
        let mut entries = inner.lock();
        let Some(entry) = entries.get_mut(&held.id) else {
            return;
        };
        if entry.claim_in_call {
            return;
        }
        entry.claim_in_call = true;
    }
    let inner = Arc::clone(inner);
    let ClaimHolder {
        id,
        lease,
        message_id,
    } = held;
    tokio::spawn(async move {
        let _slot = Arc::clone(&inner.claim_slots).acquire_owned().await;
        let takeover = lease
            .claim_open_to_takeover_at()
            .unwrap_or_else(|| lease.latest_visible_until());
        let cutoff = ClaimCutoff::before(takeover);
        let mut attempts = Attempts::until(lease.latest_visible_until().min(takeover));
        let mut renewed = false;
        let mut last_error: Option<StoreError> = None;
        loop {
            // A failing store cancels the handler at `cutoff.failing` even while the tries pause.
            let next = match &last_error {
                Some(error) if !lease.cancellation().is_cancelled() && Instant::now() < cutoff.failing => {
                    // The cutoff first: a try due at the same instant must not skip the cancellation
                    // (the next round would find the cutoff past and never cancel).
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep_until(cutoff.failing) => {
                            cancel_for_claim(&inner, queue, &lease, &message_id, &claim.key, error);
                            continue;
                        }
                        next = attempts.next() => next,
                    }
                }
                _ => attempts.next().await,
            };
            let Some(left) = next else {
                break;
            };
            // Until the handler is told to stop, a try that hangs is cut where it must be told.
            let left = if lease.cancellation().is_cancelled() {
                left
            } else {
                left.min(cutoff.last.saturating_duration_since(Instant::now()))
            };
            let held_until = lease.claim_lease_until_instant();
            let call = store.extend_lease(&claim, lease.claim_lease_until());
            let result = match tokio::time::timeout(left, call).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Unavailable {
                    message: format!("no answer within {left:?}"),
                }),
            };
            if lease.claim().as_ref() != Some(&claim) {
                // Completed or released meanwhile: nothing left to hold.
                renewed = true;
                break;
            }
            match result {
                Ok(()) => {
                    lease.claim_extended(held_until);
                    renewed = true;
                    break;
                }
                Err(StoreError::Fenced { .. }) => {
                    if mark_lost(&inner, id, queue, &lease, CancelReason::ClaimTakenOver) {
                        tracing::error!(
                            %message_id,
                            key = %claim.key,
                            "idempotency claim was taken over while the job ran; cancelling the handler"
                        );
                    }
                    renewed = true;
                    break;
                }
                Err(error) => {
                    if attempts.tries() == 1 {
                        tracing::warn!(
                            %error,
                            %message_id,
                            key = %claim.key,
                            "could not extend the idempotency claim; retrying"
                        );
                    }
                    if Instant::now() >= cutoff.failing {
                        cancel_for_claim(&inner, queue, &lease, &message_id, &claim.key, &error);
                    }
                    last_error = Some(error);
                }
            }
        }
        if !renewed && lease.claim().as_ref() == Some(&claim) {
            let error = StoreError::Unavailable {
                message: "no try landed before the claim could be taken over".into(),
            };
            cancel_for_claim(&inner, queue, &lease, &message_id, &claim.key, &error);
        }
        if let Some(entry) = inner.lock().get_mut(&id) {
            entry.claim_in_call = false;
        }
    });
}

/// Time for a cancellation to reach the handler.
const CLAIM_CANCEL_MARGIN: Duration = Duration::from_millis(500);

/// When a run whose claim is not renewed is told to stop.
#[derive(Debug, Clone, Copy)]
struct ClaimCutoff {
    /// A failed try from here on cancels the handler: its grace ([`CANCEL_GRACE`]) then ends before
    /// the claim could be taken over.
    failing: Instant,
    /// No try landed by here: cancel, whatever the tries still out may answer.
    last: Instant,
}

impl ClaimCutoff {
    fn before(takeover: Instant) -> Self {
        let last = takeover.checked_sub(CLAIM_CANCEL_MARGIN).unwrap_or(takeover);
        let failing = last.checked_sub(CANCEL_GRACE).unwrap_or(last);
        Self { failing, last }
    }
}

/// Cancels a run whose claim could not be renewed in time (once; the message keeps being extended, so
/// it stays invisible until the pipeline has settled it).
fn cancel_for_claim(
    inner: &Inner,
    queue: usize,
    lease: &Lease,
    message_id: &str,
    key: &str,
    error: &StoreError,
) {
    if lease.cancellation().is_cancelled() {
        return;
    }
    lease.cancel(CancelReason::ClaimNotRenewed);
    add(&inner.status.counters().leases_lost, 1);
    inner.metrics[queue].leases_lost.increment(1);
    tracing::error!(
        %message_id,
        %key,
        %error,
        "the idempotency claim could not be renewed before another delivery could take it over; \
         cancelling the handler"
    );
}

/// Stops extending entry `id`, cancels its handler and counts the lost lease; true when the caller
/// should say why. Only stops extending when the message's delete is out (a delete that lands before
/// an extension makes the receipt invalid: nothing is lost), and does nothing when the entry is gone
/// (its outcome was applied meanwhile).
fn mark_lost(inner: &Inner, id: u64, queue: usize, lease: &Lease, reason: CancelReason) -> bool {
    {
        let mut entries = inner.lock();
        let Some(entry) = entries.get_mut(&id) else {
            return false;
        };
        if !entry.extending {
            return false;
        }
        entry.extending = false;
        if entry.deleting {
            tracing::debug!(message_id = %entry.message_id, "extension refused while the delete is out; the delete decides");
            return false;
        }
    }
    if !lease.cancellation().is_cancelled() {
        lease.cancel(reason);
    }
    add(&inner.status.counters().leases_lost, 1);
    inner.metrics[queue].leases_lost.increment(1);
    true
}

#[cfg(test)]
mod tests {
    use conveyor_core::runtime::StoreHealth;
    use std::time::SystemTime;

    use conveyor_core::port::ClaimOutcome;
    use conveyor_core::port::{ClaimRequest, IdempotencyStore};
    use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, MessageState, ScriptedQueue};

    use super::*;

    const VISIBILITY: Duration = Duration::from_secs(30);

    struct Setup {
        queue: Arc<MemoryQueue>,
        heartbeats: Heartbeats,
        status: WorkerStatus,
        stop: CancellationToken,
    }

    fn setup(max_processing_time: Duration, store: Option<Arc<dyn IdempotencyStore>>) -> Setup {
        let queue = Arc::new(MemoryQueue::standard("heartbeat").with_visibility_timeout(VISIBILITY));
        let status = WorkerStatus::new(1, StoreHealth::default());
        let heartbeats = Heartbeats::new(
            HeartbeatSettings { max_processing_time },
            vec![HeartbeatQueue {
                queue: queue.clone() as Arc<dyn Queue>,
                visibility_timeout: VISIBILITY,
            }],
            store,
            status.clone(),
            vec![Arc::new(QueueMetrics::new(Arc::from("heartbeat")))],
        );
        let stop = CancellationToken::new();
        tokio::spawn(heartbeats.clone().run(stop.clone()));
        Setup {
            queue,
            heartbeats,
            status,
            stop,
        }
    }

    async fn receive(setup: &Setup) -> (Message, Arc<Lease>, Registration) {
        setup.queue.push("{}").unwrap();
        let mut messages = setup.queue.receive(1, Duration::ZERO).await.unwrap();
        let message = messages.pop().unwrap();
        let at = Instant::now();
        let lease = Arc::new(Lease::new(at + VISIBILITY));
        let registration =
            setup
                .heartbeats
                .register(0, &message, Arc::clone(&lease), at, at + MAX_VISIBILITY_TIMEOUT);
        (message, lease, registration)
    }

    /// A heartbeat with no processing limit that extends claims in `store`.
    fn setup_with_store(store: Arc<dyn IdempotencyStore>) -> Setup {
        setup(Duration::from_secs(3600), Some(store))
    }

    /// Claims `key` until the lease's visibility deadline and puts the claim in the lease, as the
    /// pipeline does.
    async fn hold_claim(store: &dyn IdempotencyStore, lease: &Lease, key: &str) {
        let held_until = lease.claim_lease_until_instant();
        let request = ClaimRequest {
            key: key.into(),
            lease_until: lease.claim_lease_until(),
            expires_at: SystemTime::now() + Duration::from_secs(3600),
            validation: None,
            restart_runs: false,
            last_attempt: false,
        };
        let ClaimOutcome::Acquired(claim) = store.claim(&request).await.unwrap() else {
            panic!("the key is free")
        };
        lease.hold_claim(claim, held_until);
    }

    fn state(queue: &MemoryQueue) -> MessageState {
        queue.snapshot()[0].state
    }

    #[tokio::test(start_paused = true)]
    async fn keeps_a_long_job_invisible_until_unregistered() {
        let setup = setup(Duration::from_secs(3600), None);
        let (_message, lease, registration) = receive(&setup).await;
        tokio::time::sleep(Duration::from_secs(290)).await;
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        assert_eq!(setup.queue.snapshot()[0].receive_count, 1);
        let extensions = setup.status.report().heartbeat_extensions;
        // One extension every 15 s (when half of 30 s remains), at 15, 30, ..., 285 s.
        assert_eq!(extensions, 19);
        assert!(lease.visible_until() > Instant::now() + VISIBILITY / 2);
        assert_eq!(setup.queue.requests().change_visibility, extensions);

        drop(registration);
        assert_eq!(setup.heartbeats.len(), 0);
        tokio::time::sleep(VISIBILITY).await;
        assert_eq!(
            state(&setup.queue),
            MessageState::Visible,
            "no extension after unregistering"
        );
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_extension_cancels_the_handler() {
        let setup = setup(Duration::from_secs(3600), None);
        let (message, lease, _registration) = receive(&setup).await;
        // The message goes back and another consumer receives it: our receipt is no longer valid.
        let back = VisibilityChange {
            receipt_handle: message.receipt_handle.clone(),
            timeout: Duration::ZERO,
        };
        setup.queue.change_visibility_batch(&[back]).await.unwrap();
        let again = setup.queue.receive(1, Duration::ZERO).await.unwrap();
        assert_eq!(again.len(), 1);
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert!(lease.cancellation().is_cancelled());
        assert_eq!(setup.status.report().leases_lost, 1);
        assert_eq!(setup.status.report().heartbeat_extensions, 0);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_refused_after_the_delete_landed_is_no_lost_lease() {
        let setup = setup(Duration::from_secs(3600), None);
        let (message, lease, registration) = receive(&setup).await;
        // The deleter has sent the delete and it landed; its answer is not applied yet, so the
        // registration lives and the next extension is refused for a receipt that is gone.
        registration.deleting();
        let failures = setup
            .queue
            .delete_batch(std::slice::from_ref(&message.receipt_handle))
            .await
            .unwrap();
        assert!(failures.is_empty());
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(
            setup.queue.requests().change_visibility,
            1,
            "the extension was tried"
        );
        assert!(!lease.cancellation().is_cancelled());
        assert_eq!(setup.status.report().leases_lost, 0);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(setup.queue.requests().change_visibility, 1, "and not tried again");
        drop(registration);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_maximum_processing_time_and_cancels() {
        let setup = setup(Duration::from_secs(50), None);
        let (_message, lease, _registration) = receive(&setup).await;
        // Extended at 15 s (to 45 s) and at 30 s (to 50 s, the limit); at 35 s no room is left.
        tokio::time::sleep(Duration::from_secs(32)).await;
        assert!(!lease.cancellation().is_cancelled());
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        tokio::time::sleep(Duration::from_secs(13)).await;
        assert!(
            lease.cancellation().is_cancelled(),
            "cancelled once no room is left"
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            state(&setup.queue),
            MessageState::Visible,
            "left to expire at 50 s"
        );
        assert_eq!(setup.status.report().leases_lost, 0, "not a lost lease");
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_before_the_deadline() {
        let setup = setup(Duration::from_secs(3600), None);
        let (_message, lease, _registration) = receive(&setup).await;
        setup.queue.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(setup.status.report().heartbeat_extensions, 0);
        setup.queue.set_unavailable(false);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert_eq!(
            setup.status.report().heartbeat_extensions,
            1,
            "retried within two seconds"
        );
        assert!(!lease.cancellation().is_cancelled());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn extends_the_claim_only_after_the_visibility() {
        let store = Arc::new(MemoryIdempotencyStore::new());
        let setup = setup_with_store(store.clone());
        let (_message, lease, _registration) = receive(&setup).await;
        hold_claim(store.as_ref(), &lease, "conveyor:test#1").await;

        setup.queue.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(
            store.requests().extend_lease,
            0,
            "visibility failed, so the claim is left alone"
        );
        setup.queue.set_unavailable(false);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(store.requests().extend_lease, 1);

        // A claim taken back by the pipeline (being settled) is not extended.
        lease.take_claim();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(store.requests().extend_lease, 1);
        assert!(setup.status.report().heartbeat_extensions >= 2);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn failing_until_the_deadline_loses_the_lease() {
        let setup = setup(Duration::from_secs(3600), None);
        let (_message, lease, _registration) = receive(&setup).await;
        setup.queue.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(
            !lease.cancellation().is_cancelled(),
            "retrying while time is left"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            lease.cancellation().is_cancelled(),
            "lost at the deadline, not before"
        );
        assert_eq!(setup.status.report().leases_lost, 1);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_on_one_queue_stalls_nothing_else() {
        let healthy = Arc::new(MemoryQueue::standard("healthy").with_visibility_timeout(VISIBILITY));
        let hanging = ScriptedQueue::new(Arc::new(
            MemoryQueue::standard("hanging").with_visibility_timeout(Duration::from_secs(12)),
        ));
        hanging.hang_visibility(true);
        let status = WorkerStatus::new(2, StoreHealth::default());
        let heartbeats = Heartbeats::new(
            HeartbeatSettings {
                max_processing_time: Duration::from_secs(3600),
            },
            vec![
                HeartbeatQueue {
                    queue: hanging.clone() as Arc<dyn Queue>,
                    visibility_timeout: Duration::from_secs(12),
                },
                HeartbeatQueue {
                    queue: healthy.clone() as Arc<dyn Queue>,
                    visibility_timeout: VISIBILITY,
                },
            ],
            None,
            status.clone(),
            vec![
                Arc::new(QueueMetrics::new(Arc::from("hanging"))),
                Arc::new(QueueMetrics::new(Arc::from("healthy"))),
            ],
        );
        let stop = CancellationToken::new();
        tokio::spawn(heartbeats.clone().run(stop.clone()));
        let mut registrations = Vec::new();
        let mut leases = Vec::new();
        for (index, queue) in [(0, Arc::clone(hanging.inner())), (1, healthy.clone())] {
            queue.push("{}").unwrap();
            let visibility = if index == 0 {
                Duration::from_secs(12)
            } else {
                VISIBILITY
            };
            let message = queue
                .receive_with_visibility(1, Duration::ZERO, visibility)
                .await
                .unwrap()
                .pop()
                .unwrap();
            let lease = Arc::new(Lease::new(Instant::now() + visibility));
            let now = Instant::now();
            registrations.push(heartbeats.register(
                index,
                &message,
                Arc::clone(&lease),
                now,
                now + MAX_VISIBILITY_TIMEOUT,
            ));
            leases.push(lease);
        }
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(
            leases[0].cancellation().is_cancelled(),
            "the hung call is cut at its deadline"
        );
        assert!(!leases[1].cancellation().is_cancelled());
        assert_eq!(healthy.snapshot()[0].state, MessageState::InFlight);
        assert!(status.report().heartbeat_extensions >= 5, "{:?}", status.report());
        assert_eq!(status.report().leases_lost, 1);
        stop.cancel();
    }

    /// A store whose lease extensions hang.
    struct SlowStore(MemoryIdempotencyStore);

    #[async_trait::async_trait]
    impl IdempotencyStore for SlowStore {
        async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            self.0.claim(request).await
        }
        async fn complete(
            &self,
            claim: &conveyor_core::port::Claim,
            output: Option<&str>,
            expires_at: SystemTime,
        ) -> Result<(), StoreError> {
            self.0.complete(claim, output, expires_at).await
        }
        async fn release(&self, claim: &conveyor_core::port::Claim) -> Result<(), StoreError> {
            self.0.release(claim).await
        }
        async fn extend_lease(
            &self,
            _claim: &conveyor_core::port::Claim,
            _lease_until: SystemTime,
        ) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn get(&self, key: &str) -> Result<Option<conveyor_core::port::IdempotencyRecord>, StoreError> {
            self.0.get(key).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_store_never_holds_up_visibility_and_stops_the_run_before_its_claim_lapses() {
        let store = Arc::new(SlowStore(MemoryIdempotencyStore::new()));
        let setup = setup_with_store(store.clone());
        let (_message, lease, _registration) = receive(&setup).await;
        hold_claim(store.as_ref(), &lease, "conveyor:test#slow").await;
        let takeover = lease.claim_open_to_takeover_at().unwrap();
        // The claim was written until the first deadline (30 s) plus the skew allowance: another
        // consumer may take it over from 30 s on. The extension at 15 s hangs (slow, not failing):
        // the handler is told to stop by the margin before that moment.
        tokio::time::sleep_until(takeover - CLAIM_CANCEL_MARGIN - Duration::from_millis(100)).await;
        assert!(!lease.cancellation().is_cancelled(), "not before the cut-off");
        tokio::time::sleep_until(takeover - CLAIM_CANCEL_MARGIN).await;
        tokio::task::yield_now().await;
        assert!(
            lease.cancellation().is_cancelled(),
            "cancelled before the claim could be taken over"
        );
        assert_eq!(
            *lease.cancel_reasons().get().unwrap(),
            CancelReason::ClaimNotRenewed
        );
        tokio::time::sleep(Duration::from_secs(260)).await;
        assert_eq!(
            setup.status.report().heartbeat_extensions,
            19,
            "visibility kept its pace: the message stays held until the pipeline settles it"
        );
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_store_stops_the_run_with_its_grace_before_the_claim_lapses() {
        let store = Arc::new(MemoryIdempotencyStore::new());
        let setup = setup_with_store(store.clone());
        let (_message, lease, _registration) = receive(&setup).await;
        hold_claim(store.as_ref(), &lease, "conveyor:test#outage").await;
        let takeover = lease.claim_open_to_takeover_at().unwrap();
        store.set_unavailable(true);
        tokio::time::sleep_until(takeover - CLAIM_CANCEL_MARGIN - CANCEL_GRACE - Duration::from_millis(600))
            .await;
        assert!(
            !lease.cancellation().is_cancelled(),
            "retrying while the grace fits"
        );
        tokio::time::sleep_until(takeover - CANCEL_GRACE).await;
        assert!(
            lease.cancellation().is_cancelled(),
            "the grace ends before the claim lapses"
        );
        assert_eq!(
            *lease.cancel_reasons().get().unwrap(),
            CancelReason::ClaimNotRenewed
        );
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_acquired_while_an_extension_was_out_catches_up() {
        let store = Arc::new(MemoryIdempotencyStore::new());
        let setup = setup_with_store(store.clone());
        let (_message, lease, _registration) = receive(&setup).await;
        // The claim is sent at 0 s, to the first deadline; it is answered at 16 s, after the
        // visibility extension at 15 s moved the deadline to 45 s.
        let held_until = lease.claim_lease_until_instant();
        let request = ClaimRequest {
            key: "conveyor:test#lagging".into(),
            lease_until: lease.claim_lease_until(),
            expires_at: SystemTime::now() + Duration::from_secs(3600),
            validation: None,
            restart_runs: false,
            last_attempt: false,
        };
        let ClaimOutcome::Acquired(claim) = store.claim(&request).await.unwrap() else {
            panic!("the key is free")
        };
        tokio::time::sleep(Duration::from_secs(16)).await;
        assert_eq!(setup.status.report().heartbeat_extensions, 1);
        lease.hold_claim(claim, held_until);
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(
            !lease.cancellation().is_cancelled(),
            "the lagging claim was extended before it could be taken over"
        );
        assert!(lease.claim_open_to_takeover_at().unwrap() > Instant::now());
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_answers_again_in_time_keeps_the_run() {
        let store = Arc::new(MemoryIdempotencyStore::new());
        let setup = setup_with_store(store.clone());
        let (_message, lease, _registration) = receive(&setup).await;
        hold_claim(store.as_ref(), &lease, "conveyor:test#brownout").await;
        store.set_unavailable(true);
        // The extension at 15 s fails; the store answers again at 20 s, before the cut-off (27.5 s).
        tokio::time::sleep(Duration::from_secs(20)).await;
        store.set_unavailable(false);
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(
            !lease.cancellation().is_cancelled(),
            "renewed in time: the run goes on"
        );
        let record = store.get("conveyor:test#brownout").await.unwrap().unwrap();
        assert!(
            record.lease_until.unwrap() > SystemTime::now() + Duration::from_secs(10),
            "the claim follows the visibility deadline again"
        );
        setup.stop.cancel();
    }
}
