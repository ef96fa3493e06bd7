//! `conveyor dlq peek|redrive|delete|tasks`: look at dead-lettered messages, move them back or delete
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use conveyor_core::port::QueueDepth;
use conveyor_sqs::admin::{
    AdminError, DeadLetterPair, Destinations, MoveFilter, MoveOptions, MoveReport, MoveTaskHandle,
    MoveTaskStatus, PeekOptions, QueueInfo, QueueRef, Received, cancel_move_task, describe, list_move_tasks,
    move_messages, peek, resolve_dead_letter, resolve_queue_url, start_move_task, wait_for_move_task,
};
use serde_json::{Value, json};

use crate::aws::Aws;
use crate::commands::payloads::Fetched;
use crate::output::{Format, Table, format_epoch_millis, format_time, print_done, print_json, progress};

/// How often `--wait` reads a move task's progress.
const TASK_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Arguments of `conveyor dlq`.
#[derive(Debug, Args)]
pub(crate) struct DlqArgs {
    /// What to do with the dead-letter queue.
    #[command(subcommand)]
    pub command: DlqCommand,
}

/// The `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Show dead-lettered messages with their failure reason, without consuming them.
    Peek(PeekArgs),
    /// Move dead-lettered messages back to their source queue (all, or only matching ones).
    Redrive(RedriveArgs),
    /// Delete dead-lettered messages for good (matching ones, or --all).
    Delete(crate::commands::dlq_delete::DeleteArgs),
    /// List the DLQ's recent message move tasks (started by `dlq redrive`) and their progress.
    Tasks(TasksArgs),
}

/// Which dead-lettered messages a command looks at: the same flags for `peek`, `redrive` and `delete`, so
/// a peek previews exactly what the other two would touch.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only messages of this job type (the conveyor.type attribute).
    #[arg(long, value_name = "TYPE")]
    pub job_type: Option<String>,
    /// Only messages whose recorded failure reason contains TEXT (ignoring case).
    #[arg(long, value_name = "TEXT")]
    pub reason_contains: Option<String>,
    /// Only the message with this DLQ message id (as `dlq peek` shows it); repeat for more.
    #[arg(long = "message-id", value_name = "ID")]
    pub message_ids: Vec<String>,
}

impl FilterArgs {
    /// The filter these flags select (empty: every message).
    pub(crate) fn filter(&self) -> MoveFilter {
        MoveFilter::default()
            .with_job_type(self.job_type.clone())
            .with_reason_contains(self.reason_contains.clone())
            .with_message_ids(
                (!self.message_ids.is_empty()).then(|| self.message_ids.iter().cloned().collect()),
            )
    }
}

/// The most messages a dry run looks at.
const DRY_RUN_MAX: usize = 1000;

/// Arguments of `conveyor dlq peek`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  conveyor dlq peek --queue-url $URL --limit 20
  conveyor dlq peek --queue-url $URL --limit 100 --job-type webhook --reason-contains 503

Messages are received with a short visibility timeout and made visible again at once, so they stay in
the DLQ (each peek adds one to their ApproximateReceiveCount). Bodies are not printed unless
--show-body is given: they may carry personal data. A large payload (an SQS Extended Client pointer) shows
as `pointer → s3://bucket/key (N bytes)`; --fetch-payloads reads the object from S3 so --show-body prints
the payload itself (needs s3:GetObject; AWS_ENDPOINT_URL_S3 for LocalStack). The object stays.")]
pub(crate) struct PeekArgs {
    /// URL (or name) of the source queue (its DLQ is found from its RedrivePolicy) or of the DLQ itself.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// The most messages to look at (those matching the filter are shown).
    #[arg(long, alias = "max", value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,
    /// Which messages to show.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print message bodies too (they may carry personal data).
    #[arg(long)]
    pub show_body: bool,
    /// With --show-body, fetch large payloads from S3 and print them instead of their pointers (only
    /// those in a --payload-bucket; any other pointer is printed as a pointer and not read).
    #[arg(long, requires = "show_body")]
    pub fetch_payloads: bool,
    /// A bucket --fetch-payloads reads from (the workers' payload bucket); repeat for more. A message
    /// cannot make the CLI read an object from any other bucket with your credentials.
    #[arg(long = "payload-bucket", value_name = "BUCKET", env = conveyor_s3::BUCKET_ENV)]
    pub payload_buckets: Vec<String>,
    /// The most bytes of one payload --fetch-payloads reads (the read stops there).
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=1024 * 1024 * 1024))]
    pub max_payload_bytes: u64,
    /// How long peeked messages stay hidden if the command dies before making them visible again.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=43_200))]
    pub hold_secs: u64,
}

