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
use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_RECEIVE_MESSAGES, MAX_WAIT_TIME};
use conveyor_core::runtime::dead_letter_copy;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{DeadLetter, EntryFailure, OutgoingMessage, Queue, QueueDepth, QueueError, VisibilityChange},
    runtime::Failure,
};

use crate::batch::{all_failures, entry_id};
use crate::convert::{from_sdk_message, queue_name, visibility_seconds};
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
/// # async fn example() -> Result<(), conveyor_core::port::QueueError> {
/// use conveyor_core::port::Queue;
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
    /// `queue_url` may also be a queue's name (`jobs`, `orders.fifo`): its URL is asked of SQS
    /// (`GetQueueUrl`, in the client's region and account). A queue that does not exist is
    /// [`QueueError::QueueMissing`] naming the URL or name; a redrive policy whose dead-letter queue
    /// does not exist is `QueueMissing` naming that ARN.
    pub async fn connect(client: Client, queue_url: impl Into<String>) -> Result<Self, QueueError> {
        let given = queue_url.into();
        let requests = AtomicU64::new(1);
        let url = if given.contains("://") {
            given
        } else {
            requests.fetch_add(1, Ordering::Relaxed);
            crate::admin::url_of_name(&client, &given).await?
        };
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

    /// How many AWS requests this queue has made so far (one per API call, including `connect`'s;
    /// the SDK's own retries of a call are not counted).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// The per-call deadlines of visibility changes and deletes ([`crate::lease_timeout_config`]).
fn lease_timeouts() -> aws_sdk_sqs::config::Builder {
    aws_sdk_sqs::config::Builder::default().timeout_config(crate::client::lease_timeout_config())
}

/// A `ReceiveRequestAttemptId` (1–128 characters of `[a-zA-Z0-9]` and punctuation): unique per logical
/// receive of this process.
fn receive_attempt_id(counter: &AtomicU64) -> String {
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = PROCESS.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64)
            ^ u64::from(std::process::id())
    });
    format!("conveyor-{process:x}-{}", counter.load(Ordering::Relaxed))
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

    fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }

    fn max_receive_count(&self) -> Option<u32> {
        self.dead_letter.as_ref().and_then(|dlq| dlq.max_receive_count)
    }

    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility_timeout: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        let max = max_messages.clamp(1, MAX_RECEIVE_MESSAGES);
        let wait = wait.min(MAX_WAIT_TIME);
        self.count_request();
        // FIFO: the SDK's own retries of this call resend the same attempt id, so a receive whose
        // response was lost returns the same messages instead of leaving them invisible and unread.
        let attempt_id = self.fifo.then(|| receive_attempt_id(&self.requests));
        let output = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(i32::try_from(max).unwrap_or(1))
            .wait_time_seconds(i32::try_from(wait.as_secs()).unwrap_or(0))
            .visibility_timeout(visibility_seconds(visibility_timeout))
            .set_receive_request_attempt_id(attempt_id)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default()
                    .timeout_config(crate::client::receive_timeout_config(wait)),
            )
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
                .customize()
                .config_override(lease_timeouts())
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
                .customize()
                .config_override(lease_timeouts())
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
        let copy = dead_letter_copy(message, failure, dlq.name.ends_with(".fifo"));
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
