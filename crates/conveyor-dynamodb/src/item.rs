//! The record layout: building the in-progress item and reading any record (Conveyor's or Powertools')
//! back into an [`IdempotencyRecord`].
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `id` | S | the key (partition key) |
//! | `status` | S | `INPROGRESS` or `COMPLETED` |
//! | `expiration` | N | record expiry, epoch seconds (the TTL attribute) |
//! | `in_progress_expiration` | N | lease end, epoch milliseconds (absent on some Powertools records) |
//! | `data` | S or native | output: JSON text (Python, Conveyor's default) or a native value such as M (TypeScript) |
//! | `validation` | S | payload hash, when validation is on |
//! | `fence` | N | the claim's fencing token (absent on Powertools' records) |
//!
//! `status` may also be `EXPIRED` (Powertools writes it for a record saved after its own expiry). With a
//! sort key ([`SortKey`]) the id sits in the sort key and the partition key holds a constant.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use conveyor_core::port::{IdempotencyRecord, RecordStatus, StoreError};
use serde_json::Value;

use crate::options::{AttributeNames, DataFormat, SortKey};

/// One DynamoDB item.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Whole seconds since the epoch (0 for earlier times).
pub(crate) fn epoch_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// Whole milliseconds since the epoch (0 for earlier times).
pub(crate) fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// A number attribute.
pub(crate) fn number(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// A string attribute.
/// A string attribute of `item`, when it is one.
pub(crate) fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Some(text),
        _ => None,
    }
}

/// A whole-number attribute of `item`, when it is one.
pub(crate) fn whole(item: &Item, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().ok(),
        _ => None,
    }
}

pub(crate) fn string(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// The primary key of record `id`: `{id: <id>}`, or with a sort key `{id: <constant>, <sort key>: <id>}`.
pub(crate) fn primary_key(names: &AttributeNames, sort_key: Option<&SortKey>, id: &str) -> Item {
    match sort_key {
        None => Item::from([(names.id.clone(), string(id))]),
        Some(sort_key) => Item::from([
            (names.id.clone(), string(&sort_key.partition_value)),
            (sort_key.attribute.clone(), string(id)),
        ]),
    }
}

/// The output as `complete` writes it into `data`.
pub(crate) fn output_value(format: DataFormat, output: &str) -> AttributeValue {
    if format == DataFormat::JsonString {
        return string(output);
    }
    match serde_json::from_str::<Value>(output) {
        Ok(value) => native(value),
        Err(_) => string(output),
    }
}

/// A JSON value as DynamoDB's native types, as the AWS SDK for JavaScript's `marshall` writes it.
fn native(value: Value) -> AttributeValue {
    match value {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(flag) => AttributeValue::Bool(flag),
        Value::Number(number) => AttributeValue::N(number.to_string()),
        Value::String(text) => AttributeValue::S(text),
        Value::Array(items) => AttributeValue::L(items.into_iter().map(native).collect()),
        Value::Object(map) => {
            AttributeValue::M(map.into_iter().map(|(key, item)| (key, native(item))).collect())
        }
    }
}

/// A native DynamoDB value as JSON (sets as arrays, binary as base64 text).
fn to_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(text) => Value::String(text.clone()),
        AttributeValue::N(text) => number_json(text),
        AttributeValue::Bool(flag) => Value::Bool(*flag),
        AttributeValue::L(items) => Value::Array(items.iter().map(to_json).collect()),
        AttributeValue::M(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (key.clone(), to_json(item)))
                .collect(),
        ),
        AttributeValue::Ss(items) => Value::Array(items.iter().cloned().map(Value::String).collect()),
        AttributeValue::Ns(items) => Value::Array(items.iter().map(|text| number_json(text)).collect()),
        AttributeValue::B(blob) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(blob.as_ref()))
        }
        AttributeValue::Bs(blobs) => Value::Array(
            blobs
                .iter()
                .map(|blob| Value::String(base64::engine::general_purpose::STANDARD.encode(blob.as_ref())))
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// A DynamoDB number as a JSON number (as text when JSON cannot hold it).
fn number_json(text: &str) -> Value {
    serde_json::from_str::<serde_json::Number>(text)
        .map_or_else(|_| Value::String(text.to_owned()), Value::Number)
}

/// Reads a stored item. `key` is the key that was asked for (used when the item lacks its id, and in
/// error messages); `table` names the table in error messages.
pub(crate) fn parse_record(
    names: &AttributeNames,
    sort_key: Option<&SortKey>,
    table: &str,
    key: &str,
    item: &Item,
) -> Result<IdempotencyRecord, StoreError> {
    let reader = Reader {
        names,
        table,
        key,
        item,
    };
    let status_text = reader.required_string(&names.status)?;
    let status = RecordStatus::parse(status_text).ok_or_else(|| {
        reader.malformed(format!(
            "attribute `{}` is {status_text:?}; expected \"INPROGRESS\", \"COMPLETED\" or \"EXPIRED\"",
            names.status
        ))
    })?;
    let expiration = reader.number(&names.expiration)?.ok_or_else(|| {
        reader.malformed(format!(
            "attribute `{}` (epoch seconds) is missing",
            names.expiration
        ))
    })?;
    let lease_millis = reader.number(&names.in_progress_expiration)?;
    let id_attribute = sort_key.map_or(&names.id, |sort_key| &sort_key.attribute);
    Ok(IdempotencyRecord {
        key: reader.optional_string(id_attribute)?.unwrap_or(key).to_owned(),
        status,
        expires_at: UNIX_EPOCH + Duration::from_secs(expiration),
        lease_until: lease_millis.map(|millis| UNIX_EPOCH + Duration::from_millis(millis)),
        output: reader.output(&names.data),
        validation: reader.optional_string(&names.validation)?.map(str::to_owned),
        token: reader.number(&names.fencing_token)?,
        last_attempt: matches!(
            item.get(crate::jobs::LAST_ATTEMPT),
            Some(AttributeValue::Bool(true))
        ),
    })
}

/// Typed access to one item's attributes, with errors that name the table, the key and the attribute.
struct Reader<'a> {
    names: &'a AttributeNames,
    table: &'a str,
    key: &'a str,
    item: &'a Item,
}

