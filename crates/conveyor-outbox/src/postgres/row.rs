//! A job's row: its columns, the message attributes as jsonb (binary values in base64) and the row read
//! back as a [`StoredJob`], refusing a format this code does not know.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use conveyor_core::message::{AttributeValue, Attributes};
use conveyor_core::port::OutgoingMessage;
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::{StoreError, StoredJob};

/// The row format this code writes and reads. A row of another version is refused, never skipped:
/// deploy the relay with the writers' Conveyor version.
pub(crate) const FORMAT_VERSION: i32 = 1;

/// The columns a read selects (the attributes as text: no sqlx json feature needed).
pub(crate) const COLUMNS: &str = "aggregate, sequence, id, queue_url, job_type, body, attributes::text AS attributes, \
     delay_ms, group_id, deduplication_id, trace_header, created_at_millis, attempts, last_error, \
     parked_at_millis, format_version";

/// The message attributes as the jsonb column holds them: `{"name": {"type": "String", "string": "v"}}`,
/// binary values as `{"type": "Binary", "binary": "<base64>"}`.
pub(crate) fn attributes_json(attributes: &Attributes) -> String {
    let map: Map<String, Value> = attributes
        .iter()
        .map(|(name, attribute)| {
            let mut entry = Map::new();
            entry.insert("type".to_owned(), Value::String(attribute.data_type.clone()));
            if let Some(string) = &attribute.string_value {
                entry.insert("string".to_owned(), Value::String(string.clone()));
            }
            if let Some(binary) = &attribute.binary_value {
                entry.insert("binary".to_owned(), Value::String(STANDARD.encode(binary)));
            }
            (name.clone(), Value::Object(entry))
        })
        .collect();
    Value::Object(map).to_string()
}

/// The jsonb column back as attributes; an entry that does not parse is an error (never dropped).
pub(crate) fn parse_attributes(text: &str) -> Result<Attributes, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| format!("attributes are not JSON: {error}"))?;
    let Value::Object(map) = value else {
        return Err("attributes are not a JSON object".to_owned());
    };
    map.into_iter()
        .map(|(name, entry)| {
            let field = |key: &str| entry.get(key).and_then(Value::as_str);
            let data_type = field("type").ok_or_else(|| format!("attribute {name} has no type"))?;
            let binary_value = field("binary")
                .map(|encoded| {
                    STANDARD
                        .decode(encoded)
                        .map_err(|error| format!("attribute {name}'s binary value is not base64: {error}"))
                })
                .transpose()?;
            let attribute = AttributeValue {
                data_type: data_type.to_owned(),
                string_value: field("string").map(str::to_owned),
                binary_value,
            };
            Ok((name, attribute))
        })
        .collect()
}

/// A number column that must not be negative.
fn unsigned(value: Option<i64>) -> Option<u64> {
    value.and_then(|value| u64::try_from(value).ok())
}

/// The row read by a `SELECT` of [`COLUMNS`] as a job.
pub(crate) fn parse_job(store: &str, row: &PgRow) -> Result<StoredJob, StoreError> {
    let aggregate: String = row.try_get("aggregate").unwrap_or_default();
    let sequence = unsigned(row.try_get("sequence").ok()).unwrap_or_default();
    let unreadable = |message: String| StoreError::Unreadable {
        store: store.to_owned(),
        aggregate: aggregate.clone(),
        sequence,
        message,
    };
    let version: Option<i32> = row.try_get("format_version").ok();
    if version != Some(FORMAT_VERSION) {
        return Err(unreadable(format!(
            "its format version is {} and this relay reads {FORMAT_VERSION}: deploy the relay with the \
             writers' Conveyor version",
            version.map_or_else(|| "missing".to_owned(), |version| version.to_string())
        )));
    }
    let column = |name: &'static str| -> Result<String, StoreError> {
        row.try_get(name)
            .map_err(|error| unreadable(format!("column {name}: {error}")))
    };
    let optional = |name: &'static str| -> Result<Option<String>, StoreError> {
        row.try_get(name)
            .map_err(|error| unreadable(format!("column {name}: {error}")))
    };
    let number = |name: &'static str| -> Result<Option<u64>, StoreError> {
        let value: Option<i64> = row
            .try_get(name)
            .map_err(|error| unreadable(format!("column {name}: {error}")))?;
        match value {
            None => Ok(None),
            Some(value) => u64::try_from(value)
                .map(Some)
                .map_err(|_| unreadable(format!("column {name} is negative: {value}"))),
        }
    };
    let attempts: i32 = row
        .try_get("attempts")
        .map_err(|error| unreadable(format!("column attempts: {error}")))?;
    let message = OutgoingMessage {
        body: column("body")?,
        attributes: parse_attributes(&column("attributes")?).map_err(unreadable)?,
        delay: number("delay_ms")?.map(Duration::from_millis),
        group_id: optional("group_id")?,
        deduplication_id: optional("deduplication_id")?,
        trace_header: optional("trace_header")?,
    };
    Ok(StoredJob {
        aggregate: aggregate.clone(),
        sequence,
        id: column("id")?,
        queue_url: column("queue_url")?,
        job_type: column("job_type")?,
        message,
        created_at_millis: number("created_at_millis")?.unwrap_or_default(),
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_error: optional("last_error")?,
        parked_at_millis: number("parked_at_millis")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_binary_values() {
        let mut attributes = Attributes::new();
        attributes.insert("kind".to_owned(), AttributeValue::string("invoice"));
        attributes.insert(
            "blob".to_owned(),
            AttributeValue {
                data_type: "Binary".to_owned(),
                string_value: None,
                binary_value: Some(vec![0, 159, 146, 150, 255]),
            },
        );
        let json = attributes_json(&attributes);
        assert_eq!(parse_attributes(&json), Ok(attributes));
        assert_eq!(parse_attributes("{}"), Ok(Attributes::new()));
    }

    #[test]
    fn a_malformed_attribute_is_an_error_not_dropped() {
        assert!(parse_attributes(r#"{"a": {"string": "x"}}"#).is_err());
        assert!(parse_attributes(r#"{"a": {"type": "Binary", "binary": "%%"}}"#).is_err());
        assert!(parse_attributes("[]").is_err());
    }
}
