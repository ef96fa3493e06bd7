//! `conveyor purge`: delete every message of a queue, guarded by an explicit flag.

use clap::Args;
use conveyor_sqs::admin::{QueueRef, describe, purge, resolve_queue_url};
use serde_json::json;

use crate::errors::UsageError;
use crate::output::{Format, print_json};

/// Arguments of `conveyor purge`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  conveyor purge --queue-url $URL --yes-i-really-mean-it

PurgeQueue deletes every message, visible, in flight and delayed, within 60 seconds; it cannot be
undone, and SQS allows one purge per queue every 60 seconds. It purges only the queue given, not its DLQ.")]
pub(crate) struct PurgeArgs {
    /// URL (or name) of the queue to empty.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Confirms that every message of the queue should be deleted.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

/// Runs `conveyor purge`.
pub(crate) async fn run(args: &PurgeArgs, client: aws_sdk_sqs::Client, format: Format) -> anyhow::Result<()> {
    if !args.yes_i_really_mean_it {
        return Err(UsageError(format!(
            "refusing to purge {}: purging deletes every message in the queue and cannot be undone; run again \
             with --yes-i-really-mean-it to confirm",
            args.queue_url
        ))
        .into());
    }
    let url = resolve_queue_url(&client, &args.queue_url).await?;
    let queue = describe(&client, &url).await?;
    purge(&client, &url).await?;
    let depth = queue.depth;
    if format == Format::Json {
        return print_json(&json!({
            "purged": queue.name(),
            "url": queue.url,
            "before": { "visible": depth.visible, "in_flight": depth.in_flight, "delayed": depth.delayed },
        }));
    }
    crate::sayln!(
        format,
        "purged {}: about {} messages deleted ({} visible, {} in flight, {} delayed); SQS finishes within 60 seconds",
        queue.name(),
        depth.visible + depth.in_flight + depth.delayed,
        depth.visible,
        depth.in_flight,
        depth.delayed
    );
    Ok(())
}
