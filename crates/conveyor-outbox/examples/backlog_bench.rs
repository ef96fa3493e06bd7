//! Drains an outbox backlog with the polling relay, from DynamoDB and from Postgres, and prints the
//! figures the docs quote: jobs per second, SQS requests and store requests (DynamoDB calls, SQL
//! statements) per job. Runs against the local stack (`make local-aws`: LocalStack, DynamoDB Local,
//! Postgres):
//!
//! ```text
//! cargo run --release -p conveyor-outbox --example backlog_bench -- 10000
//! ```
//!
//! The backlog: `count` jobs over 1,000 aggregates (10 jobs each at 10,000), in sequence order as the
//! writers' transactions leave them.

use std::sync::Arc;
use std::time::Instant;

use conveyor_outbox::backlog::write_backlog;
use conveyor_outbox::postgres::{PostgresOutbox, migrate};
use conveyor_outbox::{
    DynamoOutboxStore, JobSink, Outbox, OutboxStore, OutboxTable, Poller, PollerOptions, Relay, SqsSink,
    create_outbox_table,
};
use conveyor_sqs::NewJob;
use conveyor_testing::localstack::{self, QueueSpec};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

const AGGREGATES: usize = 1000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = std::env::args().nth(1).map_or(Ok(10_000), |arg| arg.parse())?;
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name("bench-outbox"));
    create_outbox_table(&dynamodb, &table).await?;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("bench-outbox")).await?;
    let outbox = Outbox::new(table.clone(), &queue.url);
    let mut writes = Vec::with_capacity(AGGREGATES);
    let per_aggregate = count.div_ceil(AGGREGATES);
    for aggregate in 0..AGGREGATES {
        let jobs: Vec<_> = (0..per_aggregate)
            .map(|n| aggregate * per_aggregate + n)
            .filter(|n| *n < count)
            .map(|n| NewJob::new("invoice", serde_json::json!({ "order": n })))
            .collect();
        if jobs.is_empty() {
            break;
        }
        writes.push(outbox.put_after(jobs, &format!("order#{aggregate}"), 0)?);
    }
    let written = Instant::now();
    write_backlog(&dynamodb, &table.name, &writes).await?;
    println!(
        "wrote a backlog of {count} outbox jobs over {AGGREGATES} aggregates in {:.1}s",
        written.elapsed().as_secs_f64()
    );

    let store = Arc::new(DynamoOutboxStore::new(dynamodb.clone(), table.clone()));
    drain("DynamoDB", store, &sqs, count).await?;

    let admin = std::env::var("CONVEYOR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:55432/conveyor".to_owned());
    let name = localstack::unique_name("bench_outbox").replace('-', "_");
    let mut connection = sqlx::PgConnection::connect(&admin).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut connection)
        .await?;
    let url = format!(
        "{}/{name}",
        admin.rsplit_once('/').map_or(admin.as_str(), |(base, _)| base)
    );
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    migrate(&pool).await?;
    let writer = PostgresOutbox::new(&queue.url);
    let written = Instant::now();
    for aggregate in 0..AGGREGATES {
        let mut tx = pool.begin().await?;
        for n in (0..per_aggregate)
            .map(|n| aggregate * per_aggregate + n)
            .filter(|n| *n < count)
        {
            let job = NewJob::new("invoice", serde_json::json!({ "order": n }));
            writer.put(&mut tx, job, &format!("order#{aggregate}")).await?;
        }
        tx.commit().await?;
    }
    println!(
        "wrote a backlog of {count} outbox jobs into Postgres in {AGGREGATES} transactions in {:.1}s",
        written.elapsed().as_secs_f64()
    );
    let store = Arc::new(conveyor_outbox::postgres::PostgresOutboxStore::new(pool));
    drain("Postgres", store, &sqs, count).await?;
    Ok(())
}

/// Drains the backlog in `store` with one poller; prints the figures.
async fn drain(
    source: &str,
    store: Arc<dyn OutboxStore>,
    sqs: &aws_sdk_sqs::Client,
    count: usize,
) -> anyhow::Result<()> {
    let sink = Arc::new(SqsSink::new(sqs.clone()));
    let relay = Relay::new(store.clone(), sink.clone());
    let mut options = PollerOptions::default();
    options.exit_when_idle = true;
    let poller = Poller::new(relay, "bench", options);
    let progress = poller.progress();
    let before = store.requests();
    let started = Instant::now();
    poller.run(CancellationToken::new()).await;
    let seconds = started.elapsed().as_secs_f64();
    let end = progress.snapshot();
    let sent = end.sent.max(1) as f64;
    let sqs_requests = sink.requests();
    let store_requests = store.requests() - before;
    println!(
        "{source}: relayed {} of {count} jobs in {seconds:.1}s: {:.0} jobs/s; {sqs_requests} SQS requests \
         ({:.3} per job), {store_requests} store requests ({:.3} per job), {:.3} requests per job in all",
        end.sent,
        end.sent as f64 / seconds,
        sqs_requests as f64 / sent,
        store_requests as f64 / sent,
        (sqs_requests + store_requests) as f64 / sent,
    );
    anyhow::ensure!(end.sent as usize == count, "not every job was relayed");
    Ok(())
}