/// How `dlq redrive` moves messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Method {
    /// A move task when there is no filter and one destination; the loop otherwise, or when the endpoint
    /// lacks StartMessageMoveTask.
    #[default]
    Auto,
    /// Always SQS's StartMessageMoveTask (no filters).
    Task,
    /// Always the receive / send / delete loop.
    Loop,
}

/// Arguments of `conveyor dlq redrive`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor dlq redrive --queue-url $URL --yes --wait                 # everything, with SQS's move task
  conveyor dlq redrive --queue-url $URL --yes --rate 50 --wait       # at most 50 messages per second
  conveyor dlq redrive --queue-url $URL --job-type webhook --reason-contains 503
  conveyor dlq redrive --queue-url $URL --job-type webhook --dry-run    # what it would move, moving nothing

Without a filter SQS's StartMessageMoveTask moves every message (the conveyor.failure attribute stays on
them); --wait shows its progress until it completes. With --job-type or --reason-contains, or on an
endpoint without StartMessageMoveTask, a loop receives from the DLQ, sends each matching message to its
source queue (same body and attributes, minus conveyor.failure) and deletes it from the DLQ only after
the send succeeded; messages that stay are made visible again when the scan ends. Moving every message
(no filter) needs --yes. Ctrl-C stops the loop after the current batch, says what moved and exits with
130; Ctrl-C while --wait follows a move task leaves the task running in SQS, prints its handle and the
command that cancels it, and exits with 130.")]
pub(crate) struct RedriveArgs {
    /// URL (or name) of the source queue (its DLQ is found from its RedrivePolicy) or of the DLQ itself.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Move at most N messages per second (1 to 500).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=500))]
    pub rate: Option<u32>,
    /// Which messages to move (none of these: all, which needs --yes).
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Confirms moving every message of the DLQ (needed without --job-type, --reason-contains or
    /// --message-id).
    #[arg(long)]
    pub yes: bool,
    /// Show what would be moved, moving nothing: a peek of at most 1,000 messages with the filter (a
    /// DLQ holding more is only sampled). Like any receive, the peek adds one to each message's
    /// ApproximateReceiveCount.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for a move task to finish, printing its progress (the loop always runs to the end).
    #[arg(long)]
    pub wait: bool,
    /// Send messages to this queue (URL or name) instead of the queue they came from.
    #[arg(long, value_name = "URL")]
    pub to_queue_url: Option<QueueRef>,
    /// How to move the messages.
    #[arg(long, value_enum, default_value_t = Method::Auto)]
    pub method: Method,
    /// Loop only: how long messages that stay in the DLQ remain hidden if the command dies mid-scan.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=43_200))]
    pub hold_secs: u64,
}

/// Arguments of `conveyor dlq tasks`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor dlq tasks --queue-url $URL                        # SQS's last 10 move tasks of the DLQ, with handles
  conveyor dlq tasks --queue-url $URL --cancel $HANDLE       # stop a running one; what moved stays moved")]
pub(crate) struct TasksArgs {
    /// URL of the source queue or of the DLQ.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Cancel the running move task with this handle (from the listing or `dlq redrive`).
    #[arg(long, value_name = "HANDLE")]
    pub cancel: Option<String>,
}

/// Runs a `conveyor dlq` subcommand.
pub(crate) async fn run(args: &DlqArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let client = aws.sqs_client();
    match &args.command {
        DlqCommand::Peek(args) => run_peek(args, aws, &client, format).await,
        DlqCommand::Redrive(args) => run_redrive(args, &client, format).await,
        DlqCommand::Delete(args) => crate::commands::dlq_delete::run(args, &client, format).await,
        DlqCommand::Tasks(args) => run_tasks(args, &client, format).await,
    }
}

async fn run_peek(
    args: &PeekArgs,
    aws: &Aws,
    client: &aws_sdk_sqs::Client,
    format: Format,
) -> anyhow::Result<()> {
    let pair = resolve_dead_letter(client, &resolve_queue_url(client, &args.queue_url).await?).await?;
    let options = PeekOptions::default()
        .with_max(usize::from(args.limit))
        .with_hold(Duration::from_secs(args.hold_secs));
    let mut peeked = peek(client, &pair.dlq.url, options).await?;
    let not_released = peeked.release_failures.len();
    let looked_at = peeked.messages.len();
    let filter = args.filter.filter();
    peeked.messages.retain(|received| filter.matches(received));
    let payloads = if args.fetch_payloads {
        crate::commands::payloads::fetch_all(
            aws,
            &peeked.messages,
            &args.payload_buckets,
            args.max_payload_bytes,
        )
        .await
    } else {
        Vec::new()
    };
    if format == Format::Json {
        let messages: Vec<Value> = peeked
            .messages
            .iter()
            .zip(crate::commands::payloads::padded(
                &payloads,
                peeked.messages.len(),
            ))
            .map(|(received, fetched)| message_json(received, args.show_body, fetched))
            .collect();
        print_json(&json!({
            "dead_letter_queue": queue_json(&pair.dlq),
            "source_queues": pair.sources.iter().map(queue_json).collect::<Vec<_>>(),
            "looked_at": looked_at,
            "shown": messages.len(),
            "messages": messages,
            "not_made_visible": not_released,
        }))?;
    } else {
        print_peek_text(&pair, &peeked.messages, args.show_body, &payloads, format);
        if !filter.is_empty() {
            crate::sayln!(
                format,
                "{} of the {looked_at} messages looked at match the filter",
                peeked.messages.len()
            );
        }
    }
    if not_released > 0 {
        bail!(
            "{not_released} peeked messages could not be made visible again; they come back by themselves within \
             {} seconds",
            args.hold_secs
        );
    }
    Ok(())
}

pub(crate) fn print_peek_text(
    pair: &DeadLetterPair,
    messages: &[Received],
    show_body: bool,
    payloads: &[Fetched],
    format: Format,
) {
    let sources: Vec<&str> = pair.sources.iter().map(QueueInfo::name).collect();
    crate::sayln!(
        format,
        "dead-letter queue {} (source: {}): {} visible before the peek; showing {}, all left in the DLQ",
        pair.dlq.name(),
        sources.join(", "),
        pair.dlq.depth.visible,
        messages.len()
    );
    if messages.is_empty() {
        return;
    }
    let mut table = Table::new(&[
        "MESSAGE ID",
        "JOB TYPE",
        "RECEIVES",
        "SENT",
        "FAILED AT",
        "HANDLER",
        "SOURCE",
        "REASON",
    ]);
    let mut sqs_counts = false;
    for received in messages {
        let failure = received.failure();
        let receives = match &failure {
            Some(failure) => failure.receive_count.to_string(),
            None => {
                sqs_counts = true;
                format!("{}*", received.message.receive_count)
            }
        };
        table.row(vec![
            received.message.id.clone(),
            received.message.job_type().unwrap_or("-").to_owned(),
            receives,
            received
                .message
                .sent_at
                .map_or_else(|| "-".to_owned(), format_time),
            failure.as_ref().map_or_else(
                || "-".to_owned(),
                |failure| format_epoch_millis(failure.failed_at_ms),
            ),
            failure
                .as_ref()
                .map(|failure| failure.handler.clone())
                .filter(|handler| !handler.is_empty())
                .unwrap_or_else(|| "-".to_owned()),
            source_of(received).unwrap_or_else(|| "-".to_owned()),
            received.reason(),
        ]);
    }
    table.print(format);
    if sqs_counts {
        crate::sayln!(
            format,
            "* no failure record: SQS's ApproximateReceiveCount, which counts peeks too"
        );
    }
    for received in messages {
        if let Some(pointer) = crate::commands::payloads::describe(&received.message) {
            crate::sayln!(format, "payload of {}: {pointer}", received.message.id);
        }
    }
    if show_body {
        let fetched = crate::commands::payloads::padded(payloads, messages.len());
        for (received, fetched) in messages.iter().zip(fetched) {
            match fetched {
                Some(Ok(payload)) => {
                    crate::sayln!(
                        format,
                        "body of {} (payload from S3): {payload}",
                        received.message.id
                    )
                }
                Some(Err(error)) => crate::sayln!(
                    format,
                    "body of {}: {} ({error})",
                    received.message.id,
                    received.message.body
                ),
                None => crate::sayln!(
                    format,
                    "body of {}: {}",
                    received.message.id,
                    received.message.body
                ),
            }
        }
    }
}

/// The queue a message came from: the failure record's, else the one SQS's redrive recorded.
fn source_of(received: &Received) -> Option<String> {
    if let Some(failure) = received.failure() {
        return Some(failure.source_queue);
    }
    let arn = received.dead_letter_source_arn.as_deref()?;
    Some(arn.rsplit(':').next().unwrap_or(arn).to_owned())
}

pub(crate) fn message_json(
    received: &Received,
    show_body: bool,
    fetched: Option<&Result<String, String>>,
) -> Value {
    let message = &received.message;
    let failure = received.failure();
    let mut value = json!({
        "message_id": message.id,
        "job_type": message.job_type(),
        "idempotency_key": message.idempotency_key(),
        "reason": received.reason(),
        "failure": failure,
        "receive_count": failure.as_ref().map(|failure| failure.receive_count),
        "sqs_receive_count": message.receive_count,
        "sent_at": message.sent_at.map(format_time),
        "source_queue": source_of(received),
        "dead_letter_source_arn": received.dead_letter_source_arn,
        "group_id": message.group_id,
    });
    if failure.is_none()
        && let Some(raw) = received.failure_attribute()
    {
        value["failure_attribute"] = json!(raw);
    }
    if let Some(Ok(pointer)) = conveyor_core::port::PayloadPointer::of(message) {
        value["payload"] = json!({
            "bucket": pointer.bucket,
            "key": pointer.key,
            "size": conveyor_core::port::declared_size(&message.attributes),
        });
    }
    if show_body {
        value["body"] = json!(message.body);
        match fetched {
            Some(Ok(payload)) => value["payload_body"] = json!(payload),
            Some(Err(error)) => value["payload_error"] = json!(error),
            None => {}
        }
    }
    value
}

pub(crate) fn queue_json(queue: &QueueInfo) -> Value {
    json!({
        "name": queue.name(),
        "url": queue.url,
        "arn": queue.arn.arn,
        "visible": queue.depth.visible,
        "in_flight": queue.depth.in_flight,
        "delayed": queue.depth.delayed,
    })
}

async fn run_redrive(args: &RedriveArgs, client: &aws_sdk_sqs::Client, format: Format) -> anyhow::Result<()> {
    let pair = resolve_dead_letter(client, &resolve_queue_url(client, &args.queue_url).await?).await?;
    let filter = args.filter.filter();
    if args.dry_run {
        return dry_run(client, &pair, &filter, "moved", format).await;
    }
    let destinations = match &args.to_queue_url {
        Some(queue) => Destinations::One(describe(client, &resolve_queue_url(client, queue).await?).await?),
        None if pair.sources.len() == 1 => Destinations::One(pair.sources[0].clone()),
        None => Destinations::BySource(pair.sources.clone()),
    };
    if filter.is_empty() && !args.yes {
        bail!(unconfirmed_redrive(&pair, &destinations));
    }
    if args.method == Method::Task && !filter.is_empty() {
        bail!(crate::errors::UsageError(
            "--method task moves every message: --job-type, --reason-contains and --message-id need the loop (--method auto or loop)"
                .to_owned()
        ));
    }
    let use_loop = match (args.method, &destinations) {
        (Method::Loop, _) => true,
        (Method::Task, _) => false,
        (Method::Auto, _) if !filter.is_empty() => true,
        (Method::Auto, Destinations::BySource(_)) => {
            progress(&format!(
                "{} is the DLQ of several queues: moving with the loop, which sends each message back to the \
                 queue named in its failure record (SQS's move task can only return messages its own redrive \
                 moved)",
                pair.dlq.name()
            ));
            true
        }
        (Method::Auto, Destinations::One(_)) => false,
    };
    if !use_loop {
        let destination = match &destinations {
            Destinations::One(queue) => Some(queue),
            Destinations::BySource(_) => None,
        };
        let started = start_move_task(
            client,
            &pair.dlq.arn.arn,
            destination.map(|queue| queue.arn.arn.as_str()),
            args.rate,
        )
        .await;
        match started {
            Ok(task) => return follow_task(args, client, &pair, destination, &task, format).await,
            Err(AdminError::Unsupported { message, .. }) if args.method == Method::Auto => {
                progress(&format!(
                    "the endpoint does not support StartMessageMoveTask ({message}); moving with the loop instead"
                ));
            }
            Err(error) => return Err(error.into()),
        }
    }
    run_loop(args, client, &pair, &destinations, filter, format).await
}

/// The refusal of a redrive of every message without `--yes`: what it would move, where, and how to
/// confirm or narrow it.
fn unconfirmed_redrive(pair: &DeadLetterPair, destinations: &Destinations) -> crate::errors::UsageError {
    let target = match destinations {
        Destinations::One(queue) => queue.name().to_owned(),
        Destinations::BySource(_) => "the queues they came from".to_owned(),
    };
    crate::errors::UsageError(format!(
        "refusing to move every message of {dlq} ({visible} visible) to {target} without --yes: pass --yes to \
         move them all, or a filter (--job-type, --reason-contains, --message-id) to move some; --dry-run shows \
         what would move",
        dlq = pair.dlq.name(),
        visible = pair.dlq.depth.visible,
    ))
}

/// Reports a started move task and, with `--wait`, follows it to the end.
async fn follow_task(
    args: &RedriveArgs,
    client: &aws_sdk_sqs::Client,
    pair: &DeadLetterPair,
    destination: Option<&QueueInfo>,
    task: &MoveTaskHandle,
    format: Format,
) -> anyhow::Result<()> {
    let target = destination.map_or("each message's original source queue", QueueInfo::name);
    // Watched from before the handle is printed, so a Ctrl-C after it always gets the cancel command.
    let interrupt = args.wait.then(crate::errors::ctrl_c);
    progress(&format!(
        "started a message move task from {} to {target} ({} messages visible, {}): task handle {}",
        pair.dlq.name(),
        pair.dlq.depth.visible,
        args.rate.map_or_else(
            || "SQS's default rate".to_owned(),
            |rate| format!("at most {rate} messages/s")
        ),
        task.handle
    ));
    let last = match interrupt {
        Some(interrupt) => Some(wait_or_leave(client, pair, task, interrupt).await?),
        None => None,
    };
    if format == Format::Json {
        return print_json(&json!({
            "method": "move_task",
            "task_handle": task.handle,
            "dead_letter_queue": pair.dlq.name(),
            "destination": destination.map(QueueInfo::name),
            "rate": args.rate,
            "status": last.as_ref().map_or("RUNNING", |status| status.status.as_str()),
            "moved": last.as_ref().map(|status| status.moved),
            "to_move": last.as_ref().and_then(|status| status.to_move),
        }));
    }
    match last {
        Some(status) => crate::sayln!(
            format,
            "move task {}: moved {} messages from {} to {target}",
            status.status,
            status.moved,
            pair.dlq.name()
        ),
        None => crate::sayln!(
            format,
            "move task started: task handle {}\nfollow it with `conveyor dlq tasks --queue-url {}` (or pass --wait)",
            task.handle,
            pair.dlq.url
        ),
    }
    Ok(())
}

/// Follows a move task to its end; at Ctrl-C stops following, says that the task goes on in SQS and how to
/// cancel it, and fails with [`Interrupted`](crate::errors::Interrupted) (exit code 130).
async fn wait_or_leave(
    client: &aws_sdk_sqs::Client,
    pair: &DeadLetterPair,
    task: &MoveTaskHandle,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<MoveTaskStatus> {
    let mut moved = None;
    let mut on_progress = |status: &MoveTaskStatus| {
        let to_move = status
            .to_move
            .map_or_else(|| "?".to_owned(), |count| count.to_string());
        progress(&format!("{}: moved {} of {to_move}", status.status, status.moved));
        moved = Some(status.moved);
    };
    let followed = tokio::select! {
        status = wait_for_move_task(client, task, TASK_POLL_INTERVAL, &mut on_progress) => Some(status),
        () = interrupt => None,
    };
    if let Some(status) = followed {
        return Ok(status?);
    }
    let moved = moved.map_or_else(|| "an unknown number of".to_owned(), |moved| moved.to_string());
    bail!(crate::errors::Interrupted(format!(
        "stopped following by Ctrl-C; the message move task from {dlq} goes on in SQS ({moved} messages moved so \
         far), task handle {handle}. Cancel it with `conveyor dlq tasks --queue-url {url} --cancel {handle}` (or \
         `aws sqs cancel-message-move-task --task-handle {handle}`); what moved stays moved. Follow it with \
         `conveyor dlq tasks --queue-url {url}`",
        dlq = pair.dlq.name(),
        handle = task.handle,
        url = pair.dlq.url,
    )))
}

async fn run_loop(
    args: &RedriveArgs,
    client: &aws_sdk_sqs::Client,
    pair: &DeadLetterPair,
    destinations: &Destinations,
    filter: MoveFilter,
    format: Format,
) -> anyhow::Result<()> {
    let (stop, watcher) = stop_on_ctrl_c();
    let options = MoveOptions::default()
        .with_filter(filter)
        .with_rate(args.rate)
        .with_hold(Duration::from_secs(args.hold_secs))
        .with_stop(Some(stop));
    progress(&format!(
        "moving messages from {} ({} visible) with a receive / send / delete loop",
        pair.dlq.name(),
        pair.dlq.depth.visible
    ));
    let mut on_progress = |report: &MoveReport| {
        progress(&format!(
            "examined {}: moved {}, not matching {}, unknown source {}, failed {}; arrived after the start {}",
            report.examined,
            report.moved,
            report.skipped,
            report.unroutable,
            report.failed.len(),
            report.arrived_after_start
        ));
    };
    let result = move_messages(client, &pair.dlq, destinations, &options, &mut on_progress).await;
    watcher.abort();
    let report = result?;
    let remaining = describe(client, &pair.dlq.url).await?.depth;
    if format == Format::Json {
        let mut value = scan_json(pair.dlq.name(), "moved", &report, &remaining);
        value["method"] = json!("move_loop");
        value["unknown_source"] = json!(report.unroutable);
        print_json(&value)?;
    } else {
        crate::sayln!(
            format,
            "moved {} of {} examined messages from {}; {} left there ({} not matching, {} with an unknown source, \
             {} failed, {} sent to the DLQ after the redrive started and left for a later run){}",
            report.moved,
            report.examined,
            pair.dlq.name(),
            remaining.visible + remaining.in_flight,
            report.skipped,
            report.unroutable,
            report.failed.len(),
            report.arrived_after_start,
            if report.stopped { "; stopped by Ctrl-C" } else { "" }
        );
        print_failures(&report, format);
    }
    end_of_scan(&report, "moved", "moving")
}

/// The JSON report of a scan of `dlq` that moved or deleted messages (`done`: "moved", "deleted"),
/// with what `remaining` there after it.
pub(crate) fn scan_json(dlq: &str, done: &str, report: &MoveReport, remaining: &QueueDepth) -> Value {
    let failed: Value = report
        .failed
        .iter()
        .map(|failure| json!({ "message_id": failure.message_id, "error": failure.error }))
        .collect();
    let mut value = json!({
        "dead_letter_queue": dlq,
        "examined": report.examined,
        "not_matching": report.skipped,
        "arrived_after_start": report.arrived_after_start,
        "failed": failed,
        "stopped": report.stopped,
        "dead_letter_queue_after": { "visible": remaining.visible, "in_flight": remaining.in_flight },
    });
    value[done] = json!(report.moved);
    value
}

/// The messages a scan could not move or delete, one line each.
pub(crate) fn print_failures(report: &MoveReport, format: Format) {
    for failure in &report.failed {
        crate::sayln!(format, "  {}: {}", failure.message_id, failure.error);
    }
}

/// The scan's exit: an error when messages could not be `done` ("moved"), exit 130 when Ctrl-C stopped
/// it (`doing`: "moving"), else success.
pub(crate) fn end_of_scan(report: &MoveReport, done: &str, doing: &str) -> anyhow::Result<()> {
    if !report.failed.is_empty() {
        bail!("{} messages could not be {done}", report.failed.len());
    }
    if report.stopped {
        bail!(crate::errors::Interrupted(format!(
            "stopped by Ctrl-C after {doing} {} of {} examined messages",
            report.moved, report.examined
        )));
    }
    Ok(())
}

/// A flag Ctrl-C sets (the scan stops after its current batch), and the task watching for it (abort it
/// when the scan ends).
pub(crate) fn stop_on_ctrl_c() -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt = crate::errors::ctrl_c();
    let watcher = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            interrupt.await;
            stop.store(true, Ordering::Relaxed);
            crate::errln!(
                "stopping after the current batch; messages already examined are made visible again"
            );
        })
    };
    (stop, watcher)
}

