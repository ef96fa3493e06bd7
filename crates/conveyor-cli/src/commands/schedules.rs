//! `conveyor schedules`: export the application's schedules, and list, pause, resume and trigger them.
//!
//! The definitions live in the application's code; `export` asks the application's binary for them
//! (`APP --export-schedules FILE`, which `conveyor_schedule::export` implements in a few lines) and the
//! other commands read that file. Their state (paused, runs, last tick, last outcome) lives in the
//! idempotency table, shared by every worker running the scheduler.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use conveyor_schedule::{Schedule, TickStore};
use conveyor_sqs::Producer;
use conveyor_sqs::admin::{QueueRef, resolve_queue_url};
use serde_json::json;

use crate::aws::Aws;
use crate::output::{Format, Table, format_time, print_json};

/// Arguments of `conveyor schedules`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor schedules export --app target/debug/worker --out infra/examples/lambda/schedules.json
  conveyor schedules list --file schedules.json --table conveyor-idempotency
  conveyor schedules pause nightly-sales-report --file schedules.json --table conveyor-idempotency
  conveyor schedules trigger nightly-sales-report --file schedules.json --table conveyor-idempotency --queue-url jobs

Pausing and resuming act on the workers' schedulers (state in the idempotency table). Schedules
deployed to EventBridge Scheduler (infra/modules/schedules) are paused there: set the module's
`enabled = false`, or `aws scheduler update-schedule --state DISABLED`.")]
pub(crate) struct SchedulesArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: SchedulesCommand,
}

/// Where the definitions and the state are.
#[derive(Debug, Args)]
pub(crate) struct Source {
    /// The file `conveyor schedules export` wrote.
    #[arg(long, value_name = "FILE", default_value = "schedules.json")]
    pub file: PathBuf,
    /// The idempotency table the workers' schedulers claim ticks in.
    #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE")]
    pub table: String,
}

/// The `conveyor schedules` commands.
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Write the application's schedules to a file (runs `APP --export-schedules FILE`).
    Export {
        /// The application's binary (one that supports --export-schedules, like the example worker).
        #[arg(long, value_name = "BIN")]
        app: PathBuf,
        /// Where to write the file.
        #[arg(long, value_name = "FILE", default_value = "schedules.json")]
        out: PathBuf,
    },
    /// Every schedule: next fire times, last fire, last outcome, paused, runs.
    List {
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
        /// How many next fire times to show.
        #[arg(long, default_value_t = 3)]
        next: usize,
    },
    /// Stop sending a schedule's ticks (every worker, from its next tick).
    Pause {
        /// The schedule's name.
        name: String,
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
    },
    /// Send a paused schedule's ticks again.
    Resume {
        /// The schedule's name.
        name: String,
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
    },
    /// Send the schedule's job now, once.
    Trigger {
        /// The schedule's name.
        name: String,
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
        /// URL (or name) of the queue to send to.
        #[arg(long, value_name = "URL")]
        queue_url: QueueRef,
    },
}

/// Runs `conveyor schedules`.
pub(crate) async fn run(args: &SchedulesArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    match &args.command {
        SchedulesCommand::Export { app, out } => export(app, out),
        SchedulesCommand::List { source, next } => list(source, aws, *next, format).await,
        SchedulesCommand::Pause { name, source } => set_paused(name, source, aws, true).await,
        SchedulesCommand::Resume { name, source } => set_paused(name, source, aws, false).await,
        SchedulesCommand::Trigger {
            name,
            source,
            queue_url,
        } => trigger(name, source, queue_url, aws, format).await,
    }
}

fn export(app: &PathBuf, out: &PathBuf) -> anyhow::Result<()> {
    let output = std::process::Command::new(app)
        .arg("--export-schedules")
        .arg(out)
        .output()
        .with_context(|| format!("cannot run {}", app.display()))?;
    if !output.status.success() {
        bail!(
            "{} --export-schedules failed ({}): {}",
            app.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let schedules = load(out)?;
    crate::outln!("wrote {} schedules to {}", schedules.len(), out.display());
    Ok(())
}

fn load(path: &PathBuf) -> anyhow::Result<Vec<Schedule>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}: write it with `conveyor schedules export --app <your binary> --out {}`",
            path.display(),
            path.display()
        )
    })?;
    Ok(conveyor_schedule::load(&text)?)
}

