//! Moving messages out of a DLQ by hand: for endpoints without `StartMessageMoveTask`, and for filtered
//! redrives (only messages of one job type, or whose failure reason contains a text).
//!
//! # Design note: send, then delete
//!
//! Each message is first sent to its destination (same body, same attributes minus `conveyor.failure`,
//! same trace header) and deleted from the DLQ only after SQS accepted the send. The other order could
//! lose a job: if the process died, or the send failed, after the delete, the message would be nowhere.
//! In this order the worst case is a copy in both queues (the process died between the two calls, or the
//! delete failed); the consumer's idempotency key makes the second run a no-op, and on a FIFO destination
//! the copy's deduplication id (`redrive-<DLQ message id>`) makes SQS drop a second send within 5 minutes.
//!
//! # Design note: messages that stay
//!
//! Messages that do not match the filter, that have no known destination, or whose send failed are *held*
//! (invisible for the hold time) until the scan ends and are then made visible again all at once, in
//! batches of 10. Releasing each one at once would make the scan see it again at the next receive (SQS has
//! no cursor; LocalStack serves the oldest visible message first), so a DLQ whose first ten messages do not
//! match would never get past them. The scan ends when a receive returns nothing, or only messages it has
//! already examined (a hold that ran out on a very long scan). If the process dies mid-scan, held messages
//! come back by themselves when the hold ends. The release runs even when the loop stops on an error.
//!
//! # Design note: only what was there at the start
//!
//! A consumer that fails a moved message again puts a *new* message in the DLQ (the worker sends a copy
//! under a new message id, then deletes the original), and that copy matches the same filter. A scan that
//! moved it would feed the consumer the same job again and again for as long as the scan finds new
//! messages: one poison webhook became 13,374 deliveries in five minutes (issue 19). So the loop moves only
//! messages that were *sent before the scan started* (`SentTimestamp` earlier than the start) and holds
//! every later one as "arrived after the start", to be looked at by a later run. This bound works because
//! every message the loop can cause is sent after the start: the copy it sends to the source queue is new,
//! so whatever comes back from it (the worker's dead-letter copy, or SQS's redrive of the copy, which keeps
//! the copy's `SentTimestamp`) is newer than the start too. A message sent before the start that SQS's
//! redrive moves into the DLQ during the scan may be moved, once: it was not caused by this scan. Each
//! message is therefore moved at most once per run, and the scan ends, because arrivals are bounded by the
//! number of messages moved. The comparison uses this machine's clock against SQS's; SigV4 already refuses
//! a clock more than 5 minutes off, and a clock ahead by `d` only lets copies made in the first `d` of the
//! run through once more.
//!
//! Caveat on FIFO DLQs: a held message blocks the rest of its message group until the release, so a
//! filtered scan of a FIFO DLQ sees at most the first 10 messages of each group per run.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_sqs::Client;
use conveyor_core::limits::MAX_RECEIVE_MESSAGES;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{message::ReceiptHandle, port::OutgoingMessage};

use super::error::AdminError;
use super::queue_info::QueueInfo;
use super::receive::{Received, receive_held, release};
use crate::batch::entry_id;
use crate::errors::{classify, entry_error};
use crate::send::batch_entry;

/// Which messages a redrive moves. An empty filter matches every message.
#[derive(Debug, Clone, Default, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct MoveFilter {
    /// Only messages whose `conveyor.type` attribute equals this.
    pub job_type: Option<String>,
    /// Only messages whose recorded failure (`conveyor.failure`) contains this text, ignoring ASCII case.
    /// Messages without a failure record never match.
    pub reason_contains: Option<String>,
    /// Only these DLQ message ids: a selection made from a peek.
    pub message_ids: Option<BTreeSet<String>>,
    /// Only messages that failed at or after this time ([`Received::failed_at`]).
    pub failed_after: Option<SystemTime>,
    /// Only messages that failed before this time ([`Received::failed_at`]).
    pub failed_before: Option<SystemTime>,
}

impl MoveFilter {
    /// True when the filter selects every message.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// True when `received` passes every part of the filter.
    pub fn matches(&self, received: &Received) -> bool {
        if let Some(ids) = &self.message_ids
            && !ids.contains(&received.message.id)
        {
            return false;
        }
        if self.failed_after.is_some() || self.failed_before.is_some() {
            let Some(at) = received.failed_at() else {
                return false;
            };
            if self.failed_after.is_some_and(|after| at < after)
                || self.failed_before.is_some_and(|before| at >= before)
            {
                return false;
            }
        }
        if let Some(job_type) = &self.job_type
            && received.message.job_type() != Some(job_type.as_str())
        {
            return false;
        }
        if let Some(text) = &self.reason_contains {
            let recorded = match received.failure() {
                Some(failure) => failure.error,
                None => received.failure_attribute().unwrap_or_default().to_owned(),
            };
            if !recorded.to_ascii_lowercase().contains(&text.to_ascii_lowercase()) {
                return false;
            }
        }
        true
    }
}

