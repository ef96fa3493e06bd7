//! Request-shape tests: what `SqsQueue` and `Producer` ask SQS for, against `aws-smithy-mocks`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ErrorMetadata;
use aws_sdk_sqs::operation::change_message_visibility_batch::ChangeMessageVisibilityBatchOutput;
use aws_sdk_sqs::operation::delete_message_batch::{DeleteMessageBatchInput, DeleteMessageBatchOutput};
use aws_sdk_sqs::operation::get_queue_attributes::{GetQueueAttributesError, GetQueueAttributesOutput};
use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlOutput;
use aws_sdk_sqs::operation::receive_message::{ReceiveMessageInput, ReceiveMessageOutput};
use aws_sdk_sqs::operation::send_message::{SendMessageInput, SendMessageOutput};
use aws_sdk_sqs::operation::send_message_batch::{SendMessageBatchInput, SendMessageBatchOutput};
use aws_sdk_sqs::types::error::QueueDoesNotExist;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchResultEntry, DeleteMessageBatchResultEntry, MessageSystemAttributeName,
    MessageSystemAttributeNameForSends, QueueAttributeName, SendMessageBatchResultEntry,
};
use aws_smithy_mocks::{Rule, mock};

use crate::mock_client::{failed_entry, mock_sqs};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::{DeadLetter, EntryError, Queue, QueueError, VisibilityChange},
    runtime::Failure,
};

use crate::{NewJob, ProduceError, Producer, SqsQueue};

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs";
const DLQ_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq";

/// Records every input a rule sees.
fn recorder<T>() -> Arc<Mutex<Vec<T>>> {
    Arc::new(Mutex::new(Vec::new()))
}

fn attributes_rule(redrive: Option<&str>, name: &str) -> Rule {
    let redrive = redrive.map(str::to_owned);
    let arn = format!("arn:aws:sqs:us-east-1:123456789012:{name}");
    let fifo = name.ends_with(".fifo");
    mock!(Client::get_queue_attributes).then_compute_output(move |_| {
        GetQueueAttributesOutput::builder()
            .set_attributes({
                let mut map = std::collections::HashMap::new();
                map.insert(QueueAttributeName::QueueArn, arn.clone());
                map.insert(QueueAttributeName::VisibilityTimeout, "45".to_owned());
                if fifo {
                    map.insert(QueueAttributeName::FifoQueue, "true".to_owned());
                }
                if let Some(redrive) = &redrive {
                    map.insert(QueueAttributeName::RedrivePolicy, redrive.clone());
                }
                Some(map)
            })
            .build()
    })
}

async fn connected(rules: &[&Rule]) -> SqsQueue {
    let attributes = attributes_rule(None, "jobs");
    let mut all: Vec<&Rule> = vec![&attributes];
    all.extend_from_slice(rules);
    let client = mock_sqs(all);
    SqsQueue::connect(client, URL).await.unwrap()
}

#[tokio::test]
async fn connect_reads_attributes() {
    let queue = connected(&[]).await;
    assert_eq!(queue.name(), "jobs");
    assert_eq!(queue.arn(), "arn:aws:sqs:us-east-1:123456789012:jobs");
    assert_eq!(queue.visibility_timeout(), Duration::from_secs(45));
    assert_eq!(queue.dead_letter_queue_url(), None);
    assert!(!queue.is_fifo());
    assert_eq!(queue.requests(), 1);
}

