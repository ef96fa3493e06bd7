//! `SqsQueue` and `Producer` against LocalStack 4.8.1 (started by `localstack/start.sh` through
//! `conveyor_testing::localstack::ensure_local_aws`). Each test makes its own queues.
//!
//! What LocalStack 4.8.1 does with receipt handles, as asserted in `stale_receipt_handles`:
//! - a stale handle (the message was received again since, under a new handle) is accepted by
//!   `DeleteMessageBatch` (and the message is deleted) and by `ChangeMessageVisibilityBatch` (and the
//!   current receipt's visibility changes): LocalStack reports no lost lease for it;
//! - a handle of a deleted message: delete succeeds; a visibility change fails with
//!   `InvalidParameterValueException` "... for parameter ReceiptHandle is invalid. Reason: Message does
//!   not exist or is not available for visibility timeout change." (SenderFault false) -> `LeaseLost`;
//! - a malformed handle: both fail with `ReceiptHandleIsInvalid` (SenderFault false) -> `NotIssued`.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    message::{AttributeValue, Message, ReceiptHandle},
    port::{DeadLetter, EntryError, OutgoingMessage, Queue, QueueError, VisibilityChange},
    runtime::Failure,
};
use conveyor_sqs::{NewJob, ProduceError, Producer, SqsQueue};
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client, unique_name};
use conveyor_testing::wait_for;

const DEADLINE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

async fn client() -> anyhow::Result<aws_sdk_sqs::Client> {
    ensure_local_aws().await?;
    Ok(sqs_client().await)
}

/// Receives until one message arrives (short polls, bounded by `DEADLINE`).
async fn receive_one(queue: &SqsQueue) -> anyhow::Result<Message> {
    wait_for(DEADLINE, POLL, async || {
        let mut messages = queue.receive(1, Duration::from_secs(1)).await.ok()?;
        messages.pop()
    })
    .await
    .with_context(|| format!("no message arrived on {}", queue.name()))
}

#[tokio::test]
async fn send_and_receive_round_trip_with_attributes_and_trace_header() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-round-trip")).await?;
    let producer = Producer::new(client.clone(), &created.url);
    let trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let job = NewJob::new("welcome_email", serde_json::json!({"user_id": 42}))
        .version(2)
        .key("welcome_email:user:42")
        .attribute("tenant", AttributeValue::string("acme"))
        .attribute(
            "blob",
            AttributeValue {
                data_type: "Binary".into(),
                string_value: None,
                binary_value: Some(vec![0, 1, 2, 254, 255]),
            },
        )
        .trace_header(trace);
    let id = producer.send(&job).await?;
    assert_eq!(producer.requests(), 1);

    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    assert_eq!(queue.arn(), created.arn);
    assert_eq!(queue.visibility_timeout(), Duration::from_secs(30));
    assert_eq!(queue.dead_letter_queue_url(), None);
    let message = receive_one(&queue).await?;

    assert_eq!(message.id, id);
    assert_eq!(message.body, r#"{"user_id":42}"#);
    assert_eq!(message.job_type(), Some("welcome_email"));
    assert_eq!(message.string_attribute("conveyor.version"), Some("2"));
    assert_eq!(message.idempotency_key(), Some("welcome_email:user:42"));
    assert_eq!(message.string_attribute("tenant"), Some("acme"));
    assert_eq!(
        message.attributes["blob"].binary_value.as_deref(),
        Some(&[0, 1, 2, 254, 255][..])
    );
    assert_eq!(message.trace_header.as_deref(), Some(trace));
    assert_eq!(message.receive_count, 1);
    assert!(message.sent_at.is_some());
    assert!(message.first_received_at.is_some());

    let failures = queue
        .delete_batch(std::slice::from_ref(&message.receipt_handle))
        .await?;
    assert!(failures.is_empty(), "{failures:?}");
    let depth = queue.depth().await?;
    assert_eq!((depth.visible, depth.in_flight, depth.delayed), (0, 0, 0));
    Ok(())
}

