//! One consumer instance's view of the shared queue and store: its latency, and its death.
//!
//! # Design note: how a worker dies in-process
//!
//! A process killed with SIGKILL makes no call after it died. Every call an instance makes goes
//! through its [`Instance`]: after [`Instance::kill`] a call never starts, a call in progress never
//! answers (SQS may already have acted on it, as with a request in flight at a real kill), and its
//! handlers never apply an effect. The instance's tasks may still be scheduled, but nothing they do
//! reaches the queue, the store or the sink again, so the dead worker's messages come back only when
//! their visibility timeout ends and its claims lapse with their leases: what `kill -9` does. No
//! change to the worker is needed for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{
        Claim, ClaimOutcome, ClaimRequest, DeadLetter, EntryError, EntryFailure, IdempotencyRecord,
        IdempotencyStore, OutgoingMessage, Queue, QueueDepth, QueueError, StoreError, VisibilityChange,
    },
    runtime::Failure,
};
use fastrand::Rng;

use crate::clock::Skew;
use crate::sink::Sink;

/// One consumer (a worker or a Lambda function): its name, latencies and whether it is dead.
#[derive(Debug)]
pub struct Instance {
    name: String,
    killed: AtomicBool,
    queue_latency: Duration,
    store_latency: Duration,
    skew: Skew,
    rng: Mutex<Rng>,
}

impl Instance {
    /// A live instance whose queue and store calls each take up to the given latencies, and whose
    /// clock is off the true one by up to half of `clock_skew` (drawn from `seed`).
    pub fn new(
        name: String,
        seed: u64,
        queue_latency: Duration,
        store_latency: Duration,
        clock_skew: Duration,
    ) -> Arc<Self> {
        // A generator of its own, so the latencies drawn from `seed` stay what they were before skew.
        let half = i64::try_from(clock_skew.as_millis() / 2).unwrap_or(i64::MAX);
        let skew = Skew(Rng::with_seed(seed ^ 0x5eed_c10c_5eed_c10c).i64(-half..=half));
        Arc::new(Self {
            name,
            killed: AtomicBool::new(false),
            queue_latency,
            store_latency,
            skew,
            rng: Mutex::new(Rng::with_seed(seed)),
        })
    }

    /// How far the instance's clock runs ahead of the true one.
    pub fn skew(&self) -> Skew {
        self.skew
    }

    /// The instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops the instance dead.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }

    /// True once killed.
    pub fn is_dead(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Returns only while the instance lives; a dead one waits forever.
    pub async fn alive(&self) {
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
    }

    async fn delay(&self, max: Duration) {
        if max.is_zero() {
            return;
        }
        let millis = self
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .u64(0..=max.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }

    /// `call`, after up to `latency`, as a call this instance makes: never started or answered once dead.
    async fn call<T>(&self, latency: Duration, call: impl Future<Output = T>) -> T {
        self.alive().await;
        self.delay(latency).await;
        self.alive().await;
        let answer = call.await;
        self.alive().await;
        answer
    }

    async fn queue_call<T>(&self, call: impl Future<Output = T>) -> T {
        self.call(self.queue_latency, call).await
    }

    async fn store_call<T>(&self, call: impl Future<Output = T>) -> T {
        self.call(self.store_latency, call).await
    }
}

/// The shared queue as one instance reaches it; every message it receives is logged in the sink, and
/// every visibility change SQS refuses as invalid too.
///
/// SQS's only wall-clock time a consumer reads is `ApproximateFirstReceiveTimestamp` (the 12 hours of
/// visibility count from it): it reaches the consumer as its own clock would see it, off by its skew.
pub struct InstanceQueue {
    inner: Arc<dyn Queue>,
    instance: Arc<Instance>,
    sink: Arc<Sink>,
    /// The message id of each receipt this instance was handed.
    receipts: Mutex<HashMap<String, String>>,
}

impl InstanceQueue {
    /// `inner` through `instance`.
    pub fn new(inner: Arc<dyn Queue>, instance: Arc<Instance>, sink: Arc<Sink>) -> Self {
        Self {
            inner,
            instance,
            sink,
            receipts: Mutex::new(HashMap::new()),
        }
    }

    fn receipts(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.receipts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs the changes SQS refused as invalid (a sender's fault no retry mends).
    fn log_refusals(&self, changes: &[VisibilityChange], failures: &[EntryFailure]) {
        for failure in failures {
            let EntryError::Failed { code, message, .. } = &failure.error else {
                continue;
            };
            if !code.starts_with("InvalidParameter") {
                continue;
            }
            let message_id = changes
                .get(failure.index)
                .and_then(|change| self.receipts().get(change.receipt_handle.as_str()).cloned());
            let asked = changes.get(failure.index).map(|change| change.timeout);
            self.sink.visibility_refused(
                self.instance.name(),
                message_id,
                format!("{code}: {message} (asked {asked:?})"),
            );
        }
    }
}

impl std::fmt::Debug for InstanceQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceQueue")
            .field("queue", &self.inner.name())
            .field("instance", &self.instance.name())
            .finish()
    }
}

#[async_trait]
impl Queue for InstanceQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }

    fn visibility_timeout(&self) -> Duration {
        self.inner.visibility_timeout()
    }

    fn max_receive_count(&self) -> Option<u32> {
        self.inner.max_receive_count()
    }

    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        let mut messages = self
            .instance
            .queue_call(self.inner.receive_with_visibility(max_messages, wait, visibility))
            .await?;
        let skew = self.instance.skew();
        for message in &mut messages {
            self.sink.received(self.instance.name(), message);
            self.receipts()
                .insert(message.receipt_handle.as_str().to_owned(), message.id.clone());
            // A clock ahead by the skew finds the first receive that much longer ago.
            message.first_received_at = message.first_received_at.map(|first| skew.undo(first));
        }
        Ok(messages)
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        self.instance.queue_call(self.inner.delete_batch(receipts)).await
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        let failures = self
            .instance
            .queue_call(self.inner.change_visibility_batch(changes))
            .await?;
        self.log_refusals(changes, &failures);
        Ok(failures)
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        let id = self.instance.queue_call(self.inner.send(message)).await?;
        self.sink
            .step(format!("{} sent a copy {id}", self.instance.name()));
        Ok(id)
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        self.instance
            .queue_call(self.inner.dead_letter(message, failure))
            .await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.instance.queue_call(self.inner.depth()).await
    }
}

/// The shared store as one instance reaches it.
pub struct InstanceStore {
    inner: Arc<dyn IdempotencyStore>,
    instance: Arc<Instance>,
}

impl InstanceStore {
    /// `inner` through `instance`.
    pub fn new(inner: Arc<dyn IdempotencyStore>, instance: Arc<Instance>) -> Self {
        Self { inner, instance }
    }
}

impl std::fmt::Debug for InstanceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceStore")
            .field("instance", &self.instance.name())
            .finish()
    }
}

#[async_trait]
impl IdempotencyStore for InstanceStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.instance.store_call(self.inner.claim(request)).await
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: std::time::SystemTime,
    ) -> Result<(), StoreError> {
        self.instance
            .store_call(self.inner.complete(claim, output, expires_at))
            .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.instance.store_call(self.inner.release(claim)).await
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        lease_until: std::time::SystemTime,
    ) -> Result<(), StoreError> {
        self.instance
            .store_call(self.inner.extend_lease(claim, lease_until))
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.instance.store_call(self.inner.get(key)).await
    }

    async fn claim_tracked(
        &self,
        request: &ClaimRequest,
        change: &conveyor_core::port::JobChange,
    ) -> Result<ClaimOutcome, StoreError> {
        self.instance
            .store_call(self.inner.claim_tracked(request, change))
            .await
    }

    async fn complete_tracked(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: std::time::SystemTime,
        change: &conveyor_core::port::JobChange,
    ) -> Result<(), StoreError> {
        self.instance
            .store_call(self.inner.complete_tracked(claim, output, expires_at, change))
            .await
    }

    async fn release_tracked(
        &self,
        claim: &Claim,
        change: &conveyor_core::port::JobChange,
    ) -> Result<(), StoreError> {
        self.instance
            .store_call(self.inner.release_tracked(claim, change))
            .await
    }

    async fn record_progress(
        &self,
        claim: &Claim,
        progress: &conveyor_core::Progress,
    ) -> Result<(), StoreError> {
        self.instance
            .store_call(self.inner.record_progress(claim, progress))
            .await
    }
}
