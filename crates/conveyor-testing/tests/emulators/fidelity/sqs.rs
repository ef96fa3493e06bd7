//! The SQS table: the queue conformance suite (and the probes below) against every SQS implementation
//! that installs from the registries here, `SqsQueue` on LocalStack 4.8.1, moto's server and fauxqs, and
//! against `MemoryQueue` beside them. See the parent module for how a run is judged.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::port::{OutgoingMessage, Queue, VisibilityChange};
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{OwnFauxqs, OwnMoto, create_queue, ensure_local_aws, sqs_client};
use conveyor_testing::queue_conformance::{self, QueueFactory, QueueUnderTest};
use conveyor_testing::{MemoryQueueFactory, QueueSpec};

use super::{Deviation, Failed, Implementation, Matrix, Row, Seen};

/// The implementations, in the table's order.
const COLUMNS: &[Implementation] = &[
    Implementation::LocalStack,
    Implementation::MotoSqs,
    Implementation::Fauxqs,
    Implementation::MemoryQueue,
];

/// Every known deviation. The test fails when a run disagrees with this list in either direction.
const DEVIATIONS: &[Deviation] = &[
    Deviation {
        implementation: Implementation::LocalStack,
        seen: Seen::Always,
        case: "fifo_group_stays_locked_while_any_message_is_in_flight",
        does: "Unlocks a FIFO group as soon as any of its messages is visible again: the second message, made \
               visible, is delivered while the first is still in flight (conveyor-core's FifoGate guards the \
               worker against it).",
        aws_says: "Inflight messages block delivery of available messages within the same message group.",
        source: "https://repost.aws/knowledge-center/sqs-fifo-messages-not-returned",
    },
    Deviation {
        implementation: Implementation::MotoSqs,
        seen: Seen::Always,
        case: "receipt_handles_sqs_never_issued",
        does: "Answers a visibility change of a deleted message (a handle it issued) with \
               `ReceiptHandleIsInvalid`, as for a handle it never issued, so the adapter reports `NotIssued` \
               where SQS's answer maps to `LeaseLost`.",
        aws_says: "MessageNotInflight: The specified message isn't in flight.",
        source: "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ChangeMessageVisibility.html",
    },
    Deviation {
        implementation: Implementation::MotoSqs,
        seen: Seen::Always,
        case: "standard_queue_carries_a_tenant_group",
        does: "Accepts a `MessageGroupId` with a space (`acme corp`).",
        aws_says: "The length of MessageGroupId is 128 characters. Valid values: alphanumeric characters and \
                   punctuation (!\"#$%&'()*+,-./:;<=>?@[\\]^_\\`{|}~).",
        source: "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html",
    },
    Deviation {
        implementation: Implementation::Fauxqs,
        seen: Seen::Always,
        case: "attribute_round_trip",
        does: "Drops the `AWSTraceHeader` system attribute: the trace header sent is not received.",
        aws_says: "AWSTraceHeader – Returns the X-Ray trace header string.",
        source: "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html",
    },
    Deviation {
        implementation: Implementation::Fauxqs,
        seen: Seen::Always,
        case: "fifo_group_stays_locked_while_any_message_is_in_flight",
        does: "Returns one message of a FIFO group per receive (2 visible, `MaxNumberOfMessages` 10: 1 \
               returned), so the group lock with two messages in flight cannot be set up.",
        aws_says: "When you specify a MaxNumberOfMessages parameter in the ReceiveMessage API call, SQS returns \
                   as many messages with the same message group ID as possible.",
        source: "https://repost.aws/knowledge-center/sqs-fifo-messages-not-returned",
    },
    Deviation {
        implementation: Implementation::Fauxqs,
        seen: Seen::Always,
        case: "receipt_handles_sqs_never_issued",
        does: "Deletes with receipt handles it never issued (made up, another queue's) succeed instead of \
               failing with `ReceiptHandleIsInvalid`.",
        aws_says: "ReceiptHandleIsInvalid: The specified receipt handle isn't valid.",
        source: "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_DeleteMessage.html",
    },
    Deviation {
        implementation: Implementation::Fauxqs,
        seen: Seen::Always,
        case: "standard_queue_carries_a_tenant_group",
        does: "Does not return a standard queue's `MessageGroupId` (the tenant of a fair queue) on receive.",
        aws_says: "MessageGroupId – Returns the value provided by the producer that calls the SendMessage action.",
        source: "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html",
    },
];

/// Probes of SQS behaviour the suite does not check, because an emulator the project runs on is known to
/// get them wrong; they run beside the suite's cases and appear in the table the same way.
const PROBES: &[&str] = &["fifo_group_stays_locked_while_any_message_is_in_flight"];