/// Where moved messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destinations {
    /// Every message goes to this queue.
    One(QueueInfo),
    /// Each message goes back to the queue it came from, among these: the one named by SQS's
    /// `DeadLetterQueueSourceArn`, else the one named by the failure record's `source_queue`.
    BySource(Vec<QueueInfo>),
}

impl Destinations {
    /// Where `received` goes; `None` when its source is not among the known queues.
    pub fn route(&self, received: &Received) -> Option<&QueueInfo> {
        let queues = match self {
            Destinations::One(queue) => return Some(queue),
            Destinations::BySource(queues) if queues.len() == 1 => return queues.first(),
            Destinations::BySource(queues) => queues,
        };
        if let Some(arn) = &received.dead_letter_source_arn
            && let Some(queue) = queues.iter().find(|queue| &queue.arn.arn == arn)
        {
            return Some(queue);
        }
        let source = received.failure()?.source_queue;
        queues
            .iter()
            .find(|queue| queue.name() == source || queue.url == source || queue.arn.arn == source)
    }
}

/// How the move loop runs.
#[derive(Debug, Clone, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct MoveOptions {
    /// Which messages move.
    pub filter: MoveFilter,
    /// At most this many messages moved per second; `None` for as fast as SQS answers.
    pub rate: Option<u32>,
    /// How long examined messages stay invisible if the process dies before releasing them.
    pub hold: Duration,
    /// Long-poll wait of each receive: the scan ends at the first receive that returns nothing.
    pub wait: Duration,
    /// Set to stop after the current batch (Ctrl-C); held messages are still released.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for MoveOptions {
    fn default() -> Self {
        Self {
            filter: MoveFilter::default(),
            rate: None,
            hold: Duration::from_secs(300),
            wait: Duration::from_secs(1),
            stop: None,
        }
    }
}

/// A message that could not be moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveFailure {
    /// The DLQ message id.
    pub message_id: String,
    /// What went wrong, and where the message is now.
    pub error: String,
}

/// What the move loop did so far (passed to the progress callback after each batch, and returned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveReport {
    /// Distinct messages examined.
    pub examined: u64,
    /// Messages sent to their destination and deleted from the DLQ.
    pub moved: u64,
    /// Messages that did not match the filter (left in the DLQ).
    pub skipped: u64,
    /// Matching messages whose source queue is unknown (left in the DLQ).
    pub unroutable: u64,
    /// Messages sent to the DLQ after the loop started (left in the DLQ, not examined): among them the
    /// copies a consumer dead-lettered again after this run moved them. See the module's design notes.
    pub arrived_after_start: u64,
    /// Messages that could not be moved, or were sent but not deleted from the DLQ.
    pub failed: Vec<MoveFailure>,
    /// True when the loop stopped because `stop` was set.
    pub stopped: bool,
    /// Held messages whose release failed: they come back when their hold ends.
    pub release_failures: u64,
}

/// Moves the messages of `dlq` that pass `options.filter` to their destination, batch by batch, calling
/// `on_progress` after each batch. See the module's design notes for the order of calls and for what
/// happens to the messages that stay.
pub async fn move_messages(
    client: &Client,
    dlq: &QueueInfo,
    destinations: &Destinations,
    options: &MoveOptions,
    on_progress: &mut (dyn FnMut(&MoveReport) + Send),
) -> Result<MoveReport, AdminError> {
    run(client, dlq, Action::Move(destinations), options, on_progress).await
}

/// Deletes the messages of `dlq` that pass `options.filter` (for good: they are not sent anywhere),
/// batch by batch, calling `on_progress` after each batch; the report's `moved` counts the deleted
/// messages. The scan is the move loop's (same holds, same release, same bound on what it looks at), so
/// a filter or a selection deletes exactly what a redrive with it would have moved.
pub async fn delete_messages(
    client: &Client,
    dlq: &QueueInfo,
    options: &MoveOptions,
    on_progress: &mut (dyn FnMut(&MoveReport) + Send),
) -> Result<MoveReport, AdminError> {
    run(client, dlq, Action::Delete, options, on_progress).await
}

