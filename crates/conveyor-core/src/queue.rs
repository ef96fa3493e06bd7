//! The `Queue` port: what a runtime needs from SQS (or from a double that behaves like it).

use std::time::Duration;

use async_trait::async_trait;

use crate::message::{Attributes, Message, ReceiptHandle};
use crate::outcome::Failure;

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutgoingMessage {
    /// The body.
    pub body: String,
    /// Message attributes.
    pub attributes: Attributes,
    /// Delivery delay (standard queues only; at most 15 minutes).
    pub delay: Option<Duration>,
    /// `MessageGroupId`: the FIFO group (required on FIFO queues), or the tenant on a standard queue
    /// (SQS's fair queues).
    pub group_id: Option<String>,
    /// FIFO deduplication id (required on FIFO queues without content-based deduplication).
    pub deduplication_id: Option<String>,
    /// An X-Ray trace header to propagate as `AWSTraceHeader`.
    pub trace_header: Option<String>,
}

impl OutgoingMessage {
    /// A message for the handler of `job_type` with `body` (the job as JSON) and nothing else set:
    /// what a producer's plain send carries, for queues without the SQS producer (in-memory ones).
    pub fn job(job_type: &str, body: impl Into<String>) -> Self {
        let mut attributes = Attributes::new();
        attributes.insert(
            crate::message::JOB_TYPE_ATTRIBUTE.to_owned(),
            crate::message::AttributeValue::string(job_type),
        );
        Self {
            body: body.into(),
            attributes,
            ..Self::default()
        }
    }

    /// The size SQS counts against its 1 MiB limit: body plus attribute names, types and values.
    pub fn size(&self) -> usize {
        self.body.len() + crate::message::attributes_size(&self.attributes)
    }
}

/// A visibility change for one receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibilityChange {
    /// The receipt to change.
    pub receipt_handle: ReceiptHandle,
    /// The new visibility timeout, counted from now (at most 12 hours).
    pub timeout: Duration,
}

/// Why one entry of a batch call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// A receipt handle SQS issued that no longer holds the message: it is no longer in flight under
    /// it (received again elsewhere, deleted, moved to the DLQ), so the lease is lost. SQS answers
    /// `InvalidParameterValue` "… for parameter ReceiptHandle is invalid. Reason: Message does not exist
    /// or is not available for visibility timeout change." (or "The receipt handle has expired.").
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// A receipt handle SQS says it never issued (`ReceiptHandleIsInvalid`: malformed, or not one of
    /// this queue's). A receive's own handle never is, nor is one in an event Lambda's event source
    /// mapping sends: the record came from somewhere else, such as a hand-written test event.
    #[error("receipt handle not issued by this queue: {0}")]
    NotIssued(String),
    /// Any other per-entry failure, with SQS's code and message.
    #[error("{code}: {message}")]
    Failed {
        /// SQS's error code.
        code: String,
        /// SQS's message.
        message: String,
        /// SQS's `SenderFault`: false means trying again may work.
        sender_fault: bool,
    },
}

/// One failed entry of a batch call, by its index in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryFailure {
    /// The index in the entries passed in.
    pub index: usize,
    /// Why it failed.
    pub error: EntryError,
}

/// Where a dead-lettered message went.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetter {
    /// A copy was sent to this DLQ (its name).
    Sent(String),
    /// The queue has no redrive policy, so there is no DLQ to send to.
    NoDeadLetterQueue,
}

/// Counts from `GetQueueAttributes` (approximate, as SQS reports them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// `ApproximateNumberOfMessages`.
    pub visible: u64,
    /// `ApproximateNumberOfMessagesNotVisible`.
    pub in_flight: u64,
    /// `ApproximateNumberOfMessagesDelayed`.
    pub delayed: u64,
}