/// `--dry-run`: the messages a redrive or delete with `filter` would touch, from a peek of up to
/// [`DRY_RUN_MAX`] (`verb`: "moved" or "deleted"); nothing is touched.
pub(crate) async fn dry_run(
    client: &aws_sdk_sqs::Client,
    pair: &DeadLetterPair,
    filter: &MoveFilter,
    verb: &str,
    format: Format,
) -> anyhow::Result<()> {
    let options = PeekOptions::default().with_max(DRY_RUN_MAX);
    let mut peeked = peek(client, &pair.dlq.url, options).await?;
    let looked_at = peeked.messages.len();
    peeked.messages.retain(|received| filter.matches(received));
    if format == Format::Json {
        print_json(&json!({
            "dry_run": true,
            "dead_letter_queue": queue_json(&pair.dlq),
            "looked_at": looked_at,
            "would_be": verb,
            "matching": peeked.messages.len(),
            "messages": peeked.messages.iter().map(|received| message_json(received, false, None)).collect::<Vec<_>>(),
        }))?;
    } else {
        print_peek_text(pair, &peeked.messages, false, &[], format);
        let more = if looked_at >= DRY_RUN_MAX {
            " (more may be there: a dry run looks at 1,000)"
        } else {
            ""
        };
        crate::sayln!(
            format,
            "dry run: {} of the {looked_at} messages looked at would be {verb}{more}; nothing was {verb}",
            peeked.messages.len()
        );
    }
    Ok(())
}