/// What the scan does with the messages that pass the filter.
#[derive(Clone, Copy)]
enum Action<'a> {
    Move(&'a Destinations),
    Delete,
}

async fn run(
    client: &Client,
    dlq: &QueueInfo,
    action: Action<'_>,
    options: &MoveOptions,
    on_progress: &mut (dyn FnMut(&MoveReport) + Send),
) -> Result<MoveReport, AdminError> {
    let mut report = MoveReport::default();
    let mut held: HashMap<String, ReceiptHandle> = HashMap::new();
    let scanned = scan(client, dlq, action, options, &mut report, &mut held, on_progress).await;
    let receipts: Vec<ReceiptHandle> = held.into_values().collect();
    let released = release(client, &dlq.url, &receipts).await;
    scanned?;
    report.release_failures = released?.len() as u64;
    Ok(report)
}

/// The scan itself: receive, sort, send, delete, until the DLQ has nothing new to show.
async fn scan(
    client: &Client,
    dlq: &QueueInfo,
    action: Action<'_>,
    options: &MoveOptions,
    report: &mut MoveReport,
    held: &mut HashMap<String, ReceiptHandle>,
    on_progress: &mut (dyn FnMut(&MoveReport) + Send),
) -> Result<(), AdminError> {
    let started = Instant::now();
    let started_at = SystemTime::now();
    let batch_size = options.rate.map_or(MAX_RECEIVE_MESSAGES, |rate| {
        (rate.max(1) as usize).min(MAX_RECEIVE_MESSAGES)
    });
    let mut examined_ids: HashSet<String> = HashSet::new();
    loop {
        if options
            .stop
            .as_ref()
            .is_some_and(|stop| stop.load(Ordering::Relaxed))
        {
            report.stopped = true;
            return Ok(());
        }
        let batch = receive_held(client, &dlq.url, batch_size, options.hold, options.wait).await?;
        let mut new = 0;
        let mut to_move: Vec<(Received, &QueueInfo)> = Vec::new();
        let mut to_delete: Vec<Received> = Vec::new();
        for received in batch {
            let id = received.message.id.clone();
            if !examined_ids.insert(id.clone()) {
                // Examined before and its hold ran out: hold it again with the new receipt.
                held.insert(id, received.message.receipt_handle);
                continue;
            }
            new += 1;
            if received
                .message
                .sent_at
                .is_some_and(|sent_at| sent_at >= started_at)
            {
                report.arrived_after_start += 1;
                held.insert(id, received.message.receipt_handle);
                continue;
            }
            report.examined += 1;
            if !options.filter.matches(&received) {
                report.skipped += 1;
                held.insert(id, received.message.receipt_handle);
                continue;
            }
            let destinations = match action {
                Action::Delete => {
                    to_delete.push(received);
                    continue;
                }
                Action::Move(destinations) => destinations,
            };
            let Some(destination) = destinations.route(&received) else {
                report.unroutable += 1;
                held.insert(id, received.message.receipt_handle);
                continue;
            };
            to_move.push((received, destination));
        }
        if new == 0 {
            return Ok(());
        }
        move_batch(client, dlq, to_move, report, held).await?;
        delete_from_dlq(client, dlq, to_delete, "deleting it", report).await?;
        on_progress(report);
        pace(started, report.moved, options.rate).await;
    }
}

/// Sends the batch to its destinations, then deletes from the DLQ what was sent.
async fn move_batch(
    client: &Client,
    dlq: &QueueInfo,
    to_move: Vec<(Received, &QueueInfo)>,
    report: &mut MoveReport,
    held: &mut HashMap<String, ReceiptHandle>,
) -> Result<(), AdminError> {
    let mut by_destination: Vec<(&QueueInfo, Vec<Received>)> = Vec::new();
    for (received, destination) in to_move {
        match by_destination
            .iter_mut()
            .find(|(queue, _)| queue.url == destination.url)
        {
            Some((_, group)) => group.push(received),
            None => by_destination.push((destination, vec![received])),
        }
    }
    for (destination, group) in by_destination {
        let sent = send_group(client, destination, &group, report, held).await?;
        let doing = format!("it was sent to {} but", destination.name());
        delete_from_dlq(client, dlq, sent, &doing, report).await?;
    }
    Ok(())
}

