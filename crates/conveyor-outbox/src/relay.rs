//! [`Relay`]: sends the outbox items of a run of stream records to SQS and deletes them. One
//! implementation, used by the Lambda handler (`conveyor_lambda::outbox`) and the stream reader
//! ([`crate::StreamRelay`]).
//!
//! # Design note: order, failures and duplicates
//!
//! - Records arrive in stream order (per shard; DynamoDB keeps one item key's changes in one shard in
//!   order). The jobs of one aggregate are sent in that order: a job is sent only after every earlier job of
//!   its aggregate was accepted, so at most one job per aggregate goes into a round of `SendMessageBatch`
//!   calls (one call per queue, up to 10 entries of 10 aggregates). An aggregate may span queues.
//!   `Outbox::put_unordered` gives a job an aggregate of its own (its item id), for jobs that need no order.
//! - When a job cannot be sent, the later jobs of its aggregate are not sent in this run. The caller learns
//!   the index of the first record not relayed ([`RelayReport::first_failure`]) and resumes there (Lambda:
//!   `batchItemFailures`; the stream reader: its checkpoint stops before it). Records after that index
//!   that were sent are sent again on the retry: a duplicate on a standard queue, which the consumer
//!   settles once under the job's idempotency key, and on a FIFO queue a deduplicated re-send within
//!   SQS's 5-minute window (the deduplication id is the item id).
//! - Items are deleted only after their job was accepted by SQS. A crash between the send and the delete,
//!   or a failed delete, leaves the item in the table (its TTL removes it later) and, when the caller had
//!   not yet checkpointed, the record is read and sent again: a duplicate, settled once by the consumer.
//!   A failed delete is therefore logged and counted, never reported as a failure.
//! - Items that are outbox items but cannot be sent (a malformed or newer-format item) are logged with
//!   their id and skipped: retrying cannot fix them, and the item stays in the table for inspection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use conveyor_core::limits::MAX_BATCH_ENTRIES;
use conveyor_sqs::Producer;

use crate::image::{Change, OutboxEntry, StreamRecord, parse};
use crate::table::OutboxTable;

/// DynamoDB's `BatchWriteItem` limit.
const DELETE_BATCH: usize = 25;
/// Attempts for the unprocessed deletes of one `BatchWriteItem`.
const DELETE_ATTEMPTS: u32 = 3;

/// What one [`Relay::relay`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Jobs SQS accepted.
    pub sent: usize,
    /// Records that are not outbox inserts (other items, `MODIFY`, `REMOVE`).
    pub ignored: usize,
    /// Outbox inserts whose item is removed later in the same run (sent and deleted by an earlier relay
    /// whose checkpoint was lost, or deleted before it was sent): not sent again.
    pub already_removed: usize,
    /// Outbox items that cannot be sent (malformed or of a newer format); logged.
    pub unreadable: usize,
    /// Sent items deleted from the outbox table.
    pub deleted: usize,
    /// Sent items whose delete failed (left to their TTL).
    pub delete_failures: usize,
    /// The index of the first record not relayed: it and everything after it must be retried.
    pub first_failure: Option<usize>,
    /// AWS requests made (sends and deletes).
    pub requests: u64,
}

/// Sends outbox items to SQS and deletes them from the outbox table.
#[derive(Clone)]
pub struct Relay {
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    table: OutboxTable,
    producers: Arc<Mutex<HashMap<String, Arc<Producer>>>>,
    requests: Arc<AtomicU64>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("table", &self.table.name)
            .finish_non_exhaustive()
    }
}

/// One record's outbox entry and its index in the run.
struct Pending {
    index: usize,
    entry: OutboxEntry,
}

