//! The batching producer against a mocked SQS: how jobs are gathered, and what each caller is told.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::operation::send_message_batch::{SendMessageBatchInput, SendMessageBatchOutput};
use aws_sdk_sqs::types::SendMessageBatchResultEntry;
use aws_smithy_mocks::{Rule, mock};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::mock_client::{failed_entry, mock_sqs};
use crate::{BatchingConfig, BatchingError, BatchingProducer, NewJob, ProduceError, Producer};

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs";
const FIFO_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs.fifo";

/// The bodies of each call, in order.
type Calls = Arc<Mutex<Vec<Vec<String>>>>;

/// A `SendMessageBatch` that stores every entry as `msg-<body>`, except what `refuse` answers for
/// (by body, and the call's number from 1): `(code, sender_fault)`.
fn batch_rule(calls: &Calls, refuse: fn(&str, usize) -> Option<(&'static str, bool)>) -> Rule {
    let calls = Arc::clone(calls);
    mock!(Client::send_message_batch).then_compute_output(move |input: &SendMessageBatchInput| {
        let mut calls = calls.lock().unwrap();
        calls.push(
            input
                .entries()
                .iter()
                .map(|entry| entry.message_body().to_owned())
                .collect(),
        );
        let call = calls.len();
        let mut output = SendMessageBatchOutput::builder().set_failed(Some(Vec::new()));
        let mut successful = Vec::new();
        for entry in input.entries() {
            let body = entry.message_body();
            if let Some((code, sender_fault)) = refuse(body, call) {
                output = output.failed(failed_entry(entry.id(), code, sender_fault, Some("refused")));
                continue;
            }
            successful.push(
                SendMessageBatchResultEntry::builder()
                    .id(entry.id())
                    .message_id(format!("msg-{body}"))
                    .md5_of_message_body("x")
                    .build()
                    .unwrap(),
            );
        }
        output.set_successful(Some(successful)).build().unwrap()
    })
}

fn batching(url: &str, rule: &Rule, config: BatchingConfig) -> BatchingProducer {
    BatchingProducer::new(Producer::new(mock_sqs([rule]), url), config).unwrap()
}

fn fifo_job(group: &str, n: u32) -> NewJob<String> {
    NewJob::new("n", format!("{group}{n}"))
        .group_id(group)
        .deduplication_id(format!("{group}-{n}"))
}

#[tokio::test(start_paused = true)]
async fn concurrent_sends_share_calls_and_each_caller_gets_its_own_id() {
    let calls = Calls::default();
    let rule = batch_rule(&calls, |_, _| None);
    let producer = batching(URL, &rule, BatchingConfig::default());
    let jobs: Vec<NewJob<u32>> = (0..25).map(|n| NewJob::new("n", n)).collect();
    let results = join_all(jobs.iter().map(|job| producer.send(job))).await;

    for (n, result) in results.into_iter().enumerate() {
        assert_eq!(result, Ok(format!("msg-{n}")));
    }
    let sizes: Vec<usize> = calls.lock().unwrap().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![10, 10, 5]);
    assert_eq!(producer.producer().requests(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_refused_entry_is_its_callers_error_and_the_others_are_sent() {
    let calls = Calls::default();
    let rule = batch_rule(&calls, |body, _| {
        (body == "4").then_some(("InvalidMessageContents", true))
    });
    let producer = batching(URL, &rule, BatchingConfig::default());
    let jobs: Vec<NewJob<u32>> = (0..6).map(|n| NewJob::new("n", n)).collect();
    let results = join_all(jobs.iter().map(|job| producer.send(job))).await;

    assert!(matches!(
        &results[4],
        Err(ProduceError::Rejected { code, sender_fault: true, .. }) if code == "InvalidMessageContents"
    ));
    let sent = results.iter().filter(|result| result.is_ok()).count();
    assert_eq!(sent, 5);
    assert_eq!(calls.lock().unwrap().len(), 1, "a sender fault is not retried");
}

#[tokio::test(start_paused = true)]
async fn a_fifo_job_overtaken_in_its_call_is_not_resent_and_its_groups_buffered_jobs_are_held() {
    let calls = Calls::default();
    // The first call stores a1 but fails a0 with a retryable error.
    let rule = batch_rule(&calls, |body, call| {
        (call == 1 && body == "\"a0\"").then_some(("InternalError", false))
    });
    let producer = batching(FIFO_URL, &rule, BatchingConfig::default().with_max_entries(2));
    let jobs = [
        fifo_job("a", 0),
        fifo_job("a", 1),
        fifo_job("a", 2),
        fifo_job("b", 0),
    ];
    let results = join_all(jobs.iter().map(|job| producer.send(job))).await;

    let overtaken = results[0].as_ref().unwrap_err().to_string();
    assert!(overtaken.contains("not sent again"), "{overtaken}");
    assert_eq!(results[1], Ok("msg-\"a1\"".to_owned()));
    assert_eq!(
        results[2],
        Err(ProduceError::GroupHeld {
            group: "a".to_owned()
        })
    );
    assert_eq!(results[3], Ok("msg-\"b0\"".to_owned()));
    let seen = calls.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![vec!["\"a0\"", "\"a1\""], vec!["\"b0\""]],
        "a0 is not resent after a1; a2 makes no request"
    );

    // A job of the group handed over after the failure was known goes.
    assert_eq!(
        producer.send(&fifo_job("a", 3)).await,
        Ok("msg-\"a3\"".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_sends_what_is_buffered_without_waiting_out_the_linger_and_refuses_what_comes_after() {
    let calls = Calls::default();
    let rule = batch_rule(&calls, |_, _| None);
    let linger = Duration::from_secs(1);
    let producer = batching(URL, &rule, BatchingConfig::default().with_linger(linger));
    let started = Instant::now();
    let sends: Vec<_> = (0..3u32)
        .map(|n| {
            let producer = producer.clone();
            tokio::spawn(async move { producer.send(&NewJob::new("n", n)).await })
        })
        .collect();
    // Every send is in the buffer (or taken by the flusher, lingering for more).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    producer.shutdown().await;
    assert!(
        started.elapsed() < linger,
        "shutdown does not wait out the linger"
    );
    for send in sends {
        assert!(send.await.unwrap().is_ok());
    }
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(
        producer.send(&NewJob::new("n", 9)).await,
        Err(ProduceError::ShutDown)
    );
    assert_eq!(calls.lock().unwrap().len(), 1, "nothing is sent after shutdown");
}

#[tokio::test]
async fn settings_out_of_range_are_refused_with_what_is_allowed() {
    let rule = batch_rule(&Calls::default(), |_, _| None);
    let producer = || Producer::new(mock_sqs([&rule]), URL);
    let error =
        BatchingProducer::new(producer(), BatchingConfig::default().with_max_entries(11)).unwrap_err();
    assert!(error.to_string().contains("max_entries = 11") && error.to_string().contains("1 to 10"));
    let error = BatchingProducer::new(
        producer(),
        BatchingConfig::default().with_linger(Duration::from_secs(5)),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            BatchingError::Setting {
                setting: "linger",
                ..
            }
        ),
        "{error}"
    );
    let error = BatchingProducer::new(producer(), BatchingConfig::default().with_buffer(0)).unwrap_err();
    assert!(
        matches!(
            error,
            BatchingError::Setting {
                setting: "buffer",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn outside_a_runtime_the_producer_says_it_needs_one() {
    let rule = batch_rule(&Calls::default(), |_, _| None);
    let error =
        BatchingProducer::new(Producer::new(mock_sqs([&rule]), URL), BatchingConfig::default()).unwrap_err();
    assert_eq!(error, BatchingError::NoRuntime);
}
