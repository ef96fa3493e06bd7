//! The queue conformance suite: the `Queue` port's contracts, checked against any backend.
//!
//! Each case is a public function taking a [`QueueFactory`] and returning `Result<(), SuiteFailure>`;
//! [`run_all`] runs them all and reports every failed case. Cases create their own queues (fresh, with
//! the spec they need), use visibility timeouts of 1–3 s, and wait for conditions with a deadline, never
//! with a bare sleep; absence is checked with a long poll whose window ends before the event could
//! legitimately happen. All times are `tokio::time::Instant`, so the suite runs instantly against
//! [`MemoryQueue`] under `tokio::time::pause()` and in real time against LocalStack.
//!
//! One difference between backends is allowed, and only one: what a *stale* receipt handle (the message
//! was received again since) does to a visibility change or a delete. `MemoryQueue` refuses both with
//! `LeaseLost`; LocalStack and SQS accept some of them, and a stale delete may even delete.
//! [`stale_receipt_after_redelivery`] has the measured table and accepts each; it requires only that the
//! latest receipt keeps working after a stale visibility change or a refused stale delete.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    message::{AttributeValue, Attributes, Message, ReceiptHandle},
    port::{DeadLetter, EntryError, EntryFailure, OutgoingMessage, Queue, QueueError, VisibilityChange},
    runtime::Failure,
};
use tokio::time::Instant;

use crate::localstack::QueueSpec;
use crate::memory_queue::MemoryQueue;
use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// A queue made for one case, with its DLQ when the spec asked for one.
#[derive(Clone)]
pub struct QueueUnderTest {
    /// The queue.
    pub queue: Arc<dyn Queue>,
    /// Its dead-letter queue (the target of its redrive policy), read by the DLQ cases.
    pub dead_letter_queue: Option<Arc<dyn Queue>>,
}

impl std::fmt::Debug for QueueUnderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueUnderTest")
            .field("queue", &self.queue.name())
            .field(
                "dead_letter_queue",
                &self.dead_letter_queue.as_ref().map(|dlq| dlq.name()),
            )
            .finish()
    }
}

/// Creates fresh queues for the suite.
#[async_trait]
pub trait QueueFactory: Send + Sync {
    /// Creates a queue (FIFO when `spec.fifo`, named from `spec.name_prefix`) with the spec's visibility
    /// timeout and, when `spec.max_receive_count` is set, a DLQ and a redrive policy.
    async fn create(&self, spec: &QueueSpec) -> anyhow::Result<QueueUnderTest>;
}

/// Makes [`MemoryQueue`]s: the DLQ (same FIFO-ness, `<name>-dlq`) and the queue with its redrive policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryQueueFactory;

#[async_trait]
impl QueueFactory for MemoryQueueFactory {
    async fn create(&self, spec: &QueueSpec) -> anyhow::Result<QueueUnderTest> {
        let name = crate::localstack::unique_name(&spec.name_prefix);
        let make = |name: &str| {
            let queue = if spec.fifo {
                MemoryQueue::fifo(name)
            } else {
                MemoryQueue::standard(name)
            };
            queue.with_visibility_timeout(Duration::from_secs(u64::from(spec.visibility_timeout_secs)))
        };
        let Some(max_receive_count) = spec.max_receive_count else {
            return Ok(QueueUnderTest {
                queue: Arc::new(make(&name)),
                dead_letter_queue: None,
            });
        };
        let dlq = Arc::new(make(&format!("{name}-dlq")));
        let queue = make(&name).with_dead_letter_queue(Arc::clone(&dlq), max_receive_count);
        Ok(QueueUnderTest {
            queue: Arc::new(queue),
            dead_letter_queue: Some(dlq),
        })
    }
}

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "receive_returns_at_most_max",
    "received_message_is_invisible_then_redelivered",
    "receive_applies_the_visibility_timeout_it_sends",
    "change_visibility_zero_makes_visible_at_once",
    "change_visibility_extends_the_deadline",
    "delete_removes_for_good",
    "stale_receipt_after_redelivery",
    "receipt_handles_sqs_never_issued",
    "redrive_moves_to_dlq_after_max_receive_count",
    "dead_letter_copy_carries_failure_and_attributes",
    "dead_letter_without_dlq",
    "fifo_group_order_and_blocking",
    "delayed_message_not_visible_before_delay",
    "batch_operations_of_23_entries",
    "attribute_round_trip",
    "long_poll_returns_when_a_message_arrives",
    "depth_counts",
    "standard_queue_carries_a_tenant_group",
];