/// A queue call that failed as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The queue does not exist: fatal until someone creates it or fixes the URL.
    #[error("queue {queue} does not exist: create it (infra/modules/queue) or fix the configured queue URL")]
    QueueMissing {
        /// The queue's URL or name.
        queue: String,
    },
    /// The credentials may not do this.
    #[error("access denied on queue {queue}: {message}; grant the IAM actions listed in infra/README.md")]
    AccessDenied {
        /// The queue's URL or name.
        queue: String,
        /// The service's message.
        message: String,
    },
    /// Throttled, timed out, a 5xx or a dropped connection: trying again later may work.
    #[error("SQS is unavailable ({message})")]
    Unavailable {
        /// What happened.
        message: String,
    },
    /// The request was wrong (too large, a bad parameter): trying again will not help.
    #[error("SQS refused the request: {message}")]
    Invalid {
        /// What was wrong.
        message: String,
    },
}

impl QueueError {
    /// True when the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, QueueError::Unavailable { .. })
    }
}

/// The queue port, implemented on `aws-sdk-sqs` (`conveyor-sqs`) and in memory (`conveyor-testing`).
///
/// Contracts every implementation keeps (the conformance suite in `conveyor-testing` checks them):
/// - `receive_with_visibility` returns at most `max_messages` (1..=10) messages, waiting up to `wait`
///   (≤ 20 s) for the first; each returned message is invisible for the `visibility_timeout` sent with
///   the request (as SQS's `ReceiveMessage` `VisibilityTimeout`), after which it is delivered again with
///   `receive_count` one higher. `receive` does the same with the queue's own visibility timeout. A message received more than the redrive policy's
///   `maxReceiveCount` times moves to the DLQ instead. FIFO queues never return a message of a group
///   while another message of that group is in flight. Dropping the future mid-wait is allowed; a
///   message received by a dropped call comes back after its visibility timeout.
/// - `delete_batch` and `change_visibility_batch` take any number of entries (split into calls of 10),
///   and report per-entry failures by index; a receipt SQS issued that no longer holds the message is
///   `EntryError::LeaseLost`, a receipt it never issued (malformed, another queue's) is
///   `EntryError::NotIssued`.
///   Deleting an already deleted message with its last receipt handle succeeds, as on SQS.
/// - `dead_letter` sends a copy (body, attributes and a `conveyor.failure` attribute) to the DLQ named
///   by the queue's redrive policy and does not delete the original: the caller deletes it after.
/// - An `Err` means the whole call failed and nothing was changed, except that a failed batch call
///   may have applied some entries (callers retry idempotent operations only).
#[async_trait]
pub trait Queue: Send + Sync {
    /// The queue's name (the last segment of its URL); ends in `.fifo` for FIFO queues.
    fn name(&self) -> &str;

    /// True for FIFO queues.
    fn is_fifo(&self) -> bool {
        self.name().ends_with(".fifo")
    }

    /// The queue's own visibility timeout (its `VisibilityTimeout` attribute, read when connecting).
    fn visibility_timeout(&self) -> Duration;

    /// The redrive policy's `maxReceiveCount`, when the queue has a DLQ.
    fn max_receive_count(&self) -> Option<u32>;

    /// Long-polls for up to `max_messages` messages, each invisible for `visibility_timeout` from now.
    ///
    /// The runtime sends the visibility timeout it computes its deadlines from, so the deadline SQS
    /// applies and the one the heartbeat assumes are the same number.
    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility_timeout: Duration,
    ) -> Result<Vec<Message>, QueueError>;

    /// Long-polls for up to `max_messages` messages with the queue's own visibility timeout.
    async fn receive(&self, max_messages: usize, wait: Duration) -> Result<Vec<Message>, QueueError> {
        self.receive_with_visibility(max_messages, wait, self.visibility_timeout())
            .await
    }

    /// Deletes the receipts; returns the entries that failed.
    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError>;

    /// Changes the receipts' visibility timeouts; returns the entries that failed.
    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError>;

    /// Sends one message; returns its message id.
    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError>;

    /// Sends a copy of `message` with `failure` recorded to the DLQ; does not delete the original.
    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError>;

    /// Approximate counts of the queue's messages.
    async fn depth(&self) -> Result<QueueDepth, QueueError>;
}
