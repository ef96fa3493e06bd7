//! [`Outbox`]: jobs turned into the `TransactWriteItem`s an application adds to its own DynamoDB
//! transaction.
//!
//! # Design note: the sequence
//!
//! Each aggregate has a head item holding the last sequence number allocated. The jobs of one
//! [`Outbox::put`] take the next numbers, and the transaction updates the head on the condition that it
//! still holds the number read before ([`Outbox::head`], one consistent `GetItem`). Two transactions
//! that read the same head cannot both commit: the second fails with `TransactionCanceledException`
//! (reason `ConditionalCheckFailed` on the head) and the application runs it again, as it would for
//! any optimistic write ([`is_sequence_conflict`] tells it apart). So job `n + 1` of an aggregate commits
//! only after job `n`, which is what the relay's order rests on (`relay.rs`).

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use conveyor_core::limits::MAX_ITEM_BYTES;
use conveyor_core::port::OutgoingMessage;
use conveyor_sqs::{NewJob, ProduceError};
use serde::Serialize;

use crate::encode::{EncodedJob, encode};
use crate::table::{self, OutboxTable};

/// Why a job could not be put in the outbox.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The job breaks one of the producer's checks (the same error [`conveyor_sqs::Producer::send`]
    /// would return).
    #[error(transparent)]
    Job(#[from] ProduceError),
    /// The aggregate id is empty, too long or reserved.
    #[error(
        "job {job_type}: the aggregate id must be 1 to 128 characters (it becomes the FIFO message group \
         id) and must not start with `lease#`, got {length} bytes"
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
    /// More jobs than one transaction holds.
    #[error(
        "{count} jobs for one aggregate: a DynamoDB transaction holds 100 items, one of them the \
         aggregate's head; split them over transactions"
    )]
    TooManyJobs {
        /// The jobs given.
        count: usize,
    },
    /// The aggregate's head could not be read.
    #[error("reading the outbox head of aggregate {aggregate} in table {table}: {message}")]
    Head {
        /// The table.
        table: String,
        /// The aggregate.
        aggregate: String,
        /// The SDK's error.
        message: String,
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
/// // `head` is what `outbox.head(&client, "order:42").await?` read (0 for a new aggregate).
/// let write = outbox.put_after(vec![NewJob::new("invoice", Invoice { order_id: 42 })], "order:42", 0)?;
/// assert_eq!(write.transact_items().len(), 2, "the job and the aggregate's head");
/// // client.transact_write_items().transact_items(order_put).set_transact_items(Some(write.transact_items())).send().await?;
/// assert!(write.idempotency_keys()[0].starts_with("outbox:"));
/// # Ok::<(), conveyor_outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Outbox {
    table: OutboxTable,
    queue_url: String,
}

/// The items of one [`Outbox::put`]: the jobs and the aggregate's head update, to add to the application's
/// `TransactWriteItems`.
#[derive(Debug, Clone, Default)]
pub struct OutboxWrite {
    ids: Vec<String>,
    idempotency_keys: Vec<String>,
    items: Vec<HashMap<String, AttributeValue>>,
    transact_items: Vec<TransactWriteItem>,
    /// The head as an item (for bulk loads, which cannot run the head's update).
    head_item: Option<HashMap<String, AttributeValue>>,
}

impl OutboxWrite {
    /// The jobs' item ids.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The idempotency keys the consumer settles the jobs under: each job's own key when it set one,
    /// otherwise `outbox:<item id>`.
    pub fn idempotency_keys(&self) -> &[String] {
        &self.idempotency_keys
    }

    /// The jobs' items (for inspection and the benchmark's bulk writes).
    pub fn items(&self) -> &[HashMap<String, AttributeValue>] {
        &self.items
    }

    /// The aggregate's head after this write, as a whole item: for loading a backlog in bulk
    /// (`BatchWriteItem`), not for transactions.
    #[doc(hidden)]
    pub fn head_item(&self) -> Option<&HashMap<String, AttributeValue>> {
        self.head_item.as_ref()
    }

    /// The `TransactWriteItem`s: one `Put` per job (conditional on the item not existing) and the head's
    /// `Update` (conditional on the sequence read before).
    pub fn transact_items(&self) -> Vec<TransactWriteItem> {
        self.transact_items.clone()
    }
}

impl IntoIterator for OutboxWrite {
    type Item = TransactWriteItem;
    type IntoIter = std::vec::IntoIter<TransactWriteItem>;

    fn into_iter(self) -> Self::IntoIter {
        self.transact_items.into_iter()
    }
}