/// Runs every case against queues from `factory`; returns every failed case.
pub async fn run_all(factory: &dyn QueueFactory) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (
            "receive_returns_at_most_max",
            Box::pin(receive_returns_at_most_max(factory)),
        ),
        (
            "received_message_is_invisible_then_redelivered",
            Box::pin(received_message_is_invisible_then_redelivered(factory)),
        ),
        (
            "receive_applies_the_visibility_timeout_it_sends",
            Box::pin(receive_applies_the_visibility_timeout_it_sends(factory)),
        ),
        (
            "change_visibility_zero_makes_visible_at_once",
            Box::pin(change_visibility_zero_makes_visible_at_once(factory)),
        ),
        (
            "change_visibility_extends_the_deadline",
            Box::pin(change_visibility_extends_the_deadline(factory)),
        ),
        (
            "delete_removes_for_good",
            Box::pin(delete_removes_for_good(factory)),
        ),
        (
            "stale_receipt_after_redelivery",
            Box::pin(stale_receipt_after_redelivery(factory)),
        ),
        (
            "receipt_handles_sqs_never_issued",
            Box::pin(receipt_handles_sqs_never_issued(factory)),
        ),
        (
            "redrive_moves_to_dlq_after_max_receive_count",
            Box::pin(redrive_moves_to_dlq_after_max_receive_count(factory)),
        ),
        (
            "dead_letter_copy_carries_failure_and_attributes",
            Box::pin(dead_letter_copy_carries_failure_and_attributes(factory)),
        ),
        (
            "dead_letter_without_dlq",
            Box::pin(dead_letter_without_dlq(factory)),
        ),
        (
            "fifo_group_order_and_blocking",
            Box::pin(fifo_group_order_and_blocking(factory)),
        ),
        (
            "delayed_message_not_visible_before_delay",
            Box::pin(delayed_message_not_visible_before_delay(factory)),
        ),
        (
            "batch_operations_of_23_entries",
            Box::pin(batch_operations_of_23_entries(factory)),
        ),
        ("attribute_round_trip", Box::pin(attribute_round_trip(factory))),
        (
            "long_poll_returns_when_a_message_arrives",
            Box::pin(long_poll_returns_when_a_message_arrives(factory)),
        ),
        ("depth_counts", Box::pin(depth_counts(factory))),
        (
            "standard_queue_carries_a_tenant_group",
            Box::pin(standard_queue_carries_a_tenant_group(factory)),
        ),
    ];
    run_cases("queue", CASES, cases).await
}

/// How long a case waits for something that must happen (generous: LocalStack on a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);
/// The long poll used while waiting.
const POLL: Duration = Duration::from_secs(1);
/// Clock slack between this process and the backend when checking "not before".
const SLACK: Duration = Duration::from_millis(300);

fn spec(case: &str, visibility_timeout_secs: u32) -> QueueSpec {
    QueueSpec {
        name_prefix: format!("conf-{}", case.replace('_', "-")),
        fifo: false,
        visibility_timeout_secs,
        max_receive_count: None,
    }
}

async fn create(
    case: &'static str,
    factory: &dyn QueueFactory,
    spec: QueueSpec,
) -> Result<QueueUnderTest, SuiteFailure> {
    factory.create(&spec).await.or_fail(case, "creating the queue")
}

fn body(case: &str, n: usize) -> OutgoingMessage {
    OutgoingMessage {
        body: format!("{{\"case\":\"{case}\",\"n\":{n}}}"),
        ..OutgoingMessage::default()
    }
}

async fn send(
    case: &'static str,
    queue: &dyn Queue,
    message: OutgoingMessage,
) -> Result<String, SuiteFailure> {
    queue.send(message).await.or_fail(case, "send")
}

async fn receive(
    case: &'static str,
    queue: &dyn Queue,
    max: usize,
    wait: Duration,
) -> Result<Vec<Message>, SuiteFailure> {
    let messages = queue.receive(max, wait).await.or_fail(case, "receive")?;
    ensure!(
        case,
        messages.len() <= max,
        "receive({max}) returned {} messages",
        messages.len()
    );
    Ok(messages)
}

/// Receives until a message with `id` comes (other messages are ignored), or fails after [`PATIENCE`].
async fn receive_id(
    case: &'static str,
    queue: &dyn Queue,
    id: &str,
    what: &str,
) -> Result<Message, SuiteFailure> {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let batch = receive(case, queue, 10, POLL).await?;
        if let Some(message) = batch.into_iter().find(|message| message.id == id) {
            return Ok(message);
        }
    }
    Err(SuiteFailure::new(
        case,
        format!("{what}: message {id} not received within {PATIENCE:?}"),
    ))
}

/// Receives until `count` distinct messages came, or fails after [`PATIENCE`].
async fn receive_distinct(
    case: &'static str,
    queue: &dyn Queue,
    count: usize,
) -> Result<Vec<Message>, SuiteFailure> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = HashSet::new();
    let mut received = Vec::new();
    while received.len() < count && Instant::now() < deadline {
        for message in receive(case, queue, 10, POLL).await? {
            ensure!(
                case,
                seen.insert(message.id.clone()),
                "message {} was delivered twice while in flight",
                message.id
            );
            received.push(message);
        }
    }
    ensure!(
        case,
        received.len() == count,
        "received {} of {count} messages within {PATIENCE:?}",
        received.len()
    );
    Ok(received)
}

fn change(message: &Message, timeout: Duration) -> VisibilityChange {
    VisibilityChange {
        receipt_handle: message.receipt_handle.clone(),
        timeout,
    }
}

async fn change_ok(
    case: &'static str,
    queue: &dyn Queue,
    changes: &[VisibilityChange],
    what: &str,
) -> CaseResult {
    let failures = queue.change_visibility_batch(changes).await.or_fail(case, what)?;
    ensure!(
        case,
        failures.is_empty(),
        "{what}: unexpected entry failures {failures:?}"
    );
    Ok(())
}

async fn delete_ok(
    case: &'static str,
    queue: &dyn Queue,
    receipts: &[ReceiptHandle],
    what: &str,
) -> CaseResult {
    let failures = queue.delete_batch(receipts).await.or_fail(case, what)?;
    ensure!(
        case,
        failures.is_empty(),
        "{what}: unexpected entry failures {failures:?}"
    );
    Ok(())
}

fn receipts(messages: &[Message]) -> Vec<ReceiptHandle> {
    messages
        .iter()
        .map(|message| message.receipt_handle.clone())
        .collect()
}

