//! Emptying a queue.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;

use super::error::AdminError;
use crate::errors::classify;

/// Codes SQS answers with while an earlier purge of the queue is still running.
const PURGE_IN_PROGRESS_CODES: &[&str] = &[
    "AWS.SimpleQueueService.PurgeQueueInProgress",
    "PurgeQueueInProgress",
];

/// Deletes every message of `queue_url` (`PurgeQueue`). SQS finishes the deletion within 60 seconds, and
/// allows one purge per queue per 60 seconds: a second one is [`AdminError::PurgeInProgress`].
pub async fn purge(client: &Client, queue_url: &str) -> Result<(), AdminError> {
    let result = client.purge_queue().queue_url(queue_url).send().await;
    let Err(error) = result else {
        return Ok(());
    };
    if error
        .code()
        .is_some_and(|code| PURGE_IN_PROGRESS_CODES.contains(&code))
    {
        return Err(AdminError::PurgeInProgress {
            queue: queue_url.to_owned(),
        });
    }
    Err(AdminError::Queue(classify(&error, queue_url)))
}
