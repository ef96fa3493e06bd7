//! Large payloads (claim check): a job body too large for SQS is stored in an object store (S3) and the
//! message carries a pointer to it, in the format of AWS's SQS Extended Client Library, so Conveyor and
//! producers or consumers built on that library (Java, Python) read each other's messages.
//!
//! # The format, as the libraries write and read it
//!
//! Read from the libraries' sources (`awslabs/amazon-sqs-python-extended-client-lib` at 9175bbd,
//! `awslabs/amazon-sqs-java-extended-client-lib` at 3f763f6, `awslabs/payload-offloading-java-common-lib-for-aws`
//! at d9c73b6):
//!
//! - **Body**: the JSON array `["software.amazon.payloadoffloading.PayloadS3Pointer",
//!   {"s3BucketName": "<bucket>", "s3Key": "<key>"}]` (Python `client.py` lines 232–257: `dumps([MESSAGE_POINTER_CLASS,
//!   {...}])`; Java `PayloadS3Pointer.toJson` through Jackson's `enableDefaultTyping(NON_FINAL)`,
//!   `JsonDataConverter.java` line 22, which writes the same `[class, object]` pair). The legacy class name
//!   `com.amazon.sqs.javamessaging.MessageS3Pointer` is accepted on read (Java `AmazonSQSExtendedClient.java`
//!   line 342 rewrites it; Python ignores the class and reads element 1, `client.py` lines 332–340).
//! - **Attribute**: `ExtendedPayloadSize` (`Number`, the payload's size in UTF-8 bytes), or the legacy
//!   `SQSLargePayloadSize`, which the Java library still writes by default (`ExtendedClientConfiguration.java`
//!   line 36, `useLegacyReservedAttributeName = true`). Both libraries decide that a received message is a
//!   pointer by the presence of either attribute, not by the body (Python `client.py` line 390, Java
//!   `AmazonSQSExtendedClient.java` line 340), and remove it before handing the message over; so does
//!   [`resolve`].
//! - **When to offload**: body bytes + attribute bytes (name + data type + value of each, Python
//!   `_get_message_attributes_size`, lines 133–161; Java `getMsgAttributesSize`) over a threshold that
//!   defaults to 262,144 bytes in both libraries (SQS's limit before August 2025), or always
//!   (`always_through_s3`). The object key is a random UUID (Python line 131, Java `storeOriginalPayload`).
//!   A message that is offloaded may carry at most 9 attributes besides the reserved one.
//! - **Receipt handles**: on receive, both libraries rewrite the receipt handle as
//!   `-..s3BucketName..-<bucket>-..s3BucketName..--..s3Key..-<key>-..s3Key..-<handle>` so that their
//!   `delete_message` knows which object to delete (Python lines 276–299 and 427–447). This is the
//!   library's own client state: it never travels in a message. Conveyor receives with its own client, so
//!   it sees plain handles, and deletes the object itself after the job succeeded and its message was
//!   deleted ([`crate::Pipeline::discard_payload`]); nothing here needs the decoration.
//! - **Dead-lettering**: the libraries have no DLQ path of their own (SQS's redrive moves the pointer and
//!   the object stays). Conveyor's DLQ copy keeps the pointer body and the attributes as they were, so a
//!   dead-lettered job keeps its object until whoever deals with the DLQ message deletes it.
//!
//! # Design note: an object outlives every message that points at it
//!
//! The bucket's lifecycle rule expires an object a fixed time after it was last written
//! (`infra/modules/payload-bucket`: 29 days, the source queue's 14 days of retention plus a redriven DLQ
//! message's 14 fresh days plus one, for the messages SQS moves without Conveyor: its own redrive to the
//! DLQ and a redrive back). Conveyor makes new
//! messages that point at an object long after the producer wrote it: every delay hop, every deferred
//! copy, every DLQ copy (with 14 fresh days of retention), every redrive of that copy. So before such a
//! copy is sent the pipeline *touches* the object ([`PayloadStore::touch`]: on S3 a copy of the object
//! onto itself, which restarts the lifecycle's clock): always before a DLQ copy, and before a hop or a
//! deferral once per [`Payloads::touch_every`] of the job's life (one `CopyObject` a day while it hops).
//! A touch that fails is logged and the copy still goes (the object then lives 29 days from its last
//! touch; a failure that lasts that long is an S3 outage the job could not survive anyway).
//!
//! Deletion happens only when the job is done for good: its claim completed (an idempotent handler
//! with a store, so a redelivery of any copy finds the completed record and is acknowledged as a
//! duplicate without its object), and in the worker only after the message's delete was confirmed. A
//! duplicate or a cancelled copy never deletes the object (another copy may still need it), a handler
//! that is not idempotent leaves it to the lifecycle, and so does everything after a failure.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::message::{AttributeValue, Attributes, Message};

