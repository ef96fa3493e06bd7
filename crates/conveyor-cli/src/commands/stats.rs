//! `conveyor stats`: depth of a queue and of its DLQ.

use clap::Args;
use conveyor_sqs::admin::{OldestAge, QueueRef, QueueStats, resolve_queue_url, stats};
use serde_json::{Value, json};

use crate::output::{Format, Table, format_age, print_json};

/// Arguments of `conveyor stats`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  conveyor stats --queue-url $URL
  conveyor stats --queue-url $URL --peek-age --output json

The age of the oldest message is a CloudWatch metric (ApproximateAgeOfOldestMessage), not a queue
attribute, so it shows as n/a. --peek-age estimates it instead from the SentTimestamp of up to 100
peeked messages: a lower bound on standard queues, and each peek counts as a receive of the peeked
messages (on a queue with a low maxReceiveCount that can move them to the DLQ sooner).")]
pub(crate) struct StatsArgs {
    /// URL (or name) of the queue (its DLQ is found from its RedrivePolicy).
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Estimate the oldest message's age by peeking (see below).
    #[arg(long)]
    pub peek_age: bool,
}

/// Runs `conveyor stats`.
pub(crate) async fn run(args: &StatsArgs, client: aws_sdk_sqs::Client, format: Format) -> anyhow::Result<()> {
    let url = resolve_queue_url(&client, &args.queue_url).await?;
    let stats = stats(&client, &url, args.peek_age).await?;
    let max_receive_count = stats
        .queue
        .queue
        .redrive
        .as_ref()
        .and_then(|policy| policy.max_receive_count);
    if format == Format::Json {
        return print_json(&json!({
            "queue": queue_json(&stats.queue),
            "max_receive_count": max_receive_count,
            "dead_letter_queue": stats.dead_letter.as_ref().map(queue_json),
            "dead_letter_queue_of": stats.dead_letter_of,
        }));
    }
    let mut table = Table::new(&["QUEUE", "VISIBLE", "IN FLIGHT", "DELAYED", "OLDEST MESSAGE"]);
    table.row(row(&stats.queue, ""));
    if let Some(dlq) = &stats.dead_letter {
        table.row(row(dlq, " (DLQ)"));
    }
    table.print(format);
    match (&stats.queue.queue.redrive, max_receive_count) {
        (Some(_), Some(count)) => {
            crate::sayln!(
                format,
                "messages move to the DLQ after {count} receives (maxReceiveCount)"
            )
        }
        (Some(_), None) => crate::sayln!(format, "the redrive policy gives no readable maxReceiveCount"),
        (None, _) if !stats.dead_letter_of.is_empty() => {
            let sources: Vec<&str> = stats
                .dead_letter_of
                .iter()
                .map(|url| url.trim_end_matches('/').rsplit('/').next().unwrap_or(url))
                .collect();
            crate::sayln!(
                format,
                "{} is the DLQ of {}",
                stats.queue.queue.name(),
                sources.join(", ")
            );
        }
        (None, _) => crate::sayln!(
            format,
            "{} has no redrive policy, so no DLQ",
            stats.queue.queue.name()
        ),
    }
    Ok(())
}

fn row(stats: &QueueStats, suffix: &str) -> Vec<String> {
    let depth = stats.queue.depth;
    vec![
        format!("{}{suffix}", stats.queue.name()),
        depth.visible.to_string(),
        depth.in_flight.to_string(),
        depth.delayed.to_string(),
        age_text(stats.oldest),
    ]
}

fn age_text(oldest: OldestAge) -> String {
    match oldest {
        OldestAge::Unavailable => "n/a (CloudWatch metric)".to_owned(),
        OldestAge::Empty => "- (no visible message)".to_owned(),
        OldestAge::AtLeast { age, peeked } => format!(">= {} (peek of {peeked})", format_age(age)),
    }
}

fn queue_json(stats: &QueueStats) -> Value {
    let depth = stats.queue.depth;
    let (age_secs, age_source, peeked) = match stats.oldest {
        OldestAge::Unavailable => (
            None,
            "unavailable (CloudWatch metric ApproximateAgeOfOldestMessage)",
            None,
        ),
        OldestAge::Empty => (None, "peek", Some(0)),
        OldestAge::AtLeast { age, peeked } => (Some(age.as_secs()), "peek", Some(peeked)),
    };
    json!({
        "name": stats.queue.name(),
        "url": stats.queue.url,
        "arn": stats.queue.arn.arn,
        "fifo": stats.queue.fifo,
        "visible": depth.visible,
        "in_flight": depth.in_flight,
        "delayed": depth.delayed,
        "oldest_message_age_secs": age_secs,
        "oldest_message_age_source": age_source,
        "peeked": peeked,
    })
}
