//! `conveyor outbox`: run the outbox relay from the table's stream, and count the outbox's backlog.

use std::time::{Duration, Instant, SystemTime};

use clap::{Args, Subcommand};
use conveyor_core::runtime::epoch_millis;
use conveyor_outbox::{OutboxTable, ProgressSnapshot, Relay, StreamRelay, StreamRelayOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::aws::Aws;
use crate::output::{Format, print_json};

/// Arguments of `conveyor outbox`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor outbox relay --table orders                      # until Ctrl-C, a progress line every 5 s
  conveyor outbox relay --table orders --exit-when-idle     # drain the backlog, then exit
  conveyor outbox backlog --table orders                    # outbox items not yet removed

The relay reads the table's DynamoDB stream, sends each outbox item's job to its queue and deletes the
item. One relay reads a stream at a time (a lease in the state table); others stand by.")]
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
    /// The table's sort key attribute ("" for a table without one).
    #[arg(long, global = true, env = "CONVEYOR_OUTBOX_SORT_KEY", default_value = "sk")]
    pub sort_key: String,
    /// What to do.
    #[command(subcommand)]
    pub command: OutboxCommand,
}

/// The `outbox` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Relay outbox items from the table's stream to SQS, printing progress.
    Relay(RelayArgs),
    /// Count the outbox items still in the table (a Scan: reads the whole table) and the oldest one's age.
    Backlog,
}

/// Arguments of `conveyor outbox relay`.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The table holding the relay's lease and checkpoints (partition key `id`).
    #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
    pub state_table: String,
    /// Exit once a pass over the stream reads nothing (a backlog drained).
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Seconds between progress lines.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub progress_every: u64,
    /// Seconds a lease lasts without renewal (a standby relay takes over within this).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub lease_seconds: u64,
}

/// Runs `conveyor outbox`.
pub(crate) async fn run(args: &OutboxArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let Some(name) = args.table.clone() else {
        anyhow::bail!("no outbox table: pass --table NAME or set CONVEYOR_OUTBOX_TABLE");
    };
    let table = OutboxTable::new(name)
        .partition_key(&args.partition_key)
        .sort_key(Some(args.sort_key.as_str()).filter(|key| !key.is_empty()));
    match &args.command {
        OutboxCommand::Relay(relay) => run_relay(relay, table, aws, format).await,
        OutboxCommand::Backlog => backlog(&table, aws, format).await,
    }
}

async fn run_relay(args: &RelayArgs, table: OutboxTable, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let mut options = StreamRelayOptions::new(&args.state_table);
    options.exit_when_idle = args.exit_when_idle;
    options.lease = Duration::from_secs(args.lease_seconds.max(3));
    options.progress_interval = Duration::from_secs(args.progress_every.max(1));
    let relay = StreamRelay::new(
        Relay::new(aws.sqs_client(), aws.dynamodb_client(), table),
        aws.streams_client(),
        aws.dynamodb_client(),
        options,
    );
    let progress = relay.progress();
    let stop = CancellationToken::new();
    let every = Duration::from_secs(args.progress_every.max(1));
    let started = Instant::now();
    let mut run = tokio::spawn(relay.run(stop.clone()));
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    let mut last = ProgressSnapshot::default();
    let result = loop {
        tokio::select! {
            result = &mut run => break result,
            _ = tokio::signal::ctrl_c() => stop.cancel(),
            _ = ticker.tick() => {
                let now = progress.snapshot();
                if format == Format::Text {
                    crate::outln!(
                        "{} relayed {} ({:.0}/s), lag {:.1}s, failures {}, delete failures {}, AWS requests {}",
                        if now.leader { "reading:" } else { "standby:" },
                        now.relayed,
                        (now.relayed - last.relayed) as f64 / every.as_secs_f64(),
                        now.lag_millis as f64 / 1000.0,
                        now.failures,
                        now.delete_failures,
                        now.requests,
                    );
                }
                last = now;
            }
        }
    };
    result??;
    let end = progress.snapshot();
    let seconds = started.elapsed().as_secs_f64();
    if format == Format::Json {
        return print_json(&json!({
            "relayed": end.relayed,
            "ignored": end.ignored,
            "unreadable": end.unreadable,
            "failures": end.failures,
            "delete_failures": end.delete_failures,
            "requests": end.requests,
            "seconds": seconds,
        }));
    }
    crate::outln!(
        "relayed {} jobs in {:.1}s ({:.0}/s), {} AWS requests ({:.2} per job), {} records ignored, {} unreadable",
        end.relayed,
        seconds,
        end.relayed as f64 / seconds.max(0.001),
        end.requests,
        end.requests as f64 / end.relayed.max(1) as f64,
        end.ignored,
        end.unreadable,
    );
    Ok(())
}

async fn backlog(table: &OutboxTable, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let client = aws.dynamodb_client();
    let mut count = 0u64;
    let mut oldest: Option<u64> = None;
    let mut start = None;
    loop {
        let output = client
            .scan()
            .table_name(&table.name)
            .filter_expression("attribute_exists(#version)")
            .projection_expression("#created")
            .expression_attribute_names("#version", conveyor_outbox::table::VERSION)
            .expression_attribute_names("#created", conveyor_outbox::table::CREATED_AT)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|error| {
                anyhow::anyhow!(
                    "scanning {}: {}",
                    table.name,
                    aws_sdk_dynamodb::error::DisplayErrorContext(&error)
                )
            })?;
        for item in output.items() {
            count += 1;
            let created = item
                .get(conveyor_outbox::table::CREATED_AT)
                .and_then(|value| value.as_n().ok())
                .and_then(|text| text.parse::<u64>().ok());
            if let Some(created) = created {
                oldest = Some(oldest.map_or(created, |old| old.min(created)));
            }
        }
        start = output.last_evaluated_key;
        if start.is_none() {
            break;
        }
    }
    let age = oldest.map(|created| epoch_millis(SystemTime::now()).saturating_sub(created) / 1000);
    if format == Format::Json {
        return print_json(&json!({ "table": table.name, "items": count, "oldest_age_seconds": age }));
    }
    match age {
        Some(age) => crate::outln!(
            "{count} outbox items in {}, the oldest written {age}s ago",
            table.name
        ),
        None => crate::outln!("no outbox items in {}", table.name),
    }
    Ok(())
}