/// The pointer class the libraries write.
pub(crate) const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// The pointer class older Java clients wrote; accepted on read.
pub(crate) const LEGACY_POINTER_CLASS: &str = "com.amazon.sqs.javamessaging.MessageS3Pointer";
/// The attribute that marks a pointer message and holds the payload's size in bytes.
pub const SIZE_ATTRIBUTE: &str = "ExtendedPayloadSize";
/// The attribute older clients (and the Java library by default) write instead.
pub const LEGACY_SIZE_ATTRIBUTE: &str = "SQSLargePayloadSize";
// The libraries' default offload threshold is 262,144 bytes (SQS's message limit before August 2025).

/// Where a large payload is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PayloadPointer {
    /// The S3 bucket.
    pub bucket: String,
    /// The object key.
    pub key: String,
}

impl std::fmt::Display for PayloadPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// A message marked as a pointer whose body is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the message carries the {attribute} attribute (a large-payload pointer) but its body is not a pointer \
     ({problem}); expected [\"{POINTER_CLASS}\", {{\"s3BucketName\": …, \"s3Key\": …}}]"
)]
pub struct PointerError {
    /// The marking attribute.
    pub attribute: &'static str,
    /// What was wrong with the body.
    pub problem: String,
}

impl PayloadPointer {
    /// A pointer to `key` in `bucket`.
    pub fn new(bucket: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            key: key.into(),
        }
    }

    /// The message body the libraries write for this pointer.
    pub fn to_body(&self) -> String {
        serde_json::json!([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": self.key}]).to_string()
    }

    /// Reads a pointer body (current or legacy class name); `Err` says what was wrong.
    pub fn from_body(body: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(body).map_err(|error| format!("not JSON: {error}"))?;
        let Some([class, fields]) = value.as_array().map(Vec::as_slice) else {
            return Err("not a two-element JSON array".to_owned());
        };
        let class = class.as_str().unwrap_or_default();
        if class != POINTER_CLASS && class != LEGACY_POINTER_CLASS {
            return Err(format!("unknown pointer class {class:?}"));
        }
        let field = |name: &str| {
            fields
                .get(name)
                .and_then(Value::as_str)
                .filter(|text| !text.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| format!("no {name} string"))
        };
        Ok(Self {
            bucket: field("s3BucketName")?,
            key: field("s3Key")?,
        })
    }

    /// The pointer `message` carries: `None` when it is not marked as one (neither size attribute).
    pub fn of(message: &Message) -> Option<Result<Self, PointerError>> {
        let attribute = marking_attribute(&message.attributes)?;
        Some(Self::from_body(&message.body).map_err(|problem| PointerError { attribute, problem }))
    }
}

/// Which of the two marking attributes `attributes` holds, if any.
pub fn marking_attribute(attributes: &Attributes) -> Option<&'static str> {
    [SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE]
        .into_iter()
        .find(|name| attributes.contains_key(*name))
}

/// The payload size a pointer message declares (its marking attribute), when it is a number.
pub fn declared_size(attributes: &Attributes) -> Option<u64> {
    let name = marking_attribute(attributes)?;
    attributes.get(name)?.string_value.as_deref()?.trim().parse().ok()
}

/// The attribute a producer adds to a pointer message: the payload's size in bytes.
pub fn size_attribute(size: usize) -> (String, AttributeValue) {
    (SIZE_ATTRIBUTE.to_owned(), AttributeValue::number(size))
}

/// `message` with the payload `body` in place of its pointer and without the marking attribute, as
/// the libraries hand a received pointer message over.
pub fn resolved(message: &Message, body: String) -> Message {
    let mut resolved = message.clone();
    resolved.body = body;
    resolved.attributes.remove(SIZE_ATTRIBUTE);
    resolved.attributes.remove(LEGACY_SIZE_ATTRIBUTE);
    resolved
}

/// Why a payload store call failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// No object at the pointer: deleted after an earlier successful run, expired by the bucket's
    /// lifecycle rule, or never written.
    #[error(
        "payload object s3://{bucket}/{key} does not exist (deleted after an earlier successful run, expired by \
         the bucket's lifecycle rule, or never written)"
    )]
    NotFound {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// The store cannot be reached, throttled or failed: retry later.
    #[error("payload store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
    },
    /// The bucket does not exist or access is denied: fix the configuration.
    #[error("payload store refused the request: {message}")]
    Misconfigured {
        /// What was wrong and what to do.
        message: String,
    },
}