#[tokio::test]
async fn stale_receipt_handles() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(
        &client,
        &QueueSpec::standard("sqs-stale").visibility_timeout_secs(1),
    )
    .await?;
    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    Producer::new(client.clone(), &created.url)
        .send(&NewJob::new("t", 1))
        .await?;

    let first = receive_one(&queue).await?;
    // Received again once the 1 s visibility timeout lapses: a new receipt handle.
    let second = receive_one(&queue).await?;
    assert_eq!(second.id, first.id);
    assert_eq!(second.receive_count, 2);
    assert_ne!(second.receipt_handle, first.receipt_handle);

    // LocalStack accepts the stale handle for a visibility change ...
    let stale = VisibilityChange {
        receipt_handle: first.receipt_handle.clone(),
        timeout: Duration::from_secs(60),
    };
    let failures = queue.change_visibility_batch(&[stale]).await?;
    assert!(
        failures.is_empty(),
        "LocalStack 4.8.1 accepts a stale handle: {failures:?}"
    );
    // ... and the change applied to the message (still in flight well past the 1 s timeout).
    let depth = queue.depth().await?;
    assert_eq!((depth.visible, depth.in_flight), (0, 1));

    // ... and for a delete, which really deletes the message.
    let failures = queue
        .delete_batch(std::slice::from_ref(&first.receipt_handle))
        .await?;
    assert!(failures.is_empty(), "{failures:?}");
    let depth = queue.depth().await?;
    assert_eq!(
        (depth.visible, depth.in_flight),
        (0, 0),
        "the stale delete deleted the message"
    );

    // Once the message is gone: deleting again succeeds, a visibility change is a lost lease.
    let failures = queue
        .delete_batch(std::slice::from_ref(&second.receipt_handle))
        .await?;
    assert!(failures.is_empty(), "{failures:?}");
    let gone = VisibilityChange {
        receipt_handle: second.receipt_handle.clone(),
        timeout: Duration::from_secs(10),
    };
    let failures = queue.change_visibility_batch(&[gone]).await?;
    assert_eq!(failures.len(), 1);
    assert!(
        matches!(&failures[0].error, EntryError::LeaseLost(text) if text.contains("InvalidParameterValue")),
        "{failures:?}"
    );

    // A malformed handle: ReceiptHandleIsInvalid on both calls.
    let garbage = ReceiptHandle("garbage".into());
    let failures = queue.delete_batch(std::slice::from_ref(&garbage)).await?;
    assert!(
        matches!(&failures[0].error, EntryError::NotIssued(text) if text.contains("ReceiptHandleIsInvalid"))
    );
    let failures = queue
        .change_visibility_batch(&[VisibilityChange {
            receipt_handle: garbage,
            timeout: Duration::from_secs(10),
        }])
        .await?;
    assert!(
        matches!(&failures[0].error, EntryError::NotIssued(text) if text.contains("ReceiptHandleIsInvalid"))
    );
    Ok(())
}

#[tokio::test]
async fn dead_letter_goes_to_the_dlq_named_by_the_redrive_policy() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-dlq").max_receive_count(5)).await?;
    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    assert_eq!(queue.dead_letter_queue_url(), created.dlq_url.as_deref());
    assert_eq!(queue.max_receive_count(), Some(5));

    let producer = Producer::new(client.clone(), &created.url);
    producer
        .send(
            &NewJob::new("email", 7)
                .key("email:7")
                .attribute("tenant", AttributeValue::string("acme")),
        )
        .await?;
    let message = receive_one(&queue).await?;
    let failure = Failure::now(
        "user 7 does not exist",
        message.receive_count,
        queue.name(),
        "email",
    );
    let outcome = queue.dead_letter(&message, &failure).await?;
    let dlq_name = created.dlq_name.clone().context("dlq")?;
    assert_eq!(outcome, DeadLetter::Sent(dlq_name));

    let dlq = SqsQueue::connect(client.clone(), created.dlq_url.clone().context("dlq url")?).await?;
    assert_eq!(dlq.dead_letter_queue_url(), None);
    let copy = receive_one(&dlq).await?;
    assert_eq!(copy.body, message.body);
    assert_eq!(copy.job_type(), Some("email"));
    assert_eq!(copy.idempotency_key(), Some("email:7"));
    assert_eq!(copy.string_attribute("tenant"), Some("acme"));
    let recorded: Failure =
        serde_json::from_str(copy.string_attribute(FAILURE_ATTRIBUTE).context("failure")?)?;
    assert_eq!(recorded, failure);
    // The original stays until the caller deletes it.
    assert_eq!(queue.depth().await?.in_flight, 1);
    Ok(())
}

