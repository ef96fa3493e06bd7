//! What administration needs to know about a queue, and finding a queue's DLQ (or a DLQ's sources).

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_core::port::{QueueDepth, QueueError};

use super::error::AdminError;
use crate::errors::classify;
use crate::redrive::{QueueArn, RedrivePolicy};

/// A queue's identity, kind, redrive policy and depth, from one `GetQueueAttributes` (`All`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's URL.
    pub url: String,
    /// The queue's ARN (its name and account).
    pub arn: QueueArn,
    /// True for a FIFO queue.
    pub fifo: bool,
    /// True when a FIFO queue deduplicates on a hash of the body.
    pub content_based_deduplication: bool,
    /// The redrive policy, when the queue has a DLQ.
    pub redrive: Option<RedrivePolicy>,
    /// Approximate message counts.
    pub depth: QueueDepth,
    /// The queue's `VisibilityTimeout` attribute.
    pub visibility_timeout: Option<std::time::Duration>,
}

impl QueueInfo {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.arn.name
    }
}

/// Reads a queue's attributes. A queue that does not exist is [`QueueError::QueueMissing`] naming `url`.
pub async fn describe(client: &Client, url: &str) -> Result<QueueInfo, AdminError> {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|error| classify(&error, url))?;
    let attributes = output.attributes().cloned().unwrap_or_default();
    let attribute = |name: QueueAttributeName| attributes.get(&name).map(String::as_str);
    let count = |name: QueueAttributeName| attribute(name).and_then(|value| value.parse().ok()).unwrap_or(0);

    let arn_text = attribute(QueueAttributeName::QueueArn).ok_or_else(|| QueueError::Invalid {
        message: format!("GetQueueAttributes on {url} returned no QueueArn"),
    })?;
    let arn = QueueArn::parse(arn_text).ok_or_else(|| QueueError::Invalid {
        message: format!("queue {url} has QueueArn {arn_text:?}, which is not an SQS queue ARN"),
    })?;
    let redrive = match attribute(QueueAttributeName::RedrivePolicy) {
        None | Some("") => None,
        Some(json) => Some(RedrivePolicy::parse(json).ok_or_else(|| QueueError::Invalid {
            message: format!("queue {url} has a RedrivePolicy without a valid deadLetterTargetArn: {json}"),
        })?),
    };
    Ok(QueueInfo {
        url: url.to_owned(),
        fifo: attribute(QueueAttributeName::FifoQueue) == Some("true") || arn.is_fifo(),
        content_based_deduplication: attribute(QueueAttributeName::ContentBasedDeduplication) == Some("true"),
        arn,
        redrive,
        depth: QueueDepth {
            visible: count(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            delayed: count(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        },
        visibility_timeout: attribute(QueueAttributeName::VisibilityTimeout)
            .and_then(|value| value.parse().ok())
            .map(std::time::Duration::from_secs),
    })
}

/// The URL of the queue with this ARN (one `GetQueueUrl`, with the ARN's account as the owner).
pub async fn url_for_arn(client: &Client, arn: &QueueArn) -> Result<String, AdminError> {
    let output = client
        .get_queue_url()
        .queue_name(&arn.name)
        .queue_owner_aws_account_id(&arn.account)
        .send()
        .await
        .map_err(|error| classify(&error, &arn.name))?;
    let url = output.queue_url().ok_or_else(|| QueueError::Invalid {
        message: format!("GetQueueUrl for {} returned no URL", arn.name),
    })?;
    Ok(url.to_owned())
}

/// The URLs of the queues whose redrive policy names `dlq_url` as their DLQ (`ListDeadLetterSourceQueues`,
/// every page).
pub async fn dead_letter_sources(client: &Client, dlq_url: &str) -> Result<Vec<String>, AdminError> {
    let mut urls = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let output = client
            .list_dead_letter_source_queues()
            .queue_url(dlq_url)
            .max_results(1000)
            .set_next_token(token.take())
            .send()
            .await
            .map_err(|error| classify(&error, dlq_url))?;
        urls.extend(output.queue_urls().iter().cloned());
        match output.next_token() {
            Some(next) if !next.is_empty() => token = Some(next.to_owned()),
            _ => return Ok(urls),
        }
    }
}

/// The URLs of the queues whose name starts with `prefix` (`ListQueues`, every page), sorted.
pub async fn list_queues(client: &Client, prefix: &str) -> Result<Vec<String>, AdminError> {
    let mut urls = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let output = client
            .list_queues()
            .queue_name_prefix(prefix)
            .max_results(1000)
            .set_next_token(token.take())
            .send()
            .await
            .map_err(|error| classify(&error, prefix))?;
        urls.extend(output.queue_urls().iter().cloned());
        match output.next_token() {
            Some(next) if !next.is_empty() => token = Some(next.to_owned()),
            _ => break,
        }
    }
    urls.sort();
    Ok(urls)
}

/// A DLQ and the queues that send to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPair {
    /// The DLQ.
    pub dlq: QueueInfo,
    /// The source queue the caller named, or every queue that names the DLQ in its redrive policy when the
    /// caller named the DLQ itself.
    pub sources: Vec<QueueInfo>,
    /// True when the caller named the DLQ, false when they named a source queue.
    pub named_dlq: bool,
}

/// Resolves `url` to a DLQ and its sources: `url` may be a source queue (its DLQ comes from its
/// `RedrivePolicy`) or the DLQ itself (its sources come from `ListDeadLetterSourceQueues`).
///
/// A queue that has no redrive policy and is nobody's DLQ is [`AdminError::NoDeadLetterQueue`].
pub async fn resolve_dead_letter(client: &Client, url: &str) -> Result<DeadLetterPair, AdminError> {
    let named = describe(client, url).await?;
    if let Some(policy) = &named.redrive {
        let dlq_url = url_for_arn(client, &policy.dead_letter_arn).await?;
        let dlq = describe(client, &dlq_url).await?;
        return Ok(DeadLetterPair {
            dlq,
            sources: vec![named],
            named_dlq: false,
        });
    }
    let source_urls = dead_letter_sources(client, url).await?;
    if source_urls.is_empty() {
        return Err(AdminError::NoDeadLetterQueue {
            queue: url.to_owned(),
        });
    }
    let mut sources = Vec::with_capacity(source_urls.len());
    for source_url in &source_urls {
        sources.push(describe(client, source_url).await?);
    }
    Ok(DeadLetterPair {
        dlq: named,
        sources,
        named_dlq: true,
    })
}
