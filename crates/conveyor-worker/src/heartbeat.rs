//! The heartbeat: one task that keeps every in-flight message invisible while its job runs.
//!
//! # Design note: ordering
//!
//! Each received message is registered here (with its [`Lease`]) *before* anything else happens to it,
//! and unregistered only *after* its outcome was applied to the queue. Between those two points its
//! visibility deadline is tracked in the lease and extended when less than a third of the visibility
//! timeout remains, by `visibility_timeout`, in one `ChangeMessageVisibilityBatch` per queue (the
//! `Queue` implementation splits it into calls of 10).
//!
//! 1. **Register at receipt, not at start.** A message can wait for a FIFO predecessor, a job-type slot
//!    or a rate-limit token before its job starts; it is in flight all that time and must not reappear.
//! 2. **The deadline is counted from when the receive returned** (SQS starts the timer when it hands
//!    the message out; a long poll may have waited up to 20 s before that). An extension's new deadline
//!    is counted from when the extension request was *sent*, so the tracked deadline is never later
//!    than the real one.
//! 3. **Visibility first, then the claim.** The idempotency claim's lease is extended only after the
//!    message's visibility extension succeeded, and to the new visibility deadline. The claim must never
//!    outlive the message's invisibility: if this worker dies, the claim lapses exactly when SQS hands
//!    the message to someone else. The claim is read from the lease at that moment: the pipeline takes it
//!    out of the lease before completing or releasing it, so a settled record is never extended; a
//!    `Fenced` answer for a claim the lease no longer holds is that benign race and is ignored.
//! 4. **A refused extension is a lost lease.** `LeaseLost` (receipt no longer valid: the message was
//!    received again elsewhere or deleted) cancels the handler's token; the pipeline then releases the
//!    claim (fenced if another worker took it over) and the outcome's queue call fails harmlessly.
//!    Transient failures (the whole call failed, or an entry failed with a server fault) are retried
//!    at the next tick, which comes within half of the remaining margin.
//! 5. **Limits.** Extensions stop at `max_processing_time` after the receipt, and never go past SQS's
//!    12 hours per receipt. Then the message is left to expire: the handler's token is cancelled (the
//!    pipeline gives it a grace period, releases the claim and the message goes back at once).
//! 6. **Unregister after the outcome is applied.** A delete sits in the delete batcher for up to
//!    `delete_flush_interval`; if the heartbeat stopped before the delete was done, a message near its
//!    deadline could reappear and run again. So the `Registration` travels with the delete request
//!    and is dropped by the batcher once `DeleteMessageBatch` answered (or, for retries and rejects,
//!    once the visibility change answered).
//! 7. **At shutdown the heartbeat stops last**, after the drain, the releases and the final delete flush.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use conveyor_core::limits::MAX_VISIBILITY_TIMEOUT;
use conveyor_core::{
    EntryError, IdempotencyStore, Lease, Message, Queue, ReceiptHandle, StoreError, VisibilityChange,
};
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::report::{WorkerStatus, add};
use crate::telemetry::QueueMetrics;

/// Claim extensions run at most this many at once.
const CLAIM_EXTENSION_CONCURRENCY: usize = 16;

/// What the heartbeat needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeartbeatSettings {
    /// Each extension sets the visibility timeout to this (the queue's visibility timeout).
    pub(crate) visibility_timeout: Duration,
    /// No extension past this long after the receipt.
    pub(crate) max_processing_time: Duration,
}

impl HeartbeatSettings {
    /// Extend when less than this remains.
    fn margin(&self) -> Duration {
        self.visibility_timeout / 3
    }

    /// The shortest pause between ticks (so failing extensions are not retried in a busy loop).
    fn min_pause(&self) -> Duration {
        (self.margin() / 4).min(Duration::from_secs(1))
    }
}

/// The heartbeat's registry of in-flight messages. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Heartbeats {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
    settings: HeartbeatSettings,
    queues: Vec<Arc<dyn Queue>>,
    store: Option<Arc<dyn IdempotencyStore>>,
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
}

