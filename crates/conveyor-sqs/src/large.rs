//! Large payloads on the producer side (claim check): a job over the threshold is stored in the payload
//! store and sent as a pointer in the SQS Extended Client Library's format (`conveyor-core/src/payload.rs`).
//!
//! # Design note: ordering
//!
//! The object is written before the message is sent, so a consumer never receives a pointer to nothing.
//! A send that fails after the write leaves an object no message points to; the bucket's lifecycle
//! rule removes it (`infra/modules/payload-bucket`).

use std::sync::Arc;

use conveyor_core::limits::MAX_PRODUCER_ATTRIBUTES;
use conveyor_core::message::AttributeValue;
use conveyor_core::port::OutgoingMessage;
use conveyor_core::port::{LEGACY_SIZE_ATTRIBUTE, PayloadPointer, PayloadStore, size_attribute};

use crate::job::{ProduceError, check_size};

/// Where a producer stores large payloads, and from which size.
#[derive(Clone)]
pub(crate) struct LargePayloads {
    pub(crate) store: Arc<dyn PayloadStore>,
    pub(crate) bucket: String,
    /// Offload when body plus attributes exceed this many bytes; `None`: the queue's
    /// `MaximumMessageSize`.
    pub(crate) threshold: Option<usize>,
    /// Mark pointers with the legacy `SQSLargePayloadSize` (what the Java library writes by default,
    /// and all that old readers know) instead of `ExtendedPayloadSize`.
    pub(crate) legacy_attribute: bool,
    /// Put objects under this prefix (the libraries' `s3KeyPrefix`): `<prefix><uuid>`.
    pub(crate) key_prefix: String,
}

impl LargePayloads {
    /// Offloads into `bucket` through `store`, with the defaults: `ExtendedPayloadSize`, no prefix.
    pub(crate) fn new(store: Arc<dyn PayloadStore>, bucket: String) -> Self {
        Self {
            store,
            bucket,
            threshold: None,
            legacy_attribute: false,
            key_prefix: String::new(),
        }
    }
}

