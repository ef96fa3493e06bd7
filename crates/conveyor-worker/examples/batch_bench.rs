//! A batch handler against a per-job handler (figures, not pass/fail), on LocalStack and DynamoDB Local:
//!
//! ```text
//! cargo run --release -p conveyor-worker --example batch_bench
//! ```
//!
//! The same jobs (`BENCH_ROWS`, default 2000 rows, each with its own key) through the same queue setup
//! and a worker at `max_in_flight` 50 with the DynamoDB idempotency store, twice: each row written with
//! one `PutItem` per job (`PutRow`), then with one `BatchWriteItem` per call of up to 25 jobs
//! (`WriteRows`, `tests/common/rows.rs`). Prints jobs/s and the handler's DynamoDB requests per job.
//! The claims are the same in both: a conditional write to claim and one to complete, per job (DynamoDB
//! has no conditional batch write per item).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/common/rows.rs"]
mod rows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_core::{Pipeline, Router};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{self, QueueSpec, create_queue, create_table, ensure_local_aws};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use futures_util::StreamExt;
use rows::{PutRow, RowJob, RowTable, WriteRows};
use tokio_util::sync::CancellationToken;

/// No run may take longer than this.
const BENCH_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy)]
enum Handling {
    PerJob,
    Batch,
}

fn message(id: usize) -> OutgoingMessage {
    let job = RowJob {
        id: format!("row-{id}"),
        value: id as u64,
    };
    let mut message = OutgoingMessage {
        body: serde_json::to_string(&job).unwrap(),
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("row"));
    message.attributes.insert(
        IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
        AttributeValue::string(&job.id),
    );
    message
}

async fn run(handling: Handling, count: usize) -> anyhow::Result<()> {
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let created = create_queue(&sqs, &QueueSpec::standard("batch-bench").max_receive_count(5)).await?;
    let queue = Arc::new(SqsQueue::connect(sqs.clone(), &created.url).await?);
    futures_util::stream::iter(0..count)
        .for_each_concurrent(32, |id| {
            let queue = Arc::clone(&queue);
            async move {
                queue.send(message(id)).await.unwrap();
            }
        })
        .await;
    let store: Arc<dyn IdempotencyStore> = Arc::new(DynamoStore::new(
        dynamodb.clone(),
        create_table(&dynamodb, "batch-bench").await?,
    ));
    let rows = RowTable::create(dynamodb, "batch-bench-rows").await?;
    let router = match handling {
        Handling::PerJob => Router::new().route(PutRow(Arc::clone(&rows))),
        Handling::Batch => Router::new().batch_route(WriteRows(Arc::clone(&rows))),
    };
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(&created.url)])
        .with_max_in_flight(50)
        .with_listen_addr(None);
    let worker = Worker::new(
        config,
        Pipeline::new(router).with_store(store),
        vec![queue as Arc<dyn Queue>],
    )?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    conveyor_testing::wait_until(BENCH_TIMEOUT, Duration::from_millis(20), async || {
        rows.writes().len() == count
    })
    .await?;
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await??;
    let label = match handling {
        Handling::PerJob => "per-job handler (PutItem each)",
        Handling::Batch => "batch handler (BatchWriteItem, 25 per call)",
    };
    println!(
        "figure: {label}: {count} jobs in {:.2} s, {:.0} jobs/s, {:.3} handler DynamoDB requests per job \
         (plus 2 conditional writes per job for the claim and its completion in both)",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64(),
        rows.requests() as f64 / count as f64,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let count = std::env::var("BENCH_ROWS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2000);
    run(Handling::PerJob, count).await?;
    run(Handling::Batch, count).await?;
    Ok(())
}
