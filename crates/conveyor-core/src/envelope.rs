//! The body envelope: job type, version and key inside the body, for senders that cannot set message
//! attributes (EventBridge Scheduler's SQS target, some webhooks-to-SQS bridges).
//!
//! ```json
//! {"conveyor": {"type": "nightly_report", "version": 1, "key": "schedule:nightly@2026-11-30T02:00:00Z"},
//!  "payload": {"kind": "sales"}}
//! ```
//!
//! A message *without* a `conveyor.type` attribute whose body is exactly such an object (the two
//! fields `conveyor` and `payload`, `conveyor.type` a string) is opened before routing: the header
//! becomes the attributes (`conveyor.type`, `conveyor.version`, `conveyor.key`) and the payload the
//! body. Everything else (plain bodies, bodies that merely contain a `conveyor` field, messages with
//! attributes) is left as it is.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{
    AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, Message, SCHEMA_VERSION_ATTRIBUTE,
};

/// The envelope's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// The schema version (1 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// The idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    conveyor: Header,
    payload: Value,
}

#[derive(Serialize)]
struct Sealed<'a> {
    conveyor: &'a Header,
    payload: Value,
}

/// The envelope for `payload` with `header`, as JSON text.
///
/// The text is the same in every build: the header is written in its fields' order and the
/// payload's object keys sorted. (serde_json keeps maps in insertion order when any crate in the
/// build enables its `preserve_order` feature, and sorted otherwise; an exported schedule's text
/// must not change with that, or Terraform sees a change that is not one.)
pub fn seal(header: &Header, payload: &Value) -> String {
    let sealed = Sealed {
        conveyor: header,
        payload: sorted(payload),
    };
    match serde_json::to_string(&sealed) {
        Ok(text) => text,
        // Unreachable: a header of strings and a `Value` always serialise.
        Err(_) => serde_json::json!({ "conveyor": header, "payload": sealed.payload }).to_string(),
    }
}

/// `value` with every object's keys in sorted order, whatever map order serde_json was built with.
pub fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::with_capacity(map.len());
            for key in keys {
                out.insert(key.clone(), sorted(&map[key]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// The message with its envelope opened, when it is an enveloped message without attributes.
pub fn open(message: &Message) -> Option<Message> {
    if message.job_type().is_some() || !message.body.trim_start().starts_with('{') {
        return None;
    }
    let envelope: Envelope = serde_json::from_str(&message.body).ok()?;
    let mut opened = message.clone();
    opened.body = envelope.payload.to_string();
    let header = envelope.conveyor;
    opened.attributes.insert(
        JOB_TYPE_ATTRIBUTE.to_owned(),
        AttributeValue::string(header.job_type),
    );
    if let Some(version) = header.version {
        opened.attributes.insert(
            SCHEMA_VERSION_ATTRIBUTE.to_owned(),
            AttributeValue::number(version),
        );
    }
    if let Some(key) = header.key {
        opened
            .attributes
            .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    }
    Some(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sealed_text_does_not_depend_on_map_order() {
        let header = Header {
            job_type: "report".into(),
            version: Some(1),
            key: Some("k".into()),
        };
        // Built in insertion order "b", "a": kept so when serde_json's `preserve_order` is on
        // (the workspace build has it), sorted when it is off. The text must be one and the same.
        let mut inner = serde_json::Map::new();
        inner.insert("d".into(), Value::from(1));
        inner.insert("c".into(), Value::from(2));
        let mut payload = serde_json::Map::new();
        payload.insert("b".into(), Value::from(1));
        payload.insert("a".into(), Value::Array(vec![Value::Object(inner)]));
        assert_eq!(
            seal(&header, &Value::Object(payload)),
            r#"{"conveyor":{"type":"report","version":1,"key":"k"},"payload":{"a":[{"c":2,"d":1}],"b":1}}"#
        );
    }

    #[test]
    fn an_envelope_opens_into_attributes_and_payload() {
        let header = Header {
            job_type: "nightly_report".into(),
            version: Some(2),
            key: Some("schedule:nightly@2026-11-30T02:00:00Z".into()),
        };
        let body = seal(&header, &serde_json::json!({"kind": "sales"}));
        let opened = open(&Message::new("m-1", body)).unwrap();
        assert_eq!(opened.job_type(), Some("nightly_report"));
        assert_eq!(opened.string_attribute(SCHEMA_VERSION_ATTRIBUTE), Some("2"));
        assert_eq!(
            opened.idempotency_key(),
            Some("schedule:nightly@2026-11-30T02:00:00Z")
        );
        assert_eq!(opened.body, r#"{"kind":"sales"}"#);
    }

    #[test]
    fn plain_bodies_and_attributed_messages_are_left_alone() {
        assert!(open(&Message::new("m", r#"{"kind":"sales"}"#)).is_none());
        assert!(
            open(&Message::new(
                "m",
                r#"{"conveyor":{"type":"x"},"payload":1,"extra":2}"#
            ))
            .is_none()
        );
        assert!(open(&Message::new("m", "not json")).is_none());
        let mut typed = Message::new("m", r#"{"conveyor":{"type":"x"},"payload":1}"#);
        typed
            .attributes
            .insert(JOB_TYPE_ATTRIBUTE.into(), AttributeValue::string("y"));
        assert!(open(&typed).is_none());
    }
}