/// `message` as it goes to SQS: unchanged when it fits under `threshold`, else its body stored and a
/// pointer in its place. Without a payload store an oversized message is refused with what to do.
pub(crate) async fn offload(
    large: Option<&LargePayloads>,
    job_type: &str,
    mut message: OutgoingMessage,
    threshold: usize,
    queue_limit: usize,
) -> Result<OutgoingMessage, ProduceError> {
    let Some(large) = large else {
        check_size(job_type, &message, queue_limit)?;
        return Ok(message);
    };
    if message.size() <= threshold {
        return Ok(message);
    }
    // The marker takes one attribute slot; one more stays free for the failure record on a DLQ. The
    // trace context gives way to it.
    conveyor_core::trace::make_room(&mut message.attributes, 1, MAX_PRODUCER_ATTRIBUTES);
    if message.attributes.len() + 1 > MAX_PRODUCER_ATTRIBUTES {
        return Err(ProduceError::TooManyAttributes {
            job_type: job_type.to_owned(),
            count: message.attributes.len() + 1,
            limit: MAX_PRODUCER_ATTRIBUTES,
        });
    }
    let key = format!("{}{}", large.key_prefix, uuid::Uuid::new_v4());
    let size = message.body.len();
    let body = std::mem::take(&mut message.body).into_bytes();
    large
        .store
        .put(&large.bucket, &key, body)
        .await
        .map_err(|error| ProduceError::Payload {
            job_type: job_type.to_owned(),
            error,
        })?;
    let pointer = PayloadPointer::new(&large.bucket, key);
    tracing::debug!(job_type, %pointer, size, "large payload stored; sending its pointer");
    message.body = pointer.to_body();
    let (name, value) = if large.legacy_attribute {
        (LEGACY_SIZE_ATTRIBUTE.to_owned(), AttributeValue::number(size))
    } else {
        size_attribute(size)
    };
    message.attributes.insert(name, value);
    check_size(job_type, &message, queue_limit)?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use conveyor_core::limits::MAX_MESSAGE_BYTES;
    use conveyor_core::port::SIZE_ATTRIBUTE;
    use conveyor_testing::MemoryPayloadStore;

    use super::*;
    use crate::NewJob;

    fn large(store: &Arc<MemoryPayloadStore>) -> LargePayloads {
        LargePayloads::new(store.clone(), "payloads".to_owned())
    }

    #[tokio::test]
    async fn the_legacy_attribute_and_a_key_prefix_are_options() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        let options = LargePayloads {
            legacy_attribute: true,
            key_prefix: "jobs/".to_owned(),
            ..large(&store)
        };
        let sent = offload(
            Some(&options),
            "report",
            job(2 * 1024 * 1024),
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap();
        let pointer = PayloadPointer::from_body(&sent.body).unwrap();
        assert!(
            pointer.key.starts_with("jobs/") && pointer.key.len() == 41,
            "{}",
            pointer.key
        );
        assert!(sent.attributes.contains_key(LEGACY_SIZE_ATTRIBUTE));
        assert!(!sent.attributes.contains_key(SIZE_ATTRIBUTE));
        assert!(store.object("payloads", &pointer.key).is_some());
    }

    fn job(bytes: usize) -> OutgoingMessage {
        NewJob::new("report", "x".repeat(bytes)).encode("jobs").unwrap()
    }

    #[tokio::test]
    async fn over_the_threshold_the_body_is_stored_and_the_pointer_sent() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        let message = job(2 * 1024 * 1024);
        let original = message.body.clone();
        let sent = offload(
            Some(&large(&store)),
            "report",
            message,
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap();
        let pointer = PayloadPointer::from_body(&sent.body).unwrap();
        assert_eq!(pointer.bucket, "payloads");
        assert_eq!(
            pointer.key.len(),
            36,
            "a UUID, as the libraries use: {}",
            pointer.key
        );
        assert_eq!(
            store.object("payloads", &pointer.key).unwrap(),
            original.as_bytes()
        );
        assert_eq!(
            sent.attributes[SIZE_ATTRIBUTE].string_value.as_deref(),
            Some(original.len().to_string().as_str())
        );
        assert_eq!(
            sent.attributes["conveyor.type"].string_value.as_deref(),
            Some("report")
        );
    }

    #[tokio::test]
    async fn a_large_jobs_pointer_takes_the_trace_contexts_slot_when_there_is_no_other() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        let mut message = job(2 * 1024 * 1024);
        // conveyor.type, conveyor.v and six of the user's own: with a traceparent, the producer's nine.
        for index in 0..6 {
            message
                .attributes
                .insert(format!("own.{index}"), AttributeValue::string("x"));
        }
        message.attributes.insert(
            conveyor_core::trace::TRACEPARENT_ATTRIBUTE.to_owned(),
            AttributeValue::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        assert_eq!(message.attributes.len(), MAX_PRODUCER_ATTRIBUTES);
        let sent = offload(
            Some(&large(&store)),
            "report",
            message,
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .expect("tracing never fails a send");
        assert!(PayloadPointer::from_body(&sent.body).is_ok());
        assert!(sent.attributes.contains_key(SIZE_ATTRIBUTE));
        assert!(
            !sent
                .attributes
                .contains_key(conveyor_core::trace::TRACEPARENT_ATTRIBUTE)
        );
        assert_eq!(sent.attributes.len(), MAX_PRODUCER_ATTRIBUTES);
    }

    #[tokio::test]
    async fn at_or_under_the_threshold_nothing_is_stored() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        let message = job(1000);
        let threshold = message.size();
        let sent = offload(
            Some(&large(&store)),
            "report",
            message.clone(),
            threshold,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap();
        assert_eq!(sent, message);
        assert!(store.is_empty("payloads"));
        // One byte lower and it is offloaded: attributes count toward the size, as in the libraries.
        let sent = offload(
            Some(&large(&store)),
            "report",
            message,
            threshold - 1,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap();
        assert!(PayloadPointer::from_body(&sent.body).is_ok());
    }

    #[tokio::test]
    async fn without_a_store_an_oversized_job_says_how_to_send_it() {
        let error = offload(
            None,
            "report",
            job(MAX_MESSAGE_BYTES),
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("with_large_payloads") && text.contains("CONVEYOR_PAYLOAD_BUCKET"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_store_outage_is_an_error_and_sends_nothing() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        store.set_unavailable(true);
        let error = offload(
            Some(&large(&store)),
            "report",
            job(2 * 1024 * 1024),
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap_err();
        assert!(matches!(error, ProduceError::Payload { .. }), "{error:?}");
    }

    #[tokio::test]
    async fn the_marker_needs_an_attribute_slot() {
        let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
        let mut job = NewJob::new("report", "x".repeat(2 * 1024 * 1024)).key("k");
        for name in ["a", "b", "c", "d", "e", "f"] {
            job = job.attribute(name, conveyor_core::message::AttributeValue::string("v"));
        }
        let message = job.encode("jobs").unwrap();
        assert_eq!(message.attributes.len(), 9);
        let error = offload(
            Some(&large(&store)),
            "report",
            message,
            MAX_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, ProduceError::TooManyAttributes { count: 10, .. }),
            "{error:?}"
        );
        assert!(store.is_empty("payloads"));
    }
}
