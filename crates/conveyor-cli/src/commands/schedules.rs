//! `conveyor schedules`: export the application's schedules; list, pause, resume and trigger them; add
//! and remove run-time schedules; show a schedule's run history.
//!
//! The code's definitions live in the application; the leading scheduler records them in the
//! idempotency table as it serves them (once per lease term), so `list` and `trigger` read them there
//! with the run-time schedules (`add`, `remove`) and every schedule's state (paused, runs, cursor,
//! history): no export step. `--file` reads an export instead (`APP --export-schedules FILE`, which
//! `conveyor_schedule::export` implements in a few lines), for deployments without a worker's
//! scheduler (Lambda with EventBridge Scheduler).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use conveyor_schedule::{MissedTicks, Schedule, ScheduleStore, TickStore};
use conveyor_sqs::Producer;
use conveyor_sqs::admin::{QueueRef, resolve_queue_url};
use serde_json::json;

use crate::aws::Aws;
use crate::output::{Format, Table, format_time, print_done, print_json};

/// Arguments of `conveyor schedules`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor schedules list --table conveyor-idempotency      # code and run-time schedules, no export
  conveyor schedules pause nightly-sales-report --table conveyor-idempotency
  conveyor schedules trigger nightly-sales-report --queue-url jobs --table conveyor-idempotency
  conveyor schedules export --app target/debug/worker --out infra/examples/lambda/schedules.json
  conveyor schedules list --file infra/examples/lambda/schedules.json   # EventBridge (Lambda) schedules
  conveyor schedules add cleanup --every 300 --start 2026-12-01T00:00:00Z --job-type cleanup --payload '{}' --table conveyor-idempotency
  conveyor schedules history nightly-sales-report --table conveyor-idempotency
  conveyor schedules remove cleanup --table conveyor-idempotency

The workers' leading scheduler records the schedules given in code (with their policies, defaults
included) in the table once per lease term: `list` and `trigger` read them there, with the run-time
ones. `--file` reads an export instead, for schedules that no worker serves (EventBridge on Lambda).

A pause is recorded (paused_at, resumed_at): the ticks of the paused period are skipped, never replayed
after the resume. Run-time schedules are picked up by the leading scheduler within a third of its lease.

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
    /// Read the definitions from this file (`conveyor schedules export`) instead of the table, where
    /// the workers' leading scheduler records the code's schedules.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The schedule set (the scheduler's `with_set`).
    #[arg(long, default_value = conveyor_schedule::DEFAULT_SET)]
    pub set: String,
    /// The idempotency table the workers' schedulers claim ticks in.
    #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
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
    /// Every schedule (from code, as the leading scheduler recorded it, and run-time ones): timing,
    /// missed-tick policy, next fire times, last fire, last outcome, paused, runs. No export needed.
    List {
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
        /// How many next fire times to show.
        #[arg(long, default_value_t = 3)]
        next: usize,
    },
    /// Stop sending a schedule's ticks from now on (its paused ticks are never replayed).
    Pause {
        /// The schedule's name.
        name: String,
        /// The idempotency table the schedulers keep their state in.
        #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
        table: String,
    },
    /// Send a paused schedule's ticks again, from the next one after now.
    Resume {
        /// The schedule's name.
        name: String,
        /// The idempotency table the schedulers keep their state in.
        #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
        table: String,
    },
    /// The schedule's recent ticks: tick, recorded at, outcome, message id or reason.
    History {
        /// The schedule's name.
        name: String,
        /// The idempotency table the schedulers keep their state in.
        #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
        table: String,
    },
    /// Add (or replace) a run-time schedule; the leading scheduler picks it up.
    Add(AddArgs),
    /// Remove a run-time schedule.
    Remove {
        /// The schedule's name.
        name: String,
        /// The schedule set.
        #[arg(long, default_value = conveyor_schedule::DEFAULT_SET)]
        set: String,
        /// The idempotency table the schedulers keep their state in.
        #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
        table: String,
    },
    /// Send the schedule's job now, once.
    Trigger {
        /// The schedule's name.
        name: String,
        /// Where the definitions and the state are.
        #[command(flatten)]
        source: Source,
        /// URL (or name) of the queue to send to.
        #[arg(long, env = "CONVEYOR_QUEUE_URL", value_name = "URL")]
        queue_url: QueueRef,
    },
}

