//! [`Outbox`]: a job turned into the `TransactWriteItem` an application adds to its own transaction.
//!
//! The job goes through the producer's own encoding and checks ([`NewJob::to_message`]): size, attribute
//! count and names, schema version, delay, FIFO group. A job that would be refused at send time is refused
//! here, before the transaction, so a committed outbox item is always sendable.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use conveyor_core::limits::MAX_ITEM_BYTES;
use conveyor_core::port::OutgoingMessage;
use conveyor_sqs::{NewJob, ProduceError};
use serde::Serialize;

use crate::table::{self, OutboxTable};

/// Why a job could not be put in the outbox.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The job breaks one of the producer's checks (the same error [`conveyor_sqs::Producer::send`]
    /// would return).
    #[error(transparent)]
    Job(#[from] ProduceError),
    /// The aggregate id is empty or too long.
    #[error(
        "job {job_type}: the aggregate id must be 1 to 128 characters (it becomes the FIFO message group \
         id), got {length}"
    )]
    InvalidAggregate {
        /// The job type.
        job_type: String,
        /// The aggregate id's length.
        length: usize,
    },
    /// The item id is empty or too long.
    #[error(
        "job {job_type}: the outbox item id must be 1 to 100 characters (it becomes the FIFO \
         deduplication id), got {length}"
    )]
    InvalidId {
        /// The job type.
        job_type: String,
        /// The id's length.
        length: usize,
    },
    /// The encoded job does not fit in a DynamoDB item.
    #[error(
        "job {job_type}: the outbox item is about {size} bytes, over DynamoDB's item limit of {limit} bytes \
         (the job itself may be up to 1 MiB on SQS, but the outbox holds it in one item): store the \
         payload elsewhere (S3) and put a reference in the job"
    )]
    TooLarge {
        /// The job type.
        job_type: String,
        /// The item's estimated size.
        size: usize,
        /// DynamoDB's limit.
        limit: usize,
    },
    /// The item could not be built (a required field missing).
    #[error("the outbox item could not be built: {0}")]
    Build(String),
}

/// Puts jobs for one queue in the outbox table, as items of the application's own transaction.
///
/// ```
/// use conveyor_outbox::{Outbox, OutboxTable};
/// use conveyor_sqs::NewJob;
///
/// #[derive(serde::Serialize)]
/// struct Invoice { order_id: u64 }
///
/// let outbox = Outbox::new(
///     OutboxTable::new("orders"),
///     "https://sqs.us-east-1.amazonaws.com/123456789012/invoices",
/// );
/// let item = outbox.put(NewJob::new("invoice", Invoice { order_id: 42 }), "order:42")?;
/// // client.transact_write_items().transact_items(order_put).transact_items(item.into()).send().await?;
/// assert!(item.idempotency_key().starts_with("outbox:"));
/// # Ok::<(), conveyor_outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Outbox {
    table: OutboxTable,
    queue_url: String,
    queue_name: String,
    ttl: Duration,
}

/// One outbox item: the `Put` to add to the application's `TransactWriteItems`.
#[derive(Debug, Clone)]
pub struct OutboxItem {
    id: String,
    idempotency_key: String,
    item: HashMap<String, AttributeValue>,
    put: TransactWriteItem,
}

impl OutboxItem {
    /// The item id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The idempotency key the consumer settles the job under: the job's own key when it set one,
    /// otherwise `outbox:<item id>`.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The item's attributes (for `BatchWriteItem` or inspection).
    pub fn item(&self) -> &HashMap<String, AttributeValue> {
        &self.item
    }

    /// The `TransactWriteItem`: a `Put` conditional on the item not existing yet.
    pub fn transact_item(&self) -> TransactWriteItem {
        self.put.clone()
    }
}

impl From<OutboxItem> for TransactWriteItem {
    fn from(item: OutboxItem) -> Self {
        item.put
    }
}

impl Outbox {
    /// An outbox in `table` for the queue at `queue_url` (FIFO when its name ends in `.fifo`).
    pub fn new(table: OutboxTable, queue_url: impl Into<String>) -> Self {
        let queue_url = queue_url.into();
        let queue_name = queue_url.rsplit('/').next().unwrap_or_default().to_owned();
        Self {
            table,
            queue_url,
            queue_name,
            ttl: table::DEFAULT_TTL,
        }
    }

