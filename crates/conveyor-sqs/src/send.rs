//! Turning an [`OutgoingMessage`] into `SendMessage` / `SendMessageBatch` requests (shared by
//! [`SqsQueue`](crate::SqsQueue) and [`Producer`](crate::Producer)).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    MessageSystemAttributeNameForSends, MessageSystemAttributeValue, SendMessageBatchRequestEntry,
};
use conveyor_core::limits::{MAX_DELAY, MAX_MESSAGE_BYTES};
use conveyor_core::port::{OutgoingMessage, QueueError};

use crate::convert::to_sdk_attributes;
use crate::errors::classify;

type SystemAttributes = HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue>;

/// A request that could not be built (a required field missing): the request was wrong.
pub(crate) fn invalid(error: aws_smithy_types::error::operation::BuildError) -> QueueError {
    QueueError::Invalid {
        message: error.to_string(),
    }
}

/// `DelaySeconds` for a delay, rounded up to whole seconds (`None` for no delay or zero).
pub(crate) fn delay_seconds(delay: Option<Duration>) -> Option<i32> {
    let delay = delay.filter(|delay| !delay.is_zero())?;
    let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    Some(i32::try_from(seconds).unwrap_or(i32::MAX))
}

/// The `AWSTraceHeader` system attribute, when there is a trace header.
fn system_attributes(trace_header: Option<&str>) -> Result<Option<SystemAttributes>, QueueError> {
    let Some(header) = trace_header else {
        return Ok(None);
    };
    let value = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        .map_err(|error| QueueError::Invalid {
            message: format!("AWSTraceHeader: {error}"),
        })?;
    Ok(Some(HashMap::from([(
        MessageSystemAttributeNameForSends::AwsTraceHeader,
        value,
    )])))
}

/// Checks a message against SQS's limits before sending, so the error says what was wrong: a per-message
/// delay on a FIFO queue (SQS supports only the queue's own delay there), a delay over 15 minutes, a
/// message over 1 MiB.
pub(crate) fn check_outgoing(message: &OutgoingMessage, fifo: bool) -> Result<(), QueueError> {
    if fifo && delay_seconds(message.delay).is_some() {
        return Err(QueueError::Invalid {
            message: "FIFO queues do not support a per-message delay".to_owned(),
        });
    }
    if let Some(delay) = message.delay.filter(|delay| *delay > MAX_DELAY) {
        return Err(QueueError::Invalid {
            message: format!(
                "a delay of {delay:?} is over SQS's 15-minute limit; schedule later work with a scheduler \
                 (e.g. EventBridge Scheduler) that sends when it is due"
            ),
        });
    }
    let size = message.size();
    if size > MAX_MESSAGE_BYTES {
        return Err(QueueError::Invalid {
            message: format!(
                "the message is {size} bytes (body and attributes), over SQS's limit of {MAX_MESSAGE_BYTES}; \
                 store the payload elsewhere (S3) and send a reference"
            ),
        });
    }
    Ok(())
}

/// Sends one message with `SendMessage`; returns its message id.
pub(crate) async fn send_message(
    client: &Client,
    queue_url: &str,
    message: &OutgoingMessage,
) -> Result<String, QueueError> {
    let output = client
        .send_message()
        .queue_url(queue_url)
        .message_body(&message.body)
        .set_message_attributes(to_sdk_attributes(&message.attributes)?)
        .set_message_system_attributes(system_attributes(message.trace_header.as_deref())?)
        .set_delay_seconds(delay_seconds(message.delay))
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone())
        .send()
        .await
        .map_err(|error| classify(&error, queue_url))?;
    output.message_id.ok_or_else(|| QueueError::Invalid {
        message: "SendMessage answered without a message id".to_owned(),
    })
}

/// One `SendMessageBatch` entry.
pub(crate) fn batch_entry(
    id: String,
    message: &OutgoingMessage,
) -> Result<SendMessageBatchRequestEntry, QueueError> {
    SendMessageBatchRequestEntry::builder()
        .id(id)
        .message_body(&message.body)
        .set_message_attributes(to_sdk_attributes(&message.attributes)?)
        .set_message_system_attributes(system_attributes(message.trace_header.as_deref())?)
        .set_delay_seconds(delay_seconds(message.delay))
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone())
        .build()
        .map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_seconds() {
        assert_eq!(delay_seconds(None), None);
        assert_eq!(delay_seconds(Some(Duration::ZERO)), None);
        assert_eq!(delay_seconds(Some(Duration::from_millis(1500))), Some(2));
        assert_eq!(delay_seconds(Some(Duration::from_secs(900))), Some(900));
    }

    #[test]
    fn limits_are_checked_before_sending() {
        let too_late = OutgoingMessage {
            body: "{}".into(),
            delay: Some(Duration::from_secs(16 * 60)),
            ..OutgoingMessage::default()
        };
        assert!(
            check_outgoing(&too_late, false)
                .unwrap_err()
                .to_string()
                .contains("15-minute")
        );
        let too_big = OutgoingMessage {
            body: "x".repeat(MAX_MESSAGE_BYTES + 1),
            ..OutgoingMessage::default()
        };
        assert!(
            check_outgoing(&too_big, false)
                .unwrap_err()
                .to_string()
                .contains("over SQS's limit")
        );
        let fifo_delay = OutgoingMessage {
            body: "{}".into(),
            delay: Some(Duration::from_secs(1)),
            ..OutgoingMessage::default()
        };
        assert!(check_outgoing(&fifo_delay, true).is_err());
        assert!(check_outgoing(&fifo_delay, false).is_ok());
    }
}
