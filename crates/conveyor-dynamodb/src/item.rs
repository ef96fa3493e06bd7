//! The record layout: building the in-progress item and reading any record (Conveyor's or Powertools')
//! back into an [`IdempotencyRecord`].
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `id` | S | the key (partition key) |
//! | `status` | S | `INPROGRESS` or `COMPLETED` |
//! | `expiration` | N | record expiry, epoch seconds (the TTL attribute) |
//! | `in_progress_expiration` | N | lease end, epoch milliseconds (absent on some Powertools records) |
//! | `data` | S | output JSON, completed records only |
//! | `validation` | S | payload hash, when validation is on |
//! | `fencing_token` | S | the claim's token (absent on Powertools' records) |

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::{ClaimRequest, IdempotencyRecord, RecordStatus, StoreError};

use crate::options::AttributeNames;

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
pub(crate) fn string(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// The item a claim writes: in progress, with its lease, expiry, token and validation.
pub(crate) fn in_progress(names: &AttributeNames, request: &ClaimRequest, token: &str) -> Item {
    let mut item = Item::with_capacity(6);
    item.insert(names.id.clone(), string(&request.key));
    item.insert(names.status.clone(), string(RecordStatus::InProgress.as_str()));
    item.insert(names.expiration.clone(), number(epoch_secs(request.expires_at)));
    item.insert(
        names.in_progress_expiration.clone(),
        number(epoch_millis(request.lease_until)),
    );
    item.insert(names.fencing_token.clone(), string(token));
    if let Some(validation) = &request.validation {
        item.insert(names.validation.clone(), string(validation));
    }
    item
}

/// Reads a stored item. `key` is the key that was asked for (used when the item lacks its id, and in
/// error messages); `table` names the table in error messages.
pub(crate) fn parse_record(
    names: &AttributeNames,
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
            "attribute `{}` is {status_text:?}; expected \"INPROGRESS\" or \"COMPLETED\"",
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
    Ok(IdempotencyRecord {
        key: reader.optional_string(&names.id)?.unwrap_or(key).to_owned(),
        status,
        expires_at: UNIX_EPOCH + Duration::from_secs(expiration),
        lease_until: lease_millis.map(|millis| UNIX_EPOCH + Duration::from_millis(millis)),
        output: reader.optional_string(&names.data)?.map(str::to_owned),
        validation: reader.optional_string(&names.validation)?.map(str::to_owned),
        token: reader.optional_string(&names.fencing_token)?.map(str::to_owned),
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

fn type_name(value: &AttributeValue) -> &'static str {
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
        let record = parse_record(&names(), "t", "asked", &powertools_completed()).unwrap();
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
        let record = parse_record(&names(), "t", "asked", &item).unwrap();
        assert_eq!(record.key, "asked");
        assert_eq!(record.lease_until, None);
    }

    #[test]
    fn fractional_and_negative_numbers_are_tolerated() {
        let mut item = powertools_completed();
        item.insert("expiration".into(), AttributeValue::N("1795964720.75".into()));
        item.insert("in_progress_expiration".into(), AttributeValue::N("-5".into()));
        let record = parse_record(&names(), "t", "k", &item).unwrap();
        assert_eq!(record.expires_at, UNIX_EPOCH + Duration::from_secs(1_795_964_720));
        assert_eq!(record.lease_until, Some(UNIX_EPOCH));
    }

    #[test]
    fn an_unknown_status_is_misconfigured_and_names_the_key() {
        let mut item = powertools_completed();
        item.insert("status".into(), AttributeValue::S("EXPIRED".into()));
        let error = parse_record(&names(), "jobs-idem", "k-1", &item).unwrap_err();
        let StoreError::Misconfigured { message } = error else {
            panic!("expected Misconfigured, got {error:?}");
        };
        assert!(message.contains("\"k-1\""), "{message}");
        assert!(message.contains("jobs-idem"), "{message}");
        assert!(message.contains("EXPIRED"), "{message}");
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
            let error = parse_record(&names(), "t", "k", &item).unwrap_err();
            assert!(matches!(error, StoreError::Misconfigured { .. }), "{error:?}");
        }
    }

    #[test]
    fn an_in_progress_item_round_trips() {
        let now = SystemTime::now();
        let request = ClaimRequest {
            key: "conveyor:email#user:42".into(),
            lease_until: now + Duration::from_secs(30),
            expires_at: now + Duration::from_secs(3600),
            validation: Some("abc".into()),
        };
        let item = in_progress(&names(), &request, "tok");
        assert_eq!(item.len(), 6);
        let record = parse_record(&names(), "t", &request.key, &item).unwrap();
        assert_eq!(record.status, RecordStatus::InProgress);
        assert_eq!(record.token.as_deref(), Some("tok"));
        assert_eq!(record.validation.as_deref(), Some("abc"));
        assert_eq!(
            epoch_millis(record.lease_until.unwrap()),
            epoch_millis(request.lease_until)
        );
        assert_eq!(epoch_secs(record.expires_at), epoch_secs(request.expires_at));
    }
}