#[tokio::test]
async fn receive_asks_for_every_system_and_message_attribute() {
    let seen = recorder::<ReceiveMessageInput>();
    let record = Arc::clone(&seen);
    let receive = mock!(Client::receive_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        ReceiveMessageOutput::builder()
            .messages(
                aws_sdk_sqs::types::Message::builder()
                    .message_id("m1")
                    .receipt_handle("rh1")
                    .body("{}")
                    .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "2")
                    .build(),
            )
            .messages(
                aws_sdk_sqs::types::Message::builder()
                    .message_id("no-receipt")
                    .build(),
            )
            .build()
    });
    let queue = connected(&[&receive]).await;
    let messages = queue.receive(25, Duration::from_secs(60)).await.unwrap();

    assert_eq!(
        messages.len(),
        1,
        "the message without a receipt handle is skipped"
    );
    assert_eq!(messages[0].receive_count, 2);
    let seen = seen.lock().unwrap();
    let input = &seen[0];
    assert_eq!(input.max_number_of_messages(), Some(10), "clamped to SQS's 10");
    assert_eq!(input.wait_time_seconds(), Some(20), "clamped to SQS's 20 s");
    assert_eq!(
        input.message_system_attribute_names(),
        &[MessageSystemAttributeName::All]
    );
    assert_eq!(input.message_attribute_names(), &["All".to_owned()]);
}

#[tokio::test]
async fn delete_batch_of_23_makes_calls_of_10_10_3_and_maps_failures_to_indices() {
    let seen = recorder::<DeleteMessageBatchInput>();
    let record = Arc::clone(&seen);
    let delete = mock!(Client::delete_message_batch).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        let mut output = DeleteMessageBatchOutput::builder().set_failed(Some(Vec::new()));
        let mut successful = Vec::new();
        for entry in input.entries() {
            match entry.id() {
                "14" => {
                    output = output.failed(failed_entry("14", "InternalError", false, Some("try again")));
                }
                "21" => {
                    output = output.failed(failed_entry(
                        "21",
                        "ReceiptHandleIsInvalid",
                        true,
                        Some("The input receipt handle is not a valid receipt handle."),
                    ));
                }
                id => successful.push(DeleteMessageBatchResultEntry::builder().id(id).build().unwrap()),
            }
        }
        output.set_successful(Some(successful)).build().unwrap()
    });
    let queue = connected(&[&delete]).await;
    let receipts: Vec<ReceiptHandle> = (0..23).map(|i| ReceiptHandle(format!("rh-{i}"))).collect();
    let failures = queue.delete_batch(&receipts).await.unwrap();

    let seen = seen.lock().unwrap();
    let sizes: Vec<usize> = seen.iter().map(|input| input.entries().len()).collect();
    assert_eq!(sizes, vec![10, 10, 3]);
    assert_eq!(seen[1].entries()[4].receipt_handle(), "rh-14");
    assert_eq!(seen[2].entries()[0].id(), "20");
    assert_eq!(failures.len(), 2);
    assert_eq!(failures[0].index, 14);
    assert!(matches!(
        failures[0].error,
        EntryError::Failed { ref code, sender_fault: false, .. } if code == "InternalError"
    ));
    assert_eq!(failures[1].index, 21);
    assert!(matches!(failures[1].error, EntryError::NotIssued(_)));
    assert_eq!(queue.requests(), 1 + 3);
}

#[tokio::test]
async fn a_visibility_change_on_a_gone_message_is_lease_lost() {
    // What LocalStack 4.8.1 answers for a receipt of a message that was deleted.
    let change = mock!(Client::change_message_visibility_batch).then_compute_output(|input| {
        ChangeMessageVisibilityBatchOutput::builder()
            .successful(
                ChangeMessageVisibilityBatchResultEntry::builder()
                    .id(input.entries()[0].id())
                    .build()
                    .unwrap(),
            )
            .failed(failed_entry(
                input.entries()[1].id(),
                "InvalidParameterValueException",
                false,
                Some(
                    "Value abc for parameter ReceiptHandle is invalid. Reason: Message does not exist or is \
                         not available for visibility timeout change.",
                ),
            ))
            .build()
            .unwrap()
    });
    let queue = connected(&[&change]).await;
    let changes: Vec<VisibilityChange> = (0..2)
        .map(|i| VisibilityChange {
            receipt_handle: ReceiptHandle(format!("rh-{i}")),
            timeout: Duration::from_secs(60),
        })
        .collect();
    let failures = queue.change_visibility_batch(&changes).await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].index, 1);
    assert!(matches!(failures[0].error, EntryError::LeaseLost(_)));
}

