//! [`SqsQueue`]: the [`Queue`] port on `aws-sdk-sqs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageSystemAttributeName,
    QueueAttributeName,
};
use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_MESSAGE_BYTES, MAX_RECEIVE_MESSAGES, MAX_WAIT_TIME};
use conveyor_core::message::attributes_size;
use conveyor_core::{
    DeadLetter, EntryFailure, Failure, Message, OutgoingMessage, Queue, QueueDepth, QueueError,
    ReceiptHandle, VisibilityChange,
};

use crate::batch::{all_failures, entry_id};
use crate::convert::{from_sdk_message, queue_name, visibility_seconds};
use crate::dead_letter::dead_letter_attributes;
use crate::errors::classify;
use crate::redrive::{QueueArn, RedrivePolicy};
use crate::send::{check_outgoing, invalid, send_message};

/// SQS's default visibility timeout, used if `GetQueueAttributes` leaves it out.
const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);

/// The dead-letter queue named by a queue's redrive policy.
#[derive(Debug, Clone)]
struct DeadLetterQueue {
    url: String,
    name: String,
    max_receive_count: Option<u32>,
}

/// An SQS queue, connected: its attributes are read once by [`SqsQueue::connect`].
///
/// ```no_run
/// # async fn example() -> Result<(), conveyor_core::QueueError> {
/// use conveyor_core::Queue;
/// use conveyor_sqs::{SqsQueue, sqs_client_from_env};
///
/// let client = sqs_client_from_env().await;
/// let queue = SqsQueue::connect(client, "https://sqs.us-east-1.amazonaws.com/123456789012/jobs").await?;
/// for message in queue.receive(10, std::time::Duration::from_secs(20)).await? {
///     println!("{} (delivery {})", message.id, message.receive_count);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqsQueue {
    client: Client,
    url: String,
    name: String,
    arn: String,
    fifo: bool,
    visibility_timeout: Duration,
    dead_letter: Option<DeadLetterQueue>,
    requests: AtomicU64,
}

impl SqsQueue {
    /// Reads the queue's attributes (ARN, redrive policy, visibility timeout, FIFO) and finds its DLQ.
    ///
    /// A queue that does not exist is [`QueueError::QueueMissing`] naming the URL; a redrive policy whose
    /// dead-letter queue does not exist is `QueueMissing` naming that ARN.
    pub async fn connect(client: Client, queue_url: impl Into<String>) -> Result<Self, QueueError> {
        let url = queue_url.into();
        let requests = AtomicU64::new(1);
        let output = client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::QueueArn)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .attribute_names(QueueAttributeName::FifoQueue)
            .send()
            .await
            .map_err(|error| classify(&error, &url))?;
        let mut attributes = output.attributes.unwrap_or_default();
        let name = queue_name(&url).to_owned();
        let arn = attributes
            .remove(&QueueAttributeName::QueueArn)
            .unwrap_or_default();
        let fifo = attributes
            .remove(&QueueAttributeName::FifoQueue)
            .map_or(name.ends_with(".fifo"), |value| {
                value.eq_ignore_ascii_case("true")
            });
        let visibility_timeout = attributes
            .remove(&QueueAttributeName::VisibilityTimeout)
            .and_then(|secs| secs.trim().parse().ok())
            .map_or(DEFAULT_VISIBILITY_TIMEOUT, Duration::from_secs);
        let dead_letter = match attributes.remove(&QueueAttributeName::RedrivePolicy) {
            Some(json) if !json.trim().is_empty() => {
                let policy = RedrivePolicy::parse(&json).ok_or_else(|| QueueError::Invalid {
                    message: format!(
                        "queue {name} has a RedrivePolicy without a valid SQS queue ARN in deadLetterTargetArn: {json}"
                    ),
                })?;
                requests.fetch_add(1, Ordering::Relaxed);
                let url = dead_letter_url(&client, &policy.dead_letter_arn, &name).await?;
                Some(DeadLetterQueue {
                    url,
                    name: policy.dead_letter_arn.name,
                    max_receive_count: policy.max_receive_count,
                })
            }
            _ => None,
        };
        tracing::debug!(
            queue = %name,
            fifo,
            visibility_timeout_secs = visibility_timeout.as_secs(),
            dlq = dead_letter.as_ref().map(|dlq| dlq.name.as_str()),
            "connected to queue"
        );
        Ok(Self {
            client,
            url,
            name,
            arn,
            fifo,
            visibility_timeout,
            dead_letter,
            requests,
        })
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The queue's ARN (`QueueArn`).
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// The URL of the DLQ named by the redrive policy, if the queue has one.
    pub fn dead_letter_queue_url(&self) -> Option<&str> {
        self.dead_letter.as_ref().map(|dlq| dlq.url.as_str())
    }

    /// The redrive policy's `maxReceiveCount`, if the queue has one.
    pub fn max_receive_count(&self) -> Option<u32> {
        self.dead_letter.as_ref().and_then(|dlq| dlq.max_receive_count)
    }