fn find(name: &str, schedules: Vec<Schedule>) -> anyhow::Result<Schedule> {
    let names: Vec<String> = schedules.iter().map(|schedule| schedule.name.clone()).collect();
    schedules
        .into_iter()
        .find(|schedule| schedule.name == name)
        .with_context(|| format!("no schedule named {name:?}; the file has: {}", names.join(", ")))
}

async fn list(source: &Source, aws: &Aws, next: usize, format: Format) -> anyhow::Result<()> {
    let schedules = load(&source.file)?;
    let store = TickStore::new(aws.dynamodb_client(), &source.table);
    let now = SystemTime::now();
    let mut rows = Vec::new();
    for schedule in &schedules {
        let state = store.state(&schedule.name).await?;
        let horizon = now + std::time::Duration::from_secs(10 * 365 * 24 * 3600);
        let upcoming: Vec<SystemTime> = schedule.ticks_between(now, horizon, next);
        rows.push((schedule, state, upcoming));
    }
    if format == Format::Json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(schedule, state, upcoming)| {
                json!({
                    "name": schedule.name,
                    "job_type": schedule.job.job_type,
                    "next": upcoming.iter().map(|tick| format_time(*tick)).collect::<Vec<_>>(),
                    "paused": state.paused,
                    "runs": state.runs,
                    "max_runs": schedule.max_runs,
                    "last_tick": state.last_tick.map(format_time),
                    "last_fire": state.last_fire.map(format_time),
                    "last_outcome": state.last_outcome,
                })
            })
            .collect();
        return print_json(&json!({ "schedules": list }));
    }
    let mut table = Table::new(&["SCHEDULE", "JOB", "NEXT", "LAST FIRE", "LAST OUTCOME", "STATE"]);
    for (schedule, state, upcoming) in rows {
        let next = upcoming
            .iter()
            .map(|tick| format_time(*tick))
            .collect::<Vec<_>>()
            .join(", ");
        let state_text = if state.paused { "paused" } else { "active" };
        table.row(vec![
            schedule.name.clone(),
            schedule.job.job_type.clone(),
            if next.is_empty() {
                "none (ended)".to_owned()
            } else {
                next
            },
            state.last_fire.map_or_else(|| "never".to_owned(), format_time),
            state.last_outcome.unwrap_or_default(),
            format!("{state_text}, {} runs", state.runs),
        ]);
    }
    crate::out!("{}", table.render());
    Ok(())
}

async fn set_paused(name: &str, source: &Source, aws: &Aws, paused: bool) -> anyhow::Result<()> {
    let schedule = find(name, load(&source.file)?)?;
    let store = TickStore::new(aws.dynamodb_client(), &source.table);
    store.set_paused(&schedule.name, paused).await?;
    let what = if paused {
        "paused: its ticks pass unsent"
    } else {
        "resumed"
    };
    crate::outln!("schedule {} {what}", schedule.name);
    Ok(())
}

async fn trigger(
    name: &str,
    source: &Source,
    queue: &QueueRef,
    aws: &Aws,
    format: Format,
) -> anyhow::Result<()> {
    let schedule = find(name, load(&source.file)?)?;
    let client = aws.sqs_client();
    let url = resolve_queue_url(&client, queue).await?;
    let store = TickStore::new(aws.dynamodb_client(), &source.table);
    let producer = Arc::new(Producer::new(client, url));
    let message_id = conveyor_schedule::trigger(&schedule, &store, &producer).await?;
    if format == Format::Json {
        return print_json(&json!({ "schedule": schedule.name, "message_id": message_id }));
    }
    crate::outln!("schedule {} triggered: sent {message_id}", schedule.name);
    Ok(())
}
