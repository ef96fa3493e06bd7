//! Turning an invocation's payload into an [`SqsEvent`], with an error that says what arrived instead.
//!
//! The payload is read as a `serde_json::Value` first, so a wrong event (an EventBridge rule or an S3
//! notification wired to the function by mistake) fails with a description of what it is, rather than
//! with serde's "missing field `Records`".

use aws_lambda_events::sqs::SqsEvent;
use serde_json::Value;

use crate::error::EventError;

/// The `eventSource` of records sent by an SQS event source mapping.
pub const SQS_EVENT_SOURCE: &str = "aws:sqs";

/// Parses an invocation payload as an SQS event.
pub fn parse_event(payload: Value) -> Result<SqsEvent, EventError> {
    let error = |detail: String| EventError {
        received: describe(&payload),
        detail,
    };
    let Some(records) = payload.get("Records") else {
        return Err(error("there is no \"Records\" field".to_owned()));
    };
    let Some(records) = records.as_array() else {
        return Err(error(format!("\"Records\" is {}, not an array", kind(records))));
    };
    for (index, record) in records.iter().enumerate() {
        if !record.is_object() {
            return Err(error(format!(
                "record {index} is {}, not an object",
                kind(record)
            )));
        }
        if let Some(source) = event_source(record)
            && source != SQS_EVENT_SOURCE
        {
            return Err(error(format!(
                "record {index} comes from {source:?}, not {SQS_EVENT_SOURCE:?}"
            )));
        }
    }
    // From a reference, so the payload is still there to describe if it does not fit.
    match <SqsEvent as serde::Deserialize>::deserialize(&payload) {
        Ok(event) => Ok(event),
        Err(serde_error) => Err(error(format!(
            "the records do not have the SQS message shape: {serde_error}"
        ))),
    }
}

/// `eventSource` (SQS, S3, DynamoDB streams, Kinesis) or `EventSource` (SNS).
fn event_source(record: &Value) -> Option<&str> {
    record
        .get("eventSource")
        .or_else(|| record.get("EventSource"))
        .and_then(Value::as_str)
}

/// A short description of a payload's shape: its type, keys, or its records' source. Never values.
fn describe(payload: &Value) -> String {
    let Some(object) = payload.as_object() else {
        return kind(payload).to_owned();
    };
    if let Some(first) = object
        .get("Records")
        .and_then(Value::as_array)
        .and_then(|r| r.first())
        && let Some(source) = event_source(first)
    {
        return format!("an event whose records come from {source:?}");
    }
    if let (Some(source), Some(detail_type)) = (
        object.get("source").and_then(Value::as_str),
        object.get("detail-type").and_then(Value::as_str),
    ) {
        return format!("an EventBridge event (source {source:?}, detail-type {detail_type:?})");
    }
    let mut keys: Vec<&str> = object.keys().map(String::as_str).take(8).collect();
    keys.sort_unstable();
    if keys.is_empty() {
        return "an empty JSON object".to_owned();
    }
    let more = if object.len() > keys.len() { ", ..." } else { "" };
    format!("a JSON object with keys [{}{more}]", keys.join(", "))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_sqs_event_parses() {
        let event = parse_event(json!({"Records": [{"messageId": "m1", "eventSource": "aws:sqs"}]})).unwrap();
        assert_eq!(event.records[0].message_id.as_deref(), Some("m1"));
    }

    #[test]
    fn an_eventbridge_event_is_named() {
        let error =
            parse_event(json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}))
                .unwrap_err();
        assert!(error.received.contains("EventBridge"), "{error}");
        assert!(error.to_string().contains("SQS events"), "{error}");
    }

    #[test]
    fn records_from_another_source_are_named() {
        let error = parse_event(json!({"Records": [{"eventSource": "aws:s3", "s3": {}}]})).unwrap_err();
        assert!(error.to_string().contains("\"aws:s3\""), "{error}");
        let error = parse_event(json!({"Records": [{"EventSource": "aws:sns", "Sns": {}}]})).unwrap_err();
        assert!(error.to_string().contains("\"aws:sns\""), "{error}");
    }

    #[test]
    fn scalars_and_odd_shapes_are_described_without_values() {
        let error = parse_event(json!("secret-value")).unwrap_err();
        assert_eq!(error.received, "a string");
        assert!(!error.to_string().contains("secret-value"));
        let error = parse_event(json!({"Records": "x"})).unwrap_err();
        assert!(error.detail.contains("not an array"), "{error}");
        let error = parse_event(json!({"hello": "world"})).unwrap_err();
        assert_eq!(error.received, "a JSON object with keys [hello]");
    }
}