impl Relay {
    /// A relay for the outbox `table`.
    pub fn new(sqs: aws_sdk_sqs::Client, dynamodb: aws_sdk_dynamodb::Client, table: OutboxTable) -> Self {
        Self {
            sqs,
            dynamodb,
            table,
            producers: Arc::default(),
            requests: Arc::default(),
        }
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// AWS requests made by this relay so far (sends and deletes).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
            + self
                .producers
                .lock()
                .map(|producers| producers.values().map(|producer| producer.requests()).sum())
                .unwrap_or(0)
    }

    /// Relays `records` (one shard's, in stream order): sends their outbox items' jobs, then deletes the
    /// sent items. See the module's design note for order and failures.
    pub async fn relay(&self, records: &[StreamRecord]) -> RelayReport {
        let before = self.requests();
        let mut report = RelayReport::default();
        let key_names: Vec<&str> = self.table.key_names().collect();
        let mut pending = Vec::new();
        let removed_at = removals(records);
        for (index, record) in records.iter().enumerate() {
            let Change::Insert(image) = &record.change else {
                report.ignored += 1;
                continue;
            };
            match parse(image, &key_names) {
                Ok(Some(entry)) if removed_later(&removed_at, &entry, index) => {
                    report.already_removed += 1;
                }
                Ok(Some(entry)) => pending.push(Pending { index, entry }),
                Ok(None) => report.ignored += 1,
                Err(error) => {
                    report.unreadable += 1;
                    tracing::error!(
                        table = %self.table.name,
                        sequence_number = %record.sequence_number,
                        %error,
                        "outbox item cannot be sent; skipped and left in the table"
                    );
                }
            }
        }
        let (sent, first_failure) = self.send(pending).await;
        report.sent = sent.len();
        report.first_failure = first_failure;
        let (deleted, failed) = self.delete(&sent).await;
        report.deleted = deleted;
        report.delete_failures = failed;
        report.requests = self.requests().saturating_sub(before);
        report
    }

    fn producer(&self, queue_url: &str) -> Arc<Producer> {
        let Ok(mut producers) = self.producers.lock() else {
            return Arc::new(Producer::new(self.sqs.clone(), queue_url));
        };
        Arc::clone(
            producers
                .entry(queue_url.to_owned())
                .or_insert_with(|| Arc::new(Producer::new(self.sqs.clone(), queue_url))),
        )
    }

    /// Sends the entries in rounds, at most one entry per aggregate per round and at most 10 per queue
    /// (one `SendMessageBatch` per queue and round); returns the entries sent and the index of the first
    /// one not sent.
    async fn send(&self, pending: Vec<Pending>) -> (Vec<OutboxEntry>, Option<usize>) {
        let mut sent = Vec::new();
        let mut first_failure: Option<usize> = None;
        let mut blocked: HashSet<String> = HashSet::new();
        let mut waiting = pending;
        while !waiting.is_empty() {
            // Aggregates with an entry in this round, or one left for a later round: their next entries
            // wait for the next round.
            let mut taken: HashSet<String> = HashSet::new();
            let mut round: Vec<(String, Vec<Pending>)> = Vec::new();
            let mut later: Vec<Pending> = Vec::new();
            for item in waiting {
                if blocked.contains(&item.entry.aggregate) {
                    first_failure = Some(first_failure.map_or(item.index, |first| first.min(item.index)));
                    continue;
                }
                if !taken.insert(item.entry.aggregate.clone()) {
                    later.push(item);
                    continue;
                }
                let position = match round.iter().position(|(url, _)| *url == item.entry.queue_url) {
                    Some(position) => position,
                    None => {
                        round.push((item.entry.queue_url.clone(), Vec::new()));
                        round.len() - 1
                    }
                };
                let batch = &mut round[position].1;
                if batch.len() == MAX_BATCH_ENTRIES {
                    later.push(item);
                } else {
                    batch.push(item);
                }
            }
            for (queue_url, batch) in round {
                let producer = self.producer(&queue_url);
                let messages = batch.iter().map(|item| item.entry.message.clone()).collect();
                let report = producer.send_messages(messages).await;
                for (item, result) in batch.into_iter().zip(report.results) {
                    let entry = item.entry;
                    match result {
                        Ok(message_id) => {
                            tracing::debug!(
                                queue = %producer.name(),
                                outbox_id = %entry.id,
                                job_type = %entry.job_type,
                                aggregate = %entry.aggregate,
                                %message_id,
                                "outbox job sent"
                            );
                            sent.push(entry);
                        }
                        Err(error) => {
                            tracing::warn!(
                                queue = %producer.name(),
                                outbox_id = %entry.id,
                                job_type = %entry.job_type,
                                aggregate = %entry.aggregate,
                                %error,
                                "outbox job not sent; its aggregate's later jobs wait for the retry"
                            );
                            first_failure =
                                Some(first_failure.map_or(item.index, |first| first.min(item.index)));
                            blocked.insert(entry.aggregate);
                        }
                    }
                }
            }
            waiting = later;
        }
        (sent, first_failure)
    }

