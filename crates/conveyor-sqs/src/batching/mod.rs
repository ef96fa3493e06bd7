//! [`BatchingProducer`]: single sends from many tasks, coalesced into `SendMessageBatch` calls.
//!
//! # Design note: the path of one job, and why nothing is lost or doubled
//!
//! 1. **The caller's task checks and encodes** ([`Producer::prepare`](crate::Producer)): limits, the
//!    timer table for long delays, large payloads. A job refused there makes no request and never
//!    reaches the buffer. A job kept as a timer is answered at once.
//! 2. **The buffer is a bounded channel** to one flusher task. A caller waits for room: when SQS is slow
//!    the flusher stops taking jobs, the channel fills and callers wait (backpressure) instead of
//!    memory growing. Each job is numbered as it is handed over (`seq`), in the caller's order.
//! 3. **The flusher gathers** up to `max_entries` jobs and `max_bytes`, waiting at most `linger` after
//!    the first, then hands the batch to a call task; at most `max_calls_in_flight` calls run at once.
//!    A job that does not fit is carried to the next batch, never reordered.
//! 4. **A call sends once** through the same code as [`Producer::send_batch`](crate::Producer::send_batch)
//!    (retries of what SQS says may be retried, nothing else) and answers each caller with its own
//!    result: its message id, or why it was not sent. A caller is told `Ok` only for an entry SQS
//!    reported as stored; no entry is sent again once SQS stored it.
//! 5. **FIFO queues**: a group has at most one call in flight (the gate), so its calls store its jobs
//!    in the order they were handed over. A job of a group that failed holds back the group's jobs
//!    handed over before the failure was known ([`crate::fifo_order`]).
//! 6. **Shutdown** ([`BatchingProducer::shutdown`]) closes the buffer: a send not yet buffered is
//!    refused ([`ProduceError::ShutDown`], not sent), everything buffered is sent, and shutdown returns
//!    when every call has answered. Dropping every handle does the same without waiting.
//!
//! A caller that stops waiting (its future dropped) after its job was buffered does not take the job
//! back: it may still be sent.

mod flusher;
mod gate;
mod send;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_MESSAGE_BYTES};
use conveyor_core::port::OutgoingMessage;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::job::{NewJob, ProduceError};
use crate::producer::{Prepared, Producer};
use crate::send::check_outgoing;

/// The longest linger [`BatchingConfig::with_linger`] accepts.
pub const MAX_LINGER: Duration = Duration::from_secs(1);

/// How a [`BatchingProducer`] gathers jobs into calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchingConfig {
    max_entries: usize,
    max_bytes: usize,
    linger: Duration,
    buffer: usize,
    max_calls_in_flight: usize,
}

impl Default for BatchingConfig {
    /// 10 jobs and 1 MiB per call (SQS's limits), a 10 ms linger, 1,000 jobs buffered, 4 calls at once.
    fn default() -> Self {
        Self {
            max_entries: MAX_BATCH_ENTRIES,
            max_bytes: MAX_MESSAGE_BYTES,
            linger: Duration::from_millis(10),
            buffer: 1_000,
            max_calls_in_flight: 4,
        }
    }
}

impl BatchingConfig {
    /// At most `entries` jobs per call (1 to 10).
    pub fn with_max_entries(mut self, entries: usize) -> Self {
        self.max_entries = entries;
        self
    }

    /// At most `bytes` of messages (bodies plus attributes) per call (up to 1 MiB, SQS's limit).
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// How long a call waits for more jobs after its first (at most [`MAX_LINGER`]; zero sends what is
    /// buffered at once). A lone job waits this long; a full batch does not wait.
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How many jobs wait in the buffer before a send waits for room (at least 1).
    pub fn with_buffer(mut self, jobs: usize) -> Self {
        self.buffer = jobs;
        self
    }

    /// How many `SendMessageBatch` calls run at once (at least 1).
    pub fn with_max_calls_in_flight(mut self, calls: usize) -> Self {
        self.max_calls_in_flight = calls;
        self
    }