impl<'a> Reader<'a> {
    fn malformed(&self, what: String) -> StoreError {
        StoreError::Misconfigured {
            message: format!(
                "idempotency record {:?} in table {} is malformed: {what} (is another application writing \
                 this table with other attribute names? `{}` is the partition key here)",
                self.key, self.table, self.names.id
            ),
        }
    }

    fn optional_string(&self, name: &str) -> Result<Option<&'a str>, StoreError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(text)) => Ok(Some(text.as_str())),
            Some(other) => Err(self.malformed(format!(
                "attribute `{name}` should be a string (S), found {}",
                type_name(other)
            ))),
        }
    }

    /// The output: a string as is (Python's JSON text), any other value as JSON (TypeScript's native
    /// map, list, number...).
    fn output(&self, name: &str) -> Option<String> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => None,
            Some(AttributeValue::S(text)) => Some(text.clone()),
            Some(other) => Some(to_json(other).to_string()),
        }
    }

    fn required_string(&self, name: &str) -> Result<&'a str, StoreError> {
        self.optional_string(name)?
            .ok_or_else(|| self.malformed(format!("attribute `{name}` is missing")))
    }

    /// A whole number of seconds or milliseconds. Written as integers by Conveyor and Powertools;
    /// a fractional number is truncated, a negative one counts as the epoch.
    fn number(&self, name: &str) -> Result<Option<u64>, StoreError> {
        let text = match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => return Ok(None),
            Some(AttributeValue::N(text)) => text,
            Some(other) => {
                return Err(self.malformed(format!(
                    "attribute `{name}` should be a number (N), found {}",
                    type_name(other)
                )));
            }
        };
        if let Ok(whole) = text.parse::<u64>() {
            return Ok(Some(whole));
        }
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() => Ok(Some(truncate(value))),
            _ => Err(self.malformed(format!("attribute `{name}` is not a number: {text:?}"))),
        }
    }
}

/// A finite float as a whole, non-negative number (saturating).
fn truncate(value: f64) -> u64 {
    if value <= 0.0 {
        return 0;
    }
    // `as` saturates for floats out of range, which is what we want here.
    value.trunc() as u64
}