/// True when a transaction failed because another transaction took the aggregate's next sequence
/// number first (or ran into it at the same moment): read the head again and run the transaction again.
/// False when the transaction failed for another reason, such as the application's own condition.
pub fn is_sequence_conflict(error: &aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError>) -> bool {
    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) = error.as_service_error()
    else {
        return false;
    };
    cancelled
        .cancellation_reasons()
        .iter()
        .any(|reason| match reason.code() {
            Some("TransactionConflict") => true,
            // The head's update returns the head it found (ALL_OLD): the only outbox item with a sequence
            // and no job id.
            Some("ConditionalCheckFailed") => reason
                .item()
                .is_some_and(|item| item.contains_key(table::SEQUENCE) && !item.contains_key(table::ID)),
            _ => false,
        })
}

impl Outbox {
    /// An outbox in `table` for the queue at `queue_url` (FIFO when its name ends in `.fifo`).
    pub fn new(table: OutboxTable, queue_url: impl Into<String>) -> Self {
        Self {
            table,
            queue_url: queue_url.into(),
        }
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// The last sequence number allocated to `aggregate` (0 for a new one): one consistent `GetItem`.
    pub async fn head(&self, client: &aws_sdk_dynamodb::Client, aggregate: &str) -> Result<u64, OutboxError> {
        let output = client
            .get_item()
            .table_name(&self.table.name)
            .key(
                &self.table.partition_key,
                AttributeValue::S(OutboxTable::aggregate_key(aggregate)),
            )
            .key(
                &self.table.sort_key,
                AttributeValue::S(table::HEAD_KEY.to_owned()),
            )
            .projection_expression("#sequence")
            .expression_attribute_names("#sequence", table::SEQUENCE)
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| OutboxError::Head {
                table: self.table.name.clone(),
                aggregate: aggregate.to_owned(),
                message: aws_sdk_dynamodb::error::DisplayErrorContext(&error).to_string(),
            })?;
        Ok(output
            .item
            .and_then(|item| item.get(table::SEQUENCE)?.as_n().ok()?.parse().ok())
            .unwrap_or(0))
    }

    /// The items for `job` as `aggregate`'s next job: reads the head, then builds the job's `Put` and the
    /// head's `Update`. `aggregate` orders jobs: the relay sends them in the order their transactions
    /// committed; on a FIFO queue it is the message group id (replacing a group id set on the job).
    pub async fn put<J: Serialize>(
        &self,
        client: &aws_sdk_dynamodb::Client,
        job: NewJob<J>,
        aggregate: &str,
    ) -> Result<OutboxWrite, OutboxError> {
        let head = self.head(client, aggregate).await?;
        self.put_after(vec![job], aggregate, head)
    }

    /// The items for `jobs` (in this order) as `aggregate`'s next jobs after sequence `head` (what
    /// [`Outbox::head`] read). Up to 99 jobs (a transaction holds 100 items, one is the head).
    pub fn put_after<J: Serialize>(
        &self,
        jobs: Vec<NewJob<J>>,
        aggregate: &str,
        head: u64,
    ) -> Result<OutboxWrite, OutboxError> {
        if jobs.is_empty() || jobs.len() > 99 {
            return Err(OutboxError::TooManyJobs { count: jobs.len() });
        }
        let mut write = OutboxWrite::default();
        let mut sequence = head;
        for job in jobs {
            sequence += 1;
            let id = uuid::Uuid::new_v4().to_string();
            let encoded = encode(job, &self.queue_url, aggregate, &id)?;
            self.push_job(&mut write, encoded, aggregate, sequence, &id, false)?;
        }
        write
            .transact_items
            .push(self.head_update(aggregate, head, sequence)?);
        let now = conveyor_core::runtime::epoch_millis(SystemTime::now());
        write.head_item = Some(HashMap::from([
            (
                self.table.partition_key.clone(),
                AttributeValue::S(OutboxTable::aggregate_key(aggregate)),
            ),
            (
                self.table.sort_key.clone(),
                AttributeValue::S(table::HEAD_KEY.to_owned()),
            ),
            (
                table::SEQUENCE.to_owned(),
                AttributeValue::N(sequence.to_string()),
            ),
            (
                table::PENDING.to_owned(),
                AttributeValue::S(pending_bucket(aggregate)),
            ),
            (table::CREATED_AT.to_owned(), AttributeValue::N(now.to_string())),
        ]));
        Ok(write)
    }

    /// The item for a job that needs no order relative to other jobs: an aggregate of its own (its item
    /// id), sequence 1, no head item.
    pub fn put_unordered<J: Serialize>(&self, job: NewJob<J>) -> Result<OutboxWrite, OutboxError> {
        let id = uuid::Uuid::new_v4().to_string();
        let encoded = encode(job, &self.queue_url, &id, &id)?;
        let mut write = OutboxWrite::default();
        self.push_job(&mut write, encoded, &id, 1, &id, true)?;
        Ok(write)
    }

