//! S3 event notifications: `{"Records": [{"eventSource": "aws:s3", ...}]}`, and the `s3:TestEvent`
//! message S3 sends when a notification configuration is saved.
//!
//! # Design note: the whole notification is one job
//!
//! One SQS message is one unit of acknowledgement: SQS can delete it or make it visible again, not
//! part of it. S3 writes one record per notification in practice, but the format allows several. Were
//! each record its own job, a message whose second record failed would have to come back whole
//! and run its first record again (or lose the second). So the handler gets the notification as
//! one job, [`S3Event`] with all its records, and one outcome settles the message; its idempotency key
//! covers every record (`s3:<bucket>/<key>@<sequencer>` each). A handler that must survive a
//! partial failure makes each record's effect idempotent on its own (the sequencer orders the
//! events of one key).

use serde::Deserialize;
use serde_json::{Map, Value};

/// An S3 event notification: the job of a [`Router::s3_events`](crate::Router::s3_events) handler
/// (use it as `Handler::Job`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawEvent")]
#[non_exhaustive]
pub struct S3Event {
    /// The records, usually one.
    pub records: Vec<S3Record>,
}

/// One record of an [`S3Event`]: what happened to which object.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Record {
    /// `eventName` without the `s3:` prefix, such as `ObjectCreated:Put` or `ObjectRemoved:Delete`.
    pub event_name: String,
    /// When it happened (ISO 8601, as S3 wrote it).
    pub event_time: String,
    /// The bucket's region.
    pub region: String,
    /// The bucket.
    pub bucket: String,
    /// The object key, decoded (S3 writes it form-encoded: `a%20b` and `a+b` for `a b`).
    pub key: String,
    /// The object's size in bytes (absent for deletions).
    pub size: Option<u64>,
    /// The object's ETag (absent for deletions).
    pub etag: Option<String>,
    /// The object's version, in a versioned bucket.
    pub version_id: Option<String>,
    /// Orders the events of one key (compare as hexadecimal strings of equal length).
    pub sequencer: Option<String>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "Records")]
    records: Vec<RawRecord>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRecord {
    event_source: String,
    event_name: String,
    event_time: String,
    #[serde(default)]
    aws_region: String,
    s3: RawEntity,
}

#[derive(Deserialize)]
struct RawEntity {
    bucket: RawBucket,
    object: RawObject,
}

#[derive(Deserialize)]
struct RawBucket {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObject {
    key: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default, alias = "etag")]
    e_tag: Option<String>,
    #[serde(default)]
    version_id: Option<String>,
    #[serde(default)]
    sequencer: Option<String>,
}

impl TryFrom<RawEvent> for S3Event {
    type Error = String;

    fn try_from(raw: RawEvent) -> Result<Self, String> {
        if raw.records.is_empty() {
            return Err("S3 event notification without records".to_owned());
        }
        let records = raw
            .records
            .into_iter()
            .map(|record| {
                if record.event_source != "aws:s3" {
                    return Err(format!(
                        "record of an S3 event notification has eventSource {:?}, not \"aws:s3\"",
                        record.event_source
                    ));
                }
                Ok(S3Record {
                    event_name: record
                        .event_name
                        .strip_prefix("s3:")
                        .unwrap_or(&record.event_name)
                        .to_owned(),
                    event_time: record.event_time,
                    region: record.aws_region,
                    bucket: record.s3.bucket.name,
                    key: form_decoded(&record.s3.object.key),
                    size: record.s3.object.size,
                    etag: record.s3.object.e_tag,
                    version_id: record.s3.object.version_id,
                    sequencer: record.s3.object.sequencer,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(S3Event { records })
    }
}

impl S3Event {
    /// The idempotency key of the notification: each record's `<bucket>/<key>@<sequencer>` (the event
    /// time when there is no sequencer), joined by spaces.
    pub(crate) fn key(&self) -> String {
        let records: Vec<String> = self
            .records
            .iter()
            .map(|record| {
                let at = record.sequencer.as_deref().unwrap_or(&record.event_time);
                format!("{}/{}@{at}", record.bucket, record.key)
            })
            .collect();
        format!("s3:{}", records.join(" "))
    }
}

/// True when `body` looks like an S3 notification: a non-empty `Records` array whose first record
/// says `"eventSource": "aws:s3"`.
pub(crate) fn is_notification(body: &Map<String, Value>) -> bool {
    body.get("Records")
        .and_then(Value::as_array)
        .and_then(|records| records.first())
        .and_then(|record| record.get("eventSource"))
        .and_then(Value::as_str)
        == Some("aws:s3")
}

/// True for the message S3 sends when a notification configuration is saved.
pub(crate) fn is_test_event(body: &Map<String, Value>) -> bool {
    body.get("Service").and_then(Value::as_str) == Some("Amazon S3")
        && body.get("Event").and_then(Value::as_str) == Some("s3:TestEvent")
}

/// The notification; `Err` names what is wrong with a body that looks like one.
pub(crate) fn open(body: Value) -> Result<S3Event, String> {
    serde_json::from_value(body).map_err(|error| format!("S3 event notification: {error}"))
}

/// `text` with `+` as a space and `%XX` escapes decoded; the text as it is when the result is not
/// UTF-8 or an escape is broken.
fn form_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        match byte {
            b'+' => out.push(b' '),
            b'%' => {
                let escape = bytes
                    .get(index + 1..index + 3)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                let Some(decoded) = escape else {
                    return text.to_owned();
                };
                out.push(decoded);
                index += 2;
            }
            other => out.push(other),
        }
        index += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}