/// A message's place in the heartbeat; dropping it ends the message's heartbeat.
pub(crate) struct Registration {
    id: u64,
    inner: Arc<Inner>,
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
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Heartbeats {
    pub(crate) fn new(
        settings: HeartbeatSettings,
        queues: Vec<Arc<dyn Queue>>,
        store: Option<Arc<dyn IdempotencyStore>>,
        status: WorkerStatus,
        metrics: Vec<Arc<QueueMetrics>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                entries: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                settings,
                queues,
                store,
                status,
                metrics,
            }),
        }
    }

    /// Starts tracking `message` of queue `queue`, received at `received_at` with `lease`.
    pub(crate) fn register(
        &self,
        queue: usize,
        message: &Message,
        lease: Arc<Lease>,
        received_at: Instant,
    ) -> Registration {
        let settings = &self.inner.settings;
        let stop_at = received_at + settings.max_processing_time.min(MAX_VISIBILITY_TIMEOUT);
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
        loop {
            let next = self.tick().await;
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Extends what is due; returns when to look again.
    pub(crate) async fn tick(&self) -> Instant {
        let settings = self.inner.settings;
        let now = Instant::now();
        let due = self.collect_due(now);
        let mut retry_soon = false;
        let calls = due
            .into_iter()
            .enumerate()
            .filter(|(_, due)| !due.is_empty())
            .map(|(queue, due)| {
                let inner = Arc::clone(&self.inner);
                async move { extend_queue(&inner, queue, due, now).await }
            });
        let results = futures_util::future::join_all(calls).await;
        let mut claims = Vec::new();
        for (failed, extended) in results {
            retry_soon |= failed;
            claims.extend(extended);
        }
        self.extend_claims(claims).await;

        let now = Instant::now();
        let mut next = now + settings.margin();
        for entry in self.inner.lock().values().filter(|entry| entry.extending) {
            next = next.min(
                entry
                    .lease
                    .visible_until()
                    .checked_sub(settings.margin())
                    .unwrap_or(now),
            );
        }
        if retry_soon {
            next = next.min(now + settings.min_pause());
        }
        next.max(now + settings.min_pause())
    }

    /// The entries due for an extension, by queue; stops (and cancels) the ones past their limit.
    fn collect_due(&self, now: Instant) -> Vec<Vec<Due>> {
        let settings = self.inner.settings;
        let mut due: Vec<Vec<Due>> = (0..self.inner.queues.len()).map(|_| Vec::new()).collect();
        let mut entries = self.inner.lock();
        for (id, entry) in entries.iter_mut().filter(|(_, entry)| entry.extending) {
            let visible_until = entry.lease.visible_until();
            if visible_until > now + settings.margin() {
                continue;
            }
            let room = entry.stop_at.saturating_duration_since(now);
            if room <= settings.margin() {
                entry.extending = false;
                tracing::warn!(
                    message_id = %entry.message_id,
                    queue = %self.inner.queues[entry.queue].name(),
                    max_processing_time = ?settings.max_processing_time,
                    "message reached its maximum processing time: no more visibility extensions; \
                     cancelling its handler and leaving it to expire"
                );
                entry.lease.cancellation().cancel();
                continue;
            }
            due[entry.queue].push(Due {
                id: *id,
                receipt: entry.receipt.clone(),
                message_id: entry.message_id.clone(),
                lease: Arc::clone(&entry.lease),
                timeout: settings.visibility_timeout.min(room),
            });
        }
        due
    }

    /// Extends the claims of freshly extended messages to their new visibility deadlines.
    async fn extend_claims(&self, leases: Vec<(u64, usize, String, Arc<Lease>)>) {
        let Some(store) = self.inner.store.clone() else {
            return;
        };
        let inner = &self.inner;
        futures_util::stream::iter(leases)
            .for_each_concurrent(CLAIM_EXTENSION_CONCURRENCY, |(id, queue, message_id, lease)| {
                let store = Arc::clone(&store);
                async move {
                    let Some(claim) = lease.claim() else {
                        return;
                    };
                    match store.extend_lease(&claim, lease.visible_until_wall()).await {
                        Ok(()) => {}
                        Err(StoreError::Fenced { .. }) if lease.claim().as_ref() == Some(&claim) => {
                            if mark_lost(inner, id, queue, &lease) {
                                tracing::error!(
                                    %message_id,
                                    key = %claim.key,
                                    "idempotency claim was taken over while the job ran; cancelling the handler"
                                );
                            }
                        }
                        Err(StoreError::Fenced { .. }) => {}
                        Err(error) => tracing::warn!(
                            %error,
                            %message_id,
                            key = %claim.key,
                            "could not extend the idempotency claim; retrying at the next extension"
                        ),
                    }
                }
            })
            .await;
    }
}

/// Sends one queue's extensions; returns (whether any should be retried soon, the extended leases).
async fn extend_queue(
    inner: &Inner,
    queue: usize,
    due: Vec<Due>,
    sent_at: Instant,
) -> (bool, Vec<(u64, usize, String, Arc<Lease>)>) {
    let changes: Vec<VisibilityChange> = due
        .iter()
        .map(|due| VisibilityChange {
            receipt_handle: due.receipt.clone(),
            timeout: due.timeout,
        })
        .collect();
    let queue_name = inner.queues[queue].name();
    let failures = match inner.queues[queue].change_visibility_batch(&changes).await {
        Ok(failures) => failures,
        Err(error) => {
            tracing::warn!(%error, queue = %queue_name, messages = due.len(), "visibility extension failed; retrying");
            return (true, Vec::new());
        }
    };
    let mut failed = vec![false; due.len()];
    let mut retry_soon = false;
    for failure in failures {
        let Some(entry) = due.get(failure.index) else {
            continue;
        };
        failed[failure.index] = true;
        match failure.error {
            EntryError::LeaseLost(reason) => {
                if mark_lost(inner, entry.id, queue, &entry.lease) {
                    tracing::warn!(
                        message_id = %entry.message_id,
                        queue = %queue_name,
                        %reason,
                        "lease lost: the message is no longer in flight for this worker; cancelling its handler"
                    );
                }
            }
            EntryError::Failed { code, message, .. } => {
                retry_soon = true;
                tracing::warn!(
                    message_id = %entry.message_id,
                    queue = %queue_name,
                    %code,
                    %message,
                    "visibility extension refused; retrying"
                );
            }
        }
    }
    let mut extended = Vec::new();
    for (due, failed) in due.into_iter().zip(failed) {
        if failed {
            continue;
        }
        due.lease.set_visible_until(sent_at + due.timeout);
        add(&inner.status.counters().heartbeat_extensions, 1);
        inner.metrics[queue].extensions.increment(1);
        if due.lease.claim().is_some() {
            extended.push((due.id, queue, due.message_id, due.lease));
        }
    }
    (retry_soon, extended)
}

/// Stops extending entry `id`, cancels its handler and counts the lost lease. Does nothing when the
/// entry is gone: its outcome was applied meanwhile (a delete makes the receipt invalid), nothing is lost.
fn mark_lost(inner: &Inner, id: u64, queue: usize, lease: &Lease) -> bool {
    {
        let mut entries = inner.lock();
        let Some(entry) = entries.get_mut(&id) else {
            return false;
        };
        entry.extending = false;
    }
    if !lease.cancellation().is_cancelled() {
        lease.cancellation().cancel();
    }
    add(&inner.status.counters().leases_lost, 1);
    inner.metrics[queue].leases_lost.increment(1);
    true
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use conveyor_core::idempotency::ClaimOutcome;
    use conveyor_core::{ClaimRequest, IdempotencyStore};
    use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, MessageState};

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
        let status = WorkerStatus::new(1);
        let heartbeats = Heartbeats::new(
            HeartbeatSettings {
                visibility_timeout: VISIBILITY,
                max_processing_time,
            },
            vec![queue.clone() as Arc<dyn Queue>],
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
        let registration = setup.heartbeats.register(0, &message, Arc::clone(&lease), at);
        (message, lease, registration)
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
        // One extension every 20 s (when a third of 30 s remains), at 20, 40, ..., 280 s.
        assert_eq!(extensions, 14);
        assert!(lease.visible_until() > Instant::now() + VISIBILITY / 3);
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
    async fn stops_at_the_maximum_processing_time_and_cancels() {
        let setup = setup(Duration::from_secs(50), None);
        let (_message, lease, _registration) = receive(&setup).await;
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert!(!lease.cancellation().is_cancelled());
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        tokio::time::sleep(Duration::from_secs(10)).await;
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
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(
            setup.status.report().heartbeat_extensions,
            1,
            "retried within a second"
        );
        assert!(!lease.cancellation().is_cancelled());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(state(&setup.queue), MessageState::InFlight);
        setup.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn extends_the_claim_only_after_the_visibility() {
        let store = Arc::new(MemoryIdempotencyStore::new());
        let setup = setup(
            Duration::from_secs(3600),
            Some(store.clone() as Arc<dyn IdempotencyStore>),
        );
        let (_message, lease, _registration) = receive(&setup).await;
        let request = ClaimRequest {
            key: "conveyor:test#1".into(),
            lease_until: lease.visible_until_wall(),
            expires_at: SystemTime::now() + Duration::from_secs(3600),
            validation: None,
        };
        let ClaimOutcome::Acquired(claim) = store.claim(&request).await.unwrap() else {
            panic!("the key is free")
        };
        lease.hold_claim(claim.clone());

        setup.queue.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(
            store.requests().extend_lease,
            0,
            "visibility failed, so the claim is left alone"
        );
        setup.queue.set_unavailable(false);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(store.requests().extend_lease, 1);

        // A claim taken back by the pipeline (being settled) is not extended.
        lease.take_claim();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(store.requests().extend_lease, 1);
        assert!(setup.status.report().heartbeat_extensions >= 2);
        setup.stop.cancel();
    }
}