/// A message that fits SQS's 1 MiB but not with the failure record added still reaches the DLQ (without
/// the record, which stays in the log) instead of failing the send and looping.
#[tokio::test]
async fn a_message_too_large_for_its_failure_record_is_dead_lettered_without_it() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-dlq-big").max_receive_count(5)).await?;
    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    let body = "x".repeat(conveyor_core::limits::MAX_MESSAGE_BYTES - 64);
    queue
        .send(OutgoingMessage {
            body: body.clone(),
            ..OutgoingMessage::default()
        })
        .await?;
    let message = receive_one(&queue).await?;
    let failure = Failure::now("too big to explain", message.receive_count, queue.name(), "blob");
    let outcome = queue.dead_letter(&message, &failure).await?;
    assert!(matches!(outcome, DeadLetter::Sent(_)), "{outcome:?}");

    let dlq = SqsQueue::connect(client.clone(), created.dlq_url.clone().context("dlq url")?).await?;
    let copy = receive_one(&dlq).await?;
    assert_eq!(copy.body.len(), body.len());
    assert_eq!(copy.string_attribute(FAILURE_ATTRIBUTE), None);
    Ok(())
}

/// A FIFO pair created here without content-based deduplication, so the DLQ send must carry its own
/// deduplication id (it would be refused otherwise) and a repeated dead-letter is deduplicated by it.
#[tokio::test]
async fn fifo_dead_letter_keeps_the_group_and_deduplicates_on_the_message_id() -> anyhow::Result<()> {
    let client = client().await?;
    let base = unique_name("sqs-fifo-dlq");
    let dlq_url = client
        .create_queue()
        .queue_name(format!("{base}-dlq.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await?
        .queue_url
        .context("dlq url")?;
    let dlq_arn = conveyor_testing::localstack::queue_arn(&client, &dlq_url).await?;
    let policy = serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}).to_string();
    let url = client
        .create_queue()
        .queue_name(format!("{base}.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::RedrivePolicy, policy)
        .send()
        .await?
        .queue_url
        .context("url")?;

    let queue = SqsQueue::connect(client.clone(), &url).await?;
    assert!(queue.is_fifo());
    assert_eq!(queue.dead_letter_queue_url(), Some(dlq_url.as_str()));
    Producer::new(client.clone(), &url)
        .send(
            &NewJob::new("charge", 1)
                .group_id("customer-9")
                .deduplication_id("charge-1"),
        )
        .await?;
    let message = receive_one(&queue).await?;
    assert_eq!(message.group_id.as_deref(), Some("customer-9"));

    let failure = Failure::now("card declined", 1, queue.name(), "charge");
    queue.dead_letter(&message, &failure).await?;
    queue.dead_letter(&message, &failure).await?;

    let dlq = SqsQueue::connect(client.clone(), &dlq_url).await?;
    let depth = dlq.depth().await?;
    assert_eq!(depth.visible, 1, "the second dead-letter was deduplicated");
    let copy = receive_one(&dlq).await?;
    assert_eq!(copy.group_id.as_deref(), Some("customer-9"));
    assert_eq!(copy.deduplication_id.as_deref(), Some(message.id.as_str()));
    assert!(copy.string_attribute(FAILURE_ATTRIBUTE).is_some());
    Ok(())
}

#[tokio::test]
async fn a_producer_batch_of_25_jobs_all_arrive() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-batch")).await?;
    let producer = Producer::new(client.clone(), &created.url);
    let jobs: Vec<NewJob<serde_json::Value>> = (0..25)
        .map(|n| NewJob::new("count", serde_json::json!({ "n": n })).key(format!("count:{n}")))
        .collect();
    let report = producer.send_batch(&jobs).await;
    assert!(report.all_sent(), "{:?}", report.failures().collect::<Vec<_>>());
    assert_eq!(producer.requests(), 3, "10 + 10 + 5");
    let sent: BTreeSet<String> = report.results.iter().filter_map(|r| r.clone().ok()).collect();
    assert_eq!(sent.len(), 25);

    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    let mut received = BTreeSet::new();
    let mut keys = BTreeSet::new();
    wait_for(DEADLINE, POLL, async || {
        for message in queue.receive(10, Duration::from_secs(1)).await.ok()? {
            keys.insert(message.idempotency_key().unwrap_or_default().to_owned());
            received.insert(message.id);
        }
        (received.len() == 25).then_some(())
    })
    .await?;
    assert_eq!(received, sent);
    assert_eq!(keys.len(), 25);
    Ok(())
}

#[tokio::test]
async fn producer_limits_are_checked_with_clear_errors() -> anyhow::Result<()> {
    let client = client().await?;
    let standard = create_queue(&client, &QueueSpec::standard("sqs-limits")).await?;
    let fifo = create_queue(&client, &QueueSpec::fifo("sqs-limits")).await?;
    let producer = Producer::new(client.clone(), &standard.url);

    let oversize = producer
        .send(&NewJob::new("big", "x".repeat(1024 * 1024)))
        .await
        .unwrap_err();
    assert!(
        matches!(oversize, ProduceError::TooLarge { limit: 1_048_576, .. }),
        "{oversize}"
    );

    let mut crowded = NewJob::new("crowded", 1).key("k");
    for i in 0..7 {
        crowded = crowded.attribute(format!("a{i}"), AttributeValue::string("v"));
    }
    let too_many = producer.send(&crowded).await.unwrap_err();
    assert!(
        matches!(
            too_many,
            ProduceError::TooManyAttributes {
                count: 10,
                limit: 9,
                ..
            }
        ),
        "{too_many}"
    );
    assert!(too_many.to_string().contains("conveyor.failure"));
    assert_eq!(producer.requests(), 0, "limits are checked before any request");

    let fifo_producer = Producer::new(client.clone(), &fifo.url);
    let no_group = fifo_producer.send(&NewJob::new("t", 1)).await.unwrap_err();
    assert!(
        matches!(no_group, ProduceError::MissingGroupId { .. }),
        "{no_group}"
    );
    assert!(
        fifo_producer
            .send(&NewJob::new("t", 1).group_id("g"))
            .await
            .is_ok()
    );

    let missing_url = standard
        .url
        .replace(&standard.name, &unique_name("no-such-queue"));
    let missing = Producer::new(client.clone(), &missing_url)
        .send(&NewJob::new("t", 1))
        .await
        .unwrap_err();
    assert_eq!(
        missing,
        ProduceError::Queue(QueueError::QueueMissing {
            queue: missing_url.clone()
        })
    );
    assert!(missing.to_string().contains("does not exist"), "{missing}");
    let connect = SqsQueue::connect(client.clone(), &missing_url).await.unwrap_err();
    assert_eq!(connect, QueueError::QueueMissing { queue: missing_url });
    let by_name = SqsQueue::connect(client.clone(), "conveyor-no-such-queue")
        .await
        .unwrap_err();
    assert_eq!(
        by_name,
        QueueError::QueueMissing {
            queue: "conveyor-no-such-queue".into()
        }
    );
    Ok(())
}

/// A queue's name works where its URL does (`CONVEYOR_QUEUE_URL=jobs`): the URL comes from
/// `GetQueueUrl`, and the queue, its DLQ and its settings are the ones the URL gives.
#[tokio::test]
async fn a_queue_is_connected_by_its_name() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-by-name").max_receive_count(4)).await?;
    let queue = SqsQueue::connect(client.clone(), &created.name).await?;
    assert_eq!(queue.url(), created.url);
    assert_eq!(queue.name(), created.name);
    assert_eq!(queue.dead_letter_queue_url(), created.dlq_url.as_deref());
    assert_eq!(queue.max_receive_count(), Some(4));
    Ok(())
}

