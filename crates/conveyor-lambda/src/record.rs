//! One `SqsEvent` record → the [`Message`] the pipeline takes, field for field as the worker builds it
//! from `ReceiveMessage`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::encodings::Base64Data;
use aws_lambda_events::sqs::{SqsMessage, SqsMessageAttribute};
use conveyor_core::message::{AttributeValue, Message, ReceiptHandle};

/// System attribute names, as SQS spells them in the record's `attributes`.
mod names {
    pub(super) const RECEIVE_COUNT: &str = "ApproximateReceiveCount";
    pub(super) const SENT_TIMESTAMP: &str = "SentTimestamp";
    pub(super) const FIRST_RECEIVE_TIMESTAMP: &str = "ApproximateFirstReceiveTimestamp";
    pub(super) const GROUP_ID: &str = "MessageGroupId";
    pub(super) const DEDUPLICATION_ID: &str = "MessageDeduplicationId";
    pub(super) const TRACE_HEADER: &str = "AWSTraceHeader";
}

/// A record the adapter cannot process.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// No `messageId`: it cannot even be reported as a failure.
    #[error(
        "record has no messageId; it cannot be processed or reported, so the invocation fails and the batch comes back"
    )]
    MissingMessageId,
    /// No `receiptHandle`: its visibility cannot be changed, nor can it be dead-lettered safely.
    #[error("record {0} has no receiptHandle; reporting it as a failure")]
    MissingReceiptHandle(String),
    /// No `eventSourceARN`: the queue it came from is unknown.
    #[error("record {0} has no eventSourceARN; reporting it as a failure")]
    MissingSource(String),
}

/// Converts a record. The body defaults to empty (it then fails to decode and is dead-lettered); an
/// unreadable receive count counts as a first delivery (logged).
pub fn to_message(record: &SqsMessage) -> Result<Message, RecordError> {
    into_message(record.clone())
}

/// [`to_message`] taking the record, so its body and attributes move instead of being copied.
pub(crate) fn into_message(record: SqsMessage) -> Result<Message, RecordError> {
    let Some(id) = record.message_id.filter(|id| !id.is_empty()) else {
        return Err(RecordError::MissingMessageId);
    };
    let Some(receipt) = record.receipt_handle.filter(|handle| !handle.is_empty()) else {
        return Err(RecordError::MissingReceiptHandle(id));
    };
    let system = &record.attributes;
    let text = |name: &str| system.get(name).filter(|value| !value.is_empty()).cloned();
    let receive_count = match system.get(names::RECEIVE_COUNT).map(|count| count.parse::<u32>()) {
        Some(Ok(count)) if count > 0 => count,
        Some(_) => {
            tracing::warn!(message_id = %id, "unreadable ApproximateReceiveCount; counting a first delivery");
            1
        }
        None => 1,
    };
    Ok(Message {
        receipt_handle: ReceiptHandle(receipt),
        body: record.body.unwrap_or_default(),
        attributes: record
            .message_attributes
            .into_iter()
            .map(|(name, value)| (name, attribute(value)))
            .collect(),
        receive_count,
        sent_at: system.get(names::SENT_TIMESTAMP).and_then(|ms| epoch_millis(ms)),
        first_received_at: system
            .get(names::FIRST_RECEIVE_TIMESTAMP)
            .and_then(|ms| epoch_millis(ms)),
        group_id: text(names::GROUP_ID),
        deduplication_id: text(names::DEDUPLICATION_ID),
        trace_header: text(names::TRACE_HEADER),
        id,
    })
}

/// The record an event source mapping delivers for `message` from the queue `event_source_arn`: the
/// inverse of [`to_message`], for local runners, simulations and tests.
pub fn to_record(message: &Message, event_source_arn: &str) -> SqsMessage {
    let millis = |time: SystemTime| {
        time.duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis())
            .to_string()
    };
    let mut attributes =
        HashMap::from([(names::RECEIVE_COUNT.to_owned(), message.receive_count.to_string())]);
    let optional = [
        (names::SENT_TIMESTAMP, message.sent_at.map(millis)),
        (
            names::FIRST_RECEIVE_TIMESTAMP,
            message.first_received_at.map(millis),
        ),
        (names::GROUP_ID, message.group_id.clone()),
        (names::DEDUPLICATION_ID, message.deduplication_id.clone()),
        (names::TRACE_HEADER, message.trace_header.clone()),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            attributes.insert(name.to_owned(), value);
        }
    }
    let message_attributes = message
        .attributes
        .iter()
        .map(|(name, value)| {
            let mut attribute = SqsMessageAttribute::default();
            attribute.string_value = value.string_value.clone();
            attribute.binary_value = value.binary_value.clone().map(base64_data);
            attribute.data_type = Some(value.data_type.clone());
            (name.clone(), attribute)
        })
        .collect();
    let mut record = SqsMessage::default();
    record.message_id = Some(message.id.clone());
    record.receipt_handle = Some(message.receipt_handle.as_str().to_owned());
    record.body = Some(message.body.clone());
    record.attributes = attributes;
    record.message_attributes = message_attributes;
    record.event_source_arn = Some(event_source_arn.to_owned());
    record.event_source = Some(crate::SQS_EVENT_SOURCE.to_owned());
    record.aws_region = event_source_arn.split(':').nth(3).map(str::to_owned);
    record
}