async fn run_tasks(args: &TasksArgs, client: &aws_sdk_sqs::Client, format: Format) -> anyhow::Result<()> {
    let pair = resolve_dead_letter(client, &resolve_queue_url(client, &args.queue_url).await?).await?;
    if let Some(handle) = &args.cancel {
        let moved = cancel_move_task(client, handle).await?;
        return print_done(
            format,
            json!({ "dead_letter_queue": pair.dlq.name(), "cancelled": handle, "moved": moved }),
            &format!(
                "cancelling the move task from {}: {moved} messages moved before it stops; the rest stay in the DLQ",
                pair.dlq.name()
            ),
        );
    }
    let tasks = list_move_tasks(client, &pair.dlq.arn.arn).await?;
    if format == Format::Json {
        let tasks: Vec<Value> = tasks
            .iter()
            .map(|task| {
                json!({
                    "status": task.status,
                    "moved": task.moved,
                    "to_move": task.to_move,
                    "destination_arn": task.destination_arn,
                    "rate": task.rate,
                    "started_at": format_epoch_millis(task.started_at_ms),
                    "failure_reason": task.failure_reason,
                    "task_handle": task.handle,
                })
            })
            .collect();
        return print_json(&json!({ "dead_letter_queue": pair.dlq.name(), "tasks": tasks }));
    }
    if tasks.is_empty() {
        crate::sayln!(format, "no message move tasks for {}", pair.dlq.name());
        return Ok(());
    }
    let mut table = Table::new(&[
        "STARTED",
        "STATUS",
        "MOVED",
        "TO MOVE",
        "DESTINATION",
        "HANDLE",
        "FAILURE",
    ]);
    for task in &tasks {
        table.row(vec![
            format_epoch_millis(task.started_at_ms),
            task.status.clone(),
            task.moved.to_string(),
            task.to_move
                .map_or_else(|| "-".to_owned(), |count| count.to_string()),
            task.destination_name().unwrap_or("original source").to_owned(),
            task.handle.clone().unwrap_or_else(|| "-".to_owned()),
            task.failure_reason.clone().unwrap_or_default(),
        ]);
    }
    table.print(format);
    Ok(())
}
