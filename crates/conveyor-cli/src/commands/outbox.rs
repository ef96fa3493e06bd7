//! `conveyor outbox`: run the polling relay, show the backlog (its age, pending aggregates, parked jobs),
//! and resend a parked aggregate.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::{Args, Subcommand};
use conveyor_core::runtime::epoch_millis;
use conveyor_outbox::{
    DynamoOutboxStore, OutboxStore, OutboxTable, Poller, PollerOptions, ProgressSnapshot, Relay, SqsSink,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::aws::Aws;
use crate::output::{Format, print_json};

/// Arguments of `conveyor outbox`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor outbox relay --table orders                      # until Ctrl-C, a progress line every 5 s
  conveyor outbox relay --table orders --exit-when-idle     # drain the backlog, then exit
  conveyor outbox backlog --table orders                    # the oldest unsent job's age, parked jobs
  conveyor outbox resend --table orders --aggregate order:42  # after fixing why its job was parked
  conveyor outbox resend --table orders --queue emails        # every aggregate parked on that queue

The relay sends each aggregate's jobs from the table in commit order and removes them once SQS took
them. One relay sends at a time (a lease in the outbox table); others stand by and take over.")]
pub(crate) struct OutboxArgs {
    /// The outbox table (the application's own table, or a table of its own).
    #[arg(long, global = true, env = "CONVEYOR_OUTBOX_TABLE")]
    pub table: Option<String>,
    /// The table's partition key attribute.
    #[arg(
        long,
        global = true,
        env = "CONVEYOR_OUTBOX_PARTITION_KEY",
        default_value = "pk"
    )]
    pub partition_key: String,
    /// The table's sort key attribute.
    #[arg(long, global = true, env = "CONVEYOR_OUTBOX_SORT_KEY", default_value = "sk")]
    pub sort_key: String,
    /// An outbox in Postgres instead of DynamoDB: the database's URL (its `conveyor_outbox` tables,
    /// migrations/postgres/0001_outbox.sql).
    #[arg(long, global = true, env = "CONVEYOR_OUTBOX_POSTGRES_URL", value_name = "URL")]
    pub postgres_url: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: OutboxCommand,
}

/// The `outbox` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Relay the outbox's jobs to SQS, printing progress.
    Relay(RelayArgs),
    /// The backlog: the oldest unsent job's age, the aggregates waiting, the parked jobs and why.
    Backlog(BacklogArgs),
    /// Unpark an aggregate's parked jobs so the relay sends them again (after fixing the cause).
    Resend(ResendArgs),
}

/// Arguments of `conveyor outbox relay`.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Exit once a pass finds nothing to send (a backlog drained).
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Seconds between progress lines.
    #[arg(long, alias = "progress-every", value_name = "SECONDS", default_value_t = 5)]
    pub progress_every_secs: u64,
    /// Seconds a lease lasts without renewal (a standby relay takes over within this).
    #[arg(long, alias = "lease-seconds", value_name = "SECONDS", default_value_t = 30)]
    pub lease_secs: u64,
}

