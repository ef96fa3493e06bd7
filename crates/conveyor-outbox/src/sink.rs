//! [`JobSink`]: where the relay sends jobs. [`SqsSink`] sends through the producer
//! ([`conveyor_sqs::Producer::send_messages`], `SendMessageBatch` packed to SQS's limits);
//! [`QueueSink`] sends through the queue port (in-memory queues in tests and the simulator).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use conveyor_core::port::{OutgoingMessage, Queue, QueueError};
use conveyor_sqs::{ProduceError, Producer};

/// Why a job was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// What SQS (or the sink) said.
    pub message: String,
    /// True when the same send may succeed later by itself (throttling, an outage); false when someone
    /// must change something (the queue, the permissions, the job).
    pub retryable: bool,
}

impl SendFailure {
    fn from_queue_error(error: &QueueError) -> Self {
        Self {
            message: error.to_string(),
            retryable: error.is_retryable(),
        }
    }
}

/// Sends encoded jobs to a queue by its URL.
#[async_trait]
pub trait JobSink: Send + Sync {
    /// Sends `messages` to the queue at `queue_url`; one result per message, in order.
    async fn send(&self, queue_url: &str, messages: Vec<OutgoingMessage>)
    -> Vec<Result<String, SendFailure>>;

    /// Requests made so far.
    fn requests(&self) -> u64;
}

/// Sends to SQS, one [`Producer`] per queue URL.
#[derive(Debug, Clone)]
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    producers: Arc<Mutex<HashMap<String, Arc<Producer>>>>,
}

impl SqsSink {
    /// A sink on `client`.
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            producers: Arc::default(),
        }
    }

    fn producer(&self, queue_url: &str) -> Arc<Producer> {
        let Ok(mut producers) = self.producers.lock() else {
            return Arc::new(Producer::new(self.client.clone(), queue_url));
        };
        Arc::clone(
            producers
                .entry(queue_url.to_owned())
                .or_insert_with(|| Arc::new(Producer::new(self.client.clone(), queue_url))),
        )
    }
}

#[async_trait]
impl JobSink for SqsSink {
    async fn send(
        &self,
        queue_url: &str,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<String, SendFailure>> {
        let report = self.producer(queue_url).send_messages(messages).await;
        report
            .results
            .into_iter()
            .map(|result| result.map_err(|error| classify(&error)))
            .collect()
    }

    fn requests(&self) -> u64 {
        self.producers
            .lock()
            .map(|producers| producers.values().map(|producer| producer.requests()).sum())
            .unwrap_or(0)
    }
}

/// A producer's refusal as a send failure: SQS unavailable or a server-side fault is retryable, anything
/// the sender must change is not.
fn classify(error: &ProduceError) -> SendFailure {
    match error {
        ProduceError::Queue(error) => SendFailure::from_queue_error(error),
        ProduceError::Rejected { sender_fault, .. } => SendFailure {
            message: error.to_string(),
            retryable: !sender_fault,
        },
        // Held back behind an earlier job of its group: sent again with that one. A wrong SQS endpoint:
        // the items wait for the fix, as for an outage.
        ProduceError::GroupHeld { .. } | ProduceError::Unreachable(_) => SendFailure {
            message: error.to_string(),
            retryable: true,
        },
        _ => SendFailure {
            message: error.to_string(),
            retryable: false,
        },
    }
}

/// Sends through queue ports by URL (in-memory queues); an unknown URL is a missing queue.
#[derive(Clone, Default)]
pub struct QueueSink {
    queues: HashMap<String, Arc<dyn Queue>>,
    requests: Arc<AtomicU64>,
}

impl std::fmt::Debug for QueueSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSink")
            .field("queues", &self.queues.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl QueueSink {
    /// A sink with no queues.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `queue` reachable at `queue_url`.
    pub fn with_queue(mut self, queue_url: impl Into<String>, queue: Arc<dyn Queue>) -> Self {
        self.queues.insert(queue_url.into(), queue);
        self
    }
}

#[async_trait]
impl JobSink for QueueSink {
    async fn send(
        &self,
        queue_url: &str,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<String, SendFailure>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let Some(queue) = self.queues.get(queue_url) else {
            let missing = QueueError::QueueMissing {
                queue: queue_url.to_owned(),
            };
            return messages
                .iter()
                .map(|_| Err(SendFailure::from_queue_error(&missing)))
                .collect();
        };
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let result = queue.send(message).await;
            results.push(result.map_err(|error| SendFailure::from_queue_error(&error)));
        }
        results
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}