    /// Adds a job's `Put`; `indexed` puts the job itself in the pending index (a job without a head).
    fn push_job(
        &self,
        write: &mut OutboxWrite,
        encoded: EncodedJob,
        aggregate: &str,
        sequence: u64,
        id: &str,
        indexed: bool,
    ) -> Result<(), OutboxError> {
        let mut item = self.item(&encoded, aggregate, sequence, id);
        if indexed {
            item.insert(
                table::PENDING.to_owned(),
                AttributeValue::S(pending_bucket(aggregate)),
            );
        }
        let size = item_size(&item);
        if size > MAX_ITEM_BYTES {
            return Err(OutboxError::TooLarge {
                job_type: encoded.job_type,
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
        write.ids.push(id.to_owned());
        write.idempotency_keys.push(encoded.idempotency_key);
        write.items.push(item);
        write
            .transact_items
            .push(TransactWriteItem::builder().put(put).build());
        Ok(())
    }

    /// The head's update to `last`, on the condition that it still holds `head`.
    fn head_update(&self, aggregate: &str, head: u64, last: u64) -> Result<TransactWriteItem, OutboxError> {
        let condition = if head == 0 {
            "attribute_not_exists(#sequence)"
        } else {
            "#sequence = :head"
        };
        let mut update = Update::builder()
            .table_name(&self.table.name)
            .key(
                &self.table.partition_key,
                AttributeValue::S(OutboxTable::aggregate_key(aggregate)),
            )
            .key(
                &self.table.sort_key,
                AttributeValue::S(table::HEAD_KEY.to_owned()),
            )
            // The head carries the aggregate's entry in the pending index: its bucket (unless parked) and
            // when its oldest unsent job was committed (kept when set; the relay moves it on).
            .update_expression(
                "SET #sequence = :last, #pending = if_not_exists(#pending, :bucket), \
                 #created = if_not_exists(#created, :now)",
            )
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_names("#sequence", table::SEQUENCE)
            .expression_attribute_names("#pending", table::PENDING)
            .expression_attribute_names("#created", table::CREATED_AT)
            .expression_attribute_values(":last", AttributeValue::N(last.to_string()))
            .expression_attribute_values(":bucket", AttributeValue::S(pending_bucket(aggregate)))
            .expression_attribute_values(
                ":now",
                AttributeValue::N(conveyor_core::runtime::epoch_millis(SystemTime::now()).to_string()),
            );
        if head > 0 {
            update = update.expression_attribute_values(":head", AttributeValue::N(head.to_string()));
        }
        let update = update
            .build()
            .map_err(|error| OutboxError::Build(error.to_string()))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    fn item(
        &self,
        encoded: &EncodedJob,
        aggregate: &str,
        sequence: u64,
        id: &str,
    ) -> HashMap<String, AttributeValue> {
        let message = &encoded.message;
        let now_millis = conveyor_core::runtime::epoch_millis(SystemTime::now());
        let string = |value: &str| AttributeValue::S(value.to_owned());
        let number = |value: u64| AttributeValue::N(value.to_string());
        let mut item = HashMap::from([
            (
                self.table.partition_key.clone(),
                string(&OutboxTable::aggregate_key(aggregate)),
            ),
            (
                self.table.sort_key.clone(),
                string(&OutboxTable::job_key(sequence)),
            ),
            (
                table::VERSION.to_owned(),
                number(u64::from(table::FORMAT_VERSION)),
            ),
            (table::ID.to_owned(), string(id)),
            (table::QUEUE_URL.to_owned(), string(&self.queue_url)),
            (table::JOB_TYPE.to_owned(), string(&encoded.job_type)),
            (table::AGGREGATE.to_owned(), string(aggregate)),
            (table::SEQUENCE.to_owned(), number(sequence)),
            (
                table::IDEMPOTENCY_KEY.to_owned(),
                string(&encoded.idempotency_key),
            ),
            (table::BODY.to_owned(), string(&message.body)),
            (table::ATTRIBUTES.to_owned(), attributes_value(message)),
            (table::CREATED_AT.to_owned(), number(now_millis)),
        ]);
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

/// The pending index's partition key value of `aggregate`'s jobs: `pending#<bucket>`, the bucket a
/// stable hash (FNV-1a) of the aggregate.
pub(crate) fn pending_bucket(aggregate: &str) -> String {
    let hash = aggregate.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("pending#{}", hash % u64::from(table::PENDING_BUCKETS))
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
    use std::time::Duration;

    use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;

    use super::*;

    fn string<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> &'a str {
        item.get(name)
            .and_then(|value| value.as_s().ok())
            .map_or("", String::as_str)
    }

    #[test]
    fn the_items_carry_the_encoded_jobs_in_sequence_after_the_head() -> anyhow::Result<()> {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs");
        let write = outbox.put_after(
            vec![NewJob::new("invoice", 7), NewJob::new("invoice", 8)],
            "order:1",
            4,
        )?;
        assert_eq!(write.items().len(), 2);
        let first = &write.items()[0];
        assert_eq!(string(first, "pk"), "outbox#order:1");
        assert_eq!(string(first, "sk"), "outbox#job#00000000000000000005");
        assert_eq!(string(&write.items()[1], "sk"), "outbox#job#00000000000000000006");
        assert_eq!(string(first, table::BODY), "7");
        assert_eq!(string(first, table::AGGREGATE), "order:1");
        assert!(
            !first.contains_key(table::PENDING),
            "an aggregate's jobs are indexed through its head"
        );
        assert!(
            !first.contains_key(table::GROUP_ID),
            "standard queues get no group"
        );
        assert!(
            !first.keys().any(|name| name.contains("expires")),
            "no TTL on a committed job"
        );
        let attributes = first
            .get(table::ATTRIBUTES)
            .and_then(|value| value.as_m().ok())
            .ok_or_else(|| anyhow::anyhow!("no attributes"))?;
        assert!(attributes.contains_key(IDEMPOTENCY_KEY_ATTRIBUTE));
        assert_eq!(write.idempotency_keys()[0], format!("outbox:{}", write.ids()[0]));
        let items = write.transact_items();
        assert_eq!(items.len(), 3);
        let head = items[2]
            .update()
            .ok_or_else(|| anyhow::anyhow!("the head is an update"))?;
        assert_eq!(head.condition_expression(), Some("#sequence = :head"));
        assert_eq!(
            head.expression_attribute_values()
                .and_then(|values| values.get(":last")),
            Some(&AttributeValue::N("6".into()))
        );
        let put = items[0].put().ok_or_else(|| anyhow::anyhow!("not a put"))?;
        assert_eq!(put.condition_expression(), Some("attribute_not_exists(#pk)"));
        Ok(())
    }

    #[test]
    fn fifo_items_group_by_aggregate_and_deduplicate_by_id() -> anyhow::Result<()> {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs.fifo");
        let write = outbox.put_after(vec![NewJob::new("invoice", 7).key("invoice:7")], "order:1", 0)?;
        assert_eq!(write.idempotency_keys()[0], "invoice:7", "the job's own key wins");
        let item = &write.items()[0];
        assert_eq!(string(item, table::GROUP_ID), "order:1");
        assert_eq!(string(item, table::DEDUPLICATION_ID), write.ids()[0]);
        let head = write.transact_items()[1].update().cloned();
        assert_eq!(
            head.and_then(|update| update.condition_expression().map(str::to_owned)),
            Some("attribute_not_exists(#sequence)".to_owned()),
            "a new aggregate's head must not exist yet"
        );
        Ok(())
    }

    #[test]
    fn the_producers_checks_and_the_item_limit_apply_before_the_transaction() {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs.fifo");
        let delayed = outbox.put_after(vec![NewJob::new("t", 1).delay(Duration::from_secs(5))], "a", 0);
        assert!(matches!(
            delayed,
            Err(OutboxError::Job(ProduceError::DelayOnFifo { .. }))
        ));
        let standard = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs");
        let big = standard.put_after(vec![NewJob::new("t", "x".repeat(500 * 1024))], "a", 0);
        let Err(error) = big else {
            panic!("a 500 KB job fits no item")
        };
        assert!(error.to_string().contains("409600"), "{error}");
        for aggregate in ["", "lease#relay"] {
            assert!(matches!(
                standard.put_after(vec![NewJob::new("t", 1)], aggregate, 0),
                Err(OutboxError::InvalidAggregate { .. })
            ));
        }
        let none: Vec<NewJob<u32>> = Vec::new();
        assert!(matches!(
            standard.put_after(none, "a", 0),
            Err(OutboxError::TooManyJobs { count: 0 })
        ));
    }

    #[test]
    fn unordered_jobs_need_no_head() -> anyhow::Result<()> {
        let outbox = Outbox::new(OutboxTable::new("t"), "http://localhost/000/jobs");
        let write = outbox.put_unordered(NewJob::new("t", 1))?;
        assert_eq!(write.transact_items().len(), 1);
        assert_eq!(string(&write.items()[0], table::AGGREGATE), write.ids()[0]);
        assert!(
            string(&write.items()[0], table::PENDING).starts_with("pending#"),
            "indexed itself"
        );
        Ok(())
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(pending_bucket("order:1"), pending_bucket("order:1"));
        let buckets: std::collections::HashSet<String> =
            (0..64).map(|n| pending_bucket(&format!("order:{n}"))).collect();
        assert_eq!(buckets.len(), table::PENDING_BUCKETS as usize);
    }
}