/// One `SendMessageBatch` of up to 10 messages to `destination`; returns the messages SQS accepted.
async fn send_group(
    client: &Client,
    destination: &QueueInfo,
    group: &[Received],
    report: &mut MoveReport,
    held: &mut HashMap<String, ReceiptHandle>,
) -> Result<Vec<Received>, AdminError> {
    let mut entries = Vec::with_capacity(group.len());
    for (index, received) in group.iter().enumerate() {
        entries.push(batch_entry(
            entry_id(index),
            &moved_copy(received, destination.fifo),
        )?);
    }
    let output = client
        .send_message_batch()
        .queue_url(&destination.url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|error| classify(&error, &destination.url))?;
    let mut accepted = vec![false; group.len()];
    for entry in output.successful() {
        if let Some(flag) = entry
            .id()
            .parse::<usize>()
            .ok()
            .and_then(|index| accepted.get_mut(index))
        {
            *flag = true;
        }
    }
    for entry in output.failed() {
        let Some(received) = entry
            .id()
            .parse::<usize>()
            .ok()
            .and_then(|index| group.get(index))
        else {
            continue;
        };
        report.failed.push(MoveFailure {
            message_id: received.message.id.clone(),
            error: format!(
                "send to {} failed ({}); left in the DLQ",
                destination.name(),
                entry_error(entry)
            ),
        });
    }
    let mut sent = Vec::new();
    for (received, accepted) in group.iter().zip(accepted) {
        if accepted {
            sent.push(received.clone());
        } else {
            held.insert(
                received.message.id.clone(),
                received.message.receipt_handle.clone(),
            );
            if !report
                .failed
                .iter()
                .any(|failure| failure.message_id == received.message.id)
            {
                report.failed.push(MoveFailure {
                    message_id: received.message.id.clone(),
                    error: format!(
                        "SQS did not report the send to {}; left in the DLQ",
                        destination.name()
                    ),
                });
            }
        }
    }
    Ok(sent)
}