fn redrive_policy(dlq: &str) -> String {
    format!(r#"{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:{dlq}","maxReceiveCount":"5"}}"#)
}

#[tokio::test]
async fn dead_letter_sends_the_copy_with_the_failure_to_the_dlq_from_the_redrive_policy() {
    let attributes = attributes_rule(Some(&redrive_policy("jobs-dlq")), "jobs");
    let get_url = mock!(Client::get_queue_url)
        .match_requests(|input| {
            input.queue_name() == Some("jobs-dlq")
                && input.queue_owner_aws_account_id() == Some("123456789012")
        })
        .then_output(|| GetQueueUrlOutput::builder().queue_url(DLQ_URL).build());
    let seen = recorder::<SendMessageInput>();
    let record = Arc::clone(&seen);
    let send = mock!(Client::send_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        SendMessageOutput::builder().message_id("dlq-1").build()
    });
    let client = mock_sqs([&attributes, &get_url, &send]);
    let queue = SqsQueue::connect(client, URL).await.unwrap();
    assert_eq!(queue.dead_letter_queue_url(), Some(DLQ_URL));
    assert_eq!(queue.max_receive_count(), Some(5));

    let mut message = Message::new("m-1", r#"{"user_id":0}"#);
    message.attributes.insert(
        "conveyor.type".into(),
        conveyor_core::message::AttributeValue::string("email"),
    );
    message.trace_header = Some("Root=1-abc".into());
    let failure = Failure::now("no such user", 1, "jobs", "email");
    let outcome = queue.dead_letter(&message, &failure).await.unwrap();

    assert_eq!(outcome, DeadLetter::Sent("jobs-dlq".into()));
    let seen = seen.lock().unwrap();
    let input = &seen[0];
    assert_eq!(input.queue_url(), Some(DLQ_URL));
    assert_eq!(input.message_body(), Some(r#"{"user_id":0}"#));
    let attributes = input.message_attributes().unwrap();
    let recorded: Failure =
        serde_json::from_str(attributes[FAILURE_ATTRIBUTE].string_value().unwrap()).unwrap();
    assert_eq!(recorded, failure);
    assert_eq!(attributes["conveyor.type"].string_value(), Some("email"));
    assert_eq!(
        input.message_system_attributes().unwrap()[&MessageSystemAttributeNameForSends::AwsTraceHeader]
            .string_value(),
        Some("Root=1-abc")
    );
    assert_eq!(input.message_group_id(), None);
    assert_eq!(input.message_deduplication_id(), None);
}

/// Every receive sends the visibility timeout the runtime tracks (the queue's own by default, read at
/// connect), and on a FIFO queue a fresh `ReceiveRequestAttemptId`, so that the SDK's retry of a receive
/// whose answer was lost returns the same messages instead of leaving them invisible and unread.
#[tokio::test]
async fn receives_send_their_visibility_timeout_and_fifo_receives_an_attempt_id() {
    let seen = recorder::<ReceiveMessageInput>();
    let record = Arc::clone(&seen);
    let receive = mock!(Client::receive_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        ReceiveMessageOutput::builder().build()
    });
    let standard = connected(&[&receive]).await;
    standard.receive(1, Duration::ZERO).await.unwrap();
    standard
        .receive_with_visibility(1, Duration::ZERO, Duration::from_secs(90))
        .await
        .unwrap();

    let attributes = attributes_rule(None, "jobs.fifo");
    let fifo = SqsQueue::connect(mock_sqs([&attributes, &receive]), format!("{URL}.fifo"))
        .await
        .unwrap();
    fifo.receive(1, Duration::ZERO).await.unwrap();
    fifo.receive(1, Duration::ZERO).await.unwrap();

    let seen = seen.lock().unwrap();
    let visibility: Vec<Option<i32>> = seen.iter().map(ReceiveMessageInput::visibility_timeout).collect();
    assert_eq!(
        visibility,
        vec![Some(45), Some(90), Some(45), Some(45)],
        "the queue's own 45 s, or what was asked"
    );
    assert_eq!(
        seen[0].receive_request_attempt_id(),
        None,
        "standard queues take none"
    );
    let (first, second) = (
        seen[2].receive_request_attempt_id(),
        seen[3].receive_request_attempt_id(),
    );
    assert!(first.is_some() && second.is_some(), "{first:?} {second:?}");
    assert_ne!(first, second, "each receive its own attempt id");
}

/// A tenant on a standard queue is the `MessageGroupId` of the send, with no deduplication id (SQS
/// refuses one there) and no attribute.
#[tokio::test]
async fn a_tenant_is_sent_as_the_message_group_of_a_standard_queue() {
    let seen = recorder::<SendMessageInput>();
    let record = Arc::clone(&seen);
    let send = mock!(Client::send_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        SendMessageOutput::builder().message_id("m-1").build()
    });
    let client = mock_sqs([&send]);
    crate::Producer::new(client, URL)
        .send(&crate::NewJob::new("invoice", 7).tenant("acme-42"))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].message_group_id(), Some("acme-42"));
    assert_eq!(seen[0].message_deduplication_id(), None);
    let names: Vec<&String> = seen[0].message_attributes().unwrap().keys().collect();
    assert_eq!(
        names.len(),
        2,
        "conveyor.type and conveyor.version only: {names:?}"
    );
}