    /// How long an outbox item lives if it is never deleted (default [`table::DEFAULT_TTL`]): the TTL
    /// attribute is a backstop, not what removes sent items.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// The item for `job`, with a new random id. `aggregate` orders jobs: the relay sends the jobs of one
    /// aggregate in the order their transactions committed, and on a FIFO queue it is the message group
    /// id (replacing a group id set on the job).
    pub fn put<J: Serialize>(&self, job: NewJob<J>, aggregate: &str) -> Result<OutboxItem, OutboxError> {
        self.put_with_id(job, aggregate, &uuid::Uuid::new_v4().to_string())
    }

    /// The item for a job that needs no order relative to other jobs: its aggregate is its own item id,
    /// so the relay batches it freely.
    pub fn put_unordered<J: Serialize>(&self, job: NewJob<J>) -> Result<OutboxItem, OutboxError> {
        let id = uuid::Uuid::new_v4().to_string();
        self.put_with_id(job, &id, &id)
    }

    /// As [`Outbox::put`] with an id the application chose (1 to 100 characters: letters, digits and
    /// punctuation, as SQS allows in a deduplication id). Putting the same id twice fails the second
    /// transaction (`ConditionalCheckFailed`).
    pub fn put_with_id<J: Serialize>(
        &self,
        job: NewJob<J>,
        aggregate: &str,
        id: &str,
    ) -> Result<OutboxItem, OutboxError> {
        let job_type = job.job_type().to_owned();
        if aggregate.is_empty() || aggregate.len() > 128 {
            return Err(OutboxError::InvalidAggregate {
                job_type,
                length: aggregate.len(),
            });
        }
        if id.is_empty() || id.len() > 100 {
            return Err(OutboxError::InvalidId {
                job_type,
                length: id.len(),
            });
        }
        let fifo = self.queue_name.ends_with(".fifo");
        let key = job
            .producer_key()
            .map_or_else(|| format!("outbox:{id}"), str::to_owned);
        let mut job = job.key(key.clone());
        if fifo {
            job = job.group_id(aggregate);
        }
        let mut message = job.to_message(&self.queue_name)?;
        if fifo && message.deduplication_id.is_none() {
            message.deduplication_id = Some(id.to_owned());
        }
        let item = self.item(&message, &job_type, aggregate, &key, id);
        let size = item_size(&item);
        if size > MAX_ITEM_BYTES {
            return Err(OutboxError::TooLarge {
                job_type,
                size,
                limit: MAX_ITEM_BYTES,
            });
        }
        let put = Put::builder()
            .table_name(&self.table.name)
            .set_item(Some(item.clone()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", &self.table.partition_key)
            .build()
            .map_err(|error| OutboxError::Build(error.to_string()))?;
        Ok(OutboxItem {
            id: id.to_owned(),
            idempotency_key: key,
            item,
            put: TransactWriteItem::builder().put(put).build(),
        })
    }

    fn item(
        &self,
        message: &OutgoingMessage,
        job_type: &str,
        aggregate: &str,
        key: &str,
        id: &str,
    ) -> HashMap<String, AttributeValue> {
        let now = SystemTime::now();
        let now_millis = conveyor_core::runtime::epoch_millis(now);
        let expires = now_millis / 1000 + self.ttl.as_secs();
        let string = |value: &str| AttributeValue::S(value.to_owned());
        let number = |value: u64| AttributeValue::N(value.to_string());
        let mut item = HashMap::new();
        for name in self.table.key_names() {
            item.insert(name.to_owned(), string(&OutboxTable::key_value(id)));
        }
        item.insert(
            table::VERSION.to_owned(),
            number(u64::from(table::FORMAT_VERSION)),
        );
        item.insert(table::ID.to_owned(), string(id));
        item.insert(table::QUEUE_URL.to_owned(), string(&self.queue_url));
        item.insert(table::JOB_TYPE.to_owned(), string(job_type));
        item.insert(table::AGGREGATE.to_owned(), string(aggregate));
        item.insert(table::IDEMPOTENCY_KEY.to_owned(), string(key));
        item.insert(table::BODY.to_owned(), string(&message.body));
        item.insert(table::ATTRIBUTES.to_owned(), attributes_value(message));
        item.insert(table::CREATED_AT.to_owned(), number(now_millis));
        item.insert(self.table.ttl_attribute.clone(), number(expires));
        if let Some(delay) = message.delay {
            let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            item.insert(table::DELAY_MS.to_owned(), number(millis));
        }
        let optional = [
            (table::GROUP_ID, &message.group_id),
            (table::DEDUPLICATION_ID, &message.deduplication_id),
            (table::TRACE_HEADER, &message.trace_header),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                item.insert(name.to_owned(), string(value));
            }
        }
        item
    }
}

/// The message attributes as a map of name to `{type, string}` or `{type, binary}`.
fn attributes_value(message: &OutgoingMessage) -> AttributeValue {
    let map = message
        .attributes
        .iter()
        .map(|(name, value)| {
            let mut entry = HashMap::from([("type".to_owned(), AttributeValue::S(value.data_type.clone()))]);
            if let Some(text) = &value.string_value {
                entry.insert("string".to_owned(), AttributeValue::S(text.clone()));
            }
            if let Some(bytes) = &value.binary_value {
                entry.insert(
                    "binary".to_owned(),
                    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bytes.clone())),
                );
            }
            (name.clone(), AttributeValue::M(entry))
        })
        .collect();
    AttributeValue::M(map)
}

