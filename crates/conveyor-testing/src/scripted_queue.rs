//! [`ScriptedQueue`]: a [`MemoryQueue`] whose calls can be made to hang, fail or wait on cue, for the
//! runtime tests that need one operation to misbehave while the others keep SQS's semantics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{DeadLetter, EntryFailure, OutgoingMessage, Queue, QueueDepth, QueueError, VisibilityChange},
    runtime::Failure,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::MemoryQueue;

/// A [`MemoryQueue`] with switches: visibility changes that hang, deletes that fail, receives that
/// hold their messages until released, DLQ sends that take a while. Everything else passes through.
#[derive(Debug)]
pub struct ScriptedQueue {
    inner: Arc<MemoryQueue>,
    hang_visibility: AtomicBool,
    fail_deletes: AtomicBool,
    hold_receives: AtomicBool,
    receiving: Notify,
    release_receives: Notify,
    deleted_at: Mutex<Vec<Instant>>,
    dead_letter_latency: Mutex<Duration>,
}

impl ScriptedQueue {
    /// Wraps `inner`; every switch off.
    pub fn new(inner: Arc<MemoryQueue>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            hang_visibility: AtomicBool::new(false),
            fail_deletes: AtomicBool::new(false),
            hold_receives: AtomicBool::new(false),
            receiving: Notify::new(),
            release_receives: Notify::new(),
            deleted_at: Mutex::new(Vec::new()),
            dead_letter_latency: Mutex::new(Duration::ZERO),
        })
    }

    /// The wrapped queue.
    pub fn inner(&self) -> &Arc<MemoryQueue> {
        &self.inner
    }

    /// While on, visibility changes never answer.
    pub fn hang_visibility(&self, on: bool) {
        self.hang_visibility.store(on, Ordering::SeqCst);
    }

    /// While on, `delete_batch` fails as a whole with a retryable error (SQS answering 503).
    pub fn fail_deletes(&self, on: bool) {
        self.fail_deletes.store(on, Ordering::SeqCst);
    }

    /// While on, a receive takes its messages (they are in flight) and then waits for
    /// [`ScriptedQueue::release_receive`] before returning them: a long poll whose answer is late.
    pub fn hold_receives(&self, on: bool) {
        self.hold_receives.store(on, Ordering::SeqCst);
    }

    /// Waits until a receive has started.
    pub async fn receive_started(&self) {
        self.receiving.notified().await;
    }

    /// Lets one held receive return.
    pub fn release_receive(&self) {
        self.release_receives.notify_one();
    }

    /// Each DLQ send answers `latency` after it is made (zero: at once, the default).
    pub fn slow_dead_letters(&self, latency: Duration) {
        *self
            .dead_letter_latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = latency;
    }

    /// When each successful `delete_batch` answered.
    pub fn deleted_at(&self) -> Vec<Instant> {
        self.deleted_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Queue for ScriptedQueue {
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
        self.receiving.notify_one();
        let mut messages = self
            .inner
            .receive_with_visibility(max_messages, wait, visibility)
            .await?;
        if self.hold_receives.load(Ordering::SeqCst) {
            let (answered, wall) = (Instant::now(), std::time::SystemTime::now());
            self.release_receives.notified().await;
            // SQS's first-receive time was taken when the receive was answered, `answered.elapsed()`
            // ago; under tokio's paused clock the wall clock did not move that much meanwhile, so
            // the time is moved back by the difference (none on a real clock).
            let wall_moved = wall.elapsed().unwrap_or(Duration::ZERO);
            let held = answered.elapsed().saturating_sub(wall_moved);
            for message in &mut messages {
                message.first_received_at = message
                    .first_received_at
                    .and_then(|first| first.checked_sub(held));
            }
        }
        Ok(messages)
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        if self.fail_deletes.load(Ordering::SeqCst) {
            return Err(QueueError::Unavailable {
                message: "503 from DeleteMessageBatch (scripted)".into(),
            });
        }
        let answer = self.inner.delete_batch(receipts).await?;
        self.deleted_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Instant::now());
        Ok(answer)
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        if self.hang_visibility.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.change_visibility_batch(changes).await
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        self.inner.send(message).await
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        let latency = *self
            .dead_letter_latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.inner.dead_letter(message, failure).await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.inner.depth().await
    }
}
