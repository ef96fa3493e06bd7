//! Creating a queue with its DLQ and redrive policy, idempotently (for `conveyor local init`).
//!
//! The layout is `infra/modules/queue`'s: a DLQ named `<name>-dlq` (`<name>-dlq.fifo` for FIFO queues) of
//! the same kind, and the main queue with a `RedrivePolicy` naming the DLQ's ARN, read back from
//! `GetQueueAttributes` (never built from an account id). An existing queue is kept as it is, except that
//! a main queue without the expected redrive policy gets it: running twice is safe and says what existed.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;

use super::error::AdminError;
use super::queue_info::describe;
use crate::errors::classify;

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSetup {
    /// The main queue's name, without `.fifo` (added for FIFO queues).
    pub name: String,
    /// A FIFO queue (and FIFO DLQ), with content-based deduplication on.
    pub fifo: bool,
    /// The redrive policy's `maxReceiveCount`.
    pub max_receive_count: u32,
    /// The main queue's visibility timeout, in seconds.
    pub visibility_timeout_secs: u32,
}

/// What happened to one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// It was created now.
    Created,
    /// It existed already, as wanted.
    Existed,
    /// It existed already; its redrive policy was set or corrected.
    Updated,
}

/// The queues after [`ensure_queue_with_dlq`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSetupReport {
    /// The main queue's URL.
    pub url: String,
    /// What happened to the main queue.
    pub queue: Created,
    /// The DLQ's URL.
    pub dlq_url: String,
    /// What happened to the DLQ.
    pub dlq: Created,
}

impl QueueSetup {
    /// The main queue's full name (`.fifo` appended for FIFO queues).
    pub fn queue_name(&self) -> String {
        self.full_name(&self.name)
    }

    /// The DLQ's full name: `<name>-dlq`, `.fifo` appended for FIFO queues.
    pub fn dlq_name(&self) -> String {
        self.full_name(&format!("{}-dlq", self.name))
    }

    fn full_name(&self, base: &str) -> String {
        if self.fifo {
            format!("{base}.fifo")
        } else {
            base.to_owned()
        }
    }

    fn kind_attributes(&self) -> Vec<(QueueAttributeName, String)> {
        if !self.fifo {
            return Vec::new();
        }
        vec![
            (QueueAttributeName::FifoQueue, "true".to_owned()),
            (QueueAttributeName::ContentBasedDeduplication, "true".to_owned()),
        ]
    }
}

/// Creates the DLQ, then the main queue with its redrive policy, each unless it exists.
pub async fn ensure_queue_with_dlq(
    client: &Client,
    setup: &QueueSetup,
) -> Result<QueueSetupReport, AdminError> {
    let (dlq_url, dlq) = ensure_queue(client, &setup.dlq_name(), setup.kind_attributes()).await?;
    let dlq_info = describe(client, &dlq_url).await?;
    let policy = serde_json::json!({
        "deadLetterTargetArn": dlq_info.arn.arn,
        "maxReceiveCount": setup.max_receive_count.to_string(),
    })
    .to_string();
    let mut attributes = setup.kind_attributes();
    attributes.push((
        QueueAttributeName::VisibilityTimeout,
        setup.visibility_timeout_secs.to_string(),
    ));
    attributes.push((QueueAttributeName::RedrivePolicy, policy.clone()));
    let (url, mut queue) = ensure_queue(client, &setup.queue_name(), attributes).await?;
    if queue == Created::Existed {
        let info = describe(client, &url).await?;
        let wanted = info.redrive.as_ref().is_some_and(|redrive| {
            redrive.dead_letter_arn.arn == dlq_info.arn.arn
                && redrive.max_receive_count == Some(setup.max_receive_count)
        });
        if !wanted {
            client
                .set_queue_attributes()
                .queue_url(&url)
                .attributes(QueueAttributeName::RedrivePolicy, policy)
                .send()
                .await
                .map_err(|error| classify(&error, &url))?;
            queue = Created::Updated;
        }
    }
    Ok(QueueSetupReport {
        url,
        queue,
        dlq_url,
        dlq,
    })
}

/// The URL of queue `name`, creating it with `attributes` when `GetQueueUrl` does not find it.
async fn ensure_queue(
    client: &Client,
    name: &str,
    attributes: Vec<(QueueAttributeName, String)>,
) -> Result<(String, Created), AdminError> {
    if let Ok(output) = client.get_queue_url().queue_name(name).send().await
        && let Some(url) = output.queue_url
    {
        return Ok((url, Created::Existed));
    }
    let mut request = client.create_queue().queue_name(name);
    for (attribute, value) in attributes {
        request = request.attributes(attribute, value);
    }
    let output = request.send().await.map_err(|error| classify(&error, name))?;
    let url = output.queue_url.ok_or_else(|| {
        AdminError::Queue(conveyor_core::port::QueueError::Invalid {
            message: format!("CreateQueue {name} returned no queue URL"),
        })
    })?;
    Ok((url, Created::Created))
}
