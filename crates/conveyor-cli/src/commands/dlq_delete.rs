//! `conveyor dlq delete`: dead-lettered messages deleted for good, chosen with the same filter as
//! `dlq peek` and `dlq redrive`.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use conveyor_sqs::admin::{
    MoveOptions, MoveReport, QueueRef, delete_messages, describe, resolve_dead_letter, resolve_queue_url,
};

use crate::commands::dlq::{FilterArgs, dry_run, end_of_scan, print_failures, scan_json, stop_on_ctrl_c};
use crate::errors::UsageError;
use crate::output::{Format, print_json, progress};

/// Arguments of `conveyor dlq delete`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor dlq delete --queue-url $URL --job-type report --dry-run     # what it would delete
  conveyor dlq delete --queue-url $URL --job-type report --yes
  conveyor dlq delete --queue-url $URL --message-id $ID --yes
  conveyor dlq delete --queue-url $URL --all --yes

Deleted messages are gone (they are not sent anywhere). The scan is the redrive loop's: messages that
stay are made visible again when it ends. Ctrl-C stops it after the current batch, says what was deleted
and exits with 130.")]
pub(crate) struct DeleteArgs {
    /// URL (or name) of the source queue (its DLQ is found from its RedrivePolicy) or of the DLQ itself.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Which messages to delete.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Delete every message (instead of a filter).
    #[arg(long, conflicts_with_all = ["job_type", "reason_contains", "message_ids"])]
    pub all: bool,
    /// Confirms the deletion (it cannot be undone).
    #[arg(long)]
    pub yes: bool,
    /// Show what would be deleted, deleting nothing: a peek of at most 1,000 messages with the filter (a
    /// DLQ holding more is only sampled). Like any receive, the peek adds one to each message's
    /// ApproximateReceiveCount.
    #[arg(long, conflicts_with = "yes")]
    pub dry_run: bool,
    /// How long messages that stay in the DLQ remain hidden if the command dies mid-scan.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=43_200))]
    pub hold_secs: u64,
}

/// Runs `conveyor dlq delete`.
pub(crate) async fn run(
    args: &DeleteArgs,
    client: &aws_sdk_sqs::Client,
    format: Format,
) -> anyhow::Result<()> {
    let filter = args.filter.filter();
    if filter.is_empty() && !args.all {
        bail!(UsageError(
            "say which messages to delete: --job-type, --reason-contains or --message-id, or --all for every one"
                .to_owned()
        ));
    }
    let pair = resolve_dead_letter(client, &resolve_queue_url(client, &args.queue_url).await?).await?;
    if args.dry_run {
        return dry_run(client, &pair, &filter, "deleted", format).await;
    }
    if !args.yes {
        bail!(UsageError(format!(
            "deleting from {} cannot be undone: pass --yes to confirm, or --dry-run to see what would be deleted",
            pair.dlq.name()
        )));
    }
    let (stop, watcher) = stop_on_ctrl_c();
    let options = MoveOptions::default()
        .with_filter(filter)
        .with_hold(Duration::from_secs(args.hold_secs))
        .with_stop(Some(stop));
    let mut on_progress = |report: &MoveReport| {
        progress(&format!(
            "examined {}: deleted {}, not matching {}, failed {}",
            report.examined,
            report.moved,
            report.skipped,
            report.failed.len()
        ));
    };
    let result = delete_messages(client, &pair.dlq, &options, &mut on_progress).await;
    watcher.abort();
    let report = result?;
    let remaining = describe(client, &pair.dlq.url).await?.depth;
    if format == Format::Json {
        print_json(&scan_json(pair.dlq.name(), "deleted", &report, &remaining))?;
    } else {
        crate::sayln!(
            format,
            "deleted {} of {} examined messages from {}; {} left there ({} not matching, {} failed){}",
            report.moved,
            report.examined,
            pair.dlq.name(),
            remaining.visible + remaining.in_flight,
            report.skipped,
            report.failed.len(),
            if report.stopped { "; stopped by Ctrl-C" } else { "" }
        );
        print_failures(&report, format);
    }
    end_of_scan(&report, "deleted", "deleting")
}
