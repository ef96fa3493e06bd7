//! How a job's idempotency record id (and validation hash) is built: Conveyor's own style, or the way
//! AWS Lambda Powertools builds it, so a Powertools consumer and a Conveyor consumer of the same
//! messages deduplicate against each other.
//!
//! # Design note: matching Powertools byte for byte
//!
//! Powertools hashes the JSON text of the value its `event_key_jmespath` selects:
//!
//! - **Python** (`aws-lambda-powertools` 3.x, `persistence/base.py`): `f"{prefix}#" +
//!   md5(json.dumps(value, sort_keys=True).encode()).hexdigest()`, where `prefix` is `key_prefix` when
//!   set, else `f"{AWS_LAMBDA_FUNCTION_NAME}.{module}.{qualname}"`. `json.dumps` defaults: `", "` and
//!   `": "` separators, keys sorted by code point, non-ASCII escaped as `\uXXXX` (`ensure_ascii`).
//! - **TypeScript** (`@aws-lambda-powertools/idempotency` 2.x, `BasePersistenceLayer.ts`):
//!   `` `${prefix}#` + base64(md5(JSON.stringify(deepSort(value)))) ``, where `prefix` is `keyPrefix` when
//!   set, else `AWS_LAMBDA_FUNCTION_NAME` (and `.${functionName}` when one is configured). `deepSort`
//!   orders keys case-insensitively; JavaScript puts integer-like keys first, in numeric order.
//!
//! A string key (a message id, a producer key) is hashed with its quotes: `"abc"`. Strings, integers,
//! booleans, null and objects or arrays of them serialise exactly as each side does; floats print as
//! Rust prints them (shortest round-trip), which matches for ordinary values (`1.5`) but not for every
//! exponent form, and object keys that differ only in case may order differently from TypeScript.
//! Keys are therefore best taken from strings or integers.

use base64::Engine;
use md5::{Digest, Md5};
use serde_json::Value;

use crate::idempotency::{idempotency_key, payload_hash};
use crate::message::Message;

/// How a handler's idempotency record id is built. [`KeyStyle::Conveyor`] is the default.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyStyle {
    /// `conveyor:<job type>#<producer key or message id>`; validation hashes the body with SHA-256.
    #[default]
    Conveyor,
    /// The id a Powertools consumer of the same messages builds, so the two deduplicate together.
    Powertools(PowertoolsKey),
}

/// Which Powertools builds the ids to match.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowertoolsFlavor {
    /// Powertools for AWS Lambda (Python): hex MD5 of `json.dumps(value, sort_keys=True)`.
    Python,
    /// Powertools for AWS Lambda (TypeScript): base64 MD5 of `JSON.stringify(deepSort(value))`.
    TypeScript,
}

/// Where the value that is hashed comes from, and the `event_key_jmespath` that selects the same value
/// from an SQS record on the Powertools side.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The SQS message id (of the job's first copy). Powertools: `messageId`.
    MessageId,
    /// A field of the JSON body, dotted for nested fields (`order.id`).
    /// Powertools: `powertools_json(body).order.id`.
    BodyField(String),
    /// Conveyor's producer key (the `conveyor.key` attribute), else the message id.
    /// Powertools: `messageAttributes."conveyor.key".stringValue || messageId`.
    ProducerKey,
}

/// A Powertools-compatible key: the other side's prefix (everything before the `#` in the ids of its
/// records), its flavor, and where the key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowertoolsKey {
    /// Python or TypeScript.
    pub flavor: PowertoolsFlavor,
    /// The prefix the Powertools consumer uses, e.g. `orders-fn.app.handler` (Python's default,
    /// `<function name>.<module>.<qualname>`) or its `key_prefix` / `keyPrefix`.
    pub prefix: String,
    /// Where the hashed value comes from.
    pub source: KeySource,
}

/// A key that cannot be built from a message.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The body is not JSON, so a body field cannot be read.
    #[error("the body is not JSON, so the idempotency key field `{field}` cannot be read: {reason}")]
    BodyNotJson {
        /// The configured field.
        field: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The body has no such field, or it is null (Powertools refuses such keys too).
    #[error("the body has no idempotency key field `{field}` (or it is null)")]
    MissingField {
        /// The configured field.
        field: String,
    },
}

impl KeyStyle {
    /// The record id for `message`, handled by `job_type`.
    pub fn key(&self, job_type: &str, message: &Message) -> Result<String, KeyError> {
        let powertools = match self {
            KeyStyle::Conveyor => {
                return Ok(idempotency_key(
                    job_type,
                    message.idempotency_key(),
                    &message.original_id(),
                ));
            }
            KeyStyle::Powertools(powertools) => powertools,
        };
        let value = powertools.source.value(message)?;
        Ok(format!(
            "{}#{}",
            powertools.prefix,
            powertools.flavor.hash(&value)
        ))
    }

