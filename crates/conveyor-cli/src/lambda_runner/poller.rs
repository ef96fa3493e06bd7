//! Polling the queue the way an SQS event source mapping does, and settling a batch from the
//! function's `SqsBatchResponse`.
//!
//! - Receive with the batch size (at most 10 per `ReceiveMessage`), all system and message attributes,
//!   long polling; with a batching window, keep receiving until the batch is full or the window has
//!   passed since the first message arrived.
//! - Records have the event's shape: `eventSourceARN` from `GetQueueAttributes`, `awsRegion`,
//!   `md5OfBody` and `md5OfMessageAttributes` as SQS returned them.
//! - A batch whose event would be over Lambda's 6 MB invocation payload limit is cut: the records that
//!   fit are invoked ([`Poller::cut_to_payload`]), the rest are made visible again at once (visibility
//!   0), so nothing is lost and nothing waits a visibility timeout.
//! - After the invocation, delete every record not listed in `batchItemFailures`; the listed ones stay
//!   in flight and come back after their visibility timeout (or the backoff the function set), and SQS
//!   redrives them to the DLQ after `maxReceiveCount`, as on AWS. A response Lambda would treat as a
//!   complete failure (invalid JSON, an empty, missing or unknown `itemIdentifier`) leaves the batch.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_lambda_events::encodings::Base64Data;
use aws_lambda_events::sqs::{SqsEvent, SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use conveyor_core::limits::{MAX_RECEIVE_MESSAGES, MAX_WAIT_TIME};
use serde_json::Value;
use tokio::time::Instant;

/// Lambda's limit for a synchronous invocation's payload (the event), in bytes.
pub(crate) const MAX_INVOCATION_PAYLOAD: usize = 6 * 1024 * 1024;

/// Receives batches from one queue.
pub(crate) struct Poller {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    arn: String,
    region: String,
    batch_size: usize,
    window: Duration,
    poll_wait: Duration,
}

impl Poller {
    /// A poller for `queue_url` (whose ARN is `arn`) in `region`.
    pub(crate) fn new(
        client: aws_sdk_sqs::Client,
        queue_url: String,
        arn: String,
        region: String,
        batch_size: usize,
        window: Duration,
        poll_wait: Duration,
    ) -> Self {
        Self {
            client,
            queue_url,
            arn,
            region,
            batch_size: batch_size.max(1),
            window,
            poll_wait: poll_wait.min(MAX_WAIT_TIME),
        }
    }

    /// The next batch: empty when a long poll found nothing.
    pub(crate) async fn next_batch(&self) -> anyhow::Result<Vec<Message>> {
        let mut batch = self.receive(self.want(0), self.poll_wait).await?;
        if batch.is_empty() || self.window.is_zero() {
            return Ok(batch);
        }
        let window_end = Instant::now() + self.window;
        while batch.len() < self.batch_size {
            let remaining = window_end.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let wait = Duration::from_secs(remaining.as_secs()).min(MAX_WAIT_TIME);
            let more = self.receive(self.want(batch.len()), wait).await?;
            if more.is_empty() && wait.is_zero() {
                // A short poll found nothing and less than a second is left: wait out the window.
                tokio::time::sleep(remaining.min(Duration::from_millis(100))).await;
            }
            batch.extend(more);
        }
        Ok(batch)
    }

    fn want(&self, have: usize) -> usize {
        (self.batch_size - have.min(self.batch_size)).clamp(1, MAX_RECEIVE_MESSAGES)
    }

    async fn receive(&self, max: usize, wait: Duration) -> anyhow::Result<Vec<Message>> {
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(i32::try_from(max).unwrap_or(10))
            .wait_time_seconds(i32::try_from(wait.as_secs()).unwrap_or(20))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|error| {
                anyhow::anyhow!(
                    "ReceiveMessage on {} failed: {}",
                    self.queue_url,
                    aws_sdk_sqs::error::DisplayErrorContext(error)
                )
            })?;
        Ok(output.messages.unwrap_or_default())
    }

    /// The event an event source mapping would send for `messages`.
    pub(crate) fn event(&self, messages: &[Message]) -> SqsEvent {
        let mut event = SqsEvent::default();
        event.records = messages.iter().map(|message| self.record(message)).collect();
        event
    }

    /// Splits `messages` into the longest prefix whose event fits in `limit` bytes (at least one
    /// message, as one SQS message always fits) and the rest. A prefix keeps FIFO order.
    pub(crate) fn cut_to_payload(
        &self,
        mut messages: Vec<Message>,
        limit: usize,
    ) -> (Vec<Message>, Vec<Message>) {
        // `{"Records":[` + records joined by `,` + `]}`.
        let mut size = r#"{"Records":[]}"#.len();
        let mut fits = 0;
        for (index, message) in messages.iter().enumerate() {
            let record = serde_json::to_vec(&self.record(message)).map_or(0, |bytes| bytes.len());
            let separator = usize::from(index > 0);
            if index > 0 && size + separator + record > limit {
                break;
            }
            size += separator + record;
            fits = index + 1;
        }
        let rest = messages.split_off(fits);
        (messages, rest)
    }

    fn record(&self, message: &Message) -> SqsMessage {
        let attributes: HashMap<String, String> = message
            .attributes
            .as_ref()
            .map(|attributes| {
                attributes
                    .iter()
                    .map(|(name, value)| (system_attribute_name(name), value.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let message_attributes: HashMap<String, SqsMessageAttribute> = message
            .message_attributes
            .as_ref()
            .map(|attributes| {
                attributes
                    .iter()
                    .map(|(name, value)| (name.clone(), message_attribute(value)))
                    .collect()
            })
            .unwrap_or_default();
        let mut record = SqsMessage::default();
        record.message_id = message.message_id.clone();
        record.receipt_handle = message.receipt_handle.clone();
        record.body = message.body.clone();
        record.md5_of_body = message.md5_of_body.clone();
        record.md5_of_message_attributes = message.md5_of_message_attributes.clone();
        record.attributes = attributes;
        record.message_attributes = message_attributes;
        record.event_source_arn = Some(self.arn.clone());
        record.event_source = Some("aws:sqs".to_owned());
        record.aws_region = Some(self.region.clone());
        record
    }
}

fn system_attribute_name(name: &MessageSystemAttributeName) -> String {
    name.as_str().to_owned()
}

fn message_attribute(value: &MessageAttributeValue) -> SqsMessageAttribute {
    let mut attribute = SqsMessageAttribute::default();
    attribute.string_value = value.string_value.clone();
    attribute.binary_value = value.binary_value.as_ref().map(|blob| base64_data(blob.as_ref()));
    attribute.string_list_values = value.string_list_values.clone().unwrap_or_default();
    attribute.binary_list_values = value
        .binary_list_values
        .as_ref()
        .map(|blobs| blobs.iter().map(|blob| base64_data(blob.as_ref())).collect())
        .unwrap_or_default();
    attribute.data_type = Some(value.data_type.clone());
    attribute
}

/// `Base64Data` is `#[non_exhaustive]` in aws_lambda_events 1.x: built through `Default` and `DerefMut`.
fn base64_data(bytes: &[u8]) -> Base64Data {
    let mut data = Base64Data::default();
    data.extend_from_slice(bytes);
    data
}

/// How the batch ends, read from the function's response as Lambda reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Delete every record except these message ids.
    Partial(HashSet<String>),
    /// Lambda would treat the response as a complete failure: leave the whole batch.
    WholeBatchFailed(String),
}

/// Reads an `SqsBatchResponse` for a batch of `ids`.
///
/// Lambda's documented rules: an empty or null `batchItemFailures`, or an empty or null response, is a
/// complete success; invalid JSON, an empty or null `itemIdentifier`, a bad key name, or an id that is
/// not in the batch is a complete failure.
pub(crate) fn verdict(body: &[u8], ids: &HashSet<String>) -> Verdict {
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        return Verdict::Partial(HashSet::new());
    }
    let value: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(error) => return Verdict::WholeBatchFailed(format!("the response is not JSON: {error}")),
    };
    let failures = match &value {
        Value::Null => return Verdict::Partial(HashSet::new()),
        Value::Object(object) => object.get("batchItemFailures"),
        _ => {
            return Verdict::WholeBatchFailed("the response is not an SqsBatchResponse object".to_owned());
        }
    };
    let failures = match failures {
        None | Some(Value::Null) => return Verdict::Partial(HashSet::new()),
        Some(Value::Array(failures)) => failures,
        Some(_) => return Verdict::WholeBatchFailed("batchItemFailures is not an array".to_owned()),
    };
    let mut listed = HashSet::new();
    for failure in failures {
        let Some(id) = failure.get("itemIdentifier").and_then(Value::as_str) else {
            return Verdict::WholeBatchFailed(format!("a failure has no itemIdentifier: {failure}"));
        };
        if id.is_empty() || !ids.contains(id) {
            return Verdict::WholeBatchFailed(format!(
                "itemIdentifier {id:?} is not a message id of this batch"
            ));
        }
        listed.insert(id.to_owned());
    }
    Verdict::Partial(listed)
}

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::primitives::Blob;

    use super::*;

    fn ids(list: &[&str]) -> HashSet<String> {
        list.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn lambdas_rules_for_batch_responses() {
        let batch = ids(&["a", "b"]);
        let partial = |list: &[&str]| Verdict::Partial(ids(list));
        assert_eq!(verdict(b"", &batch), partial(&[]));
        assert_eq!(verdict(b"null", &batch), partial(&[]));
        assert_eq!(verdict(b"{}", &batch), partial(&[]));
        assert_eq!(verdict(br#"{"batchItemFailures":null}"#, &batch), partial(&[]));
        assert_eq!(verdict(br#"{"batchItemFailures":[]}"#, &batch), partial(&[]));
        assert_eq!(
            verdict(br#"{"batchItemFailures":[{"itemIdentifier":"b"}]}"#, &batch),
            partial(&["b"])
        );
        for whole in [
            &b"{not json"[..],
            br#"{"batchItemFailures":[{"itemIdentifier":""}]}"#,
            br#"{"batchItemFailures":[{"itemIdentifier":null}]}"#,
            br#"{"batchItemFailures":[{"itemId":"a"}]}"#,
            br#"{"batchItemFailures":[{"itemIdentifier":"zzz"}]}"#,
            br#"{"batchItemFailures":"a"}"#,
            br#""ok""#,
        ] {
            assert!(
                matches!(verdict(whole, &batch), Verdict::WholeBatchFailed(_)),
                "{}",
                String::from_utf8_lossy(whole)
            );
        }
    }

    fn test_poller() -> Poller {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .build();
        Poller::new(
            aws_sdk_sqs::Client::from_conf(config),
            "http://127.0.0.1:4566/000000000000/jobs".to_owned(),
            "arn:aws:sqs:us-east-1:000000000000:jobs".to_owned(),
            "us-east-1".to_owned(),
            10,
            Duration::ZERO,
            Duration::from_secs(1),
        )
    }

    #[test]
    fn a_batch_is_cut_to_the_payload_limit_keeping_its_order() {
        let poller = test_poller();
        // Bodies with characters JSON escapes: the cut measures the event as sent, not the bodies.
        let body = "\"x\n".repeat(200_000);
        let messages: Vec<Message> = (0..10)
            .map(|n| {
                Message::builder()
                    .message_id(format!("m{n}"))
                    .receipt_handle(format!("rh{n}"))
                    .body(&body)
                    .build()
            })
            .collect();
        let (fit, rest) = poller.cut_to_payload(messages.clone(), MAX_INVOCATION_PAYLOAD);
        let size = serde_json::to_vec(&poller.event(&fit)).unwrap().len();
        assert!(size <= MAX_INVOCATION_PAYLOAD, "{size}");
        let one_more = serde_json::to_vec(&poller.event(&messages[..=fit.len()]))
            .unwrap()
            .len();
        assert!(
            one_more > MAX_INVOCATION_PAYLOAD,
            "the cut keeps every record that fits"
        );
        assert_eq!(fit.len() + rest.len(), 10);
        let order: Vec<_> = fit
            .iter()
            .chain(&rest)
            .map(|m| m.message_id.clone().unwrap())
            .collect();
        assert_eq!(order, (0..10).map(|n| format!("m{n}")).collect::<Vec<_>>());
        let (all, none) = poller.cut_to_payload(messages[..2].to_vec(), MAX_INVOCATION_PAYLOAD);
        assert_eq!((all.len(), none.len()), (2, 0));
        // A single record over the limit is still invoked (SQS's 1 MiB keeps this from happening).
        let (one, rest) = poller.cut_to_payload(messages[..2].to_vec(), 10);
        assert_eq!((one.len(), rest.len()), (1, 1));
    }

    #[test]
    fn records_have_the_event_source_mapping_shape() {
        let poller = test_poller();
        let message = Message::builder()
            .message_id("m1")
            .receipt_handle("rh1")
            .body("{}")
            .md5_of_body("99914b932bd37a50b983c5e7c90ae93b")
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "2")
            .attributes(MessageSystemAttributeName::MessageGroupId, "g")
            .message_attributes(
                "conveyor.type",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("welcome_email")
                    .build()
                    .unwrap(),
            )
            .message_attributes(
                "blob",
                MessageAttributeValue::builder()
                    .data_type("Binary")
                    .binary_value(Blob::new(vec![1, 2]))
                    .build()
                    .unwrap(),
            )
            .build();
        let event = serde_json::to_value(poller.event(&[message])).unwrap();
        let record = &event["Records"][0];
        assert_eq!(record["messageId"], "m1");
        assert_eq!(record["receiptHandle"], "rh1");
        assert_eq!(record["md5OfBody"], "99914b932bd37a50b983c5e7c90ae93b");
        assert_eq!(record["eventSource"], "aws:sqs");
        assert_eq!(
            record["eventSourceARN"],
            "arn:aws:sqs:us-east-1:000000000000:jobs"
        );
        assert_eq!(record["awsRegion"], "us-east-1");
        assert_eq!(record["attributes"]["ApproximateReceiveCount"], "2");
        assert_eq!(record["attributes"]["MessageGroupId"], "g");
        assert_eq!(
            record["messageAttributes"]["conveyor.type"]["stringValue"],
            "welcome_email"
        );
        assert_eq!(record["messageAttributes"]["conveyor.type"]["dataType"], "String");
        assert_eq!(record["messageAttributes"]["blob"]["binaryValue"], "AQI=");
    }
}
