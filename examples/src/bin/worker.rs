//! The example application as a long-poll worker (the ECS service's container command).
//!
//! ```text
//! worker [--config worker.toml]     run until SIGTERM/SIGINT
//! worker --healthcheck              exit 0 when the running worker's /healthz answers (ECS health check)
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use conveyor_core::Queue;
use conveyor_worker::connect::{DEFAULT_CONNECT_PATIENCE, connect_with_retry};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(about = "Conveyor example worker: welcome emails, webhooks and reports from SQS")]
struct Args {
    /// A TOML config file; environment variables (CONVEYOR_*) override it.
    #[arg(long, env = "CONVEYOR_CONFIG")]
    config: Option<PathBuf>,
    /// Check the running worker's /healthz and exit (for container health checks).
    #[arg(long)]
    healthcheck: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    conveyor_examples::init_tracing()?;
    // The application's own CONVEYOR_* variable, so it is not reported as a typo.
    let config = conveyor_worker::config::load_config_reading(
        args.config.as_deref(),
        &[conveyor_examples::OUTBOX_ENV],
    )?;
    if args.healthcheck {
        let addr = config
            .listen_addr
            .clone()
            .context("the operations endpoint is off (CONVEYOR_LISTEN_ADDR=off)")?;
        conveyor_worker::healthcheck(&addr).await?;
        return Ok(());
    }
    let pipeline = conveyor_examples::app_pipeline().await?;
    let client = conveyor_sqs::sqs_client_from_env().await;
    // A configuration error (no region, no credentials, a missing queue, denied access) stops here at
    // once with its fix; an outage is retried with backoff.
    let mut queues: Vec<Arc<dyn Queue>> = Vec::new();
    let mut dead_letter_queues: Vec<Arc<dyn Queue>> = Vec::new();
    for queue in &config.queues {
        let connected = connect_with_retry(&queue.url, DEFAULT_CONNECT_PATIENCE, || {
            conveyor_sqs::SqsQueue::connect(client.clone(), &queue.url)
        })
        .await?;
        if let Some(dlq_url) = connected.dead_letter_queue_url() {
            let dlq = connect_with_retry(dlq_url, DEFAULT_CONNECT_PATIENCE, || {
                conveyor_sqs::SqsQueue::connect(client.clone(), dlq_url)
            })
            .await?;
            dead_letter_queues.push(Arc::new(dlq));
        }
        queues.push(Arc::new(connected));
    }
    let mut worker = conveyor_worker::Worker::new(config, pipeline, queues)?;
    // conveyor_dlq_messages{queue=...} on /metrics.
    for dlq in dead_letter_queues {
        worker = worker.watch_dead_letter_queue(dlq);
    }
    let report = worker.run_until_signal().await?;
    tracing::info!(?report, "worker stopped");
    Ok(())
}
