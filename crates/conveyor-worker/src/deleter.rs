//! The delete batcher: acknowledged messages are deleted with `DeleteMessageBatch`, 10 at a time.
//!
//! A queue's pending deletes are flushed when 10 are waiting, when the oldest has waited
//! `delete_flush_interval`, and at shutdown. Flushes run concurrently with the batching, so a slow
//! call never holds back the next batch.
//!
//! Each request holds the message's heartbeat registration, dropped only once the delete's fate is
//! known, so the heartbeat keeps the message invisible until the delete is confirmed. Before the first
//! try the registration is marked as deleting: an extension that races a delete that landed is then
//! refused without a false "lease lost" (see `heartbeat.rs`, `Registration::deleting`). Pending deletes
//! are bounded by `max_in_flight`: a request takes a pending-delete slot before it is queued, and the
//! message task waits for one while still holding its in-flight slot, so when deletes fail the receive
//! loops wait instead of piling up receipts (in the normal flow the slots are never short).
//!
//! Failed deletes are retried (with jitter, [`crate::retry`]) until shortly before the message's
//! visibility deadline, which the heartbeat keeps moving while the request is pending; a delete that
//! still fails then is given up, and the message comes back to be acknowledged as a duplicate by its
//! idempotency record.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::limits::MAX_BATCH_ENTRIES;
use conveyor_core::{
    message::ReceiptHandle,
    port::{EntryError, Queue},
    runtime::Lease,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::heartbeat::Registration;
use crate::report::{WorkerStatus, add};
use crate::retry::{Attempts, errors_by_entry};

/// Deletes stop being retried this long before the message's visibility deadline.
const DELETE_MARGIN: Duration = Duration::from_secs(1);

/// One acknowledged message to delete.
#[derive(Debug)]
pub(crate) struct DeleteRequest {
    /// The queue's index.
    pub(crate) queue: usize,
    /// The receipt to delete.
    pub(crate) receipt: ReceiptHandle,
    /// For logs.
    pub(crate) message_id: String,
    /// The message's lease: its visibility deadline bounds the retries.
    pub(crate) lease: Arc<Lease>,
    /// Keeps the message invisible (heartbeat) until the delete answered; dropped with the request.
    pub(crate) registration: Registration,
    /// One of the `max_in_flight` pending-delete slots.
    #[expect(dead_code, reason = "held for its Drop: frees the pending-delete slot")]
    pub(crate) pending: OwnedSemaphorePermit,
    /// Told whether the delete succeeded (FIFO groups wait for it before the next message).
    pub(crate) confirm: Option<oneshot::Sender<bool>>,
}

impl DeleteRequest {
    fn deadline(&self) -> Instant {
        self.lease
            .latest_visible_until()
            .checked_sub(DELETE_MARGIN)
            .unwrap_or_else(Instant::now)
    }

    fn finish(self, deleted: bool) {
        if let Some(confirm) = self.confirm {
            let _ = confirm.send(deleted);
        }
    }
}

/// Sends delete requests to the batcher. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Deleter {
    sender: mpsc::UnboundedSender<DeleteRequest>,
    pending: Arc<Semaphore>,
}

impl Deleter {
    /// Waits for a pending-delete slot (only short when deletes keep failing).
    pub(crate) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.pending).acquire_owned().await.ok()
    }

    /// Queues a delete. If the batcher is gone (only after shutdown finished), the message comes back
    /// after its visibility timeout and is acknowledged as a duplicate then.
    pub(crate) fn delete(&self, request: DeleteRequest) {
        if let Err(error) = self.sender.send(request) {
            tracing::warn!(message_id = %error.0.message_id, "delete batcher stopped; the message will come back");
        }
    }
}

/// Starts the batcher; it flushes everything and returns after `stop` is cancelled.
pub(crate) fn spawn(
    max_pending: usize,
    queues: Vec<Arc<dyn Queue>>,
    flush_interval: Duration,
    status: WorkerStatus,
    stop: CancellationToken,
) -> (Deleter, tokio::task::JoinHandle<()>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let batcher = Batcher {
        pending: queues.iter().map(|_| Vec::new()).collect(),
        oldest: vec![None; queues.len()],
        queues,
        flush_interval,
        status,
        flushes: JoinSet::new(),
    };
    let task = tokio::spawn(batcher.run(receiver, stop));
    let pending = Arc::new(Semaphore::new(max_pending.max(1)));
    (Deleter { sender, pending }, task)
}

struct Batcher {
    queues: Vec<Arc<dyn Queue>>,
    pending: Vec<Vec<DeleteRequest>>,
    oldest: Vec<Option<Instant>>,
    flush_interval: Duration,
    status: WorkerStatus,
    flushes: JoinSet<()>,
}

