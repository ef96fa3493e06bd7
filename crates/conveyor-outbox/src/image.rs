//! Stream records in one shape, whichever runtime read them (a Lambda `DynamoDB` event, the Streams API,
//! a test), and the outbox entry parsed from a record's new image.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use conveyor_core::{
    message::{AttributeValue as MessageAttribute, Attributes},
    port::OutgoingMessage,
};

use crate::table::{self, FORMAT_VERSION};

/// An attribute value of a stream image: the types an outbox item uses, anything else as `Other`.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string.
    S(String),
    /// A number, as its decimal text.
    N(String),
    /// Binary.
    B(Vec<u8>),
    /// A map.
    M(BTreeMap<String, Value>),
    /// Any other type (lists, sets, booleans, null): never part of an outbox item.
    Other,
}

/// An item image: attribute name to value.
pub type Image = BTreeMap<String, Value>;

/// What changed in a stream record.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new item (`INSERT`) with its new image.
    Insert(Image),
    /// A removed item (`REMOVE`) with its key attributes: an `INSERT` of the same key earlier in the
    /// same run was sent and deleted already (or deleted before it was sent) and is not sent again.
    Remove(Image),
    /// A modified item (`MODIFY`), or an `INSERT` without a new image: not relayed.
    Other,
}

/// One record of the outbox table's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// The record's sequence number within its shard.
    pub sequence_number: String,
    /// When the change was made (approximately, epoch milliseconds), for the relay's lag.
    pub created_at_millis: Option<u64>,
    /// The change.
    pub change: Change,
}

impl StreamRecord {
    /// A record from the stream's event name (`INSERT`, `MODIFY`, `REMOVE`), keys and new image.
    pub fn new(
        sequence_number: impl Into<String>,
        event_name: &str,
        keys: Option<Image>,
        new_image: Option<Image>,
    ) -> Self {
        let change = match (event_name, new_image, keys) {
            ("INSERT", Some(image), _) if !image.is_empty() => Change::Insert(image),
            ("REMOVE", _, Some(keys)) if !keys.is_empty() => Change::Remove(keys),
            _ => Change::Other,
        };
        Self {
            sequence_number: sequence_number.into(),
            created_at_millis: None,
            change,
        }
    }
}

/// An outbox item read back from a stream image, ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// The item id.
    pub id: String,
    /// The item's key attributes (name, value), to delete it once sent.
    pub key: Vec<(String, String)>,
    /// The target queue's URL.
    pub queue_url: String,
    /// The job type.
    pub job_type: String,
    /// The aggregate id.
    pub aggregate: String,
    /// The idempotency key.
    pub idempotency_key: String,
    /// The message to send.
    pub message: OutgoingMessage,
}

/// Why an image that is an outbox item cannot be sent.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// A required attribute is missing or of the wrong type.
    #[error("outbox item {id}: attribute {name} is missing or not a {expected}")]
    Missing {
        /// The item id, when readable.
        id: String,
        /// The attribute's name.
        name: &'static str,
        /// The type expected.
        expected: &'static str,
    },
    /// The item was written by a newer Conveyor.
    #[error(
        "outbox item {id} has format version {version}; this relay reads version {FORMAT_VERSION}: deploy the \
         relay with the producers' Conveyor version"
    )]
    NewerFormat {
        /// The item id.
        id: String,
        /// The item's format version.
        version: String,
    },
}

/// Parses an image: `Ok(None)` when it is not an outbox item (no `outbox_version`), an error when it is
/// one but cannot be sent.
pub fn parse(image: &Image, key_names: &[&str]) -> Result<Option<OutboxEntry>, ImageError> {
    let Some(version) = image.get(table::VERSION) else {
        return Ok(None);
    };
    let id = match image.get(table::ID) {
        Some(Value::S(id)) => id.clone(),
        _ => String::new(),
    };
    if *version != Value::N(FORMAT_VERSION.to_string()) {
        let version = match version {
            Value::N(text) | Value::S(text) => text.clone(),
            _ => "?".to_owned(),
        };
        return Err(ImageError::NewerFormat { id, version });
    }
    let string = |name: &'static str| match image.get(name) {
        Some(Value::S(text)) => Ok(text.clone()),
        _ => Err(ImageError::Missing {
            id: id.clone(),
            name,
            expected: "string",
        }),
    };
    let optional = |name: &str| match image.get(name) {
        Some(Value::S(text)) => Some(text.clone()),
        _ => None,
    };
    let mut key = Vec::new();
    for name in key_names {
        match image.get(*name) {
            Some(Value::S(value)) => key.push(((*name).to_owned(), value.clone())),
            _ => {
                return Err(ImageError::Missing {
                    id: id.clone(),
                    name: "table key",
                    expected: "string",
                });
            }
        }
    }
    let delay = match image.get(table::DELAY_MS) {
        Some(Value::N(millis)) => millis.parse::<u64>().ok().map(Duration::from_millis),
        _ => None,
    };
    let message = OutgoingMessage {
        body: string(table::BODY)?,
        attributes: attributes(image.get(table::ATTRIBUTES)),
        delay,
        group_id: optional(table::GROUP_ID),
        deduplication_id: optional(table::DEDUPLICATION_ID),
        trace_header: optional(table::TRACE_HEADER),
    };
    Ok(Some(OutboxEntry {
        key,
        queue_url: string(table::QUEUE_URL)?,
        job_type: string(table::JOB_TYPE)?,
        aggregate: string(table::AGGREGATE)?,
        idempotency_key: string(table::IDEMPOTENCY_KEY)?,
        message,
        id,
    }))
}