    /// Deletes sent items with `BatchWriteItem` (a delete of an item already gone is not an error);
    /// returns how many were deleted and how many could not be.
    async fn delete(&self, sent: &[OutboxEntry]) -> (usize, usize) {
        let mut deleted = 0;
        let mut failed = 0;
        for chunk in sent.chunks(DELETE_BATCH) {
            let mut requests: Vec<WriteRequest> = chunk.iter().filter_map(delete_request).collect();
            failed += chunk.len() - requests.len();
            for attempt in 1..=DELETE_ATTEMPTS {
                if requests.is_empty() {
                    break;
                }
                let count = requests.len();
                self.requests.fetch_add(1, Ordering::Relaxed);
                let answer = self
                    .dynamodb
                    .batch_write_item()
                    .request_items(&self.table.name, requests.clone())
                    .send()
                    .await;
                match answer {
                    Ok(output) => {
                        let left = output
                            .unprocessed_items
                            .and_then(|mut items| items.remove(&self.table.name))
                            .unwrap_or_default();
                        deleted += count - left.len();
                        requests = left;
                    }
                    Err(error) => {
                        tracing::warn!(
                            table = %self.table.name,
                            error = %aws_sdk_dynamodb::error::DisplayErrorContext(&error),
                            attempt,
                            "deleting sent outbox items failed"
                        );
                    }
                }
                if !requests.is_empty() && attempt < DELETE_ATTEMPTS {
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
            }
            if !requests.is_empty() {
                failed += requests.len();
                tracing::warn!(
                    table = %self.table.name,
                    count = requests.len(),
                    "sent outbox items left in the table; their TTL removes them (a relay reading them again \
                     sends a duplicate, which the consumer settles once)"
                );
            }
        }
        (deleted, failed)
    }
}

/// The key values of `REMOVE` records, with the index of the last removal of each key.
fn removals(records: &[StreamRecord]) -> HashMap<Vec<(String, String)>, usize> {
    let mut removed = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        if let Change::Remove(keys) = &record.change {
            removed.insert(key_of(keys), index);
        }
    }
    removed
}

fn key_of(image: &crate::image::Image) -> Vec<(String, String)> {
    image
        .iter()
        .filter_map(|(name, value)| match value {
            crate::image::Value::S(text) => Some((name.clone(), text.clone())),
            _ => None,
        })
        .collect()
}

fn removed_later(
    removed_at: &HashMap<Vec<(String, String)>, usize>,
    entry: &OutboxEntry,
    index: usize,
) -> bool {
    let mut key = entry.key.clone();
    key.sort();
    removed_at.get(&key).is_some_and(|removed| *removed > index)
}

fn delete_request(entry: &OutboxEntry) -> Option<WriteRequest> {
    let key = entry
        .key
        .iter()
        .map(|(name, value)| (name.clone(), AttributeValue::S(value.clone())))
        .collect();
    let delete = DeleteRequest::builder().set_key(Some(key)).build().ok()?;
    Some(WriteRequest::builder().delete_request(delete).build())
}