/// Arguments of `conveyor schedules add`.
#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The schedule's name.
    name: String,
    /// A cron expression (5 fields, or 6 with seconds first).
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    cron: Option<String>,
    /// The cron expression's IANA time zone.
    #[arg(long, default_value = "UTC")]
    zone: String,
    /// An interval in seconds.
    #[arg(long, value_name = "SECS")]
    every: Option<u64>,
    /// The first tick (RFC 3339); intervals count from it.
    #[arg(long, value_name = "TIME")]
    start: Option<String>,
    /// The job type to send.
    #[arg(long)]
    job_type: String,
    /// The job's version.
    #[arg(long, default_value_t = 1)]
    version: u32,
    /// The job's payload (JSON).
    #[arg(long, default_value = "{}")]
    payload: String,
    /// At most this many runs.
    #[arg(long)]
    max_runs: Option<u64>,
    /// Missed ticks: latest_once, all or skip.
    #[arg(long, default_value = "latest_once")]
    missed: String,
    /// Skip a tick while the previous tick's job has not completed, for at most this many seconds.
    #[arg(long, value_name = "SECS")]
    skip_while_running: Option<u64>,
    /// The schedule set.
    #[arg(long, default_value = conveyor_schedule::DEFAULT_SET)]
    set: String,
    /// The idempotency table the schedulers keep their state in.
    #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", value_name = "TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
    table: String,
}

/// Runs `conveyor schedules`.
pub(crate) async fn run(args: &SchedulesArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    match &args.command {
        SchedulesCommand::Export { app, out } => export(app, out, format),
        SchedulesCommand::List { source, next } => list(source, aws, *next, format).await,
        SchedulesCommand::Pause { name, table } => set_paused(name, table, aws, true, format).await,
        SchedulesCommand::Resume { name, table } => set_paused(name, table, aws, false, format).await,
        SchedulesCommand::History { name, table } => history(name, table, aws, format).await,
        SchedulesCommand::Add(args) => add(args, aws, format).await,
        SchedulesCommand::Remove { name, set, table } => {
            let store = TickStore::new(aws.dynamodb_client(), table);
            store.remove_definition(set, name).await?;
            print_done(
                format,
                json!({ "removed": name, "set": set }),
                &format!("schedule {name} removed from set {set}"),
            )
        }
        SchedulesCommand::Trigger {
            name,
            source,
            queue_url,
        } => trigger(name, source, queue_url, aws, format).await,
    }
}

fn export(app: &PathBuf, out: &PathBuf, format: Format) -> anyhow::Result<()> {
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
    let names: Vec<&str> = schedules.iter().map(|schedule| schedule.name.as_str()).collect();
    print_done(
        format,
        json!({ "file": out.display().to_string(), "schedules": names }),
        &format!("wrote {} schedules to {}", schedules.len(), out.display()),
    )
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

fn find(name: &str, schedules: Vec<(Schedule, Origin)>) -> anyhow::Result<Schedule> {
    let names: Vec<String> = schedules
        .iter()
        .map(|(schedule, _)| schedule.name.clone())
        .collect();
    schedules
        .into_iter()
        .map(|(schedule, _)| schedule)
        .find(|schedule| schedule.name == name)
        .with_context(|| format!("no schedule named {name:?}; there are: {}", names.join(", ")))
}

/// Where a listed schedule's definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Given in code, recorded by the leading scheduler.
    Code,
    /// Added at run time (`conveyor schedules add`).
    RunTime,
    /// Read from an export file.
    File,
}

impl Origin {
    fn name(self) -> &'static str {
        match self {
            Origin::Code => "code",
            Origin::RunTime => "run-time",
            Origin::File => "file",
        }
    }
}