/// Deletes `sent` from the DLQ (batches of at most 10: one receive's worth); each one deleted counts in
/// `report.moved`. `doing` says what was going on, for the failures.
async fn delete_from_dlq(
    client: &Client,
    dlq: &QueueInfo,
    sent: Vec<Received>,
    doing: &str,
    report: &mut MoveReport,
) -> Result<(), AdminError> {
    if sent.is_empty() {
        return Ok(());
    }
    let entries = sent
        .iter()
        .enumerate()
        .map(|(index, received)| {
            aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(entry_id(index))
                .receipt_handle(received.message.receipt_handle.as_str())
                .build()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::send::invalid)?;
    let output = client
        .delete_message_batch()
        .queue_url(&dlq.url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|error| classify(&error, &dlq.url))?;
    let mut failed = vec![false; sent.len()];
    for entry in output.failed() {
        let Some(index) = entry
            .id()
            .parse::<usize>()
            .ok()
            .filter(|index| *index < sent.len())
        else {
            continue;
        };
        failed[index] = true;
        report.failed.push(MoveFailure {
            message_id: sent[index].message.id.clone(),
            error: format!(
                "{doing} the delete from the DLQ failed ({}): it is still there (after a move: a copy is in both queues)",
                entry_error(entry)
            ),
        });
    }
    report.moved += failed.iter().filter(|failed| !**failed).count() as u64;
    Ok(())
}

/// The message to send for `received`: its body, attributes without the failure record, and trace header;
/// on a FIFO destination its group (or its id) and a deduplication id derived from the DLQ message id.
pub fn moved_copy(received: &Received, fifo_destination: bool) -> OutgoingMessage {
    let message = &received.message;
    let mut attributes = message.attributes.clone();
    attributes.remove(FAILURE_ATTRIBUTE);
    let mut copy = OutgoingMessage {
        body: message.body.clone(),
        attributes,
        trace_header: message.trace_header.clone(),
        ..OutgoingMessage::default()
    };
    if fifo_destination {
        copy.group_id = Some(message.group_id.clone().unwrap_or_else(|| message.id.clone()));
        copy.deduplication_id = Some(format!("redrive-{}", message.id));
    } else {
        // A standard destination's MessageGroupId is the tenant (fair queues).
        copy.group_id = message.tenant().map(str::to_owned);
    }
    copy
}

/// Sleeps as long as needed to keep `moved` messages since `started` at or under `rate` per second.
async fn pace(started: Instant, moved: u64, rate: Option<u32>) {
    let Some(rate) = rate.filter(|rate| *rate > 0) else {
        return;
    };
    let due = Duration::from_secs_f64(moved as f64 / f64::from(rate));
    let elapsed = started.elapsed();
    if due > elapsed {
        tokio::time::sleep(due - elapsed).await;
    }
}

#[cfg(test)]
mod tests {
    use conveyor_core::message::JOB_TYPE_ATTRIBUTE;
    use conveyor_core::{
        message::{AttributeValue, Message},
        port::QueueDepth,
        runtime::Failure,
    };

    use super::*;
    use crate::redrive::QueueArn;

    fn received(job_type: Option<&str>, failure: Option<Failure>, source_arn: Option<&str>) -> Received {
        let mut message = Message::new("m1", "{\"to\":\"a@b\"}");
        if let Some(job_type) = job_type {
            message
                .attributes
                .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
        }
        if let Some(failure) = failure {
            message.attributes.insert(
                FAILURE_ATTRIBUTE.to_owned(),
                AttributeValue::string(failure.to_json()),
            );
        }
        Received {
            message,
            dead_letter_source_arn: source_arn.map(str::to_owned),
        }
    }

    fn queue(name: &str) -> QueueInfo {
        let arn = format!("arn:aws:sqs:us-east-1:000000000000:{name}");
        QueueInfo {
            url: format!("http://localhost/{name}"),
            arn: QueueArn::parse(&arn).unwrap(),
            fifo: name.ends_with(".fifo"),
            content_based_deduplication: false,
            redrive: None,
            visibility_timeout: None,
            depth: QueueDepth::default(),
        }
    }

    #[test]
    fn filters_match_job_type_and_reason_ignoring_case() {
        let failure = Failure::now("Webhook returned 410 Gone", 2, "jobs", "webhook");
        let message = received(Some("webhook"), Some(failure), None);
        assert!(MoveFilter::default().matches(&message));
        let by_type = MoveFilter {
            job_type: Some("webhook".to_owned()),
            ..MoveFilter::default()
        };
        assert!(by_type.matches(&message));
        let other_type = MoveFilter {
            job_type: Some("email".to_owned()),
            ..MoveFilter::default()
        };
        assert!(!other_type.matches(&message));
        let by_reason = MoveFilter {
            reason_contains: Some("410 gone".to_owned()),
            ..MoveFilter::default()
        };
        assert!(by_reason.matches(&message));
        let both_one_wrong = MoveFilter {
            job_type: Some("webhook".to_owned()),
            reason_contains: Some("timeout".to_owned()),
            ..MoveFilter::default()
        };
        assert!(!both_one_wrong.matches(&message));
        // No failure record: never matches a reason filter.
        assert!(!by_reason.matches(&received(Some("webhook"), None, None)));
    }

    #[test]
    fn routes_by_sqs_source_then_by_failure_record() {
        let destinations = Destinations::BySource(vec![queue("a"), queue("b")]);
        let by_arn = received(None, None, Some("arn:aws:sqs:us-east-1:000000000000:b"));
        assert_eq!(destinations.route(&by_arn).map(QueueInfo::name), Some("b"));
        let by_record = received(None, Some(Failure::now("x", 1, "a", "h")), None);
        assert_eq!(destinations.route(&by_record).map(QueueInfo::name), Some("a"));
        let unknown = received(None, Some(Failure::now("x", 1, "c", "h")), None);
        assert_eq!(destinations.route(&unknown), None);
        assert_eq!(destinations.route(&received(None, None, None)), None);
        let single = Destinations::BySource(vec![queue("a")]);
        assert_eq!(single.route(&unknown).map(QueueInfo::name), Some("a"));
        let one = Destinations::One(queue("z"));
        assert_eq!(one.route(&unknown).map(QueueInfo::name), Some("z"));
    }

    #[test]
    fn the_copy_drops_the_failure_record_and_keeps_the_rest() {
        let mut original = received(Some("email"), Some(Failure::now("x", 1, "a", "h")), None);
        original.message.trace_header = Some("Root=1-abc".to_owned());
        original.message.group_id = Some("g".to_owned());
        let copy = moved_copy(&original, false);
        assert_eq!(copy.body, original.message.body);
        assert!(!copy.attributes.contains_key(FAILURE_ATTRIBUTE));
        assert_eq!(
            copy.attributes.get(JOB_TYPE_ATTRIBUTE),
            Some(&AttributeValue::string("email"))
        );
        assert_eq!(copy.trace_header.as_deref(), Some("Root=1-abc"));
        assert_eq!(
            copy.group_id.as_deref(),
            Some("g"),
            "a standard destination keeps the tenant"
        );
        let fifo = moved_copy(&original, true);
        assert_eq!(fifo.group_id.as_deref(), Some("g"));
        assert_eq!(fifo.deduplication_id.as_deref(), Some("redrive-m1"));
    }
}