fn matrix() -> Matrix {
    let mut rows: Vec<Row> = queue_conformance::CASES
        .iter()
        .map(|case| Row::new(*case, None))
        .collect();
    rows.extend(PROBES.iter().map(|probe| Row::new(*probe, Some("probe"))));
    Matrix {
        marker: "fidelity-matrix",
        columns: COLUMNS,
        rows,
        deviations: DEVIATIONS,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sqs_implementation_deviates_only_as_the_matrix_says() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let (moto, fauxqs) = tokio::try_join!(OwnMoto::start(), OwnFauxqs::start())?;
    let localstack = SdkQueues(sqs_client().await);
    let moto = SdkQueues(moto.sqs_client());
    let fauxqs_queues = SdkQueues(fauxqs.sqs_client());
    let factories: [(Implementation, &dyn QueueFactory); 4] = [
        (Implementation::LocalStack, &localstack),
        (Implementation::MotoSqs, &moto),
        (Implementation::Fauxqs, &fauxqs_queues),
        (Implementation::MemoryQueue, &MemoryQueueFactory),
    ];
    matrix()
        .judge(&factories, async |factory: &&dyn QueueFactory| {
            run_implementation(*factory).await
        })
        .await
}

/// The suite and the probes, concurrently, against one implementation.
async fn run_implementation(factory: &dyn QueueFactory) -> Failed {
    let (suite, probe) = tokio::join!(
        queue_conformance::run_all(factory),
        fifo_group_stays_locked_while_any_message_is_in_flight(factory)
    );
    let mut failed = Failed::new();
    if let Err(failures) = suite {
        for failure in failures.0 {
            failed.insert(failure.case.to_owned(), failure.message);
        }
    }
    if let Err(message) = probe {
        failed.insert(PROBES[0].to_owned(), message);
    }
    failed
}

/// The SDK adapter, `SqsQueue`, on any SQS endpoint.
struct SdkQueues(aws_sdk_sqs::Client);

#[async_trait]
impl QueueFactory for SdkQueues {
    async fn create(&self, spec: &QueueSpec) -> anyhow::Result<QueueUnderTest> {
        let created = create_queue(&self.0, spec).await?;
        let queue = SqsQueue::connect(self.0.clone(), &created.url).await?;
        let dead_letter_queue = match &created.dlq_url {
            Some(url) => {
                let dlq: Arc<dyn Queue> = Arc::new(SqsQueue::connect(self.0.clone(), url).await?);
                Some(dlq)
            }
            None => None,
        };
        Ok(QueueUnderTest {
            queue: Arc::new(queue),
            dead_letter_queue,
        })
    }
}

/// FIFO: while one message of a group is in flight, no other message of that group is delivered, even
/// one that was received with it and made visible again. Two messages of a group are received together,
/// the second is made visible again (`ChangeMessageVisibility` 0) while the first stays in flight: a
/// receive must return nothing of the group until the first is deleted, then the second.
async fn fifo_group_stays_locked_while_any_message_is_in_flight(
    factory: &dyn QueueFactory,
) -> Result<(), String> {
    let spec = QueueSpec::fifo("fidelity-fifo-lock").visibility_timeout_secs(60);
    let under = factory
        .create(&spec)
        .await
        .map_err(|error| format!("creating the queue failed: {error}"))?;
    let queue = under.queue.as_ref();
    for n in 0..2 {
        let message = OutgoingMessage {
            body: format!("{{\"n\":{n}}}"),
            group_id: Some("g".to_owned()),
            deduplication_id: Some(format!("fifo-lock-{n}")),
            ..OutgoingMessage::default()
        };
        queue
            .send(message)
            .await
            .map_err(|error| format!("send failed: {error}"))?;
    }
    let both = receive_up_to(queue, 2).await?;
    if both.len() != 2 {
        return Err(format!(
            "a receive of 10 returned {} of the group's 2 visible messages",
            both.len()
        ));
    }
    let change = VisibilityChange {
        receipt_handle: both[1].receipt_handle.clone(),
        timeout: Duration::ZERO,
    };
    let failures = queue
        .change_visibility_batch(&[change])
        .await
        .map_err(|error| format!("change_visibility(0) on the second failed: {error}"))?;
    if !failures.is_empty() {
        return Err(format!(
            "change_visibility(0) on the second: entry failures {failures:?}"
        ));
    }
    let early = queue
        .receive(10, Duration::from_secs(1))
        .await
        .map_err(|error| format!("receive failed: {error}"))?;
    if !early.is_empty() {
        return Err(format!(
            "delivered {} message(s) of the group while its first message was in flight",
            early.len()
        ));
    }
    let failures = queue
        .delete_batch(&[both[0].receipt_handle.clone()])
        .await
        .map_err(|error| format!("deleting the first failed: {error}"))?;
    if !failures.is_empty() {
        return Err(format!("deleting the first: entry failures {failures:?}"));
    }
    let after = receive_up_to(queue, 1).await?;
    match after.first() {
        Some(message) if message.id == both[1].id => Ok(()),
        Some(message) => Err(format!(
            "after the first was deleted, {} came, not the second",
            message.id
        )),
        None => Err("after the first was deleted, the second never came".to_owned()),
    }
}

/// Receives (10 at a time, 1 s long polls) until `count` messages came or 10 s passed.
async fn receive_up_to(
    queue: &dyn Queue,
    count: usize,
) -> Result<Vec<conveyor_core::message::Message>, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut received = Vec::new();
    while received.len() < count && tokio::time::Instant::now() < deadline {
        let batch = queue
            .receive(10, Duration::from_secs(1))
            .await
            .map_err(|error| format!("receive failed: {error}"))?;
        received.extend(batch);
    }
    Ok(received)
}
