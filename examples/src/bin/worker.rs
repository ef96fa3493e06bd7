//! The example application as a long-poll worker (the ECS service's container command).
//!
//! ```text
//! worker [--config worker.toml]     run until SIGTERM/SIGINT
//! worker --healthcheck              exit 0 when the running worker's /healthz answers (ECS health check)
//! worker --export-schedules FILE    write the schedules for EventBridge Scheduler (infra/modules/schedules)
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;

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
    /// Write the application's schedules as the file infra/modules/schedules reads, and exit.
    #[arg(long, value_name = "FILE")]
    export_schedules: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before the worker starts, so the --healthcheck and --export-schedules paths log too.
    conveyor_worker::init_logging()?;
    // The application's own CONVEYOR_* variable, so it is not reported as a typo.
    let app_variables = conveyor_examples::APP_VARIABLES;
    if args.healthcheck {
        let config = conveyor_worker::config::load_config_reading(args.config.as_deref(), app_variables)?;
        let addr = config
            .listen_addr
            .clone()
            .context("the operations endpoint is off (CONVEYOR_LISTEN_ADDR=off)")?;
        conveyor_worker::healthcheck(&addr).await?;
        return Ok(());
    }
    if let Some(path) = &args.export_schedules {
        let file = conveyor_schedule::export(&conveyor_examples::schedules::schedules()?)?;
        std::fs::write(path, file + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(());
    }
    let pipeline = conveyor_examples::app_pipeline().await?;
    let scheduler = conveyor_examples::schedules::app_scheduler().await?;
    // With CONVEYOR_OUTBOX_TABLE set, this worker also relays the transactional outbox (one worker of the
    // service holds the relay's lease at a time; the others stand by).
    let outbox_relay = conveyor_outbox::poller_from_env().await?;
    // With flows on, every worker sweeps flows past their deadline once a minute (a flow whose child
    // reached the DLQ by SQS's redrive, or was never sent, ends there by its policy).
    let flow_sweeper = match (pipeline.flows(), pipeline.store()) {
        (Some(flows), Some(store)) => Some(conveyor_core::FlowSweeper::new(flows.clone(), Arc::clone(store))),
        _ => None,
    };
    // Reads the config, connects the queues (a configuration error stops here with its fix, an outage
    // is retried), watches their DLQs, runs until SIGTERM/SIGINT.
    let report = conveyor_worker::Runner::new(pipeline)
        .config_file(args.config)
        .app_variables(app_variables)
        .configure(move |worker| {
            let worker = match scheduler {
                Some(scheduler) => worker.with_background_task(scheduler),
                None => worker,
            };
            let worker = match flow_sweeper {
                Some(sweeper) => worker.with_background_task(sweeper),
                None => worker,
            };
            match outbox_relay {
                Some(relay) => worker.with_background_task(relay),
                None => worker,
            }
        })
        .run()
        .await?;
    tracing::info!(?report, "worker stopped");
    Ok(())
}
