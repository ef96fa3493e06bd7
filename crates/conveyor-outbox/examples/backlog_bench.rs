//! Drains an outbox backlog with the stream relay and prints the figures the README quotes: jobs per
//! second and AWS requests per job. Runs against the local stack (`make local-aws`):
//!
//! ```text
//! cargo run --release -p conveyor-outbox --example backlog_bench -- 10000
//! ```

use std::time::{Duration, Instant};

use conveyor_outbox::backlog::write_backlog;
use conveyor_outbox::{Outbox, OutboxTable, Relay, StreamRelay, StreamRelayOptions, create_outbox_table};
use conveyor_sqs::NewJob;
use conveyor_testing::localstack::{self, QueueSpec};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber_init();
    let count: usize = std::env::args().nth(1).map_or(Ok(10_000), |arg| arg.parse())?;
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name("bench-outbox"));
    create_outbox_table(&dynamodb, &table).await?;
    let state = localstack::create_table(&dynamodb, "bench-outbox-state").await?;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("bench-outbox")).await?;
    let outbox = Outbox::new(table.clone(), &queue.url);
    let items = (0..count)
        .map(|n| {
            outbox.put(
                NewJob::new("invoice", serde_json::json!({"order": n})),
                &format!("order#{}", n % 1000),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let written = Instant::now();
    write_backlog(&dynamodb, &table.name, &items).await?;
    println!(
        "wrote a backlog of {count} outbox items in {:.1}s",
        written.elapsed().as_secs_f64()
    );

    let mut options = StreamRelayOptions::new(&state);
    options.exit_when_idle = true;
    options.progress_interval = Duration::from_secs(2);
    let relay = StreamRelay::new(
        Relay::new(sqs.clone(), dynamodb.clone(), table.clone()),
        localstack_streams_client(),
        dynamodb.clone(),
        options,
    );
    let progress = relay.progress();
    let started = Instant::now();
    relay.run(CancellationToken::new()).await?;
    let seconds = started.elapsed().as_secs_f64();
    let end = progress.snapshot();
    println!(
        "relayed {} of {count} jobs in {seconds:.1}s: {:.0} jobs/s, {} AWS requests ({:.3} per job), {} delete failures",
        end.relayed,
        end.relayed as f64 / seconds,
        end.requests,
        end.requests as f64 / end.relayed.max(1) as f64,
        end.delete_failures,
    );
    anyhow::ensure!(end.relayed as usize == count, "not every job was relayed");
    Ok(())
}

fn localstack_streams_client() -> aws_sdk_dynamodbstreams::Client {
    use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
    let credentials = Credentials::new(
        localstack::DUMMY_CREDENTIAL,
        localstack::DUMMY_CREDENTIAL,
        None,
        None,
        "bench",
    );
    aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(localstack::REGION))
            .endpoint_url(localstack::dynamodb_endpoint())
            .credentials_provider(credentials)
            .build(),
    )
}

/// Progress lines (the relay logs one every 2 s) on stderr.
fn tracing_subscriber_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("conveyor_outbox=info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
