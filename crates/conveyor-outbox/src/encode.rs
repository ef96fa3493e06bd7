//! A job encoded for the outbox: through the producer's own encoding and checks
//! ([`NewJob::to_message`]: size, attribute count and names, schema version, delay, FIFO group), so a job
//! that would be refused at send time is refused before the transaction, and a committed job is sendable.
//! Every store's writer uses it.

use conveyor_core::port::OutgoingMessage;
use conveyor_sqs::NewJob;
use serde::Serialize;

use crate::item::OutboxError;

/// The longest aggregate id: it becomes the FIFO message group id (SQS allows 128 characters).
pub(crate) const MAX_AGGREGATE_CHARS: usize = 128;
/// The longest item id: it becomes the FIFO deduplication id (SQS allows 128; the outbox keeps 100).
pub(crate) const MAX_ID_CHARS: usize = 100;

/// A job ready to be stored.
#[derive(Debug, Clone)]
pub struct EncodedJob {
    /// The job type.
    pub job_type: String,
    /// The idempotency key the consumer settles it under.
    pub idempotency_key: String,
    /// The message as the relay sends it.
    pub message: OutgoingMessage,
}

/// The queue's name: the last segment of its URL.
pub(crate) fn queue_name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().unwrap_or_default()
}

/// Encodes `job` for the queue at `queue_url` as item `id` of `aggregate`: on a FIFO queue the aggregate
/// is the message group id and the item id the deduplication id (unless the job set one); the idempotency
/// key is the job's own, or `outbox:<id>`.
pub fn encode<J: Serialize>(
    job: NewJob<J>,
    queue_url: &str,
    aggregate: &str,
    id: &str,
) -> Result<EncodedJob, OutboxError> {
    let job_type = job.job_type().to_owned();
    if aggregate.is_empty()
        || aggregate.chars().count() > MAX_AGGREGATE_CHARS
        || aggregate.starts_with(crate::table::LEASE_PREFIX)
    {
        return Err(OutboxError::InvalidAggregate {
            job_type,
            length: aggregate.len(),
        });
    }
    if id.is_empty() || id.chars().count() > MAX_ID_CHARS {
        return Err(OutboxError::InvalidId {
            job_type,
            length: id.len(),
        });
    }
    let queue = queue_name(queue_url);
    let fifo = queue.ends_with(".fifo");
    let key = job
        .producer_key()
        .map_or_else(|| format!("outbox:{id}"), str::to_owned);
    let mut job = job.key(key.clone());
    if fifo {
        job = job.group_id(aggregate);
    }
    let mut message = job.to_message(queue)?;
    if fifo && message.deduplication_id.is_none() {
        message.deduplication_id = Some(id.to_owned());
    }
    Ok(EncodedJob {
        job_type,
        idempotency_key: key,
        message,
    })
}