    fn validate(&self) -> Result<(), BatchingError> {
        let refuse = |setting, value: String, allowed| {
            Err(BatchingError::Setting {
                setting,
                value,
                allowed,
            })
        };
        if !(1..=MAX_BATCH_ENTRIES).contains(&self.max_entries) {
            return refuse(
                "max_entries",
                self.max_entries.to_string(),
                "1 to 10 (SQS's limit per SendMessageBatch)",
            );
        }
        if !(1..=MAX_MESSAGE_BYTES).contains(&self.max_bytes) {
            return refuse(
                "max_bytes",
                self.max_bytes.to_string(),
                "1 to 1,048,576 (SQS's limit per SendMessageBatch)",
            );
        }
        if self.linger > MAX_LINGER {
            return refuse("linger", format!("{:?}", self.linger), "at most 1 s");
        }
        if self.buffer == 0 {
            return refuse("buffer", "0".to_owned(), "at least 1 job");
        }
        if self.max_calls_in_flight == 0 {
            return refuse("max_calls_in_flight", "0".to_owned(), "at least 1 call");
        }
        Ok(())
    }
}

/// Why a [`BatchingProducer`] could not start.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchingError {
    /// A setting out of its range.
    #[error("BatchingConfig {setting} = {value} is out of range: it must be {allowed}")]
    Setting {
        /// The setting's name.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What it may be.
        allowed: &'static str,
    },
    /// Built outside a Tokio runtime.
    #[error(
        "BatchingProducer::new needs a Tokio runtime (it starts the task that sends the batches): \
         call it from async code running on Tokio"
    )]
    NoRuntime,
}

/// One job in the buffer.
struct Entry {
    /// Its number, in the order it was handed over.
    seq: u64,
    message: OutgoingMessage,
    size: usize,
    reply: oneshot::Sender<Result<String, ProduceError>>,
}

/// What the handles, the flusher and the calls share.
struct Shared {
    producer: Producer,
    fifo: bool,
    /// The number of the next job handed over.
    next_seq: AtomicU64,
    /// FIFO: a group with a job not sent holds back its jobs numbered below this.
    held: Mutex<HashMap<String, u64>>,
    /// FIFO: at most one call in flight per group.
    gate: Arc<gate::Gate>,
    /// Cancelled by [`BatchingProducer::shutdown`].
    stop: CancellationToken,
    /// Cancelled by the flusher once every call has answered.
    finished: CancellationToken,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The group of a job to hold back: an earlier job of its group, handed over before it, failed.
    fn held_back(&self, entry: &Entry) -> Option<String> {
        let group = entry.message.group_id.as_ref()?;
        let mut held = lock(&self.held);
        let bound = *held.get(group)?;
        if entry.seq < bound {
            return Some(group.clone());
        }
        // Handed over after the failure was known: the caller chose to go on; the group is free.
        held.remove(group);
        None
    }

    /// Holds the groups whose job failed, for the jobs handed over until now.
    fn hold_failed(
        &self,
        groups: &[(usize, Option<String>)],
        results: &[Option<Result<String, ProduceError>>],
    ) {
        let bound = self.next_seq.load(Ordering::SeqCst);
        let mut held = lock(&self.held);
        for (index, group) in groups {
            let failed = matches!(results.get(*index), Some(Some(Err(_))));
            if let (true, Some(group)) = (failed, group) {
                held.insert(group.clone(), bound);
            }
        }
    }
}