#[tokio::test]
async fn fifo_dead_letters_keep_the_group_and_deduplicate_on_the_message_id() {
    let attributes = attributes_rule(Some(&redrive_policy("jobs-dlq.fifo")), "jobs.fifo");
    let get_url = mock!(Client::get_queue_url).then_output(|| {
        GetQueueUrlOutput::builder()
            .queue_url(format!("{DLQ_URL}.fifo"))
            .build()
    });
    let seen = recorder::<SendMessageInput>();
    let record = Arc::clone(&seen);
    let send = mock!(Client::send_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        SendMessageOutput::builder().message_id("dlq-1").build()
    });
    let client = mock_sqs([&attributes, &get_url, &send]);
    let queue = SqsQueue::connect(client, format!("{URL}.fifo")).await.unwrap();
    assert!(queue.is_fifo());
    let mut message = Message::new("m-7", "{}");
    message.group_id = Some("user-42".into());
    queue
        .dead_letter(&message, &Failure::now("bad", 1, "jobs.fifo", "email"))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].message_group_id(), Some("user-42"));
    assert_eq!(seen[0].message_deduplication_id(), Some("m-7"));
}

#[tokio::test]
async fn no_redrive_policy_means_no_dead_letter_queue_and_no_request() {
    let queue = connected(&[]).await;
    let outcome = queue
        .dead_letter(&Message::new("m", "{}"), &Failure::now("bad", 1, "jobs", "email"))
        .await
        .unwrap();
    assert_eq!(outcome, DeadLetter::NoDeadLetterQueue);
    assert_eq!(queue.requests(), 1);
}

fn missing_queue_rule() -> Rule {
    mock!(Client::get_queue_attributes).then_error(|| {
        GetQueueAttributesError::QueueDoesNotExist(
            QueueDoesNotExist::builder()
                .message("The specified queue does not exist.")
                .meta(
                    ErrorMetadata::builder()
                        .code("AWS.SimpleQueueService.NonExistentQueue")
                        .message("The specified queue does not exist.")
                        .build(),
                )
                .build(),
        )
    })
}

#[tokio::test]
async fn a_non_existent_queue_is_queue_missing_naming_the_queue() {
    let missing = missing_queue_rule();
    let client = mock_sqs([&missing]);
    let error = SqsQueue::connect(client, URL).await.unwrap_err();
    assert_eq!(error, QueueError::QueueMissing { queue: URL.into() });
    assert!(error.to_string().contains(URL), "{error}");
}