#[tokio::test]
async fn fifo_expired_receipt_handle_on_delete_is_lease_lost() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(
        &client,
        &QueueSpec::fifo("sqs-fifo-stale").visibility_timeout_secs(1),
    )
    .await?;
    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    Producer::new(client.clone(), &created.url)
        .send(&NewJob::new("t", 1).group_id("g"))
        .await?;
    let message = receive_one(&queue).await?;
    // Wait for the visibility timeout to lapse (the message counts as visible again), without receiving it.
    wait_for(DEADLINE, POLL, async || {
        let depth = queue.depth().await.ok()?;
        (depth.visible == 1).then_some(())
    })
    .await?;
    let failures = queue
        .delete_batch(std::slice::from_ref(&message.receipt_handle))
        .await?;
    assert_eq!(
        failures.len(),
        1,
        "LocalStack 4.8.1 refuses an expired FIFO receipt handle on delete"
    );
    assert!(
        matches!(&failures[0].error, EntryError::LeaseLost(text) if text.contains("expired")),
        "{failures:?}"
    );
    Ok(())
}

/// A job's tenant on a standard queue travels as `MessageGroupId` (no attribute spent), comes back on
/// receive, and stays on the deferred copy and on the dead-letter copy; an invalid tenant is refused
/// before it is sent, naming what is wrong.
#[tokio::test]
async fn a_tenant_travels_as_the_message_group_on_a_standard_queue() -> anyhow::Result<()> {
    let client = client().await?;
    let created = create_queue(&client, &QueueSpec::standard("sqs-tenant").max_receive_count(5)).await?;
    let queue = SqsQueue::connect(client.clone(), &created.url).await?;
    let producer = Producer::new(client.clone(), &created.url);
    producer
        .send(&NewJob::new("invoice", 7).key("invoice:7").tenant("acme-42"))
        .await?;
    let message = receive_one(&queue).await?;
    assert_eq!(message.group_id.as_deref(), Some("acme-42"));
    assert_eq!(message.tenant(), Some("acme-42"));
    assert_eq!(
        message.attributes.len(),
        3,
        "type, version and key: the tenant spends no attribute"
    );

    let copy = conveyor_core::runtime::deferred_copy(&message, Duration::ZERO, false)?;
    queue.send(copy).await?;
    queue
        .delete_batch(std::slice::from_ref(&message.receipt_handle))
        .await?;
    let deferred = receive_one(&queue).await?;
    assert_eq!(
        deferred.tenant(),
        Some("acme-42"),
        "the deferred copy keeps its tenant"
    );
    assert_eq!(deferred.original_id(), message.id);

    let failure = Failure::now("no such invoice", 1, queue.name(), "invoice");
    queue.dead_letter(&deferred, &failure).await?;
    let dlq = SqsQueue::connect(client.clone(), created.dlq_url.clone().context("dlq url")?).await?;
    let dead = receive_one(&dlq).await?;
    assert_eq!(dead.tenant(), Some("acme-42"), "the DLQ copy keeps its tenant");

    let refused = producer
        .send(&NewJob::new("invoice", 8).tenant("acme corp"))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ProduceError::InvalidTenant { .. }) && refused.to_string().contains("position 4"),
        "{refused}"
    );
    Ok(())
}
