//! `conveyor delays`: the jobs kept in the timer table (`conveyor send --timers`, `Producer::with_timers`):
//! list them, run one now, move its due time, cancel it, or relay the due ones once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use clap::{Args, Subcommand};
use conveyor_core::port::not_waiting;
use conveyor_core::port::{OVERDUE_AFTER, OVERDUE_HINT, RelayMark, Timer, TimerStore};
use conveyor_core::{TimerChange, Timers};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsSender;
use conveyor_sqs::admin::{QueueRef, resolve_queue_url};

use crate::aws::Aws;
use crate::errors::UsageError;
use crate::output::{Format, Table, format_age, format_time, print_json};

/// How far ahead `delays relay` sends (the rest of the wait travels as `DelaySeconds`).
const RELAY_LOOKAHEAD: Duration = Duration::from_secs(60);
/// The furthest `reschedule --in-secs` moves a job: SQS's longest retention, as a producer's delay.
const MAX_IN_SECS: u64 = conveyor_core::runtime::MAX_TOTAL_DELAY.as_secs();

/// `now` plus `in_secs` (checked: a due time the clock cannot hold is a usage error naming the flag).
pub(crate) fn due_in(now: SystemTime, in_secs: u64) -> Result<SystemTime, UsageError> {
    now.checked_add(Duration::from_secs(in_secs))
        .filter(|_| in_secs <= MAX_IN_SECS)
        .ok_or_else(|| {
            UsageError(format!(
                "--in-secs {in_secs}: at most {MAX_IN_SECS} seconds (14 days)"
            ))
        })
}

/// Arguments of `conveyor delays`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor send --queue-url jobs --job-type report --payload '{}' --delay-secs 86400 --timers
  conveyor delays --queue-url jobs list
  conveyor delays --queue-url jobs run 3f2a...            # sends it now
  conveyor delays --queue-url jobs reschedule 3f2a... --in-secs 600
  conveyor delays --queue-url jobs cancel 3f2a...
  conveyor delays --queue-url jobs relay                  # sends what is due, as a worker's relay does

`list` marks OVERDUE each job due more than 2 minutes ago that no relay has claimed: the consumers'
relay sends timer-table jobs only when their pipeline has timers on (conveyor::Pipeline::with_timers,
or timer_relay = true for a Lambda consumer). It also says when a relay was last seen for the queue.

Jobs delayed by hops (sent without --timers) travel inside the queue and are not listed here; cancel
those by key (Producer::cancel).")]
pub(crate) struct DelaysArgs {
    /// URL (or name) of the queue the jobs go to.
    #[arg(long, global = true, value_name = "URL")]
    pub queue_url: Option<QueueRef>,
    /// The idempotency table that holds the timers.
    #[arg(long, global = true, env = "CONVEYOR_IDEMPOTENCY_TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
    pub table: String,
    /// What to do.
    #[command(subcommand)]
    pub command: DelaysCommand,
}

/// The `delays` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DelaysCommand {
    /// List the queue's delayed jobs, soonest first; those overdue (no relay sends them) are marked.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Send a delayed job now.
    Run {
        /// The timer's id (from `send --timers` or `list`).
        id: String,
    },
    /// Move a delayed job's due time.
    Reschedule {
        /// The timer's id.
        id: String,
        /// The new due time, in seconds from now (at most 1209600 = 14 days, SQS's longest retention).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=MAX_IN_SECS))]
        in_secs: u64,
    },
    /// Cancel a delayed job: it is never sent.
    Cancel {
        /// The timer's id.
        id: String,
    },
    /// Send the jobs due within a minute once, as every worker's timer relay does.
    Relay,
}

/// Runs `conveyor delays`.
pub(crate) async fn run(args: &DelaysArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let Some(queue) = &args.queue_url else {
        bail!("which queue? pass --queue-url URL (or the queue's name)");
    };
    let client = aws.sqs_client();
    let url = resolve_queue_url(&client, queue).await?;
    let store: Arc<dyn TimerStore> = Arc::new(DynamoStore::new(aws.dynamodb_client(), &args.table));
    let timers = Timers::new(store, Arc::new(SqsSender::new(client)), url.as_str());
    match &args.command {
        DelaysCommand::List { limit } => list(&timers, *limit, &url, &args.table, format).await,
        DelaysCommand::Run { id } => match timers.run_now(id).await? {
            Some(message_id) => report(format, id, "sent", Some(&message_id)),
            None => bail!(
                "{}, or a relay is sending it (see `conveyor delays list`)",
                not_waiting(id)
            ),
        },
        DelaysCommand::Reschedule { id, in_secs } => {
            let due = due_in(SystemTime::now(), *in_secs)?;
            answer(format, id, timers.reschedule(id, due).await?, "rescheduled")
        }
        DelaysCommand::Cancel { id } => answer(format, id, timers.cancel(id).await?, "cancelled"),
        DelaysCommand::Relay => {
            let relayed = timers.relay(RELAY_LOOKAHEAD).await?;
            if format == Format::Json {
                return print_json(&serde_json::json!({
                    "sent": relayed.sent, "failed": relayed.failed, "skipped": relayed.skipped,
                }));
            }
            crate::sayln!(
                format,
                "sent {} due job(s); {} failed (kept for the next pass); {} held by another relay",
                relayed.sent,
                relayed.failed,
                relayed.skipped
            );
            Ok(())
        }
    }
}

