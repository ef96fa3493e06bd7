//! Nothing waits silently (issue 55): a producer that keeps a job in the timer table warns when no
//! relay has been seen for the queue, and stays quiet once one has run, on LocalStack and DynamoDB
//! Local with the real `Producer` and `DynamoStore`.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::{TimerRelay, Timers};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::{NewJob, Producer, SqsSender};
use conveyor_testing::localstack::{self, QueueSpec};

/// The words of the producer's warning.
const WARNING: &str = "no timer relay has been seen for this queue recently";

/// Log lines written by the test's subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().map(|bytes| bytes.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut bytes) = self.0.lock() {
            bytes.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's warnings as JSON lines until the guard drops (the test runs on one thread).
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

fn report_in_two_hours() -> NewJob<serde_json::Value> {
    NewJob::new("report", serde_json::json!({"month": "2026-11"})).delay(Duration::from_secs(7200))
}

#[tokio::test]
async fn a_producer_warns_once_when_no_relay_was_seen_and_not_when_one_ran() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "no-relay").await?;
    let store = Arc::new(DynamoStore::new(dynamodb, &table));

    // No consumer has timers on: nobody relays this queue.
    let lonely = localstack::create_queue(&sqs, &QueueSpec::standard("no-relay")).await?;
    let producer = Producer::new(sqs.clone(), &lonely.url).with_timers(store.clone());
    let (captured, guard) = capture();
    producer.send(&report_in_two_hours()).await?;
    producer.send(&report_in_two_hours()).await?;
    drop(guard);
    let logged = captured.text();
    let warnings: Vec<serde_json::Value> = logged
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|line: &serde_json::Value| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(WARNING))
        })
        .collect();
    assert_eq!(warnings.len(), 1, "one warning for two kept jobs: {logged}");
    let warning = &warnings[0];
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["fields"]["last_seen"], "never", "{warning}");
    assert!(
        warning["fields"]["queue"]
            .as_str()
            .is_some_and(|queue| lonely.url.ends_with(queue)),
        "{warning}"
    );
    assert!(
        warning["fields"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("conveyor::Pipeline::with_timers")),
        "the fix is named: {warning}"
    );
    assert!(!logged.contains("2026-11"), "no job body in the log: {logged}");

    // A queue whose consumers run a relay (what a worker with Pipeline::with_timers starts): one pass
    // leaves its mark, and the producer keeps its jobs without a word.
    let relayed = localstack::create_queue(&sqs, &QueueSpec::standard("relayed")).await?;
    let timers = Timers::new(
        store.clone(),
        Arc::new(SqsSender::new(sqs.clone())),
        relayed.url.as_str(),
    );
    TimerRelay::new(timers).relay().await?;
    let producer = Producer::new(sqs.clone(), &relayed.url).with_timers(store.clone());
    let (captured, guard) = capture();
    let id = producer.send(&report_in_two_hours()).await?;
    drop(guard);
    let logged = captured.text();
    assert!(!logged.contains(WARNING), "a relay ran: {logged}");
    let kept = producer.timers().map(|timers| timers.get(&id));
    match kept {
        Some(kept) => assert!(kept.await?.is_some(), "the job was kept in the timer table"),
        None => anyhow::bail!("timers are on"),
    }
    Ok(())
}
