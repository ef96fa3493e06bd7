//! Receiving messages for inspection (held invisible for a while) and releasing them again.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName};
use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_RECEIVE_MESSAGES, MAX_WAIT_TIME};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::EntryFailure,
    runtime::Failure,
};

use super::error::AdminError;
use crate::batch::{entry_failures, entry_id};
use crate::convert::{to_message, visibility_seconds};
use crate::errors::classify;
use crate::send::invalid;

/// A message received for inspection, with what Conveyor and SQS recorded about its failure.
#[derive(Debug, Clone)]
pub struct Received {
    /// The message (body, attributes, receive count, sent time, receipt handle).
    pub message: Message,
    /// SQS's `DeadLetterQueueSourceArn`: set when SQS's redrive moved the message here after
    /// `maxReceiveCount` receives (not when a worker sent it here with a failure record).
    pub dead_letter_source_arn: Option<String>,
}

impl Received {
    /// The failure record Conveyor attached when it dead-lettered the message (`conveyor.failure`), if
    /// the attribute is there and holds the expected JSON.
    pub fn failure(&self) -> Option<Failure> {
        let json = self.message.string_attribute(FAILURE_ATTRIBUTE)?;
        serde_json::from_str(json).ok()
    }

    /// The raw `conveyor.failure` attribute, for records that do not parse as a [`Failure`].
    pub fn failure_attribute(&self) -> Option<&str> {
        self.message.string_attribute(FAILURE_ATTRIBUTE)
    }

    /// When the message failed: the failure record's time, else (SQS's redrive moved it) when it was sent.
    pub fn failed_at(&self) -> Option<std::time::SystemTime> {
        if let Some(failure) = self.failure() {
            return Some(std::time::UNIX_EPOCH + Duration::from_millis(failure.failed_at_ms));
        }
        self.message.sent_at
    }

    /// A one-line failure reason: the recorded error, or what SQS's redrive implies, or nothing known.
    pub fn reason(&self) -> String {
        if let Some(failure) = self.failure() {
            return failure.error;
        }
        if let Some(raw) = self.failure_attribute() {
            return raw.to_owned();
        }
        if self.dead_letter_source_arn.is_some() {
            return "moved by SQS redrive after maxReceiveCount receives (no failure record)".to_owned();
        }
        "unknown (no conveyor.failure attribute)".to_owned()
    }
}

/// One `ReceiveMessage` of up to `max` messages (1..=10) that stay invisible for `hold`, waiting up to
/// `wait` for the first. Every system attribute and message attribute is requested.
pub async fn receive_held(
    client: &Client,
    queue_url: &str,
    max: usize,
    hold: Duration,
    wait: Duration,
) -> Result<Vec<Received>, AdminError> {
    let max = max.clamp(1, MAX_RECEIVE_MESSAGES);
    let output = client
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(i32::try_from(max).unwrap_or(10))
        .visibility_timeout(visibility_seconds(hold).max(1))
        .wait_time_seconds(i32::try_from(wait.min(MAX_WAIT_TIME).as_secs()).unwrap_or(20))
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .map_err(|error| classify(&error, queue_url))?;
    let received = output
        .messages
        .unwrap_or_default()
        .into_iter()
        .filter_map(|sdk| {
            let dead_letter_source_arn = sdk
                .attributes()
                .and_then(|attributes| attributes.get(&MessageSystemAttributeName::DeadLetterQueueSourceArn))
                .cloned();
            let message = to_message(sdk)?;
            Some(Received {
                message,
                dead_letter_source_arn,
            })
        })
        .collect();
    Ok(received)
}

/// Makes the receipts visible again at once (`ChangeMessageVisibilityBatch` with timeout 0, 10 per call);
/// returns the entries that failed, by index. A receipt whose hold already ran out fails harmlessly: the
/// message is visible anyway.
pub async fn release(
    client: &Client,
    queue_url: &str,
    receipts: &[ReceiptHandle],
) -> Result<Vec<EntryFailure>, AdminError> {
    let mut failures = Vec::new();
    for (chunk_index, chunk) in receipts.chunks(MAX_BATCH_ENTRIES).enumerate() {
        let offset = chunk_index * MAX_BATCH_ENTRIES;
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(position, receipt)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(entry_id(offset + position))
                    .receipt_handle(receipt.as_str())
                    .visibility_timeout(0)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let output = client
            .change_message_visibility_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|error| classify(&error, queue_url))?;
        failures.extend(entry_failures(output.failed(), offset..offset + chunk.len()));
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use conveyor_core::message::AttributeValue;

    use super::*;

    fn received(failure: Option<&str>, source: Option<&str>) -> Received {
        let mut message = Message::new("m1", "{}");
        if let Some(json) = failure {
            message
                .attributes
                .insert(FAILURE_ATTRIBUTE.to_owned(), AttributeValue::string(json));
        }
        Received {
            message,
            dead_letter_source_arn: source.map(str::to_owned),
        }
    }

    #[test]
    fn the_reason_comes_from_the_record_then_from_sqs_redrive() {
        let record = Failure::now("no such user", 3, "jobs", "email").to_json();
        let with_record = received(Some(&record), None);
        assert_eq!(with_record.reason(), "no such user");
        assert_eq!(with_record.failure().map(|f| f.receive_count), Some(3));

        let garbled = received(Some("not json"), None);
        assert!(garbled.failure().is_none());
        assert_eq!(garbled.reason(), "not json");

        let redriven = received(None, Some("arn:aws:sqs:us-east-1:1:jobs"));
        assert!(redriven.reason().contains("SQS redrive"));
        assert!(received(None, None).reason().contains("unknown"));
    }
}