/// `delays list`: the timers, each overdue one marked, then what that means and when a relay was
/// last seen (on stderr with `--output json`, whose timers carry `"overdue": true`).
async fn list(timers: &Timers, limit: usize, url: &str, table: &str, format: Format) -> anyhow::Result<()> {
    let listed = timers.list(limit).await?;
    let now = SystemTime::now();
    let overdue = listed.iter().filter(|timer| timer.is_overdue(now)).count();
    if format == Format::Json {
        print_json(&serde_json::Value::Array(
            listed.iter().map(|timer| timer_json(timer, now)).collect(),
        ))?;
    } else if listed.is_empty() {
        crate::sayln!(format, "no delayed jobs for {url} in table {table}");
    } else {
        list_table(&listed, now).print(format);
    }
    let say = |line: &str| crate::sayln!(format, "{line}");
    if overdue > 0 {
        say(&overdue_line(overdue));
    }
    if listed.is_empty() {
        return Ok(());
    }
    if let Some(relay) = relay_line(timers, now).await {
        say(&relay);
    }
    Ok(())
}

/// The hint under a listing with `count` overdue jobs.
fn overdue_line(count: usize) -> String {
    format!(
        "{count} OVERDUE (due over {} s ago, unsent): {OVERDUE_HINT}",
        OVERDUE_AFTER.as_secs()
    )
}

/// When a relay was last seen for the queue, when the store keeps marks (`None` otherwise, or when
/// the mark cannot be read).
async fn relay_line(timers: &Timers, now: SystemTime) -> Option<String> {
    if !timers.keeps_relay_marks() {
        return None;
    }
    match timers.relay_mark().await {
        Ok(mark) => Some(describe_relay(mark, now)),
        Err(error) => Some(format!("relay: its mark cannot be read: {error}")),
    }
}

/// A relay mark in an operator's words.
fn describe_relay(mark: Option<RelayMark>, now: SystemTime) -> String {
    match mark {
        Some(mark) if mark.is_fresh(now) => {
            format!("relay: seen at {}", format_time(mark.seen))
        }
        Some(mark) => format!(
            "relay: NOT SEEN since {}: no relay runs for this queue",
            format_time(mark.seen)
        ),
        None => "relay: NEVER SEEN for this queue: no relay has run for it".to_owned(),
    }
}

/// Prints a change's answer; an error when nothing was changed.
fn answer(format: Format, id: &str, change: TimerChange, done: &str) -> anyhow::Result<()> {
    match change.describe(id, done) {
        Ok(_) => report(format, id, done, None),
        Err(problem) => bail!("{problem}"),
    }
}

fn report(format: Format, id: &str, what: &str, message_id: Option<&str>) -> anyhow::Result<()> {
    if format == Format::Json {
        return print_json(&serde_json::json!({ "id": id, "result": what, "message_id": message_id }));
    }
    match message_id {
        Some(message_id) => crate::sayln!(format, "{what} delayed job {id} as message {message_id}"),
        None => crate::sayln!(format, "{what} delayed job {id}"),
    }
    Ok(())
}

fn timer_json(timer: &Timer, now: SystemTime) -> serde_json::Value {
    let millis = conveyor_core::port::to_epoch_millis;
    serde_json::json!({
        "overdue": timer.is_overdue(now),
        "id": timer.id,
        "job_type": timer.job_type,
        "due_ms": millis(timer.due),
        "created_ms": millis(timer.created),
        "claimed_until_ms": timer.claimed_until.map(millis),
    })
}

fn list_table(timers: &[Timer], now: SystemTime) -> Table {
    let mut table = Table::new(&["ID", "JOB TYPE", "DUE", "IN", "STATE", "CREATED"]);
    for timer in timers {
        let wait = timer
            .due
            .duration_since(now)
            .map_or_else(|_| "due".to_owned(), format_age);
        table.row(vec![
            timer.id.clone(),
            timer.job_type.clone(),
            format_time(timer.due),
            wait,
            state(timer, now),
            format_time(timer.created),
        ]);
    }
    table
}

/// The STATE column: the timer's state, marked when it is overdue.
fn state(timer: &Timer, now: SystemTime) -> String {
    let described = timer.describe_state(now);
    if timer.is_overdue(now) {
        return format!("OVERDUE: {described}, no relay sent it");
    }
    described
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_says_when_each_is_due_and_whether_a_relay_holds_it() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let timer = |due_in: u64, claimed: Option<i64>| Timer {
            id: format!("t{due_in}"),
            queue_url: "q".to_owned(),
            due: now + Duration::from_secs(due_in),
            job_type: "report".to_owned(),
            created: now,
            claimed_until: claimed.map(|secs| {
                if secs >= 0 {
                    now + Duration::from_secs(secs.unsigned_abs())
                } else {
                    now - Duration::from_secs(secs.unsigned_abs())
                }
            }),
        };
        let rendered =
            list_table(&[timer(7200, None), timer(0, Some(120)), timer(0, Some(-5))], now).render();
        assert!(rendered.contains("2h 0m"), "{rendered}");
        assert!(rendered.contains("sending (claimed until"), "{rendered}");
        assert!(rendered.contains("claim lapsed"), "{rendered}");
        assert!(rendered.contains("delayed"), "{rendered}");
        assert!(
            !rendered.contains("OVERDUE"),
            "due now, or claimed: not overdue: {rendered}"
        );
        let late = Timer {
            due: now - OVERDUE_AFTER - Duration::from_secs(1),
            ..timer(0, None)
        };
        let rendered = list_table(&[late], now).render();
        assert!(rendered.contains("OVERDUE: delayed"), "{rendered}");
        assert!(overdue_line(1).contains("conveyor::Pipeline::with_timers"));
    }
}
