//! CloudEvents, in structured JSON mode (the body is the event) and in binary mode (the body is the
//! data, the context attributes are message attributes).
//!
//! # Design note: binary mode on SQS
//!
//! CloudEvents has no SQS binding. The one AWS binding ever drafted, for SNS ("Amazon SNS Transport
//! Binding for CloudEvents", 0.4-wip, never released), maps each context attribute to a message
//! attribute prefixed `ce_` (`ce_id`, `ce_source`, `ce_specversion`, `ce_type`, `ce_time`,
//! `ce_datacontenttype`), as the Kafka binding does with its headers; SNS passes those attributes to
//! SQS unchanged. Conveyor reads that prefix, and also `ce-` (the HTTP binding's header names,
//! which bridges that copy HTTP headers into attributes produce; SQS allows both characters). A
//! message is in binary mode when it carries `ce_specversion` (or `ce-specversion`); it then needs
//! `ce_id`, `ce_source` and `ce_type` with the same prefix. Other attributes with the prefix are
//! extensions.
//!
//! Structured mode is detected by `specversion`, `id` and `source` at the top of a JSON body; a body
//! with those and no `type` is a malformed event. `data` becomes the body as JSON text; `data_base64`
//! is decoded and must be UTF-8 (the handler decodes text).

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Map, Value};

use crate::message::Attributes;

/// The attribute prefixes of binary mode, in the order they are looked for.
const PREFIXES: [&str; 2] = ["ce_", "ce-"];

/// A CloudEvent's context attributes (its data is the handler's job).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudEvent {
    /// `id`: unique within its source.
    pub id: String,
    /// `source`, a URI reference.
    pub source: String,
    /// `type`, such as `com.example.order.created`: what the route matches.
    pub event_type: String,
    /// `specversion` (`1.0`).
    pub spec_version: String,
    /// `subject`, when set.
    pub subject: Option<String>,
    /// `time`, when set (RFC 3339, as the producer wrote it).
    pub time: Option<String>,
    /// `datacontenttype`, when set.
    pub data_content_type: Option<String>,
    /// `dataschema`, when set.
    pub data_schema: Option<String>,
    /// Extension attributes (`traceparent`, ...), as text.
    pub extensions: BTreeMap<String, String>,
}

impl CloudEvent {
    /// The idempotency key: `cloudevents:<source> <id>` (a URI reference has no spaces, so the
    /// pair is unambiguous).
    pub(crate) fn key(&self) -> String {
        format!("cloudevents:{} {}", self.source, self.id)
    }
}

/// True when `body` looks like a structured-mode CloudEvent.
pub(crate) fn is_structured(body: &Map<String, Value>) -> bool {
    ["specversion", "id", "source"]
        .iter()
        .all(|key| body.contains_key(*key))
}

/// The prefix of a binary-mode CloudEvent's attributes, when `attributes` carry one.
pub(crate) fn binary_prefix(attributes: &Attributes) -> Option<&'static str> {
    PREFIXES
        .into_iter()
        .find(|prefix| attributes.contains_key(&format!("{prefix}specversion")))
}

/// A structured-mode event's context and its data as the body's text.
pub(crate) fn open_structured(body: Map<String, Value>) -> Result<(CloudEvent, String), String> {
    let mut fields: BTreeMap<String, Value> = body.into_iter().collect();
    let data = fields.remove("data");
    let data_base64 = fields.remove("data_base64");
    let mut text = |name: &str| -> Result<Option<String>, String> {
        match fields.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(value)) => Ok(Some(value)),
            Some(other) => Err(format!("CloudEvent: {name} is not a string: {other}")),
        }
    };
    let id = text("id")?.unwrap_or_default();
    let source = text("source")?.unwrap_or_default();
    let spec_version = text("specversion")?.unwrap_or_default();
    let event_type = text("type")?;
    let subject = text("subject")?;
    let time = text("time")?;
    let data_content_type = text("datacontenttype")?;
    let data_schema = text("dataschema")?;
    let extensions = fields
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => (name, text),
            other => (name, other.to_string()),
        })
        .collect();
    let event = checked(CloudEvent {
        id,
        source,
        event_type: event_type.unwrap_or_default(),
        spec_version,
        subject,
        time,
        data_content_type,
        data_schema,
        extensions,
    })?;
    let body = match (data, data_base64) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "CloudEvent {} from {}: both data and data_base64",
                event.id, event.source
            ));
        }
        (Some(data), None) => data.to_string(),
        (None, Some(Value::String(encoded))) => decoded(&event, &encoded)?,
        (None, Some(_)) => {
            return Err(format!(
                "CloudEvent {} from {}: data_base64 is not a string",
                event.id, event.source
            ));
        }
        (None, None) => "null".to_owned(),
    };
    Ok((event, body))
}

/// A binary-mode event's context, taken from `attributes` (the attributes with `prefix` are removed).
pub(crate) fn open_binary(attributes: &mut Attributes, prefix: &str) -> Result<CloudEvent, String> {
    let names: Vec<String> = attributes
        .keys()
        .filter(|name| name.starts_with(prefix))
        .cloned()
        .collect();
    let mut fields = BTreeMap::new();
    for name in names {
        let Some(value) = attributes.remove(&name) else {
            continue;
        };
        let Some(text) = value.string_value else {
            return Err(format!("CloudEvent attribute {name} is not a string attribute"));
        };
        fields.insert(name[prefix.len()..].to_owned(), text);
    }
    let mut take = |name: &str| fields.remove(name);
    let event = CloudEvent {
        id: take("id").unwrap_or_default(),
        source: take("source").unwrap_or_default(),
        event_type: take("type").unwrap_or_default(),
        spec_version: take("specversion").unwrap_or_default(),
        subject: take("subject"),
        time: take("time"),
        data_content_type: take("datacontenttype"),
        data_schema: take("dataschema"),
        extensions: fields,
    };
    checked(event)
}

/// The event when its required attributes are there, else what is missing.
fn checked(event: CloudEvent) -> Result<CloudEvent, String> {
    let missing: Vec<&str> = [
        ("id", &event.id),
        ("source", &event.source),
        ("type", &event.event_type),
        ("specversion", &event.spec_version),
    ]
    .into_iter()
    .filter(|(_, value)| value.is_empty())
    .map(|(name, _)| name)
    .collect();
    if missing.is_empty() {
        return Ok(event);
    }
    Err(format!(
        "CloudEvent {:?} from {:?} has no {}: it cannot be routed",
        event.id,
        event.source,
        missing.join(", ")
    ))
}

fn decoded(event: &CloudEvent, encoded: &str) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.as_bytes())
        .map_err(|error| {
            format!(
                "CloudEvent {} from {}: data_base64 is not base64: {error}",
                event.id, event.source
            )
        })?;
    String::from_utf8(bytes).map_err(|_| {
        format!(
            "CloudEvent {} from {}: data_base64 is not UTF-8 text; a handler decodes text",
            event.id, event.source
        )
    })
}