    /// The validation hash of `message`'s body: Conveyor's SHA-256 of the text, or, in a Powertools
    /// style, that side's hash of the parsed body (Powertools' `payload_validation_jmespath` set to
    /// `powertools_json(body)`). A body that is not JSON is hashed as a JSON string.
    pub fn validation(&self, message: &Message) -> String {
        match self {
            KeyStyle::Conveyor => payload_hash(&message.body),
            KeyStyle::Powertools(powertools) => {
                let body = serde_json::from_str(&message.body)
                    .unwrap_or_else(|_| Value::String(message.body.clone()));
                powertools.flavor.hash(&body)
            }
        }
    }
}

impl KeySource {
    fn value(&self, message: &Message) -> Result<Value, KeyError> {
        match self {
            KeySource::MessageId => Ok(Value::String(message.original_id())),
            KeySource::ProducerKey => Ok(Value::String(
                message
                    .idempotency_key()
                    .map_or_else(|| message.original_id(), str::to_owned),
            )),
            KeySource::BodyField(field) => body_field(&message.body, field),
        }
    }
}

fn body_field(body: &str, field: &str) -> Result<Value, KeyError> {
    let mut value: Value = serde_json::from_str(body).map_err(|error| KeyError::BodyNotJson {
        field: field.to_owned(),
        reason: error.to_string(),
    })?;
    for part in field.split('.') {
        value = match value {
            Value::Object(mut map) => map.remove(part).unwrap_or(Value::Null),
            _ => Value::Null,
        };
    }
    if value.is_null() {
        return Err(KeyError::MissingField {
            field: field.to_owned(),
        });
    }
    Ok(value)
}

impl PowertoolsFlavor {
    /// This flavor's hash of a JSON value, as it appears after the `#` (and as its validation hash).
    pub fn hash(self, value: &Value) -> String {
        match self {
            PowertoolsFlavor::Python => {
                let mut text = String::new();
                write_json(value, &PYTHON, &mut text);
                hex::encode(Md5::digest(text.as_bytes()))
            }
            PowertoolsFlavor::TypeScript => {
                let mut text = String::new();
                write_json(value, &JAVASCRIPT, &mut text);
                base64::engine::general_purpose::STANDARD.encode(Md5::digest(text.as_bytes()))
            }
        }
    }
}

/// How one language's serializer writes the JSON that Powertools hashes.
struct Dialect {
    /// Between array items and object entries.
    item_separator: &'static str,
    /// Between an object's key and its value.
    key_separator: &'static str,
    /// The order of an object's keys.
    key_order: fn(&str, &str) -> std::cmp::Ordering,
    /// A string, quoted and escaped.
    string: fn(&str, &mut String),
    /// A number.
    number: fn(&serde_json::Number, &mut String),
}

/// `json.dumps(value, sort_keys=True)` with Python's defaults.
const PYTHON: Dialect = Dialect {
    item_separator: ", ",
    key_separator: ": ",
    key_order: str::cmp,
    string: python_string,
    number: |number, out| out.push_str(&number.to_string()),
};

/// `JSON.stringify(deepSort(value))`.
const JAVASCRIPT: Dialect = Dialect {
    item_separator: ",",
    key_separator: ":",
    key_order: javascript_key_order,
    string: javascript_string,
    number: javascript_number,
};

/// Writes `value` as `dialect` does.
fn write_json(value: &Value, dialect: &Dialect, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| (dialect.key_order)(a.0, b.0));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push_str(dialect.item_separator);
                }
                (dialect.string)(key, out);
                out.push_str(dialect.key_separator);
                write_json(item, dialect, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(dialect.item_separator);
                }
                write_json(item, dialect, out);
            }
            out.push(']');
        }
        Value::String(text) => (dialect.string)(text, out),
        Value::Number(number) => (dialect.number)(number, out),
        other => out.push_str(&other.to_string()),
    }
}

/// A number as JavaScript prints it (whole numbers without a fraction).
fn javascript_number(number: &serde_json::Number, out: &mut String) {
    match (number.as_i64(), number.as_u64(), number.as_f64()) {
        (Some(whole), _, _) => out.push_str(&whole.to_string()),
        (_, Some(whole), _) => out.push_str(&whole.to_string()),
        (_, _, Some(float)) => out.push_str(&float.to_string()),
        _ => out.push_str(&number.to_string()),
    }
}

/// The escapes Python's `json.dumps` and `JSON.stringify` share; false for any other character.
fn push_common_escape(ch: char, out: &mut String) -> bool {
    let escape = match ch {
        '"' => "\\\"",
        '\\' => "\\\\",
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\u{8}' => "\\b",
        '\u{c}' => "\\f",
        _ => return false,
    };
    out.push_str(escape);
    true
}