/// The schedules `source` names: the export file's, or the set's recorded code schedules plus its
/// run-time ones (a run-time one replaces a code one of the same name, as the leader does), by name.
async fn schedules(source: &Source, store: &TickStore) -> anyhow::Result<Vec<(Schedule, Origin)>> {
    if let Some(file) = &source.file {
        return Ok(load(file)?
            .into_iter()
            .map(|schedule| (schedule, Origin::File))
            .collect());
    }
    let code = store.code_definitions(&source.set).await?;
    let run_time = store.definitions(&source.set).await?;
    let mut definitions: HashMap<String, (String, Origin)> = code
        .into_iter()
        .map(|(name, text)| (name, (text, Origin::Code)))
        .collect();
    definitions.extend(
        run_time
            .into_iter()
            .map(|(name, text)| (name, (text, Origin::RunTime))),
    );
    if definitions.is_empty() {
        bail!(
            "no schedules recorded in table {} for set {:?}: a worker's leading scheduler records the \
             code's schedules when it starts serving them, and `conveyor schedules add` adds run-time \
             ones. Is a worker with schedules running on this table (and this --set)? For schedules \
             deployed to EventBridge Scheduler, pass the export: --file schedules.json",
            store.table(),
            source.set
        );
    }
    let mut names: Vec<String> = definitions.keys().cloned().collect();
    names.sort();
    let mut listed = Vec::with_capacity(names.len());
    for name in names {
        let Some((text, origin)) = definitions.remove(&name) else {
            continue;
        };
        let schedule = conveyor_schedule::from_definition_json(&name, &text)
            .with_context(|| format!("the recorded definition of schedule {name:?} does not load"))?;
        listed.push((schedule, origin));
    }
    Ok(listed)
}