/// Where large payloads live (S3 in production, memory in tests). Object-safe; share one per process.
///
/// Contract: `put` then `get` of the same bucket and key returns the same bytes; `get` of a key never
/// put, or deleted, is [`PayloadError::NotFound`] naming the bucket and key; `delete` of a missing key
/// succeeds (S3's `DeleteObject` does), so a repeated delete is harmless.
#[async_trait]
pub trait PayloadStore: Send + Sync {
    /// Stores `body` at `bucket`/`key`, replacing what was there.
    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PayloadError>;
    /// The object at `bucket`/`key`.
    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, PayloadError>;
    /// Deletes the object at `bucket`/`key`; succeeds when it is already gone.
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), PayloadError>;

    /// Restarts the object's expiry clock (S3: copies it onto itself, so the bucket's lifecycle rule
    /// counts from now): called before a new message pointing at it is sent. A store whose objects do
    /// not expire needs nothing, the default. [`PayloadError::NotFound`] when it is gone.
    async fn touch(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        let _ = (bucket, key);
        Ok(())
    }
}

/// What a consumer does with large payloads: where they are read from, and whether the object is
/// deleted once its job succeeded.
#[derive(Clone)]
pub struct Payloads {
    /// The store pointers are resolved through.
    pub store: Arc<dyn PayloadStore>,
    /// Delete the object after the job succeeded and its message was deleted (default), as the
    /// libraries' `cleanupS3Payload` / `delete_payload_from_s3` do. Never after a failure or a DLQ.
    pub delete_after_success: bool,
    /// How often a job that keeps being re-sent (hops, deferrals) touches its object (default a day;
    /// keep it well under the bucket's lifecycle expiry).
    pub touch_every: std::time::Duration,
    /// The bucket whose objects this consumer deletes after success ([`Payloads::own_bucket`];
    /// `CONVEYOR_PAYLOAD_BUCKET` from the environment). A pointer into any other bucket is read, never
    /// deleted: a producer cannot have a consumer delete objects of a bucket that is not its own.
    /// `None` deletes wherever the pointer points (a pipeline built by hand without it).
    pub own_bucket: Option<String>,
}

/// The default of [`Payloads::touch_every`].
pub(crate) const TOUCH_EVERY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl std::fmt::Debug for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payloads")
            .field("delete_after_success", &self.delete_after_success)
            .field("touch_every", &self.touch_every)
            .finish_non_exhaustive()
    }
}

impl Payloads {
    /// Resolves through `store`; deletes objects after success.
    pub fn new(store: Arc<dyn PayloadStore>) -> Self {
        Self {
            store,
            delete_after_success: true,
            touch_every: TOUCH_EVERY,
            own_bucket: None,
        }
    }

    /// Deletes after success only objects in `bucket` (see [`Payloads::own_bucket`](Payloads#structfield.own_bucket)).
    pub fn own_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.own_bucket = Some(bucket.into());
        self
    }

    /// Whether an object in `bucket` is this consumer's to delete.
    pub(crate) fn owns(&self, bucket: &str) -> bool {
        self.own_bucket.as_deref().is_none_or(|own| own == bucket)
    }

    /// Touches objects of re-sent jobs every `every` instead of once a day.
    pub fn touch_every(mut self, every: std::time::Duration) -> Self {
        self.touch_every = every;
        self
    }

    /// Keeps objects after success (the bucket's lifecycle rule removes them).
    pub fn keep_after_success(mut self) -> Self {
        self.delete_after_success = false;
        self
    }
}

/// True when a copy of `message` made at `now` must touch its object first: a copy made in a later
/// period of `every` (counted from the job's first send) than `message` itself was sent, or one whose
/// times are unknown. Each period of a hopping job's life then has one touch.
pub(crate) fn touch_due(message: &Message, now: std::time::SystemTime, every: std::time::Duration) -> bool {
    let (Some(first), Some(sent)) = (crate::delay::first_sent(message), message.sent_at) else {
        return true;
    };
    let period = |at: std::time::SystemTime| {
        at.duration_since(first).unwrap_or_default().as_millis() / every.as_millis().max(1)
    };
    period(now) > period(sent)
}

/// Fetches the payload `pointer` names and returns `message` with it as the body (see [`resolved`]).
pub async fn resolve(
    store: &dyn PayloadStore,
    message: &Message,
    pointer: &PayloadPointer,
) -> Result<Message, ResolveError> {
    let bytes = store
        .get(&pointer.bucket, &pointer.key)
        .await
        .map_err(ResolveError::Store)?;
    let body = String::from_utf8(bytes).map_err(|error| ResolveError::NotText {
        pointer: pointer.clone(),
        message: error.utf8_error().to_string(),
    })?;
    Ok(resolved(message, body))
}