/// A string as Python's `json.dumps` writes it with `ensure_ascii=True`.
fn python_string(text: &str, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        if push_common_escape(ch, out) {
            continue;
        }
        if (' '..='~').contains(&ch) {
            out.push(ch);
            continue;
        }
        let mut units = [0u16; 2];
        for unit in ch.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    }
    out.push('"');
}

/// The order of an object's keys after `deepSort` and JavaScript's own property order: integer-like
/// keys first in numeric order, then the rest compared lower-cased.
fn javascript_key_order(a: &str, b: &str) -> std::cmp::Ordering {
    let index = |key: &str| {
        key.parse::<u32>()
            .ok()
            .filter(|number| *number < u32::MAX && number.to_string() == key)
    };
    match (index(a), index(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.to_lowercase().cmp(&b.to_lowercase()),
    }
}

/// A string as `JSON.stringify` writes it (non-ASCII as is).
fn javascript_string(text: &str, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        if push_common_escape(ch, out) {
            continue;
        }
        if ch < ' ' {
            out.push_str(&format!("\\u{:04x}", u32::from(ch)));
        } else {
            out.push(ch);
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn style(flavor: PowertoolsFlavor, prefix: &str, source: KeySource) -> KeyStyle {
        KeyStyle::Powertools(PowertoolsKey {
            flavor,
            prefix: prefix.to_owned(),
            source,
        })
    }

    #[test]
    fn python_message_id_key_matches_a_record_powertools_wrote() {
        // key_derivation in ../shared/reference/powertools-idempotency-record.json (Powertools 3.37.0).
        let message = Message::new("f03c5386-ffaa-4261-84fe-68fdd7caeb19", "{}");
        let key = style(
            PowertoolsFlavor::Python,
            "peers-bench-fn.__main__.record_handler",
            KeySource::MessageId,
        )
        .key("ignored", &message)
        .unwrap();
        assert_eq!(
            key,
            "peers-bench-fn.__main__.record_handler#3511ac31c0c52af1547a237943ec42a9"
        );
    }

    #[test]
    fn python_json_matches_json_dumps_sort_keys() {
        // python3 -c 'import json; print(json.dumps({"b": [1, "é\n"], "a": None, "B": True}, sort_keys=True))'
        let value = serde_json::json!({"b": [1, "é\n"], "a": null, "B": true});
        let mut text = String::new();
        write_json(&value, &PYTHON, &mut text);
        assert_eq!(text, r#"{"B": true, "a": null, "b": [1, "\u00e9\n"]}"#);
        let mut astral = String::new();
        python_string("😀", &mut astral);
        assert_eq!(astral, r#""\ud83d\ude00""#);
    }

    #[test]
    fn javascript_json_matches_stringify_of_deep_sort() {
        // node -e 'console.log(JSON.stringify({"b":[1,"é\n"],"10":1,"2":2,"A":true,"a0":null}))' after deepSort
        let value = serde_json::json!({"b": [1, "é\n"], "10": 1, "2": 2, "a0": null, "A": true});
        let mut text = String::new();
        write_json(&value, &JAVASCRIPT, &mut text);
        assert_eq!(text, r#"{"2":2,"10":1,"A":true,"a0":null,"b":[1,"é\n"]}"#);
    }

    #[test]
    fn typescript_keys_are_base64_and_sources_differ() {
        let mut message = Message::new("m-1", r#"{"order":{"id":42}}"#);
        let field = style(
            PowertoolsFlavor::TypeScript,
            "orders",
            KeySource::BodyField("order.id".into()),
        );
        // base64(md5("42"))
        assert_eq!(
            field.key("t", &message).unwrap(),
            "orders#odDG6D8CcyfYRhBj9KxYpg=="
        );
        let by_id = style(PowertoolsFlavor::TypeScript, "orders", KeySource::MessageId);
        // base64(md5("\"m-1\""))
        assert_ne!(
            by_id.key("t", &message).unwrap(),
            field.key("t", &message).unwrap()
        );
        message.body = r#"{"order":{}}"#.into();
        assert_eq!(
            field.key("t", &message),
            Err(KeyError::MissingField {
                field: "order.id".into()
            })
        );
        message.body = "not json".into();
        assert!(matches!(
            field.key("t", &message),
            Err(KeyError::BodyNotJson { .. })
        ));
    }

    #[test]
    fn the_producer_key_is_preferred_to_the_message_id() {
        let mut message = Message::new("m-1", "{}");
        let producer = style(PowertoolsFlavor::Python, "p", KeySource::ProducerKey);
        let by_id = style(PowertoolsFlavor::Python, "p", KeySource::MessageId);
        assert_eq!(producer.key("t", &message), by_id.key("t", &message));
        message.attributes.insert(
            crate::message::IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            crate::message::AttributeValue::string("user:42"),
        );
        assert_ne!(producer.key("t", &message), by_id.key("t", &message));
        assert_eq!(
            KeyStyle::Conveyor.key("email", &message).unwrap(),
            "conveyor:email#user:42"
        );
    }
}