/// A producer many tasks share: each [`BatchingProducer::send`] is one job with its own result, and the
/// jobs of concurrent sends go to SQS together in `SendMessageBatch` calls (up to 10 jobs and 1 MiB,
/// gathered for a few milliseconds; see [`BatchingConfig`]). Cloning is cheap; every clone feeds one
/// buffer.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use conveyor_sqs::{BatchingConfig, BatchingProducer, NewJob, Producer, sqs_client_from_env};
///
/// let producer = Producer::new(sqs_client_from_env().await, "https://sqs.us-east-1.amazonaws.com/123456789012/jobs");
/// let batching = BatchingProducer::new(producer, BatchingConfig::default())?;
/// // In each request handler (a clone per task):
/// let id = batching.send(&NewJob::new("welcome_email", serde_json::json!({"user_id": 42}))).await?;
/// println!("sent {id}");
/// // Before the process exits: everything buffered is sent.
/// batching.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BatchingProducer {
    shared: Arc<Shared>,
    inbox: mpsc::Sender<Entry>,
}

impl std::fmt::Debug for BatchingProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchingProducer")
            .field("queue", &self.shared.producer.name())
            .field("buffered", &self.buffered())
            .finish_non_exhaustive()
    }
}

impl BatchingProducer {
    /// Starts the task that sends `producer`'s batches (on the current Tokio runtime).
    pub fn new(producer: Producer, config: BatchingConfig) -> Result<Self, BatchingError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BatchingError::NoRuntime)?;
        let (inbox, receiver) = mpsc::channel(config.buffer);
        let shared = Arc::new(Shared {
            fifo: producer.is_fifo(),
            producer,
            next_seq: AtomicU64::new(0),
            held: Mutex::default(),
            gate: Arc::default(),
            stop: CancellationToken::new(),
            finished: CancellationToken::new(),
        });
        let span = tracing::info_span!("batching_producer", queue = %shared.producer.name());
        runtime.spawn(flusher::run(Arc::clone(&shared), receiver, config).instrument(span));
        Ok(Self { shared, inbox })
    }

    /// Sends one job, in a batch with the jobs other tasks send meanwhile; returns its message id (or,
    /// with timers on, the timer's id for a job due later than 15 minutes, as [`Producer::send`]).
    /// Limits are checked in this task first: a job that breaks one makes no request. Waits for room
    /// when the buffer is full.
    pub async fn send<J: Serialize>(&self, job: &NewJob<J>) -> Result<String, ProduceError> {
        if self.shared.stop.is_cancelled() {
            return Err(ProduceError::ShutDown);
        }
        match self.shared.producer.prepare(job).await? {
            Prepared::Kept(id) => Ok(id),
            Prepared::Ready(message) => self.buffer(message).await,
        }
    }

    /// Sends one message already encoded by [`NewJob::to_message`] for this queue (checked against
    /// SQS's limits again, as [`Producer::send_messages`] does).
    pub async fn send_message(&self, message: OutgoingMessage) -> Result<String, ProduceError> {
        if self.shared.stop.is_cancelled() {
            return Err(ProduceError::ShutDown);
        }
        check_outgoing(&message, self.shared.fifo)?;
        self.buffer(message).await
    }

    async fn buffer(&self, message: OutgoingMessage) -> Result<String, ProduceError> {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            seq: self.shared.next_seq.fetch_add(1, Ordering::SeqCst),
            size: message.size(),
            message,
            reply,
        };
        self.inbox.send(entry).await.map_err(|_| ProduceError::ShutDown)?;
        answer.await.unwrap_or(Err(ProduceError::Unanswered))
    }

    /// Stops taking jobs, sends everything buffered and returns once SQS answered for each. Sends
    /// that were not buffered yet fail with [`ProduceError::ShutDown`]. Every clone shares the buffer,
    /// so any clone can shut it down; calling it again waits the same way.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        self.shared.finished.cancelled().await;
    }

    /// Jobs waiting in the buffer now (not counting those in calls in flight).
    pub fn buffered(&self) -> usize {
        self.inbox.max_capacity() - self.inbox.capacity()
    }

    /// The producer that makes the calls ([`Producer::requests`] counts them).
    pub fn producer(&self) -> &Producer {
        &self.shared.producer
    }
}

#[cfg(test)]
mod tests;