    /// The queue's visibility timeout (`VisibilityTimeout`).
    pub fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }

    /// How many AWS requests this queue has made so far (one per API call, including `connect`'s;
    /// the SDK's own retries of a call are not counted).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

async fn dead_letter_url(client: &Client, arn: &QueueArn, source: &str) -> Result<String, QueueError> {
    let described = format!("{} (the dead-letter queue in {source}'s RedrivePolicy)", arn.arn);
    let output = client
        .get_queue_url()
        .queue_name(&arn.name)
        .queue_owner_aws_account_id(&arn.account)
        .send()
        .await
        .map_err(|error| classify(&error, &described))?;
    output.queue_url.ok_or_else(|| QueueError::Invalid {
        message: format!("GetQueueUrl answered without a URL for {described}"),
    })
}

#[async_trait]
impl Queue for SqsQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn is_fifo(&self) -> bool {
        self.fifo
    }

    async fn receive(&self, max_messages: usize, wait: Duration) -> Result<Vec<Message>, QueueError> {
        let max = max_messages.clamp(1, MAX_RECEIVE_MESSAGES);
        let wait = wait.min(MAX_WAIT_TIME);
        self.count_request();
        let output = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(i32::try_from(max).unwrap_or(1))
            .wait_time_seconds(i32::try_from(wait.as_secs()).unwrap_or(0))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|error| classify(&error, &self.url))?;
        let messages: Vec<Message> = output
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|message| from_sdk_message(message, &self.name))
            .collect();
        tracing::trace!(queue = %self.name, count = messages.len(), "received");
        Ok(messages)
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        let mut failures = Vec::new();
        for (chunk_number, chunk) in receipts.chunks(MAX_BATCH_ENTRIES).enumerate() {
            let base = chunk_number * MAX_BATCH_ENTRIES;
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(offset, receipt)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(entry_id(base + offset))
                        .receipt_handle(receipt.as_str())
                        .build()
                        .map_err(invalid)
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.count_request();
            let output = self
                .client
                .delete_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|error| classify(&error, &self.url))?;
            let successful = output.successful.iter().map(|entry| entry.id.as_str());
            failures.extend(all_failures(base..base + chunk.len(), successful, &output.failed));
        }
        Ok(failures)
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        let mut failures = Vec::new();
        for (chunk_number, chunk) in changes.chunks(MAX_BATCH_ENTRIES).enumerate() {
            let base = chunk_number * MAX_BATCH_ENTRIES;
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(offset, change)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(entry_id(base + offset))
                        .receipt_handle(change.receipt_handle.as_str())
                        .visibility_timeout(visibility_seconds(change.timeout))
                        .build()
                        .map_err(invalid)
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.count_request();
            let output = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|error| classify(&error, &self.url))?;
            let successful = output.successful.iter().map(|entry| entry.id.as_str());
            failures.extend(all_failures(base..base + chunk.len(), successful, &output.failed));
        }
        Ok(failures)
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        check_outgoing(&message, self.fifo)?;
        self.count_request();
        send_message(&self.client, &self.url, &message).await
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        let Some(dlq) = &self.dead_letter else {
            return Ok(DeadLetter::NoDeadLetterQueue);
        };
        let fifo = dlq.name.ends_with(".fifo");
        // FIFO: keep the group (ordering in the DLQ follows the source), and deduplicate on the original
        // message id so dead-lettering the same message twice within 5 minutes leaves one copy.
        let mut attributes = dead_letter_attributes(&message.attributes, failure);
        if message.body.len() + attributes_size(&attributes) > MAX_MESSAGE_BYTES {
            // The original fitted, the failure record does not: the message matters more than its reason,
            // which stays in this log line. Its original attributes are kept as they were.
            tracing::warn!(
                queue = %self.name,
                message_id = %message.id,
                reason = %failure.error,
                "no room for the failure record within 1 MiB; dead-lettering the message without it"
            );
            attributes = message.attributes.clone();
        }
        let copy = OutgoingMessage {
            body: message.body.clone(),
            attributes,
            delay: None,
            group_id: fifo.then(|| message.group_id.clone().unwrap_or_else(|| message.id.clone())),
            deduplication_id: fifo.then(|| message.id.clone()),
            trace_header: message.trace_header.clone(),
        };
        self.count_request();
        let id = send_message(&self.client, &dlq.url, &copy).await?;
        tracing::debug!(queue = %self.name, dlq = %dlq.name, message_id = %message.id, dlq_message_id = %id, "dead-lettered");
        Ok(DeadLetter::Sent(dlq.name.clone()))
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.count_request();
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|error| classify(&error, &self.url))?;
        let attributes: HashMap<QueueAttributeName, String> = output.attributes.unwrap_or_default();
        let count = |name: QueueAttributeName| {
            attributes
                .get(&name)
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0)
        };
        Ok(QueueDepth {
            visible: count(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            delayed: count(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        })
    }
}