/// Arguments of `conveyor outbox backlog`.
#[derive(Debug, Args)]
pub(crate) struct BacklogArgs {
    /// At most this many aggregates and parked jobs listed.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// Arguments of `conveyor outbox resend`: one of `--aggregate`, `--queue`, `--all`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["aggregate", "queue", "all"])))]
pub(crate) struct ResendArgs {
    /// The aggregate whose parked jobs go again (as `conveyor outbox backlog` lists it).
    #[arg(long)]
    pub aggregate: Option<String>,
    /// Every aggregate parked on this queue (its URL or name), e.g. after the queue was created again.
    #[arg(long)]
    pub queue: Option<String>,
    /// Every parked aggregate.
    #[arg(long)]
    pub all: bool,
}

impl ResendArgs {
    fn parked(&self) -> conveyor_outbox::Parked {
        if let Some(aggregate) = &self.aggregate {
            return conveyor_outbox::Parked::Aggregate(aggregate.clone());
        }
        if let Some(queue) = &self.queue {
            return conveyor_outbox::Parked::Queue(queue.clone());
        }
        conveyor_outbox::Parked::All
    }
}

/// Runs `conveyor outbox`.
pub(crate) async fn run(args: &OutboxArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let store = store(args, aws)?;
    match &args.command {
        OutboxCommand::Relay(relay) => run_relay(relay, store, aws, format).await,
        OutboxCommand::Backlog(backlog_args) => backlog(&*store, backlog_args.limit, format).await,
        OutboxCommand::Resend(resend) => {
            let resent = conveyor_outbox::resend(&*store, &resend.parked()).await?;
            if format == Format::Json {
                return print_json(&json!({
                    "aggregate": resend.aggregate,
                    "queue": resend.queue,
                    "aggregates": resent.aggregates,
                    "unparked": resent.jobs,
                }));
            }
            crate::sayln!(
                format,
                "{} parked jobs of {} aggregates unparked: the relay sends them next, each aggregate in order",
                resent.jobs,
                resent.aggregates.len()
            );
            Ok(())
        }
    }
}

/// The outbox store the arguments name: Postgres with `--postgres-url`, else the DynamoDB table.
fn store(args: &OutboxArgs, aws: &Aws) -> anyhow::Result<Arc<dyn OutboxStore>> {
    if let Some(url) = args.postgres_url.as_deref().filter(|url| !url.is_empty()) {
        return Ok(conveyor_outbox::postgres_store(url)?);
    }
    let Some(name) = args.table.clone() else {
        anyhow::bail!(
            "no outbox: pass --table NAME (or set CONVEYOR_OUTBOX_TABLE) for DynamoDB, or --postgres-url URL \
             (CONVEYOR_OUTBOX_POSTGRES_URL) for Postgres"
        );
    };
    if args.sort_key.is_empty() {
        anyhow::bail!(
            "the outbox table needs a sort key (jobs are keyed by aggregate and sequence): pass --sort-key NAME \
             or leave CONVEYOR_OUTBOX_SORT_KEY unset for `sk`"
        );
    }
    let table = OutboxTable::new(name)
        .partition_key(&args.partition_key)
        .sort_key(&args.sort_key);
    Ok(Arc::new(DynamoOutboxStore::new(aws.dynamodb_client(), table)))
}

async fn run_relay(
    args: &RelayArgs,
    store: Arc<dyn OutboxStore>,
    aws: &Aws,
    format: Format,
) -> anyhow::Result<()> {
    let mut options = PollerOptions::default();
    options.exit_when_idle = args.exit_when_idle;
    options.lease = Duration::from_secs(args.lease_secs.max(3));
    let relay = Relay::new(store, Arc::new(SqsSink::new(aws.sqs_client())));
    let owner = format!("cli-{}", uuid::Uuid::new_v4());
    let poller = Poller::new(relay, &owner, options);
    let progress = poller.progress();
    let stop = CancellationToken::new();
    let every = Duration::from_secs(args.progress_every_secs.max(1));
    let started = Instant::now();
    let mut run = tokio::spawn(poller.run(stop.clone()));
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    let mut last = ProgressSnapshot::default();
    loop {
        tokio::select! {
            result = &mut run => { result?; break; }
            _ = tokio::signal::ctrl_c() => stop.cancel(),
            _ = ticker.tick() => {
                let now = progress.snapshot();
                if format != Format::Json {
                    crate::sayln!(format,
                        "{} sent {} ({:.0}/s), failed sends {}, parked {}, raced {}",
                        if now.leader { "relaying:" } else { "standby:" },
                        now.sent,
                        (now.sent - last.sent) as f64 / every.as_secs_f64(),
                        now.failed,
                        now.parked,
                        now.raced,
                    );
                }
                last = now;
            }
        }
    }
    let end = progress.snapshot();
    let seconds = started.elapsed().as_secs_f64();
    if format == Format::Json {
        return print_json(&json!({
            "sent": end.sent,
            "failed": end.failed,
            "parked": end.parked,
            "raced": end.raced,
            "seconds": seconds,
        }));
    }
    crate::sayln!(
        format,
        "sent {} jobs in {:.1}s ({:.0}/s), {} failed sends, {} parked",
        end.sent,
        seconds,
        end.sent as f64 / seconds.max(0.001),
        end.failed,
        end.parked,
    );
    Ok(())
}

async fn backlog(store: &dyn OutboxStore, limit: usize, format: Format) -> anyhow::Result<()> {
    let backlog = store.backlog(limit).await?;
    let now = epoch_millis(SystemTime::now());
    let age = backlog
        .oldest_pending_millis
        .map(|created| now.saturating_sub(created) / 1000);
    if format == Format::Json {
        let parked: Vec<_> = backlog
            .parked
            .iter()
            .map(|job| {
                json!({
                    "aggregate": job.aggregate,
                    "sequence": job.sequence,
                    "id": job.id,
                    "job_type": job.job_type,
                    "queue_url": job.queue_url,
                    "attempts": job.attempts,
                    "last_error": job.last_error,
                    "parked_at_millis": job.parked_at_millis,
                })
            })
            .collect();
        return print_json(&json!({
            "store": store.name(),
            "oldest_unsent_age_seconds": age,
            "pending_aggregates": backlog.pending_aggregates,
            "parked": parked,
        }));
    }
    match age {
        Some(age) => crate::sayln!(
            format,
            "the oldest unsent job in {} was committed {age}s ago; {} aggregates waiting{}",
            store.name(),
            backlog.pending_aggregates.len(),
            if backlog.pending_aggregates.len() >= limit {
                " (or more)"
            } else {
                ""
            }
        ),
        None => crate::sayln!(format, "no unsent jobs waiting in {}", store.name()),
    }
    if backlog.parked.is_empty() {
        crate::sayln!(format, "no parked jobs");
        return Ok(());
    }
    crate::sayln!(
        format,
        "{} parked jobs (their aggregates' later jobs wait behind them; fix the cause, then \
         `conveyor outbox resend --aggregate <aggregate>`, or `--queue <queue>` for all parked on a queue):",
        backlog.parked.len()
    );
    for job in &backlog.parked {
        crate::sayln!(
            format,
            "  {} #{} {} to {} after {} attempts: {}",
            crate::output::sanitize(&job.aggregate),
            job.sequence,
            crate::output::sanitize(&job.job_type),
            crate::output::sanitize(&job.queue_url),
            job.attempts,
            crate::output::sanitize(job.last_error.as_deref().unwrap_or("-")),
        );
    }
    Ok(())
}
