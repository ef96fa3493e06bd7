//! SQS's limits, checked before a send so the error can say what was wrong and what to do instead.

use std::time::Duration;

use conveyor_core::limits::{MAX_DELAY, MAX_MESSAGE_BYTES};
use conveyor_core::{OutgoingMessage, QueueError};

/// Why a message was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProduceError {
    /// The body is empty.
    #[error("the message body is empty: SQS refuses empty messages")]
    EmptyBody,
    /// Body plus attributes are over SQS's message size limit.
    #[error(
        "the message is {size} bytes (body plus attribute names, types and values), over SQS's limit of \
         {limit} bytes (1 MiB): store the payload elsewhere (S3) and send a reference"
    )]
    TooLarge {
        /// The message's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// More message attributes than a producer may set.
    #[error(
        "the message has {count} attributes, over the {limit} a producer may set: SQS allows 10 per message \
         and Conveyor keeps one free for the failure record (conveyor.failure) added when the message is \
         dead-lettered"
    )]
    TooManyAttributes {
        /// Attributes on the message, Conveyor's own included.
        count: usize,
        /// The most allowed.
        limit: usize,
    },
    /// A delay longer than SQS allows.
    #[error(
        "a delay of {}s is over SQS's limit of 900s (15 minutes): schedule the send with a scheduler \
         (EventBridge Scheduler, a cron job) instead",
        delay.as_secs()
    )]
    DelayTooLong {
        /// The delay asked for.
        delay: Duration,
    },
    /// A per-message delay on a FIFO queue.
    #[error(
        "FIFO queues do not accept a per-message delay: set DelaySeconds on the queue, or use a standard queue"
    )]
    DelayOnFifo,
    /// A FIFO send without a message group id.
    #[error("FIFO queues need a message group id on every message: set one (Job::with_group_id)")]
    MissingGroupId,
    /// An extra attribute uses a name Conveyor sets itself.
    #[error("attribute {name} is reserved for Conveyor: use the Job's setters instead")]
    ReservedAttribute {
        /// The attribute's name.
        name: String,
    },
    /// A schema version of 0.
    #[error("schema version 0 is not valid for job {job_type}: versions start at 1")]
    InvalidVersion {
        /// The job type.
        job_type: String,
    },
    /// The payload does not serialise to JSON.
    #[error("the job payload of type {job_type} does not serialise to JSON: {message}")]
    Encode {
        /// The job type.
        job_type: String,
        /// serde_json's error.
        message: String,
    },
    /// SQS refused this entry of a batch.
    #[error("SQS refused the message ({code}): {message}")]
    Rejected {
        /// SQS's error code.
        code: String,
        /// SQS's message.
        message: String,
        /// SQS's `SenderFault`: true means sending the same message again will fail again.
        sender_fault: bool,
    },
    /// SQS answered a batch call without reporting this entry.
    #[error("SQS did not report this entry of the batch as sent or failed")]
    NotReported,
    /// The send call failed as a whole.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// The size SQS counts against its 1 MiB limit: body plus attribute names, types and values.
pub fn message_size(message: &OutgoingMessage) -> usize {
    message.body.len()
        + message
            .attributes
            .iter()
            .map(|(name, value)| name.len() + value.size())
            .sum::<usize>()
}

/// Checks `message` against SQS's limits for a queue of the given kind, allowing at most
/// `attribute_limit` message attributes. Makes no request.
pub fn check_message(message: &OutgoingMessage, fifo: bool, attribute_limit: usize) -> Result<(), ProduceError> {
    if message.body.is_empty() {
        return Err(ProduceError::EmptyBody);
    }
    let size = message_size(message);
    if size > MAX_MESSAGE_BYTES {
        return Err(ProduceError::TooLarge {
            size,
            limit: MAX_MESSAGE_BYTES,
        });
    }
    if message.attributes.len() > attribute_limit {
        return Err(ProduceError::TooManyAttributes {
            count: message.attributes.len(),
            limit: attribute_limit,
        });
    }
    if let Some(delay) = message.delay {
        if fifo && !delay.is_zero() {
            return Err(ProduceError::DelayOnFifo);
        }
        if delay > MAX_DELAY {
            return Err(ProduceError::DelayTooLong { delay });
        }
    }
    if fifo && message.group_id.as_deref().is_none_or(str::is_empty) {
        return Err(ProduceError::MissingGroupId);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use conveyor_core::AttributeValue;

    use super::*;

    fn message(body: &str) -> OutgoingMessage {
        OutgoingMessage {
            body: body.to_owned(),
            ..OutgoingMessage::default()
        }
    }

    #[test]
    fn size_counts_body_and_attributes() {
        let mut outgoing = message("abc");
        outgoing
            .attributes
            .insert("k".to_owned(), AttributeValue::string("vv"));
        // 3 (body) + 1 (name) + 6 ("String") + 2 (value)
        assert_eq!(message_size(&outgoing), 12);
    }

    #[test]
    fn exactly_one_mebibyte_passes_and_one_more_byte_fails() {
        let body = "x".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(check_message(&message(&body), false, 9), Ok(()));
        let body = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let error = check_message(&message(&body), false, 9).unwrap_err();
        assert_eq!(
            error,
            ProduceError::TooLarge {
                size: MAX_MESSAGE_BYTES + 1,
                limit: MAX_MESSAGE_BYTES
            }
        );
        assert!(error.to_string().contains("1048577 bytes"));
        assert!(error.to_string().contains("1048576 bytes"));
    }

    #[test]
    fn delays_are_checked_by_queue_kind() {
        let mut outgoing = message("x");
        outgoing.delay = Some(Duration::from_secs(15 * 60));
        assert_eq!(check_message(&outgoing, false, 9), Ok(()));
        outgoing.delay = Some(Duration::from_secs(16 * 60));
        let error = check_message(&outgoing, false, 9).unwrap_err();
        assert!(error.to_string().contains("scheduler"), "{error}");
        outgoing.delay = Some(Duration::from_secs(1));
        outgoing.group_id = Some("g".to_owned());
        assert_eq!(check_message(&outgoing, true, 9), Err(ProduceError::DelayOnFifo));
    }

    #[test]
    fn fifo_needs_a_group_and_bodies_cannot_be_empty() {
        assert_eq!(check_message(&message("x"), true, 9), Err(ProduceError::MissingGroupId));
        assert_eq!(check_message(&message(""), false, 9), Err(ProduceError::EmptyBody));
    }

    #[test]
    fn attribute_count_is_limited_and_the_reason_is_given() {
        let mut outgoing = message("x");
        for index in 0..10 {
            outgoing
                .attributes
                .insert(format!("a{index}"), AttributeValue::string("v"));
        }
        let error = check_message(&outgoing, false, 9).unwrap_err();
        assert!(error.to_string().contains("conveyor.failure"), "{error}");
        assert_eq!(check_message(&outgoing, false, 10), Ok(()));
    }
}