/// `Base64Data` is `#[non_exhaustive]` in aws_lambda_events 1.x: built through its `Default` and `DerefMut`.
fn base64_data(bytes: Vec<u8>) -> Base64Data {
    let mut data = Base64Data::default();
    *data = bytes;
    data
}

/// Lambda writes `dataType` on every attribute; when it is missing, the value's kind says it.
fn attribute(value: SqsMessageAttribute) -> AttributeValue {
    let binary_value = value.binary_value.map(|data| data.0);
    let data_type = value.data_type.unwrap_or_else(|| {
        if binary_value.is_some() && value.string_value.is_none() {
            "Binary".to_owned()
        } else {
            "String".to_owned()
        }
    });
    AttributeValue {
        data_type,
        string_value: value.string_value,
        binary_value,
    }
}

fn epoch_millis(text: &str) -> Option<SystemTime> {
    let millis = text.parse::<u64>().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SqsMessage {
        let attributes = HashMap::from([
            ("ApproximateReceiveCount".to_owned(), "3".to_owned()),
            ("SentTimestamp".to_owned(), "1573251510774".to_owned()),
            (
                "ApproximateFirstReceiveTimestamp".to_owned(),
                "1573251510800".to_owned(),
            ),
            ("MessageGroupId".to_owned(), "g1".to_owned()),
            ("MessageDeduplicationId".to_owned(), "d1".to_owned()),
            (
                "AWSTraceHeader".to_owned(),
                "Root=1-5759e988-bd862e3fe1be46a994272793".to_owned(),
            ),
        ]);
        let message_attributes = HashMap::from([
            ("conveyor.type".to_owned(), {
                let mut attribute = SqsMessageAttribute::default();
                attribute.string_value = Some("welcome_email".to_owned());
                attribute.data_type = Some("String".to_owned());
                attribute
            }),
            ("blob".to_owned(), {
                let mut attribute = SqsMessageAttribute::default();
                attribute.binary_value = Some(base64_data(vec![1, 2, 3]));
                attribute
            }),
        ]);
        let mut record = SqsMessage::default();
        record.message_id = Some("m1".to_owned());
        record.receipt_handle = Some("rh1".to_owned());
        record.body = Some("{}".to_owned());
        record.attributes = attributes;
        record.message_attributes = message_attributes;
        record.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:jobs.fifo".to_owned());
        record
    }

    #[test]
    fn to_record_is_the_inverse_of_to_message() {
        let message = to_message(&record()).unwrap();
        let arn = "arn:aws:sqs:eu-west-1:123456789012:jobs.fifo";
        let again = to_record(&message, arn);
        let back = to_message(&again).unwrap();
        assert_eq!(format!("{back:?}"), format!("{message:?}"));
        assert_eq!(again.aws_region.as_deref(), Some("eu-west-1"));
        assert_eq!(again.event_source_arn.as_deref(), Some(arn));
    }

    #[test]
    fn every_field_the_pipeline_reads_is_converted() {
        let message = to_message(&record()).unwrap();
        assert_eq!(message.id, "m1");
        assert_eq!(message.receipt_handle.as_str(), "rh1");
        assert_eq!(message.body, "{}");
        assert_eq!(message.receive_count, 3);
        assert_eq!(
            message.sent_at,
            Some(UNIX_EPOCH + Duration::from_millis(1_573_251_510_774))
        );
        assert_eq!(
            message.first_received_at,
            Some(UNIX_EPOCH + Duration::from_millis(1_573_251_510_800))
        );
        assert_eq!(message.group_id.as_deref(), Some("g1"));
        assert_eq!(message.deduplication_id.as_deref(), Some("d1"));
        assert!(message.trace_header.as_deref().unwrap().starts_with("Root="));
        assert_eq!(message.job_type(), Some("welcome_email"));
        let blob = &message.attributes["blob"];
        assert_eq!(blob.data_type, "Binary");
        assert_eq!(blob.binary_value.as_deref(), Some(&[1u8, 2, 3][..]));
    }

    #[test]
    fn missing_ids_and_handles_are_errors() {
        let mut no_id = record();
        no_id.message_id = None;
        assert_eq!(to_message(&no_id).unwrap_err(), RecordError::MissingMessageId);
        let mut no_handle = record();
        no_handle.receipt_handle = Some(String::new());
        assert_eq!(
            to_message(&no_handle).unwrap_err(),
            RecordError::MissingReceiptHandle("m1".to_owned())
        );
    }

    #[test]
    fn an_unreadable_receive_count_counts_as_first() {
        let mut odd = record();
        odd.attributes
            .insert("ApproximateReceiveCount".to_owned(), "many".to_owned());
        assert_eq!(to_message(&odd).unwrap().receive_count, 1);
    }
}
