//! Records outlive the work in the Lambda adapter too: a handler whose `record_ttl` is far shorter than
//! its run keeps its in-progress record claimed until it settles, for a Powertools for Python consumer
//! of the same records as well (Powertools' key style, DynamoDB Local, the real Powertools 3.37.0).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use conveyor_core::{
    message::Message,
    port::{IdempotencyStore, Queue, RecordStatus},
    {
        Context, Handler, HandlerError, HandlerSettings, KeySource, KeyStyle, Pipeline, PowertoolsFlavor,
        PowertoolsKey, Router,
    },
};
use conveyor_dynamodb::DynamoStore;
use conveyor_lambda::LambdaConfig;
use conveyor_lambda::{BatchProcessor, FixedQueue, parse_event};
use conveyor_testing::localstack::{self, dynamodb_client, ensure_local_aws, unique_name};
use conveyor_testing::powertools::{self, Consumer, ConsumerSpec, Language, sqs_record};
use conveyor_testing::{MemoryQueue, wait_until};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

const PREFIX: &str = "orders-fn.app.handle";

/// Runs until released; its records are meant to last one second.
struct LongJob {
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    release: Arc<Notify>,
}

impl Handler for LongJob {
    type Job = Value;
    type Output = Value;
    const JOB_TYPE: &'static str = "long_job";

    async fn handle(&self, _job: Value, ctx: Context) -> Result<Value, HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        self.release.notified().await;
        Ok(json!({"by": "conveyor", "messageId": ctx.message_id()}))
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default()
            .with_record_ttl(Duration::from_secs(1))
            .with_key_style(KeyStyle::Powertools(PowertoolsKey {
                flavor: PowertoolsFlavor::Python,
                prefix: PREFIX.into(),
                source: KeySource::MessageId,
            }))
    }
}

#[tokio::test]
async fn an_in_progress_record_shorter_lived_than_its_job_stays_claimed_in_lambda() -> anyhow::Result<()> {
    ensure_local_aws()
        .await
        .context("DynamoDB Local is needed: run ./localstack/start.sh (make test does)")?;
    powertools::ensure_installed().context("Powertools is needed: run ./localstack/install-powertools.sh")?;
    let client = dynamodb_client().await;
    let table = localstack::create_table(&client, "lambda-lifetime").await?;
    let store = Arc::new(DynamoStore::new(client, &table));
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let handler = LongJob {
        runs: Arc::clone(&runs),
        started: Arc::clone(&started),
        release: Arc::clone(&release),
    };
    let pipeline = Pipeline::new(Router::new().default_route(handler)).with_store(store.clone());
    let queue: Arc<dyn Queue> = Arc::new(MemoryQueue::standard("lifetime"));
    let processor =
        BatchProcessor::new(pipeline, LambdaConfig::default(), Arc::new(FixedQueue(queue))).without_metrics();
    let message_id = unique_name("m");
    let body = r#"{"order_id": 7}"#;
    let mut record = sqs_record(&message_id, body);
    record["eventSourceARN"] = json!("arn:aws:sqs:us-east-1:123456789012:lifetime");
    // Received just now, as the mapping hands a record over: no visibility renewal is asked for it
    // (the queue never handed its receipt out, so it would refuse one and the record would not run).
    let received_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_millis();
    record["attributes"]["ApproximateFirstReceiveTimestamp"] = json!(received_ms.to_string());
    let event = parse_event(json!({"Records": [record.clone()]}))?;

    let claimed_at = SystemTime::now();
    let invocation = tokio::spawn(async move {
        processor
            .process_batch_report(event, Instant::now() + Duration::from_secs(60))
            .await
    });
    started.notified().await;
    // Past the record_ttl the claim was made with (and then some): the record must still hold.
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async move { SystemTime::now() > claimed_at + Duration::from_secs(3) },
    )
    .await?;
    let key = KeyStyle::Powertools(PowertoolsKey {
        flavor: PowertoolsFlavor::Python,
        prefix: PREFIX.into(),
        source: KeySource::MessageId,
    })
    .key("long_job", &Message::new(message_id.clone(), body))?;
    let held = store.get(&key).await?.context("the in-progress record")?;
    assert_eq!(held.status, RecordStatus::InProgress);
    assert!(
        !held.is_free_at(SystemTime::now()),
        "the record lapsed under its job: {held:?}"
    );

    let events = Consumer::run(Language::Python, &ConsumerSpec::new(&table, PREFIX, vec![record])).await?;

    assert_eq!(
        powertools::runs(&events),
        0,
        "Powertools ran a job Conveyor was running: {events:?}"
    );
    assert_eq!(powertools::errors(&events), ["IdempotencyAlreadyInProgressError"]);
    release.notify_one();
    let report = invocation.await?;
    assert!(report.response.batch_item_failures.is_empty(), "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.get(&key).await?.map(|record| record.status),
        Some(RecordStatus::Completed)
    );
    Ok(())
}