impl Batcher {
    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<DeleteRequest>, stop: CancellationToken) {
        loop {
            let next_flush = self
                .oldest
                .iter()
                .flatten()
                .min()
                .map(|oldest| *oldest + self.flush_interval);
            tokio::select! {
                biased;
                request = receiver.recv() => match request {
                    Some(request) => self.push(request),
                    None => break,
                },
                () = sleep_until_or_never(next_flush) => self.flush_due(Instant::now()),
                Some(_) = self.flushes.join_next(), if !self.flushes.is_empty() => {}
                () = stop.cancelled() => break,
            }
        }
        // Everything sent before the stop is flushed; nothing is left behind.
        receiver.close();
        while let Some(request) = receiver.recv().await {
            self.push(request);
        }
        for queue in 0..self.queues.len() {
            self.flush(queue);
        }
        while self.flushes.join_next().await.is_some() {}
    }

    fn push(&mut self, request: DeleteRequest) {
        let queue = request.queue;
        if self.pending[queue].is_empty() {
            self.oldest[queue] = Some(Instant::now());
        }
        self.pending[queue].push(request);
        if self.pending[queue].len() >= MAX_BATCH_ENTRIES {
            self.flush(queue);
        }
    }

    fn flush_due(&mut self, now: Instant) {
        for queue in 0..self.queues.len() {
            if self.oldest[queue].is_some_and(|oldest| oldest + self.flush_interval <= now) {
                self.flush(queue);
            }
        }
    }

    fn flush(&mut self, queue: usize) {
        self.oldest[queue] = None;
        let batch = std::mem::take(&mut self.pending[queue]);
        if batch.is_empty() {
            return;
        }
        let target = Arc::clone(&self.queues[queue]);
        let status = self.status.clone();
        self.flushes.spawn(delete_with_retries(target, batch, status));
    }
}

async fn sleep_until_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Deletes a batch, retrying transient failures until shortly before each message's deadline. Each
/// request (and so its heartbeat and slot) is dropped as soon as its own fate is known.
async fn delete_with_retries(queue: Arc<dyn Queue>, batch: Vec<DeleteRequest>, status: WorkerStatus) {
    let mut remaining = batch;
    let earliest = |requests: &[DeleteRequest]| {
        requests
            .iter()
            .map(DeleteRequest::deadline)
            .min()
            .unwrap_or_else(Instant::now)
    };
    // From here an extension refused for one of these receipts is the delete landing first.
    for request in &remaining {
        request.registration.deleting();
    }
    let mut attempts = Attempts::until(earliest(&remaining));
    let mut last_error = String::new();
    while let Some(left) = attempts.next().await {
        let receipts: Vec<ReceiptHandle> = remaining.iter().map(|request| request.receipt.clone()).collect();
        let failures = match attempts.run(left, queue.delete_batch(&receipts)).await {
            Ok(failures) => failures,
            Err(error) if error.is_retryable() => {
                if attempts.tries() == 1 {
                    tracing::warn!(%error, queue = %queue.name(), messages = remaining.len(), "delete failed; retrying");
                }
                last_error = error.to_string();
                attempts.move_deadline(earliest(&remaining));
                continue;
            }
            Err(error) => {
                tracing::error!(
                    %error,
                    queue = %queue.name(),
                    messages = remaining.len(),
                    "delete refused; the messages will come back and be acknowledged as duplicates"
                );
                add(&status.counters().deletes_failed, remaining.len() as u64);
                remaining.into_iter().for_each(|request| request.finish(false));
                return;
            }
        };
        remaining = settle(&queue, remaining, failures, &status);
        if remaining.is_empty() {
            return;
        }
        last_error = "an entry failed with a server fault".to_owned();
        attempts.move_deadline(earliest(&remaining));
    }
    tracing::error!(
        queue = %queue.name(),
        messages = remaining.len(),
        error = %last_error,
        tries = attempts.tries(),
        "delete still failing as the receipts expire; the messages will come back and be acknowledged as duplicates"
    );
    add(&status.counters().deletes_failed, remaining.len() as u64);
    remaining.into_iter().for_each(|request| request.finish(false));
}

/// Applies one answer; returns the requests to try again.
fn settle(
    queue: &Arc<dyn Queue>,
    batch: Vec<DeleteRequest>,
    failures: Vec<conveyor_core::port::EntryFailure>,
    status: &WorkerStatus,
) -> Vec<DeleteRequest> {
    let errors = errors_by_entry(batch.len(), failures);
    let mut retry = Vec::new();
    for (request, error) in batch.into_iter().zip(errors) {
        match error {
            None => request.finish(true),
            Some(EntryError::Failed {
                sender_fault: false, ..
            }) => retry.push(request),
            // A handle SQS says it never issued is one the worker received: only moto says so, for a
            // message no longer there (see `conveyor-sqs`'s `classify_entry`). Lost either way.
            Some(EntryError::LeaseLost(reason) | EntryError::NotIssued(reason)) => {
                tracing::warn!(
                    message_id = %request.message_id,
                    queue = %queue.name(),
                    %reason,
                    "delete refused (lease lost): the job is done; if the message comes back it is \
                     acknowledged as a duplicate by its idempotency record"
                );
                add(&status.counters().deletes_failed, 1);
                request.finish(false);
            }
            Some(EntryError::Failed { code, message, .. }) => {
                tracing::error!(message_id = %request.message_id, %code, %message, "delete refused");
                add(&status.counters().deletes_failed, 1);
                request.finish(false);
            }
        }
    }
    retry
}
