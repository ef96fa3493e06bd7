//! Request-shape tests of the administration functions, against `aws-smithy-mocks`: the order of the calls
//! the design notes promise (hold then release, send then delete) and the errors they map.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ErrorMetadata;
use aws_sdk_sqs::operation::change_message_visibility_batch::ChangeMessageVisibilityBatchOutput;
use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchOutput;
use aws_sdk_sqs::operation::purge_queue::PurgeQueueError;
use aws_sdk_sqs::operation::receive_message::{ReceiveMessageError, ReceiveMessageOutput};
use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
use aws_sdk_sqs::operation::start_message_move_task::{
    StartMessageMoveTaskError, StartMessageMoveTaskOutput,
};
use aws_sdk_sqs::types::error::{PurgeQueueInProgress, UnsupportedOperation};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchResultEntry, DeleteMessageBatchResultEntry, Message, MessageAttributeValue,
    SendMessageBatchResultEntry,
};
use aws_smithy_mocks::{Rule, mock};

use crate::mock_client::{failed_entry, mock_sqs};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{port::QueueDepth, runtime::Failure};

use super::*;
use crate::redrive::QueueArn;

const DLQ_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq";
const SOURCE_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs";

type Log = Arc<Mutex<Vec<String>>>;

fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

fn entries(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

fn sdk_message(id: &str, failure: &str) -> Message {
    let record = Failure::now(failure, 3, "jobs", "email").to_json();
    Message::builder()
        .message_id(id)
        .receipt_handle(format!("rh-{id}"))
        .body(format!("body-{id}"))
        .message_attributes(
            FAILURE_ATTRIBUTE,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(record)
                .build()
                .unwrap(),
        )
        .build()
}

/// Receive answers: each call takes the next batch; once they are used up, empty receives.
fn receive_rule(batches: Vec<Vec<Message>>, calls: &Log) -> Rule {
    let batches = Arc::new(Mutex::new(batches.into_iter()));
    let calls = Arc::clone(calls);
    mock!(Client::receive_message).then_compute_output(move |input| {
        calls.lock().unwrap().push(format!(
            "receive visibility={:?} wait={:?}",
            input.visibility_timeout(),
            input.wait_time_seconds()
        ));
        let batch = batches.lock().unwrap().next().unwrap_or_default();
        ReceiveMessageOutput::builder().set_messages(Some(batch)).build()
    })
}

/// Records every visibility change as `release <receipt> <timeout>`; all succeed.
fn release_rule(calls: &Log) -> Rule {
    let calls = Arc::clone(calls);
    mock!(Client::change_message_visibility_batch).then_compute_output(move |input| {
        let mut successful = Vec::new();
        for entry in input.entries() {
            calls.lock().unwrap().push(format!(
                "release {} {}",
                entry.receipt_handle(),
                entry.visibility_timeout().unwrap_or(-1)
            ));
            successful.push(
                ChangeMessageVisibilityBatchResultEntry::builder()
                    .id(entry.id())
                    .build()
                    .unwrap(),
            );
        }
        ChangeMessageVisibilityBatchOutput::builder()
            .set_successful(Some(successful))
            .set_failed(Some(Vec::new()))
            .build()
            .unwrap()
    })
}

#[tokio::test]
async fn peek_holds_every_message_then_releases_them_all_at_once() {
    let calls = log();
    let receive = receive_rule(
        vec![
            vec![sdk_message("m1", "a"), sdk_message("m2", "b")],
            vec![sdk_message("m3", "c")],
        ],
        &calls,
    );
    let release = release_rule(&calls);
    let client = mock_sqs([&receive, &release]);
    let options = PeekOptions {
        max: 5,
        hold: Duration::from_secs(30),
        wait: Duration::from_secs(1),
    };
    let peeked = peek(&client, DLQ_URL, options).await.unwrap();
    let ids: Vec<&str> = peeked
        .messages
        .iter()
        .map(|received| received.message.id.as_str())
        .collect();
    assert_eq!(ids, ["m1", "m2", "m3"]);
    assert_eq!(peeked.messages[0].reason(), "a");
    assert!(peeked.release_failures.is_empty());
    assert_eq!(
        entries(&calls),
        [
            "receive visibility=Some(30) wait=Some(1)",
            "receive visibility=Some(30) wait=Some(1)",
            "receive visibility=Some(30) wait=Some(1)",
            "release rh-m1 0",
            "release rh-m2 0",
            "release rh-m3 0",
        ],
        "every receive first (the third one finds nothing), then one release of every receipt to 0"
    );
}

#[tokio::test]
async fn peek_releases_what_it_holds_even_when_a_receive_fails() {
    let calls = log();
    let receive = mock!(Client::receive_message)
        .sequence()
        .output(|| {
            ReceiveMessageOutput::builder()
                .set_messages(Some(vec![sdk_message("m1", "a"), sdk_message("m2", "b")]))
                .build()
        })
        .error(|| {
            ReceiveMessageError::generic(
                ErrorMetadata::builder()
                    .code("InternalError")
                    .message("boom")
                    .build(),
            )
        })
        .build();
    let release = release_rule(&calls);
    let client = mock_sqs([&receive, &release]);
    let result = peek(&client, DLQ_URL, PeekOptions::default()).await;
    assert!(matches!(result, Err(AdminError::Queue(_))), "{result:?}");
    assert_eq!(entries(&calls), ["release rh-m1 0", "release rh-m2 0"]);
}

fn queue(url: &str, name: &str) -> QueueInfo {
    QueueInfo {
        url: url.to_owned(),
        arn: QueueArn::parse(&format!("arn:aws:sqs:us-east-1:123456789012:{name}")).unwrap(),
        fifo: false,
        content_based_deduplication: false,
        redrive: None,
        visibility_timeout: None,
        depth: QueueDepth::default(),
    }
}

#[tokio::test]
async fn the_move_loop_sends_before_it_deletes_and_keeps_what_it_could_not_send() {
    let calls = log();
    // m1 and m3 match; m2 does not; m4's send fails; m3's delete fails after its send.
    let receive = receive_rule(
        vec![vec![
            sdk_message("m1", "HTTP 503"),
            sdk_message("m2", "bad address"),
            sdk_message("m3", "HTTP 503 again"),
            sdk_message("m4", "503"),
        ]],
        &calls,
    );
    let send = {
        let calls = Arc::clone(&calls);
        mock!(Client::send_message_batch).then_compute_output(move |input| {
            let mut successful = Vec::new();
            let mut failed = Vec::new();
            for entry in input.entries() {
                let attributes = entry.message_attributes().cloned().unwrap_or_default();
                assert!(
                    !attributes.contains_key(FAILURE_ATTRIBUTE),
                    "the failure record is not sent back"
                );
                calls.lock().unwrap().push(format!(
                    "send {} to {}",
                    entry.message_body(),
                    input.queue_url().unwrap_or_default()
                ));
                if entry.message_body() == "body-m4" {
                    failed.push(failed_entry(entry.id(), "InternalError", false, None));
                } else {
                    successful.push(
                        SendMessageBatchResultEntry::builder()
                            .id(entry.id())
                            .message_id("new")
                            .md5_of_message_body("x")
                            .build()
                            .unwrap(),
                    );
                }
            }
            SendMessageBatchOutput::builder()
                .set_successful(Some(successful))
                .set_failed(Some(failed))
                .build()
                .unwrap()
        })
    };
    let delete = {
        let calls = Arc::clone(&calls);
        mock!(Client::delete_message_batch).then_compute_output(move |input| {
            let mut successful = Vec::new();
            let mut failed = Vec::new();
            for entry in input.entries() {
                calls
                    .lock()
                    .unwrap()
                    .push(format!("delete {}", entry.receipt_handle()));
                if entry.receipt_handle() == "rh-m3" {
                    failed.push(failed_entry(entry.id(), "ReceiptHandleIsInvalid", true, None));
                } else {
                    successful.push(
                        DeleteMessageBatchResultEntry::builder()
                            .id(entry.id())
                            .build()
                            .unwrap(),
                    );
                }
            }
            DeleteMessageBatchOutput::builder()
                .set_successful(Some(successful))
                .set_failed(Some(failed))
                .build()
                .unwrap()
        })
    };
    let release = release_rule(&calls);
    let client = mock_sqs([&receive, &send, &delete, &release]);
    let options = MoveOptions {
        filter: MoveFilter {
            reason_contains: Some("503".to_owned()),
            ..MoveFilter::default()
        },
        ..MoveOptions::default()
    };
    let dlq = queue(DLQ_URL, "jobs-dlq");
    let destinations = Destinations::One(queue(SOURCE_URL, "jobs"));
    let mut progress = Vec::new();
    let report = move_messages(&client, &dlq, &destinations, &options, &mut |report| {
        progress.push(report.clone())
    })
    .await
    .unwrap();

    assert_eq!(report.examined, 4);
    assert_eq!(report.moved, 1);
    assert_eq!(report.skipped, 1);
    let failed: Vec<&str> = report
        .failed
        .iter()
        .map(|failure| failure.message_id.as_str())
        .collect();
    assert_eq!(failed, ["m4", "m3"]);
    assert!(
        report.failed[1].error.contains("a copy is in both queues"),
        "{:?}",
        report.failed[1]
    );
    assert_eq!(progress.len(), 1);

    let calls = entries(&calls);
    let position = |call: &str| {
        calls
            .iter()
            .position(|logged| logged == call)
            .unwrap_or_else(|| panic!("{call} in {calls:?}"))
    };
    assert!(position(&format!("send body-m1 to {SOURCE_URL}")) < position("delete rh-m1"));
    assert!(position(&format!("send body-m3 to {SOURCE_URL}")) < position("delete rh-m3"));
    assert!(
        !calls.contains(&"delete rh-m4".to_owned()),
        "an unsent message is never deleted: {calls:?}"
    );
    assert!(
        !calls.contains(&"delete rh-m2".to_owned()),
        "a non-matching message is never deleted: {calls:?}"
    );
    assert!(
        !calls.iter().any(|call| call.starts_with("send body-m2")),
        "{calls:?}"
    );
    // What stays (m2 not matching, m4 not sent) is released at the end, after the scan's last receive.
    let mut released: Vec<&String> = calls.iter().filter(|call| call.starts_with("release")).collect();
    released.sort();
    assert_eq!(released, ["release rh-m2 0", "release rh-m4 0"]);
    let last_receive = calls
        .iter()
        .rposition(|call| call.starts_with("receive"))
        .unwrap();
    assert!(position("release rh-m2 0") > last_receive);
}

#[tokio::test]
async fn an_endpoint_without_move_tasks_is_unsupported_and_the_request_names_the_destination() {
    let inputs = log();
    let started = {
        let inputs = Arc::clone(&inputs);
        mock!(Client::start_message_move_task)
            .match_requests(|input| input.source_arn() == Some("arn:source"))
            .then_compute_output(move |input| {
                inputs.lock().unwrap().push(format!(
                    "{:?} {:?}",
                    input.destination_arn(),
                    input.max_number_of_messages_per_second()
                ));
                StartMessageMoveTaskOutput::builder()
                    .task_handle("handle-1")
                    .build()
            })
    };
    let unsupported = mock!(Client::start_message_move_task)
        .match_requests(|input| input.source_arn() == Some("arn:aws-style"))
        .then_error(|| {
            StartMessageMoveTaskError::UnsupportedOperation(
                UnsupportedOperation::builder()
                    .meta(
                        ErrorMetadata::builder()
                            .code("AWS.SimpleQueueService.UnsupportedOperation")
                            .build(),
                    )
                    .build(),
            )
        });
    let moto_style = mock!(Client::start_message_move_task)
        .match_requests(|input| input.source_arn() == Some("arn:moto-style"))
        .then_error(|| {
            StartMessageMoveTaskError::generic(ErrorMetadata::builder().code("InvalidAction").build())
        });
    let listed = mock!(Client::list_message_move_tasks).then_output(|| {
        aws_sdk_sqs::operation::list_message_move_tasks::ListMessageMoveTasksOutput::builder().build()
    });
    let client = mock_sqs([&started, &unsupported, &moto_style, &listed]);

    let task = start_move_task(&client, "arn:source", Some("arn:dest"), Some(9000))
        .await
        .unwrap();
    assert_eq!(task.handle, "handle-1");
    assert_eq!(
        entries(&inputs),
        [r#"Some("arn:dest") Some(500)"#],
        "the rate is capped at SQS's 500"
    );
    for arn in ["arn:aws-style", "arn:moto-style"] {
        let error = start_move_task(&client, arn, None, None).await.unwrap_err();
        assert!(
            matches!(
                error,
                AdminError::Unsupported {
                    operation: "StartMessageMoveTask",
                    ..
                }
            ),
            "{arn}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_purge_in_progress_says_to_wait_a_minute() {
    let rule = mock!(Client::purge_queue).then_error(|| {
        PurgeQueueError::PurgeQueueInProgress(
            PurgeQueueInProgress::builder()
                .meta(
                    ErrorMetadata::builder()
                        .code("AWS.SimpleQueueService.PurgeQueueInProgress")
                        .build(),
                )
                .build(),
        )
    });
    let client = mock_sqs([&rule]);
    let error = purge(&client, SOURCE_URL).await.unwrap_err();
    assert_eq!(
        error,
        AdminError::PurgeInProgress {
            queue: SOURCE_URL.to_owned()
        }
    );
    assert!(error.to_string().contains("60 seconds"));
}