#[tokio::test]
async fn a_missing_dead_letter_queue_is_named_by_its_arn() {
    let attributes = attributes_rule(Some(&redrive_policy("gone-dlq")), "jobs");
    let get_url = mock!(Client::get_queue_url).then_error(|| {
        aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError::QueueDoesNotExist(
            QueueDoesNotExist::builder()
                .meta(
                    ErrorMetadata::builder()
                        .code("AWS.SimpleQueueService.NonExistentQueue")
                        .build(),
                )
                .build(),
        )
    });
    let client = mock_sqs([&attributes, &get_url]);
    let error = SqsQueue::connect(client, URL).await.unwrap_err();
    let QueueError::QueueMissing { queue } = &error else {
        panic!("{error:?}")
    };
    assert!(
        queue.contains("arn:aws:sqs:us-east-1:123456789012:gone-dlq"),
        "{queue}"
    );
    assert!(queue.contains("RedrivePolicy"), "{queue}");
}

fn counting_send_rules() -> (Rule, Rule) {
    (
        mock!(Client::send_message).then_output(|| SendMessageOutput::builder().message_id("x").build()),
        mock!(Client::send_message_batch).then_output(|| {
            SendMessageBatchOutput::builder()
                .set_successful(Some(Vec::new()))
                .set_failed(Some(Vec::new()))
                .build()
                .unwrap()
        }),
    )
}

#[tokio::test]
async fn the_producer_rejects_oversized_bodies_and_long_delays_without_a_request() {
    let (send, batch) = counting_send_rules();
    let client = mock_sqs([&send, &batch]);
    let producer = Producer::new(client, URL);

    let oversized = NewJob::new("big", "x".repeat(1024 * 1024));
    let error = producer.send(&oversized).await.unwrap_err();
    assert!(
        matches!(error, ProduceError::TooLarge { limit: 1_048_576, .. }),
        "{error:?}"
    );

    let late = NewJob::new("late", 1).delay(Duration::from_secs(15 * 24 * 3600));
    let error = producer.send(&late).await.unwrap_err();
    assert!(matches!(error, ProduceError::DelayTooLong { .. }), "{error:?}");

    let report = producer.send_batch(&[late.clone(), late]).await;
    assert_eq!(report.sent(), 0);
    assert_eq!(report.failures().count(), 2);

    assert_eq!(send.num_calls(), 0);
    assert_eq!(batch.num_calls(), 0);
    assert_eq!(producer.requests(), 0);
}

#[tokio::test]
async fn the_producer_sends_type_version_key_and_trace_header() {
    let seen = recorder::<SendMessageInput>();
    let record = Arc::clone(&seen);
    let send = mock!(Client::send_message).then_compute_output(move |input| {
        record.lock().unwrap().push(input.clone());
        SendMessageOutput::builder().message_id("m-1").build()
    });
    let client = mock_sqs([&send]);
    let producer = Producer::new(client, URL);
    let job = NewJob::new("email", serde_json::json!({"user_id": 42}))
        .version(2)
        .key("email:42")
        .delay(Duration::from_secs(30))
        .trace_header("Root=1-abc");
    assert_eq!(producer.send(&job).await.unwrap(), "m-1");
    let seen = seen.lock().unwrap();
    let input = &seen[0];
    let attributes = input.message_attributes().unwrap();
    assert_eq!(attributes["conveyor.type"].string_value(), Some("email"));
    assert_eq!(attributes["conveyor.version"].string_value(), Some("2"));
    assert_eq!(attributes["conveyor.version"].data_type(), "Number");
    assert_eq!(attributes["conveyor.key"].string_value(), Some("email:42"));
    assert_eq!(input.delay_seconds(), Some(30));
    assert_eq!(
        input.message_system_attributes().unwrap()[&MessageSystemAttributeNameForSends::AwsTraceHeader]
            .string_value(),
        Some("Root=1-abc")
    );
}