/// `receive` never returns more than asked, and returns each of 15 messages once while in flight.
pub async fn receive_returns_at_most_max(factory: &dyn QueueFactory) -> CaseResult {
    let case = "receive_returns_at_most_max";
    let under = create(case, factory, spec(case, 30)).await?;
    let queue = under.queue.as_ref();
    let mut sent = HashSet::new();
    for n in 0..15 {
        sent.insert(send(case, queue, body(case, n)).await?);
    }
    let first = receive(case, queue, 3, POLL).await?;
    ensure!(
        case,
        !first.is_empty(),
        "receive(3) with 15 visible messages returned none"
    );
    let rest = receive_distinct(case, queue, 15 - first.len()).await?;
    let all: HashSet<String> = first
        .iter()
        .chain(&rest)
        .map(|message| message.id.clone())
        .collect();
    ensure!(case, all == sent, "received ids differ from the sent ids");
    Ok(())
}

/// A received message stays invisible for the visibility timeout, then comes back with
/// `receive_count + 1` and a new receipt handle.
pub async fn received_message_is_invisible_then_redelivered(factory: &dyn QueueFactory) -> CaseResult {
    let case = "received_message_is_invisible_then_redelivered";
    let visibility = Duration::from_secs(2);
    let under = create(case, factory, spec(case, 2)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let first = receive_id(case, queue, &id, "first delivery").await?;
    let received_at = Instant::now();
    ensure!(
        case,
        first.receive_count == 1,
        "first delivery has receive_count {}",
        first.receive_count
    );
    let during = receive(case, queue, 10, Duration::ZERO).await?;
    ensure!(
        case,
        during.iter().all(|message| message.id != id) || received_at.elapsed() >= visibility,
        "message was delivered again while in flight"
    );
    let second = receive_id(case, queue, &id, "redelivery after the visibility timeout").await?;
    let after = received_at.elapsed();
    ensure!(
        case,
        after + SLACK >= visibility,
        "redelivered after {after:?}, before the {visibility:?} timeout"
    );
    ensure!(
        case,
        second.receive_count == 2,
        "redelivery has receive_count {}",
        second.receive_count
    );
    ensure!(
        case,
        second.receipt_handle != first.receipt_handle,
        "redelivery reused the receipt handle"
    );
    ensure!(case, second.body == first.body, "redelivery changed the body");
    delete_ok(
        case,
        queue,
        &[second.receipt_handle],
        "delete with the latest handle",
    )
    .await
}

/// A receive's own `VisibilityTimeout` applies, not the queue's: the worker sends the one its heartbeat
/// computes deadlines from, so the two cannot disagree.
pub(crate) async fn receive_applies_the_visibility_timeout_it_sends(
    factory: &dyn QueueFactory,
) -> CaseResult {
    let case = "receive_applies_the_visibility_timeout_it_sends";
    let sent = Duration::from_secs(2);
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let deadline = Instant::now() + PATIENCE;
    let mut first = None;
    while first.is_none() && Instant::now() < deadline {
        let batch = queue
            .receive_with_visibility(10, POLL, sent)
            .await
            .or_fail(case, "receive with a visibility timeout")?;
        first = batch.into_iter().find(|message| message.id == id);
    }
    ensure!(
        case,
        first.is_some(),
        "message {id} not received within {PATIENCE:?}"
    );
    let received_at = Instant::now();
    let again = receive_id(
        case,
        queue,
        &id,
        "redelivery after the 2 s the receive sent (not the queue's 60 s)",
    )
    .await?;
    let after = received_at.elapsed();
    ensure!(
        case,
        after + SLACK >= sent,
        "redelivered after {after:?}, before the {sent:?} the receive sent"
    );
    delete_ok(case, queue, &[again.receipt_handle], "delete").await
}

/// `change_visibility(0)` makes an in-flight message visible at once.
pub async fn change_visibility_zero_makes_visible_at_once(factory: &dyn QueueFactory) -> CaseResult {
    let case = "change_visibility_zero_makes_visible_at_once";
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let first = receive_id(case, queue, &id, "first delivery").await?;
    let changed_at = Instant::now();
    change_ok(
        case,
        queue,
        &[change(&first, Duration::ZERO)],
        "change_visibility(0)",
    )
    .await?;
    let again = receive_id(case, queue, &id, "delivery after change_visibility(0)").await?;
    ensure!(
        case,
        changed_at.elapsed() < Duration::from_secs(30),
        "came back after {:?}, as if the 60 s timeout had run",
        changed_at.elapsed()
    );
    ensure!(
        case,
        again.receive_count == 2,
        "receive_count {} after visibility 0",
        again.receive_count
    );
    Ok(())
}

/// `change_visibility(d)` moves the deadline to `d` from now, past the queue's timeout.
pub async fn change_visibility_extends_the_deadline(factory: &dyn QueueFactory) -> CaseResult {
    let case = "change_visibility_extends_the_deadline";
    let extended = Duration::from_secs(4);
    let under = create(case, factory, spec(case, 1)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let first = receive_id(case, queue, &id, "first delivery").await?;
    let changed_at = Instant::now();
    change_ok(case, queue, &[change(&first, extended)], "change_visibility(4 s)").await?;
    let window = receive(case, queue, 10, Duration::from_secs(2)).await?;
    ensure!(
        case,
        window.iter().all(|message| message.id != id) || changed_at.elapsed() >= extended,
        "message came back after the queue's 1 s timeout although its visibility was extended to 4 s"
    );
    let again = receive_id(case, queue, &id, "delivery after the extended deadline").await?;
    let after = changed_at.elapsed();
    ensure!(
        case,
        after + SLACK >= extended,
        "came back {after:?} after the change, before {extended:?}"
    );
    ensure!(
        case,
        again.receive_count == 2,
        "receive_count {}",
        again.receive_count
    );
    Ok(())
}

/// A deleted message never comes back; deleting it again with its last handle succeeds.
pub async fn delete_removes_for_good(factory: &dyn QueueFactory) -> CaseResult {
    let case = "delete_removes_for_good";
    let under = create(case, factory, spec(case, 1)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let first = receive_id(case, queue, &id, "first delivery").await?;
    delete_ok(case, queue, std::slice::from_ref(&first.receipt_handle), "delete").await?;
    let later = receive(case, queue, 10, Duration::from_secs(3)).await?;
    ensure!(
        case,
        later.is_empty(),
        "a deleted message came back ({} messages)",
        later.len()
    );
    delete_ok(
        case,
        queue,
        &[first.receipt_handle],
        "repeated delete with the last handle",
    )
    .await?;
    let depth = queue.depth().await.or_fail(case, "depth")?;
    ensure!(
        case,
        depth.visible == 0 && depth.in_flight == 0,
        "depth after delete: {depth:?}"
    );
    Ok(())
}

/// After the message was received again, an old receipt must not break the latest one.
///
/// What the backends do with the old receipt differs, and the case accepts each (measured on LocalStack
/// 4.8.1; SQS's documentation in brackets):
///
/// | old receipt used for | MemoryQueue | LocalStack standard | LocalStack FIFO | SQS (documented) |
/// |---|---|---|---|---|
/// | visibility change | `LeaseLost` | accepted | accepted | refused ("receipt handle has expired") |
/// | delete | `LeaseLost`, kept | accepted, **deleted** | refused, kept | accepted, "might not be deleted" (FIFO: refused) |
///
/// What all of them do, and the case requires: neither call fails as a whole; after a visibility change
/// with the old receipt the latest receipt still works; after a delete with the old receipt either the
/// entry succeeded, or it failed and the message is still there under its latest receipt. So a runtime
/// must treat a successful heartbeat as "probably still ours" and a failed one as "lost", and never
/// count on a stale delete being refused.
pub async fn stale_receipt_after_redelivery(factory: &dyn QueueFactory) -> CaseResult {
    let case = "stale_receipt_after_redelivery";
    let under = create(case, factory, spec(case, 1)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let first = receive_id(case, queue, &id, "first delivery").await?;
    let second = receive_id(case, queue, &id, "redelivery").await?;
    ensure!(
        case,
        second.receive_count == 2,
        "redelivery has receive_count {}",
        second.receive_count
    );

    let stale_change = queue
        .change_visibility_batch(&[change(&first, Duration::from_secs(30))])
        .await
        .or_fail(case, "change_visibility with the stale handle")?;
    ensure!(
        case,
        stale_change.iter().all(|failure| failure.index == 0),
        "change_visibility with a stale handle reported {stale_change:?}"
    );
    change_ok(
        case,
        queue,
        &[change(&second, Duration::ZERO)],
        "change_visibility(0) with the latest handle after a stale change",
    )
    .await?;
    let third = receive_id(case, queue, &id, "delivery after the stale visibility change").await?;
    ensure!(
        case,
        third.receive_count == 3,
        "receive_count {}",
        third.receive_count
    );

    let stale_delete = queue
        .delete_batch(std::slice::from_ref(&second.receipt_handle))
        .await
        .or_fail(case, "delete with the stale handle")?;
    match stale_delete.as_slice() {
        [] => {
            tracing::debug!("backend accepted a delete with a stale receipt");
            Ok(())
        }
        [failure] if failure.index == 0 => {
            change_ok(
                case,
                queue,
                &[change(&third, Duration::ZERO)],
                "the latest handle after a refused stale delete",
            )
            .await?;
            let fourth = receive_id(case, queue, &id, "delivery after the refused stale delete").await?;
            delete_ok(
                case,
                queue,
                &[fourth.receipt_handle],
                "delete with the latest handle",
            )
            .await
        }
        other => Err(SuiteFailure::new(
            case,
            format!("stale delete of one entry reported {other:?}"),
        )),
    }
}

/// A receipt handle the queue never issued is told apart from one it issued whose message is gone.
///
/// The Lambda adapter runs a record whose handle SQS never issued (a hand-written event, as
/// `cargo lambda invoke` sends) and does not run one whose message is no longer in flight, so the two
/// answers must differ, and the doubles must give the same ones:
///
/// | handle used for a visibility change | SQS (documented) | LocalStack 4.8.1 | MemoryQueue | moto 5.2.6 |
/// |---|---|---|---|---|
/// | malformed (`MessageReceiptHandle`) | `ReceiptHandleIsInvalid` | `ReceiptHandleIsInvalid` | `NotIssued` | `ReceiptHandleIsInvalid` |
/// | another queue's real handle | not documented | `ReceiptHandleIsInvalid` | `NotIssued` | `ReceiptHandleIsInvalid` |
/// | this queue's, message deleted | `InvalidParameterValue` "Message does not exist or is not available for visibility timeout change." | `InvalidParameterValueException`, same text | `LeaseLost` | **`ReceiptHandleIsInvalid`** |
///
/// `conveyor-sqs` maps `ReceiptHandleIsInvalid` to [`EntryError::NotIssued`] and the others to
/// [`EntryError::LeaseLost`]. moto cannot tell a deleted message from a handle it never issued, so it
/// fails this case: a deviation of the fidelity matrix (`tests/emulators/fidelity/sqs.rs`, the table in
/// `docs/running.md`). A delete with a handle never issued fails the
/// same way (`NotIssued`); a delete of a deleted message succeeds (see [`delete_removes_for_good`]).
/// Checked on a standard and on a FIFO queue.
pub async fn receipt_handles_sqs_never_issued(factory: &dyn QueueFactory) -> CaseResult {
    let case = "receipt_handles_sqs_never_issued";
    for fifo in [false, true] {
        let mut queue_spec = spec(case, 60);
        queue_spec.fifo = fifo;
        let under = create(case, factory, queue_spec.clone()).await?;
        let other = create(case, factory, queue_spec).await?;
        let queue = under.queue.as_ref();
        let mine = send_and_receive(case, queue, fifo).await?;
        let theirs = send_and_receive(case, other.queue.as_ref(), fifo).await?;

        // The handle of `aws_lambda_events`' fixture, another queue's, and this queue's own.
        let made_up = Message {
            receipt_handle: ReceiptHandle("MessageReceiptHandle".to_owned()),
            ..mine.clone()
        };
        let changes = [
            change(&made_up, Duration::from_secs(60)),
            change(&theirs, Duration::from_secs(60)),
            change(&mine, Duration::from_secs(60)),
        ];
        let failures = queue
            .change_visibility_batch(&changes)
            .await
            .or_fail(case, "change_visibility_batch with handles never issued")?;
        ensure_not_issued(case, &failures, &[0, 1], "visibility change")?;
        let failures = queue
            .delete_batch(&[made_up.receipt_handle.clone(), theirs.receipt_handle.clone()])
            .await
            .or_fail(case, "delete_batch with handles never issued")?;
        ensure_not_issued(case, &failures, &[0, 1], "delete")?;

        // This queue's own handle, once its message is deleted: issued, no longer in flight.
        delete_ok(case, queue, std::slice::from_ref(&mine.receipt_handle), "delete").await?;
        let failures = queue
            .change_visibility_batch(&[change(&mine, Duration::from_secs(60))])
            .await
            .or_fail(case, "change_visibility_batch of a deleted message")?;
        ensure!(
            case,
            matches!(
                failures.as_slice(),
                [EntryFailure {
                    index: 0,
                    error: EntryError::LeaseLost(_)
                }]
            ),
            "fifo {fifo}: a visibility change of a deleted message must be LeaseLost (issued, no longer in \
             flight), got {failures:?}"
        );
    }
    Ok(())
}

/// Sends one message and receives it.
async fn send_and_receive(
    case: &'static str,
    queue: &dyn Queue,
    fifo: bool,
) -> Result<Message, SuiteFailure> {
    let mut message = body(case, 0);
    if fifo {
        message.group_id = Some("g".to_owned());
        message.deduplication_id = Some(format!("{case}-0"));
    }
    let id = send(case, queue, message).await?;
    receive_id(case, queue, &id, "delivery").await
}

/// Checks that exactly the entries `indexes` failed, each as [`EntryError::NotIssued`].
fn ensure_not_issued(
    case: &'static str,
    failures: &[EntryFailure],
    indexes: &[usize],
    what: &str,
) -> CaseResult {
    let failed: Vec<usize> = failures.iter().map(|failure| failure.index).collect();
    ensure!(
        case,
        failed == indexes
            && failures
                .iter()
                .all(|failure| matches!(failure.error, EntryError::NotIssued(_))),
        "{what}: entries {indexes:?} (handles the queue never issued) must fail alone as NotIssued, got \
         {failures:?}"
    );
    Ok(())
}

/// A message received `max_receive_count` times moves to the DLQ with its body and attributes.
pub async fn redrive_moves_to_dlq_after_max_receive_count(factory: &dyn QueueFactory) -> CaseResult {
    let case = "redrive_moves_to_dlq_after_max_receive_count";
    let mut queue_spec = spec(case, 30);
    queue_spec.max_receive_count = Some(2);
    let under = create(case, factory, queue_spec).await?;
    let queue = under.queue.as_ref();
    let Some(dlq) = under.dead_letter_queue.as_deref() else {
        return Err(SuiteFailure::new(
            case,
            "the factory made no DLQ for max_receive_count 2",
        ));
    };
    let mut message = body(case, 0);
    message
        .attributes
        .insert("origin".to_owned(), AttributeValue::string("conformance"));
    let id = send(case, queue, message.clone()).await?;
    for expected in 1..=2 {
        let delivery = receive_id(case, queue, &id, "delivery before the redrive").await?;
        ensure!(
            case,
            delivery.receive_count == expected,
            "delivery {expected} has receive_count {}",
            delivery.receive_count
        );
        change_ok(
            case,
            queue,
            &[change(&delivery, Duration::ZERO)],
            "change_visibility(0)",
        )
        .await?;
    }
    let deadline = Instant::now() + PATIENCE;
    let mut moved = None;
    while moved.is_none() && Instant::now() < deadline {
        let from_queue = receive(case, queue, 10, Duration::ZERO).await?;
        if let Some(third) = from_queue.iter().find(|message| message.id == id) {
            return Err(SuiteFailure::new(
                case,
                format!(
                    "delivered a third time (receive_count {}) instead of moving",
                    third.receive_count
                ),
            ));
        }
        moved = receive(case, dlq, 10, POLL).await?.into_iter().next();
    }
    let Some(moved) = moved else {
        return Err(SuiteFailure::new(
            case,
            format!("nothing reached the DLQ within {PATIENCE:?}"),
        ));
    };
    ensure!(
        case,
        moved.body == message.body,
        "the DLQ message has another body"
    );
    ensure!(
        case,
        moved.id == id,
        "the redriven message has id {}, the original {id}",
        moved.id
    );
    ensure!(
        case,
        moved.attributes == message.attributes,
        "attributes changed: {:?}",
        moved.attributes
    );
    ensure!(
        case,
        !moved.attributes.contains_key(FAILURE_ATTRIBUTE),
        "a redriven message has no failure record"
    );
    Ok(())
}

/// `dead_letter` sends a copy with the failure recorded and the original attributes, and leaves the
/// original in flight.
pub async fn dead_letter_copy_carries_failure_and_attributes(factory: &dyn QueueFactory) -> CaseResult {
    let case = "dead_letter_copy_carries_failure_and_attributes";
    let mut queue_spec = spec(case, 60);
    queue_spec.max_receive_count = Some(5);
    let under = create(case, factory, queue_spec).await?;
    let queue = under.queue.as_ref();
    let Some(dlq) = under.dead_letter_queue.as_deref() else {
        return Err(SuiteFailure::new(
            case,
            "the factory made no DLQ for max_receive_count 5",
        ));
    };
    let mut message = body(case, 0);
    message
        .attributes
        .insert("conveyor.type".to_owned(), AttributeValue::string("email"));
    message
        .attributes
        .insert("attempt".to_owned(), AttributeValue::number(7));
    let id = send(case, queue, message.clone()).await?;
    let received = receive_id(case, queue, &id, "delivery").await?;
    let failure = Failure::now("no such user", received.receive_count, queue.name(), "email");
    let sent = queue
        .dead_letter(&received, &failure)
        .await
        .or_fail(case, "dead_letter")?;
    ensure!(
        case,
        sent == DeadLetter::Sent(dlq.name().to_owned()),
        "dead_letter returned {sent:?}, the DLQ is {}",
        dlq.name()
    );

    let copies = receive_distinct(case, dlq, 1).await?;
    let copy = &copies[0];
    ensure!(case, copy.body == message.body, "the copy has another body");
    for (name, value) in &message.attributes {
        ensure!(
            case,
            copy.attributes.get(name) == Some(value),
            "the copy lost attribute {name}: {:?}",
            copy.attributes
        );
    }
    let recorded = copy.string_attribute(FAILURE_ATTRIBUTE).unwrap_or_default();
    let parsed: Result<Failure, _> = serde_json::from_str(recorded);
    ensure!(
        case,
        parsed.as_ref().ok() == Some(&failure),
        "{FAILURE_ATTRIBUTE} is {recorded:?}, expected {failure:?}"
    );

    // The original was not deleted: it is still in flight under its receipt.
    change_ok(
        case,
        queue,
        &[change(&received, Duration::ZERO)],
        "change_visibility(0) on the original",
    )
    .await?;
    let again = receive_id(case, queue, &id, "the original after dead_letter").await?;
    ensure!(
        case,
        again.receive_count == 2,
        "receive_count {}",
        again.receive_count
    );
    Ok(())
}

/// Without a redrive policy, `dead_letter` says so and sends nothing.
pub async fn dead_letter_without_dlq(factory: &dyn QueueFactory) -> CaseResult {
    let case = "dead_letter_without_dlq";
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let id = send(case, queue, body(case, 0)).await?;
    let received = receive_id(case, queue, &id, "delivery").await?;
    let failure = Failure::now("bad input", 1, queue.name(), "email");
    let outcome = queue
        .dead_letter(&received, &failure)
        .await
        .or_fail(case, "dead_letter")?;
    ensure!(
        case,
        outcome == DeadLetter::NoDeadLetterQueue,
        "dead_letter without a DLQ returned {outcome:?}"
    );
    Ok(())
}

/// FIFO: each group's messages come in send order, a retried message comes back before its successors,
/// and no message of a group is delivered while another of that group is in flight.
pub async fn fifo_group_order_and_blocking(factory: &dyn QueueFactory) -> CaseResult {
    let case = "fifo_group_order_and_blocking";
    let mut queue_spec = spec(case, 60);
    queue_spec.fifo = true;
    let under = create(case, factory, queue_spec).await?;
    let queue = under.queue.as_ref();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, group) in ["a", "b", "a", "b", "a"].into_iter().enumerate() {
        let mut message = body(case, n);
        message.group_id = Some(group.to_owned());
        message.deduplication_id = Some(format!("{case}-{n}"));
        let id = send(case, queue, message).await?;
        order.entry(group.to_owned()).or_default().push(id);
    }
    let group_of = |message: &Message| message.group_id.clone().unwrap_or_default();

    let first = receive(case, queue, 1, POLL).await?;
    let Some(head) = first.into_iter().next() else {
        return Err(SuiteFailure::new(
            case,
            "no message from a FIFO queue with 5 visible",
        ));
    };
    let head_group = group_of(&head);
    ensure!(
        case,
        order.get(&head_group).and_then(|ids| ids.first()) == Some(&head.id),
        "first delivery is not its group's head"
    );
    let other_group = if head_group == "a" { "b" } else { "a" };

    let others = receive(case, queue, 10, POLL).await?;
    ensure!(
        case,
        others.iter().all(|message| group_of(message) != head_group),
        "delivered a message of group {head_group} while its head was in flight"
    );
    let other_ids: Vec<&String> = others.iter().map(|message| &message.id).collect();
    let expected_other = &order[other_group];
    ensure!(
        case,
        !other_ids.is_empty(),
        "group {other_group} had nothing in flight but was not delivered"
    );
    ensure!(
        case,
        other_ids
            .iter()
            .zip(expected_other)
            .all(|(got, want)| *got == want),
        "group {other_group} out of order"
    );
    let blocked = receive(case, queue, 10, POLL).await?;
    ensure!(
        case,
        blocked.is_empty(),
        "delivered {} messages while both groups had messages in flight",
        blocked.len()
    );

    // A retried head comes back first, before the rest of its group.
    change_ok(
        case,
        queue,
        &[change(&head, Duration::ZERO)],
        "change_visibility(0) on the head",
    )
    .await?;
    let retried = receive(case, queue, 10, POLL).await?;
    ensure!(
        case,
        retried.first().map(|message| &message.id) == Some(&head.id),
        "the retried head did not come back first"
    );
    ensure!(
        case,
        retried.first().is_some_and(|message| message.receive_count == 2),
        "the retried head's receive_count is not 2"
    );
    ensure!(
        case,
        retried.iter().all(|message| group_of(message) == head_group),
        "delivered a message of a group in flight"
    );

    // Delete as we go and check each group's complete order.
    let mut delivered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut pending = others;
    pending.extend(retried);
    let deadline = Instant::now() + PATIENCE;
    while delivered.values().map(Vec::len).sum::<usize>() < 5 && Instant::now() < deadline {
        for message in &pending {
            delivered
                .entry(group_of(message))
                .or_default()
                .push(message.id.clone());
        }
        if !pending.is_empty() {
            delete_ok(case, queue, &receipts(&pending), "delete").await?;
        }
        pending = receive(case, queue, 10, POLL).await?;
    }
    ensure!(
        case,
        delivered == order,
        "per-group delivery order {delivered:?}, sent {order:?}"
    );
    Ok(())
}

/// A message sent with a delay is not received before the delay; one without is received at once.
pub async fn delayed_message_not_visible_before_delay(factory: &dyn QueueFactory) -> CaseResult {
    let case = "delayed_message_not_visible_before_delay";
    let delay = Duration::from_secs(2);
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let sent_at = Instant::now();
    let mut later = body(case, 1);
    later.delay = Some(delay);
    let later_id = send(case, queue, later).await?;
    let now_id = send(case, queue, body(case, 0)).await?;
    let depth = queue.depth().await.or_fail(case, "depth")?;
    ensure!(
        case,
        depth.delayed == 1 || sent_at.elapsed() >= delay,
        "depth right after sending: {depth:?}, expected 1 delayed"
    );
    receive_id(case, queue, &now_id, "the undelayed message").await?;
    let delayed = receive_id(case, queue, &later_id, "the delayed message").await?;
    let after = sent_at.elapsed();
    ensure!(
        case,
        after + SLACK >= delay,
        "the delayed message came after {after:?}, before its {delay:?} delay"
    );
    ensure!(
        case,
        delayed.receive_count == 1,
        "receive_count {}",
        delayed.receive_count
    );
    Ok(())
}

/// Batch visibility changes and deletes of 23 entries (three calls each), with a bad entry reported by
/// its index.
pub async fn batch_operations_of_23_entries(factory: &dyn QueueFactory) -> CaseResult {
    let case = "batch_operations_of_23_entries";
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    for n in 0..23 {
        send(case, queue, body(case, n)).await?;
    }
    let first = receive_distinct(case, queue, 23).await?;
    let mut changes: Vec<VisibilityChange> = first
        .iter()
        .map(|message| change(message, Duration::ZERO))
        .collect();
    change_ok(case, queue, &changes, "change_visibility_batch of 23").await?;
    let second = receive_distinct(case, queue, 23).await?;
    ensure!(
        case,
        second.iter().all(|message| message.receive_count == 2),
        "not every message came back with receive_count 2"
    );

    // A deleted message's receipt in the middle of a batch fails alone, reported by its index.
    delete_ok(
        case,
        queue,
        std::slice::from_ref(&second[0].receipt_handle),
        "delete one",
    )
    .await?;
    changes = second[1..]
        .iter()
        .map(|message| change(message, Duration::from_secs(60)))
        .collect();
    changes.insert(11, change(&second[0], Duration::from_secs(60)));
    let failures = queue
        .change_visibility_batch(&changes)
        .await
        .or_fail(case, "change_visibility_batch with a deleted entry")?;
    let indexes: Vec<usize> = failures.iter().map(|failure| failure.index).collect();
    ensure!(
        case,
        indexes == [11],
        "expected entry 11 (a deleted message) to fail alone, got {failures:?}"
    );

    // All 23 receipts, one of them of the message deleted above: deleting it again succeeds.
    delete_ok(case, queue, &receipts(&second), "delete_batch of 23").await?;
    let left = receive(case, queue, 10, POLL).await?;
    ensure!(
        case,
        left.is_empty(),
        "{} messages left after deleting all 23",
        left.len()
    );
    Ok(())
}

/// Body, message attributes of every type, and the trace header survive the round trip; the system
/// attributes are filled in.
pub async fn attribute_round_trip(factory: &dyn QueueFactory) -> CaseResult {
    let case = "attribute_round_trip";
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let mut attributes = Attributes::new();
    attributes.insert(
        "conveyor.type".to_owned(),
        AttributeValue::string("welcome_email"),
    );
    attributes.insert("conveyor.version".to_owned(), AttributeValue::number(2));
    attributes.insert("unicode".to_owned(), AttributeValue::string("héllo ✓ 東京"));
    attributes.insert(
        "bytes".to_owned(),
        AttributeValue {
            data_type: "Binary".to_owned(),
            string_value: None,
            binary_value: Some(vec![0, 1, 2, 254, 255]),
        },
    );
    attributes.insert(
        "json".to_owned(),
        AttributeValue {
            data_type: "String.json".to_owned(),
            string_value: Some("{\"a\":[1,2]}".to_owned()),
            binary_value: None,
        },
    );
    let message = OutgoingMessage {
        body: "{\"text\":\"ünïcode ✓ and \\\"quotes\\\" and <xml/> & more\"}".to_owned(),
        attributes: attributes.clone(),
        trace_header: Some(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1".to_owned(),
        ),
        ..OutgoingMessage::default()
    };
    let id = send(case, queue, message.clone()).await?;
    ensure!(case, !id.is_empty(), "send returned an empty message id");
    let received = receive_id(case, queue, &id, "delivery").await?;
    ensure!(
        case,
        received.body == message.body,
        "body changed: {:?}",
        received.body
    );
    ensure!(
        case,
        received.attributes == attributes,
        "attributes changed: {:?}",
        received.attributes
    );
    ensure!(
        case,
        received.trace_header == message.trace_header,
        "trace header changed: {:?}",
        received.trace_header
    );
    ensure!(
        case,
        received.receive_count == 1,
        "receive_count {}",
        received.receive_count
    );
    ensure!(case, received.sent_at.is_some(), "no SentTimestamp");
    ensure!(
        case,
        received.first_received_at.is_some(),
        "no ApproximateFirstReceiveTimestamp"
    );
    ensure!(
        case,
        received.group_id.is_none(),
        "a standard queue's message has a group {:?}",
        received.group_id
    );
    Ok(())
}

/// A standard queue takes a `MessageGroupId` (the tenant of SQS's fair queues) and returns it on
/// receive; a group SQS's rules refuse (a space) and a deduplication id (FIFO only) are refused.
pub async fn standard_queue_carries_a_tenant_group(factory: &dyn QueueFactory) -> CaseResult {
    let case = "standard_queue_carries_a_tenant_group";
    let under = create(case, factory, spec(case, 30)).await?;
    let queue = under.queue.as_ref();
    let tenant = OutgoingMessage {
        group_id: Some("tenant-42:eu/acme".to_owned()),
        ..body(case, 1)
    };
    let id = send(case, queue, tenant).await?;
    let received = receive_id(case, queue, &id, "the tenant's message").await?;
    ensure!(
        case,
        received.group_id.as_deref() == Some("tenant-42:eu/acme"),
        "the MessageGroupId came back as {:?}",
        received.group_id
    );
    let spaced = OutgoingMessage {
        group_id: Some("acme corp".to_owned()),
        ..body(case, 2)
    };
    ensure!(
        case,
        matches!(queue.send(spaced).await, Err(QueueError::Invalid { .. })),
        "a MessageGroupId with a space was not refused as invalid"
    );
    let deduplicated = OutgoingMessage {
        deduplication_id: Some("d-1".to_owned()),
        ..body(case, 3)
    };
    ensure!(
        case,
        matches!(queue.send(deduplicated).await, Err(QueueError::Invalid { .. })),
        "a MessageDeduplicationId on a standard queue was not refused as invalid"
    );
    Ok(())
}

/// A long poll returns as soon as a message arrives, not at the end of its wait.
pub async fn long_poll_returns_when_a_message_arrives(factory: &dyn QueueFactory) -> CaseResult {
    let case = "long_poll_returns_when_a_message_arrives";
    let wait = Duration::from_secs(10);
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    let started = Instant::now();
    let later = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        queue.send(body(case, 0)).await
    };
    let (received, sent) = tokio::join!(queue.receive(1, wait), later);
    let id = sent.or_fail(case, "send during the long poll")?;
    let received = received.or_fail(case, "long-poll receive")?;
    let elapsed = started.elapsed();
    ensure!(
        case,
        received.iter().any(|message| message.id == id),
        "the long poll returned {} messages, not the one sent",
        received.len()
    );
    ensure!(
        case,
        elapsed < wait,
        "the long poll returned after {elapsed:?}, the whole wait"
    );
    Ok(())
}

/// `depth` counts visible and in-flight messages.
pub async fn depth_counts(factory: &dyn QueueFactory) -> CaseResult {
    let case = "depth_counts";
    let under = create(case, factory, spec(case, 60)).await?;
    let queue = under.queue.as_ref();
    for n in 0..3 {
        send(case, queue, body(case, n)).await?;
    }
    let deadline = Instant::now() + PATIENCE;
    let mut received = Vec::new();
    while received.is_empty() && Instant::now() < deadline {
        received = receive(case, queue, 1, POLL).await?;
    }
    ensure!(
        case,
        received.len() == 1,
        "no message received within {PATIENCE:?}"
    );
    let mut depth = queue.depth().await.or_fail(case, "depth")?;
    while (depth.visible, depth.in_flight) != (2, 1) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        depth = queue.depth().await.or_fail(case, "depth")?;
    }
    ensure!(
        case,
        (depth.visible, depth.in_flight, depth.delayed) == (2, 1, 0),
        "depth {depth:?}, expected 2 visible and 1 in flight"
    );
    delete_ok(case, queue, &receipts(&received), "delete").await
}