pub(crate) fn type_name(value: &AttributeValue) -> &'static str {
    match value {
        AttributeValue::B(_) => "binary (B)",
        AttributeValue::Bool(_) => "boolean (BOOL)",
        AttributeValue::Bs(_) => "binary set (BS)",
        AttributeValue::L(_) => "list (L)",
        AttributeValue::M(_) => "map (M)",
        AttributeValue::N(_) => "number (N)",
        AttributeValue::Ns(_) => "number set (NS)",
        AttributeValue::Null(_) => "null (NULL)",
        AttributeValue::S(_) => "string (S)",
        AttributeValue::Ss(_) => "string set (SS)",
        _ => "an unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> AttributeNames {
        AttributeNames::default()
    }

    fn powertools_completed() -> Item {
        // item_completed from ../shared/reference/powertools-idempotency-record.json (Powertools 3.37.0).
        Item::from([
            ("expiration".to_owned(), AttributeValue::N("1795964720".into())),
            (
                "in_progress_expiration".to_owned(),
                AttributeValue::N("1795961180693".into()),
            ),
            (
                "id".to_owned(),
                AttributeValue::S(
                    "peers-bench-fn.__main__.record_handler#3511ac31c0c52af1547a237943ec42a9".into(),
                ),
            ),
            (
                "data".to_owned(),
                AttributeValue::S(
                    r#"{"messageId": "f03c5386-ffaa-4261-84fe-68fdd7caeb19", "ok": true}"#.into(),
                ),
            ),
            ("status".to_owned(), AttributeValue::S("COMPLETED".into())),
        ])
    }

    #[test]
    fn reads_a_powertools_completed_record() {
        let record = parse_record(&names(), None, "t", "asked", &powertools_completed()).unwrap();
        assert_eq!(
            record.key,
            "peers-bench-fn.__main__.record_handler#3511ac31c0c52af1547a237943ec42a9"
        );
        assert_eq!(record.status, RecordStatus::Completed);
        assert_eq!(record.expires_at, UNIX_EPOCH + Duration::from_secs(1_795_964_720));
        assert_eq!(
            record.lease_until,
            Some(UNIX_EPOCH + Duration::from_millis(1_795_961_180_693))
        );
        assert_eq!(
            record.output.as_deref(),
            Some(r#"{"messageId": "f03c5386-ffaa-4261-84fe-68fdd7caeb19", "ok": true}"#)
        );
        assert_eq!(record.token, None);
        assert_eq!(record.validation, None);
    }

    #[test]
    fn a_record_without_lease_or_id_is_read_with_the_asked_key() {
        let mut item = powertools_completed();
        item.remove("in_progress_expiration");
        item.remove("id");
        let record = parse_record(&names(), None, "t", "asked", &item).unwrap();
        assert_eq!(record.key, "asked");
        assert_eq!(record.lease_until, None);
    }

    #[test]
    fn fractional_and_negative_numbers_are_tolerated() {
        let mut item = powertools_completed();
        item.insert("expiration".into(), AttributeValue::N("1795964720.75".into()));
        item.insert("in_progress_expiration".into(), AttributeValue::N("-5".into()));
        let record = parse_record(&names(), None, "t", "k", &item).unwrap();
        assert_eq!(record.expires_at, UNIX_EPOCH + Duration::from_secs(1_795_964_720));
        assert_eq!(record.lease_until, Some(UNIX_EPOCH));
    }

    #[test]
    fn an_unknown_status_is_misconfigured_and_names_the_key() {
        let mut item = powertools_completed();
        item.insert("status".into(), AttributeValue::S("DONE".into()));
        let error = parse_record(&names(), None, "jobs-idem", "k-1", &item).unwrap_err();
        let StoreError::Misconfigured { message } = error else {
            panic!("expected Misconfigured, got {error:?}");
        };
        assert!(message.contains("\"k-1\""), "{message}");
        assert!(message.contains("jobs-idem"), "{message}");
        assert!(message.contains("DONE"), "{message}");
    }

    #[test]
    fn expired_status_and_typescript_native_data_are_read() {
        let mut item = powertools_completed();
        item.insert("status".into(), AttributeValue::S("EXPIRED".into()));
        item.insert(
            "data".into(),
            AttributeValue::M(HashMap::from([
                ("ok".to_owned(), AttributeValue::Bool(true)),
                ("n".to_owned(), AttributeValue::N("42".into())),
                (
                    "tags".to_owned(),
                    AttributeValue::L(vec![AttributeValue::S("a".into())]),
                ),
            ])),
        );
        let record = parse_record(&names(), None, "t", "k", &item).unwrap();
        assert_eq!(record.status, RecordStatus::Expired);
        let output: Value = serde_json::from_str(record.output.as_deref().unwrap()).unwrap();
        assert_eq!(output, serde_json::json!({"ok": true, "n": 42, "tags": ["a"]}));
    }

    #[test]
    fn native_output_round_trips_and_a_sort_key_holds_the_id() {
        let written = output_value(DataFormat::Native, r#"{"id":"m-1","n":[1,2.5,null]}"#);
        assert!(matches!(written, AttributeValue::M(_)));
        assert_eq!(output_value(DataFormat::JsonString, "{}"), string("{}"));
        assert_eq!(output_value(DataFormat::Native, "not json"), string("not json"));
        let sort_key = SortKey {
            attribute: "sk".into(),
            partition_value: "idempotency#fn".into(),
        };
        let mut item = primary_key(&names(), Some(&sort_key), "fn#abc");
        assert_eq!(item.get("id"), Some(&string("idempotency#fn")));
        item.insert("status".into(), string("COMPLETED"));
        item.insert("expiration".into(), number(1));
        item.insert("data".into(), written);
        item.insert("fence".into(), number(7));
        let record = parse_record(&names(), Some(&sort_key), "t", "asked", &item).unwrap();
        assert_eq!(record.key, "fn#abc");
        assert_eq!(record.token, Some(7));
        let output: Value = serde_json::from_str(record.output.as_deref().unwrap()).unwrap();
        assert_eq!(output, serde_json::json!({"id": "m-1", "n": [1, 2.5, null]}));
    }

    #[test]
    fn wrong_types_and_missing_attributes_are_misconfigured() {
        let mut wrong_type = powertools_completed();
        wrong_type.insert("expiration".into(), AttributeValue::S("1795964720".into()));
        let mut missing_status = powertools_completed();
        missing_status.remove("status");
        let mut missing_expiry = powertools_completed();
        missing_expiry.remove("expiration");
        let mut not_a_number = powertools_completed();
        not_a_number.insert("expiration".into(), AttributeValue::N("soon".into()));
        for item in [wrong_type, missing_status, missing_expiry, not_a_number] {
            let error = parse_record(&names(), None, "t", "k", &item).unwrap_err();
            assert!(matches!(error, StoreError::Misconfigured { .. }), "{error:?}");
        }
    }
}
