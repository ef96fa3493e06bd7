//! The delete batcher: acknowledged messages are deleted with `DeleteMessageBatch`, 10 at a time.
//!
//! A queue's pending deletes are flushed when 10 are waiting, when the oldest has waited
//! `delete_flush_interval`, and at shutdown. Flushes run concurrently with the batching, so a slow
//! call never holds back the next batch. Each request carries the message's heartbeat
//! [`Registration`], dropped only once the delete answered (see the heartbeat's design note).

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::limits::MAX_BATCH_ENTRIES;
use conveyor_core::{EntryError, Queue, ReceiptHandle};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::heartbeat::Registration;
use crate::report::{WorkerStatus, add};

/// Tries per flush for transient failures.
const FLUSH_ATTEMPTS: u32 = 4;
/// The first pause between tries; doubles each time.
const FLUSH_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One acknowledged message to delete.
#[derive(Debug)]
pub(crate) struct DeleteRequest {
    /// The queue's index.
    pub(crate) queue: usize,
    /// The receipt to delete.
    pub(crate) receipt: ReceiptHandle,
    /// For logs.
    pub(crate) message_id: String,
    /// Ends the message's heartbeat when dropped, after the delete answered.
    #[expect(
        dead_code,
        reason = "held for its Drop: the heartbeat ends once the delete answered"
    )]
    pub(crate) registration: Registration,
}

/// Sends delete requests to the batcher. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Deleter {
    sender: mpsc::UnboundedSender<DeleteRequest>,
}

impl Deleter {
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
    (Deleter { sender }, task)
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

/// Deletes a batch, retrying transient failures a few times. Each request (and so its heartbeat) is
/// dropped as soon as its own fate is known.
async fn delete_with_retries(queue: Arc<dyn Queue>, batch: Vec<DeleteRequest>, status: WorkerStatus) {
    let mut remaining = batch;
    for attempt in 0..FLUSH_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(FLUSH_RETRY_PAUSE * 2u32.pow(attempt - 1)).await;
        }
        let receipts: Vec<ReceiptHandle> = remaining.iter().map(|request| request.receipt.clone()).collect();
        let failures = match queue.delete_batch(&receipts).await {
            Ok(failures) => failures,
            Err(error) if error.is_retryable() => {
                tracing::warn!(%error, queue = %queue.name(), messages = remaining.len(), "delete failed; retrying");
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
                return;
            }
        };
        let mut errors: Vec<Option<EntryError>> = vec![None; remaining.len()];
        for failure in failures {
            if let Some(slot) = errors.get_mut(failure.index) {
                *slot = Some(failure.error);
            }
        }
        let mut retry = Vec::new();
        for (request, error) in remaining.into_iter().zip(errors) {
            match error {
                None => {}
                Some(EntryError::Failed {
                    sender_fault: false,
                    code,
                    message,
                }) => {
                    tracing::warn!(message_id = %request.message_id, %code, %message, "delete failed; retrying");
                    retry.push(request);
                }
                Some(EntryError::LeaseLost(reason)) => {
                    tracing::warn!(
                        message_id = %request.message_id,
                        queue = %queue.name(),
                        %reason,
                        "delete refused (lease lost): the job is done; if the message comes back it is \
                         acknowledged as a duplicate by its idempotency record"
                    );
                    add(&status.counters().deletes_failed, 1);
                }
                Some(EntryError::Failed { code, message, .. }) => {
                    tracing::error!(message_id = %request.message_id, %code, %message, "delete refused");
                    add(&status.counters().deletes_failed, 1);
                }
            }
        }
        remaining = retry;
        if remaining.is_empty() {
            return;
        }
    }
    tracing::error!(
        queue = %queue.name(),
        messages = remaining.len(),
        "delete still failing after {FLUSH_ATTEMPTS} tries; the messages will come back and be acknowledged \
         as duplicates"
    );
    add(&status.counters().deletes_failed, remaining.len() as u64);
}