async fn list(source: &Source, aws: &Aws, next: usize, format: Format) -> anyhow::Result<()> {
    let store = TickStore::new(aws.dynamodb_client(), &source.table);
    let schedules = schedules(source, &store).await?;
    let now = SystemTime::now();
    let mut rows = Vec::new();
    for (schedule, origin) in &schedules {
        let state = store.state(&schedule.name).await?;
        let horizon = now + std::time::Duration::from_secs(10 * 365 * 24 * 3600);
        let upcoming: Vec<SystemTime> = schedule.ticks_between(now, horizon, next);
        rows.push((schedule, *origin, state, upcoming));
    }
    if format == Format::Json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(schedule, origin, state, upcoming)| {
                json!({
                    "name": schedule.name,
                    "source": origin.name(),
                    "timing": timing(schedule),
                    "missed_ticks": missed_name(schedule.missed),
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
    let mut table = Table::new(&[
        "SCHEDULE",
        "SOURCE",
        "TIMING",
        "MISSED",
        "JOB",
        "NEXT",
        "LAST FIRE",
        "LAST OUTCOME",
        "STATE",
    ]);
    for (schedule, origin, state, upcoming) in rows {
        let next = upcoming
            .iter()
            .map(|tick| format_time(*tick))
            .collect::<Vec<_>>()
            .join(", ");
        let state_text = if state.paused { "paused" } else { "active" };
        let runs = match schedule.max_runs {
            Some(max) => format!("{}/{max} runs", state.runs),
            None => format!("{} runs", state.runs),
        };
        table.row(vec![
            schedule.name.clone(),
            origin.name().to_owned(),
            timing(schedule),
            missed_name(schedule.missed),
            schedule.job.job_type.clone(),
            if next.is_empty() {
                "none (ended)".to_owned()
            } else {
                next
            },
            state.last_fire.map_or_else(|| "never".to_owned(), format_time),
            state.last_outcome.unwrap_or_default(),
            format!("{state_text}, {runs}"),
        ]);
    }
    table.print(format);
    Ok(())
}

/// A schedule's timing as written: `cron <expression> <zone>` or `every <n>s`.
fn timing(schedule: &Schedule) -> String {
    match &schedule.timing {
        conveyor_schedule::Timing::Cron { expression, zone, .. } => {
            format!("cron {expression} {}", zone.iana_name().unwrap_or("UTC"))
        }
        conveyor_schedule::Timing::Every(interval) => format!("every {}s", interval.as_secs()),
        other => format!("{other:?}"),
    }
}

/// The missed-tick policy as `conveyor schedules add --missed` spells it (its serde name).
fn missed_name(policy: MissedTicks) -> String {
    serde_json::to_value(policy)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{policy:?}"))
}

async fn set_paused(name: &str, table: &str, aws: &Aws, paused: bool, format: Format) -> anyhow::Result<()> {
    let store = TickStore::new(aws.dynamodb_client(), table);
    let now = SystemTime::now();
    let value = json!({ "schedule": name, "paused": paused, "at": format_time(now) });
    if paused {
        store.pause(name, now).await?;
        print_done(
            format,
            value,
            &format!("schedule {name} paused: its ticks are skipped until resumed, never replayed"),
        )
    } else {
        store.resume(name, now).await?;
        print_done(
            format,
            value,
            &format!("schedule {name} resumed: ticks after {} fire", format_time(now)),
        )
    }
}

async fn history(name: &str, table: &str, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let store = TickStore::new(aws.dynamodb_client(), table);
    let state = store.state(name).await?;
    if format == Format::Json {
        let entries: Vec<serde_json::Value> = state
            .history
            .iter()
            .map(|entry| {
                json!({
                    "tick": format_time(entry.tick),
                    "at": format_time(entry.at),
                    "outcome": entry.outcome,
                    "detail": entry.detail,
                })
            })
            .collect();
        return print_json(&json!({
            "schedule": name,
            "paused": state.paused,
            "runs": state.runs,
            "last_tick": state.last_tick.map(format_time),
            "history": entries,
        }));
    }
    let mut table = Table::new(&["TICK", "RECORDED", "OUTCOME", "MESSAGE ID / REASON"]);
    for entry in state.history.iter().rev() {
        table.row(vec![
            format_time(entry.tick),
            format_time(entry.at),
            entry.outcome.clone(),
            entry.detail.clone(),
        ]);
    }
    table.print(format);
    Ok(())
}

async fn add(args: &AddArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let schedule = match (&args.cron, args.every) {
        (Some(cron), _) => Schedule::cron(&args.name, cron, &args.zone)?,
        (None, Some(secs)) => Schedule::every(&args.name, std::time::Duration::from_secs(secs))?,
        (None, None) => bail!("give --cron or --every"),
    };
    let payload: serde_json::Value = serde_json::from_str(&args.payload).context("--payload is not JSON")?;
    let mut schedule = schedule.job_of(&args.job_type, args.version, &payload)?;
    schedule = schedule.missed_ticks(match args.missed.as_str() {
        "latest_once" => MissedTicks::LatestOnce,
        "all" => MissedTicks::All,
        "skip" => MissedTicks::Skip,
        other => bail!("--missed {other:?}: use latest_once, all or skip"),
    });
    if let Some(start) = &args.start {
        // The definition's own parser checks the time (RFC 3339), as it does when the leader loads it.
        let mut definition: serde_json::Value =
            serde_json::from_str(&conveyor_schedule::to_definition_json(&schedule))?;
        definition["start"] = json!(start);
        schedule = conveyor_schedule::from_definition_json(&args.name, &definition.to_string())
            .with_context(|| format!("--start {start:?} is not an RFC 3339 time"))?;
    }
    if let Some(max) = args.max_runs {
        schedule = schedule.max_runs(max);
    }
    if let Some(secs) = args.skip_while_running {
        schedule = schedule.skip_while_running(std::time::Duration::from_secs(secs));
    }
    let store = TickStore::new(aws.dynamodb_client(), &args.table);
    store
        .put_definition(
            &args.set,
            &schedule.name,
            &conveyor_schedule::to_definition_json(&schedule),
        )
        .await?;
    print_done(
        format,
        json!({ "added": schedule.name, "set": args.set }),
        &format!(
            "schedule {} added to set {}: the leading scheduler picks it up within a third of its lease",
            schedule.name, args.set
        ),
    )
}

async fn trigger(
    name: &str,
    source: &Source,
    queue: &QueueRef,
    aws: &Aws,
    format: Format,
) -> anyhow::Result<()> {
    let store = TickStore::new(aws.dynamodb_client(), &source.table);
    let schedule = find(name, schedules(source, &store).await?)?;
    let client = aws.sqs_client();
    let url = resolve_queue_url(&client, queue).await?;
    let producer = Producer::new(client, url);
    let message_id = conveyor_schedule::trigger(&schedule, &store, &producer).await?;
    if format == Format::Json {
        return print_json(&json!({ "schedule": schedule.name, "message_id": message_id }));
    }
    crate::sayln!(format, "schedule {} triggered: sent {message_id}", schedule.name);
    Ok(())
}