#[tokio::test(start_paused = true)]
async fn a_partial_batch_failure_retries_only_the_failed_retryable_entry() {
    let seen = recorder::<SendMessageBatchInput>();
    let record = Arc::clone(&seen);
    let batch = mock!(Client::send_message_batch).then_compute_output(move |input| {
        let mut calls = record.lock().unwrap();
        calls.push(input.clone());
        let first_call = calls.len() == 1;
        let mut output = SendMessageBatchOutput::builder().set_failed(Some(Vec::new()));
        let mut successful = Vec::new();
        for entry in input.entries() {
            let id = entry.id();
            if first_call && id == "1" {
                output = output.failed(failed_entry(id, "InternalError", false, Some("try again")));
            } else if id == "2" {
                output = output.failed(failed_entry(
                    id,
                    "InvalidMessageContents",
                    true,
                    Some("bad characters"),
                ));
            } else {
                successful.push(
                    SendMessageBatchResultEntry::builder()
                        .id(id)
                        .message_id(format!("msg-{id}"))
                        .md5_of_message_body("x")
                        .build()
                        .unwrap(),
                );
            }
        }
        output.set_successful(Some(successful)).build().unwrap()
    });
    let client = mock_sqs([&batch]);
    let producer = Producer::new(client, URL);
    let jobs: Vec<NewJob<u32>> = (0..3).map(|i| NewJob::new("n", i)).collect();
    let report = producer.send_batch(&jobs).await;

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let retried: Vec<&str> = seen[1].entries().iter().map(|entry| entry.id()).collect();
    assert_eq!(
        retried,
        vec!["1"],
        "only the failed entry with SenderFault false is sent again"
    );
    assert_eq!(report.results[0], Ok("msg-0".to_owned()));
    assert_eq!(report.results[1], Ok("msg-1".to_owned()));
    assert!(matches!(
        &report.results[2],
        Err(ProduceError::Rejected { code, sender_fault: true, .. }) if code == "InvalidMessageContents"
    ));
    assert_eq!(producer.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_batch_entry_that_keeps_failing_gives_up_after_three_attempts() {
    let batch = mock!(Client::send_message_batch).then_compute_output(|input| {
        let mut output = SendMessageBatchOutput::builder().set_successful(Some(Vec::new()));
        for entry in input.entries() {
            output = output.failed(failed_entry(entry.id(), "InternalError", false, None));
        }
        output.build().unwrap()
    });
    let client = mock_sqs([&batch]);
    let producer = Producer::new(client, URL);
    let report = producer.send_batch(&[NewJob::new("n", 1)]).await;
    assert_eq!(batch.num_calls(), 3);
    assert!(
        matches!(&report.results[0], Err(ProduceError::Rejected { code, .. }) if code == "InternalError")
    );
}

#[tokio::test]
async fn the_producer_reports_a_missing_queue_in_queue_missing_words() {
    let batch = mock!(Client::send_message_batch).then_error(|| {
        aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError::QueueDoesNotExist(
            QueueDoesNotExist::builder()
                .meta(
                    ErrorMetadata::builder()
                        .code("AWS.SimpleQueueService.NonExistentQueue")
                        .build(),
                )
                .build(),
        )
    });
    let client = mock_sqs([&batch]);
    let producer = Producer::new(client, URL);
    let jobs: Vec<NewJob<u32>> = (0..25).map(|i| NewJob::new("n", i)).collect();
    let report = producer.send_batch(&jobs).await;
    assert_eq!(
        batch.num_calls(),
        1,
        "a missing queue stops the batch after the first call"
    );
    assert_eq!(report.failures().count(), 25);
    let error = report.results[24].as_ref().unwrap_err();
    assert!(error.to_string().contains("does not exist"), "{error}");
    assert!(matches!(error, ProduceError::Queue(QueueError::QueueMissing { queue }) if queue == URL));
}
