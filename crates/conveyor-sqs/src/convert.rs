//! Conversions between the SDK's types and Conveyor's (attributes, received messages).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use aws_smithy_types::Blob;
use conveyor_core::limits::MAX_VISIBILITY_TIMEOUT;
use conveyor_core::{
    message::{AttributeValue, Attributes, Message, ReceiptHandle},
    port::QueueError,
};

/// Converts one attribute to the SDK's type.
pub(crate) fn to_sdk_attribute(
    name: &str,
    value: &AttributeValue,
) -> Result<MessageAttributeValue, QueueError> {
    MessageAttributeValue::builder()
        .data_type(&value.data_type)
        .set_string_value(value.string_value.clone())
        .set_binary_value(value.binary_value.clone().map(Blob::new))
        .build()
        .map_err(|error| QueueError::Invalid {
            message: format!("message attribute {name}: {error}"),
        })
}

/// Converts attributes to the SDK's map (`None` when there are none, so the request omits them).
pub(crate) fn to_sdk_attributes(
    attributes: &Attributes,
) -> Result<Option<HashMap<String, MessageAttributeValue>>, QueueError> {
    if attributes.is_empty() {
        return Ok(None);
    }
    let mut map = HashMap::with_capacity(attributes.len());
    for (name, value) in attributes {
        map.insert(name.clone(), to_sdk_attribute(name, value)?);
    }
    Ok(Some(map))
}

/// Converts received attributes; list values (reserved by SQS, never sent) are ignored.
pub(crate) fn from_sdk_attributes(attributes: Option<HashMap<String, MessageAttributeValue>>) -> Attributes {
    attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            let value = AttributeValue {
                data_type: value.data_type,
                string_value: value.string_value,
                binary_value: value.binary_value.map(Blob::into_inner),
            };
            (name, value)
        })
        .collect()
}

/// Converts a received message, or `None` (logged at warn) when SQS left out its id or receipt handle.
pub(crate) fn from_sdk_message(message: aws_sdk_sqs::types::Message, queue: &str) -> Option<Message> {
    let aws_sdk_sqs::types::Message {
        message_id,
        receipt_handle,
        body,
        attributes,
        message_attributes,
        ..
    } = message;
    let (Some(id), Some(receipt_handle)) = (message_id, receipt_handle) else {
        tracing::warn!(%queue, "received a message without a message id or receipt handle; skipping it");
        return None;
    };
    let mut system = attributes.unwrap_or_default();
    let mut take = |name: MessageSystemAttributeName| system.remove(&name);
    let receive_count = match take(MessageSystemAttributeName::ApproximateReceiveCount) {
        Some(count) => count.parse().unwrap_or_else(|_| {
            tracing::warn!(%queue, message_id = %id, %count, "unreadable ApproximateReceiveCount; assuming 1");
            1
        }),
        None => 1,
    };
    Some(Message {
        receipt_handle: ReceiptHandle(receipt_handle),
        body: body.unwrap_or_default(),
        attributes: from_sdk_attributes(message_attributes),
        receive_count,
        sent_at: take(MessageSystemAttributeName::SentTimestamp).and_then(|ms| epoch_millis(&ms)),
        first_received_at: take(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)
            .and_then(|ms| epoch_millis(&ms)),
        group_id: take(MessageSystemAttributeName::MessageGroupId),
        deduplication_id: take(MessageSystemAttributeName::MessageDeduplicationId),
        trace_header: take(MessageSystemAttributeName::AwsTraceHeader),
        id,
    })
}

/// Converts a received message, or `None` (logged at warn) when SQS left out its id or receipt handle.
pub(crate) fn to_message(message: aws_sdk_sqs::types::Message) -> Option<Message> {
    from_sdk_message(message, "")
}

/// A visibility timeout in whole seconds for SQS, capped at 12 hours.
pub(crate) fn visibility_seconds(timeout: Duration) -> i32 {
    let seconds = timeout.min(MAX_VISIBILITY_TIMEOUT).as_secs();
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

fn epoch_millis(text: &str) -> Option<SystemTime> {
    let millis: u64 = text.trim().parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// The last path segment of a queue URL (or the last `:` segment of an ARN): the queue's name.
pub(crate) fn queue_name(url_or_arn: &str) -> &str {
    let trimmed = url_or_arn.trim_end_matches('/');
    let after_slash = trimmed.rsplit('/').next().unwrap_or(trimmed);
    after_slash.rsplit(':').next().unwrap_or(after_slash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_urls_and_arns() {
        assert_eq!(queue_name("http://127.0.0.1:4566/000000000000/jobs"), "jobs");
        assert_eq!(
            queue_name("https://sqs.us-east-1.amazonaws.com/123/jobs.fifo/"),
            "jobs.fifo"
        );
        assert_eq!(
            queue_name("arn:aws:sqs:us-east-1:123456789012:jobs-dlq"),
            "jobs-dlq"
        );
    }

    #[test]
    fn message_without_receipt_is_skipped_not_a_panic() {
        let message = aws_sdk_sqs::types::Message::builder()
            .message_id("m1")
            .body("{}")
            .build();
        assert!(from_sdk_message(message, "jobs").is_none());
    }

    #[test]
    fn system_attributes_are_read() {
        let message = aws_sdk_sqs::types::Message::builder()
            .message_id("m1")
            .receipt_handle("rh")
            .body("{}")
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "3")
            .attributes(MessageSystemAttributeName::SentTimestamp, "1700000000000")
            .attributes(MessageSystemAttributeName::MessageGroupId, "g")
            .attributes(MessageSystemAttributeName::AwsTraceHeader, "Root=1-abc")
            .message_attributes(
                "conveyor.type",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("email")
                    .build()
                    .unwrap(),
            )
            .build();
        let message = from_sdk_message(message, "jobs").unwrap();
        assert_eq!(message.receive_count, 3);
        assert_eq!(
            message.sent_at,
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert_eq!(message.group_id.as_deref(), Some("g"));
        assert_eq!(message.trace_header.as_deref(), Some("Root=1-abc"));
        assert_eq!(message.job_type(), Some("email"));
        assert_eq!(message.first_received_at, None);
    }
}
