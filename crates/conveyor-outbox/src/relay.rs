//! [`Relay`]: sends the outbox items of a run of stream records to SQS and deletes them. One
//! implementation, used by the Lambda handler (`conveyor_lambda::outbox`) and the stream reader
//! ([`crate::StreamRelay`]).
//!
//! # Design note: order, failures and duplicates
//!
//! - Records arrive in stream order, which for one item key is commit order. The jobs of one aggregate are
//!   sent in that order: on a FIFO queue at most one job per aggregate goes into one `SendMessageBatch`
//!   (SQS keeps a group's order across calls, and a failed entry cannot be followed by an accepted later
//!   one of its group in the same call); on a standard queue several may share a call (SQS does not order
//!   a standard queue anyway).
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
        f.debug_struct("Relay").field("table", &self.table.name).finish_non_exhaustive()
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
        let mut by_queue: Vec<(String, Vec<Pending>)> = Vec::new();
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
                Ok(Some(entry)) => {
                    let queue = entry.queue_url.clone();
                    let pending = Pending { index, entry };
                    match by_queue.iter_mut().find(|(url, _)| *url == queue) {
                        Some((_, list)) => list.push(pending),
                        None => by_queue.push((queue, vec![pending])),
                    }
                }
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
        let mut sent = Vec::new();
        for (queue_url, pending) in by_queue {
            let (queue_sent, first_failure) = self.send_to_queue(&queue_url, pending).await;
            report.sent += queue_sent.len();
            sent.extend(queue_sent);
            report.first_failure = match (report.first_failure, first_failure) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
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

    /// Sends one queue's entries in rounds of at most 10, keeping each aggregate's order; returns the
    /// entries sent and the index of the first one not sent.
    async fn send_to_queue(&self, queue_url: &str, pending: Vec<Pending>) -> (Vec<OutboxEntry>, Option<usize>) {
        let producer = self.producer(queue_url);
        let fifo = producer.name().ends_with(".fifo");
        let mut sent = Vec::new();
        let mut first_failure: Option<usize> = None;
        let mut blocked: HashSet<String> = HashSet::new();
        let mut waiting = pending;
        while !waiting.is_empty() {
            let mut round: Vec<Pending> = Vec::new();
            let mut later: Vec<Pending> = Vec::new();
            // Aggregates with a record left for a later round: their later records wait too.
            let mut deferred: HashSet<String> = HashSet::new();
            for item in waiting {
                let aggregate = &item.entry.aggregate;
                if blocked.contains(aggregate) {
                    first_failure = Some(first_failure.map_or(item.index, |first| first.min(item.index)));
                    continue;
                }
                let in_round = fifo && round.iter().any(|other| other.entry.aggregate == *aggregate);
                if deferred.contains(aggregate) || in_round || round.len() == MAX_BATCH_ENTRIES {
                    deferred.insert(aggregate.clone());
                    later.push(item);
                } else {
                    round.push(item);
                }
            }
            if round.is_empty() {
                break;
            }
            let messages = round.iter().map(|item| item.entry.message.clone()).collect();
            let report = producer.send_messages(messages).await;
            for (item, result) in round.into_iter().zip(report.results) {
                match result {
                    Ok(message_id) => {
                        tracing::debug!(
                            queue = %producer.name(),
                            outbox_id = %item.entry.id,
                            job_type = %item.entry.job_type,
                            aggregate = %item.entry.aggregate,
                            %message_id,
                            "outbox job sent"
                        );
                        sent.push(item.entry);
                    }
                    Err(error) => {
                        tracing::warn!(
                            queue = %producer.name(),
                            outbox_id = %item.entry.id,
                            job_type = %item.entry.job_type,
                            aggregate = %item.entry.aggregate,
                            %error,
                            "outbox job not sent; its aggregate's later jobs wait for the retry"
                        );
                        blocked.insert(item.entry.aggregate.clone());
                        first_failure = Some(first_failure.map_or(item.index, |first| first.min(item.index)));
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

fn removed_later(removed_at: &HashMap<Vec<(String, String)>, usize>, entry: &OutboxEntry, index: usize) -> bool {
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