fn attributes(value: Option<&Value>) -> Attributes {
    let Some(Value::M(map)) = value else {
        return Attributes::new();
    };
    map.iter()
        .filter_map(|(name, value)| {
            let Value::M(entry) = value else { return None };
            let Some(Value::S(data_type)) = entry.get("type") else {
                return None;
            };
            let attribute = MessageAttribute {
                data_type: data_type.clone(),
                string_value: match entry.get("string") {
                    Some(Value::S(text)) => Some(text.clone()),
                    _ => None,
                },
                binary_value: match entry.get("binary") {
                    Some(Value::B(bytes)) => Some(bytes.clone()),
                    _ => None,
                },
            };
            Some((name.clone(), attribute))
        })
        .collect()
}

/// The conversion from one SDK's `AttributeValue` (the DynamoDB and DynamoDB Streams crates each have
/// their own type, of the same shape).
macro_rules! image_from {
    ($name:ident, $attribute:ty, $doc:literal) => {
        #[doc = $doc]
        pub fn $name(item: &HashMap<String, $attribute>) -> Image {
            fn value(attribute: &$attribute) -> Value {
                type A = $attribute;
                match attribute {
                    A::S(text) => Value::S(text.clone()),
                    A::N(text) => Value::N(text.clone()),
                    A::B(blob) => Value::B(blob.as_ref().to_vec()),
                    A::M(map) => Value::M(map.iter().map(|(k, v)| (k.clone(), value(v))).collect()),
                    _ => Value::Other,
                }
            }
            item.iter().map(|(k, v)| (k.clone(), value(v))).collect()
        }
    };
}

image_from!(
    from_dynamodb,
    aws_sdk_dynamodb::types::AttributeValue,
    "An image from DynamoDB's own attribute values (a `GetItem` answer, or an item built by [`crate::Outbox`])."
);
image_from!(
    from_streams,
    aws_sdk_dynamodbstreams::types::AttributeValue,
    "An image from the DynamoDB Streams API's attribute values."
);

#[cfg(test)]
mod tests {
    use conveyor_sqs::NewJob;

    use super::*;
    use crate::{Outbox, OutboxTable};

    #[test]
    fn an_item_reads_back_as_the_message_it_was_built_from() -> anyhow::Result<()> {
        let table = OutboxTable::new("t");
        let outbox = Outbox::new(table.clone(), "http://localhost/000/jobs");
        let job = NewJob::new("invoice", serde_json::json!({"order": 1}))
            .attribute("tenant", MessageAttribute::string("acme"))
            .delay(Duration::from_secs(30));
        let item = outbox.put_with_id(job.clone(), "order:1", "id-1")?;
        let keys: Vec<&str> = table.key_names().collect();
        let entry =
            parse(&from_dynamodb(item.item()), &keys)?.ok_or_else(|| anyhow::anyhow!("not outbox"))?;
        let expected = job.key("outbox:id-1").to_message("jobs")?;
        assert_eq!(entry.message.body, expected.body);
        assert_eq!(entry.message.attributes, expected.attributes);
        assert_eq!(entry.message.delay, expected.delay);
        assert_eq!(entry.aggregate, "order:1");
        assert_eq!(
            entry.key,
            vec![
                ("pk".to_owned(), "outbox#id-1".to_owned()),
                ("sk".to_owned(), "outbox#id-1".to_owned())
            ]
        );
        Ok(())
    }

    #[test]
    fn other_items_are_not_the_relays_and_broken_ones_say_what_is_wrong() {
        let business = Image::from([("pk".to_owned(), Value::S("order#1".to_owned()))]);
        assert_eq!(parse(&business, &["pk"]), Ok(None));
        let newer = Image::from([
            (table::VERSION.to_owned(), Value::N("2".to_owned())),
            (table::ID.to_owned(), Value::S("x".to_owned())),
        ]);
        assert!(matches!(
            parse(&newer, &["pk"]),
            Err(ImageError::NewerFormat { .. })
        ));
        let broken = Image::from([
            (table::VERSION.to_owned(), Value::N("1".to_owned())),
            ("pk".to_owned(), Value::S("outbox#x".to_owned())),
        ]);
        let error = parse(&broken, &["pk"]).unwrap_err();
        assert!(error.to_string().contains(table::BODY), "{error}");
    }
}