/// The item's size as DynamoDB counts it, erring upward: names plus values, numbers as 21 bytes, 3 bytes
/// of overhead per map entry.
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(_) => 21,
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(name, value)| name.len() + 1 + value_size(value))
                .sum::<usize>()
        }
        _ => 21,
    }
}

#[cfg(test)]
mod tests {
    use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;

    use super::*;

    fn string<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> &'a str {
        item.get(name)
            .and_then(|value| value.as_s().ok())
            .map_or("", String::as_str)
    }

    #[test]
    fn the_item_carries_the_encoded_job_and_a_derived_key() -> anyhow::Result<()> {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs");
        let item = outbox.put_with_id(NewJob::new("invoice", 7), "order:1", "abc")?;
        assert_eq!(item.idempotency_key(), "outbox:abc");
        let fields = item.item();
        assert_eq!(string(fields, "pk"), "outbox#abc");
        assert_eq!(string(fields, "sk"), "outbox#abc");
        assert_eq!(string(fields, table::BODY), "7");
        assert_eq!(string(fields, table::AGGREGATE), "order:1");
        assert!(
            !fields.contains_key(table::GROUP_ID),
            "standard queues get no group"
        );
        let attributes = fields
            .get(table::ATTRIBUTES)
            .and_then(|value| value.as_m().ok())
            .ok_or_else(|| anyhow::anyhow!("no attributes"))?;
        assert!(attributes.contains_key(IDEMPOTENCY_KEY_ATTRIBUTE));
        let put = item.transact_item();
        let put = put.put().ok_or_else(|| anyhow::anyhow!("not a put"))?;
        assert_eq!(put.condition_expression(), Some("attribute_not_exists(#pk)"));
        Ok(())
    }

    #[test]
    fn fifo_items_group_by_aggregate_and_deduplicate_by_id() -> anyhow::Result<()> {
        let outbox = Outbox::new(
            OutboxTable::new("t").sort_key(None),
            "http://localhost/000/jobs.fifo",
        );
        let item = outbox.put_with_id(NewJob::new("invoice", 7).key("invoice:7"), "order:1", "abc")?;
        assert_eq!(item.idempotency_key(), "invoice:7", "the job's own key wins");
        assert_eq!(string(item.item(), table::GROUP_ID), "order:1");
        assert_eq!(string(item.item(), table::DEDUPLICATION_ID), "abc");
        assert!(!item.item().contains_key("sk"));
        Ok(())
    }

    #[test]
    fn the_producers_checks_and_the_item_limit_apply_before_the_transaction() {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs.fifo");
        let delayed = outbox.put(NewJob::new("t", 1).delay(Duration::from_secs(5)), "a");
        assert!(matches!(
            delayed,
            Err(OutboxError::Job(ProduceError::DelayOnFifo { .. }))
        ));
        let standard = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs");
        let big = standard.put(NewJob::new("t", "x".repeat(500 * 1024)), "a");
        let Err(error) = big else {
            panic!("a 500 KB job fits no item")
        };
        assert!(error.to_string().contains("409600"), "{error}");
        assert!(matches!(
            standard.put(NewJob::new("t", 1), ""),
            Err(OutboxError::InvalidAggregate { .. })
        ));
    }
}