/// Why [`resolve`] failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The store failed.
    #[error(transparent)]
    Store(PayloadError),
    /// The object is not UTF-8 text (an SQS body always is).
    #[error("payload object {pointer} is not UTF-8 text: {message}")]
    NotText {
        /// Where it is.
        pointer: PayloadPointer,
        /// The decoding error.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_the_libraries_pointer_and_reads_back() {
        let pointer = PayloadPointer::new("jobs-payloads", "6b1d2a5e-0000-4000-8000-000000000001");
        let body = pointer.to_body();
        assert_eq!(
            body,
            r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"jobs-payloads","s3Key":"6b1d2a5e-0000-4000-8000-000000000001"}]"#
        );
        assert_eq!(PayloadPointer::from_body(&body), Ok(pointer));
    }

    #[test]
    fn python_spacing_and_the_legacy_class_are_read() {
        // Python's json.dumps separators: ", " and ": ".
        let python =
            r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "b", "s3Key": "k"}]"#;
        assert_eq!(
            PayloadPointer::from_body(python),
            Ok(PayloadPointer::new("b", "k"))
        );
        let legacy = r#"["com.amazon.sqs.javamessaging.MessageS3Pointer",{"s3BucketName":"b","s3Key":"k"}]"#;
        assert_eq!(
            PayloadPointer::from_body(legacy),
            Ok(PayloadPointer::new("b", "k"))
        );
    }

    #[test]
    fn a_marked_message_with_a_bad_body_says_what_was_wrong() {
        let mut message = Message::new("m-1", r#"{"not":"a pointer"}"#);
        assert!(PayloadPointer::of(&message).is_none(), "unmarked: not a pointer");
        message
            .attributes
            .insert(LEGACY_SIZE_ATTRIBUTE.to_owned(), AttributeValue::number(5));
        let Some(Err(error)) = PayloadPointer::of(&message) else {
            panic!("expected an error")
        };
        let text = error.to_string();
        assert!(
            text.contains("SQSLargePayloadSize") && text.contains("two-element"),
            "{text}"
        );
        for (body, problem) in [
            (
                r#"["x.Other",{"s3BucketName":"b","s3Key":"k"}]"#,
                "unknown pointer class",
            ),
            (
                r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3Key":"k"}]"#,
                "no s3BucketName",
            ),
            ("not json", "not JSON"),
        ] {
            let error = PayloadPointer::from_body(body).unwrap_err();
            assert!(error.contains(problem), "{body}: {error}");
        }
    }

    #[test]
    fn a_hopping_job_touches_its_object_once_per_period() {
        use std::time::{Duration, UNIX_EPOCH};
        let day = Duration::from_secs(24 * 3600);
        let first = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut message = Message::new("m-1", "{}");
        // A hop's copy: first sent at `first`, this copy sent half a day later.
        let record = crate::message::DeferralRecord {
            original_id: "m-0".into(),
            first_sent_ms: Some(crate::outcome::epoch_millis(first)),
            attempts: 0,
            deferrals: 40,
            waiting_for: None,
            waiting_since_ms: None,
        };
        message.attributes.insert(
            crate::message::DEFERRAL_ATTRIBUTE.into(),
            AttributeValue::string(serde_json::to_string(&record).unwrap()),
        );
        message.sent_at = Some(first + day / 2);
        assert!(!touch_due(
            &message,
            first + day / 2 + Duration::from_secs(900),
            day
        ));
        assert!(
            touch_due(&message, first + day + Duration::from_secs(1), day),
            "a new day"
        );
        message.sent_at = None;
        assert!(touch_due(&message, first, day), "unknown times: touched");
    }

    #[test]
    fn resolving_replaces_the_body_and_drops_the_marking_attribute() {
        let mut message = Message::new("m-1", PayloadPointer::new("b", "k").to_body());
        message
            .attributes
            .insert(SIZE_ATTRIBUTE.to_owned(), AttributeValue::number(7));
        message
            .attributes
            .insert("conveyor.type".to_owned(), AttributeValue::string("report"));
        assert_eq!(declared_size(&message.attributes), Some(7));
        let resolved = resolved(&message, "{\"a\":1}".to_owned());
        assert_eq!(resolved.body, "{\"a\":1}");
        assert!(marking_attribute(&resolved.attributes).is_none());
        assert_eq!(resolved.job_type(), Some("report"));
    }
}
