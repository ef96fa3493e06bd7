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
    let config = conveyor_worker::load_config(args.config.as_deref())?;
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
    let mut queues: Vec<Arc<dyn Queue>> = Vec::new();
    for queue in &config.queues {
        let connected = conveyor_sqs::SqsQueue::connect(client.clone(), &queue.url).await?;
        queues.push(Arc::new(connected));
    }
    let worker = conveyor_worker::Worker::new(config, pipeline, queues)?;
    let report = worker.run_until_signal().await?;
    tracing::info!(?report, "worker stopped");
    Ok(())
}
