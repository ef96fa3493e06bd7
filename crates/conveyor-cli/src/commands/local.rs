//! `conveyor local init`: what a worker needs on the local emulators, in one idempotent command.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use conveyor_sqs::admin::{Created, QueueSetup, ensure_queue_with_dlq, is_queue_name};
use serde_json::json;

use crate::aws::Aws;
use crate::errors::UsageError;
use crate::output::{Format, print_json, progress};

/// The table `local init` creates unless `--table` names another (the name the README uses).
pub(crate) const DEFAULT_TABLE: &str = "conveyor-idempotency";

/// Arguments of `conveyor local`.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// What to do on the local stack.
    #[command(subcommand)]
    pub command: LocalCommand,
}

/// The `local` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum LocalCommand {
    /// Create a queue with its DLQ and redrive policy, and the idempotency table, on the local emulators.
    Init(InitArgs),
}

/// Arguments of `conveyor local init`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  ./localstack/start.sh && source localstack/env.sh
  eval \"$(conveyor local init --queue jobs)\"      # creates jobs, jobs-dlq, conveyor-idempotency; exports their names

Idempotent: what exists already is kept (a queue without the redrive policy gets it) and said so. Only
for the local emulators: it refuses AWS's own endpoints (use infra/ there). The environment to export
goes to stdout, the report of what was created to stderr.")]
pub(crate) struct InitArgs {
    /// The queue's name (`.fifo` is added with --fifo); its DLQ is NAME-dlq.
    #[arg(long, value_name = "NAME")]
    pub queue: String,
    /// A FIFO queue and FIFO DLQ, with content-based deduplication.
    #[arg(long)]
    pub fifo: bool,
    /// Receives before SQS moves a message to the DLQ (the redrive policy's maxReceiveCount).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_receive_count: u32,
    /// The queue's visibility timeout, in seconds (the worker's CONVEYOR_VISIBILITY_TIMEOUT_SECS).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u32).range(0..=43_200))]
    pub visibility_timeout_secs: u32,
    /// The idempotency table's name.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_TABLE)]
    pub table: String,
}

/// Runs `conveyor local`.
pub(crate) async fn run(args: &LocalArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    match &args.command {
        LocalCommand::Init(init) => run_init(init, aws, format).await,
    }
}

async fn run_init(args: &InitArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let name = args.queue.strip_suffix(".fifo").unwrap_or(&args.queue);
    let fifo = args.fifo || args.queue.ends_with(".fifo");
    if !is_queue_name(&format!("{name}-dlq.fifo")) {
        return Err(UsageError(format!(
            "--queue {:?} is not a valid queue name: letters, digits, - and _, at most 71 characters (the DLQ's \
             name adds -dlq, and .fifo for FIFO queues)",
            args.queue
        ))
        .into());
    }
    let (Some(sqs_endpoint), Some(dynamodb_endpoint)) =
        (aws.local_sqs_endpoint(), aws.local_dynamodb_endpoint())
    else {
        return Err(UsageError(format!(
            "local init creates queues and a table on the local emulators, but the SQS endpoint is {} and the \
             DynamoDB endpoint is {}; run `./localstack/start.sh` and `source localstack/env.sh` first (on AWS, \
             deploy infra/modules/queue and infra/modules/idempotency-table instead)",
            aws.sqs_endpoint(),
            aws.dynamodb_endpoint()
        ))
        .into());
    };
    let setup = QueueSetup {
        name: name.to_owned(),
        fifo,
        max_receive_count: args.max_receive_count,
        visibility_timeout_secs: args.visibility_timeout_secs,
    };
    let queues = ensure_queue_with_dlq(&aws.sqs_client(), &setup).await?;
    let table = ensure_table(&aws.dynamodb_client(), &args.table, &dynamodb_endpoint).await?;

    if format == Format::Json {
        return print_json(&json!({
            "queue": { "name": setup.queue_name(), "url": queues.url, "result": word(queues.queue) },
            "dead_letter_queue": { "name": setup.dlq_name(), "url": queues.dlq_url, "result": word(queues.dlq) },
            "max_receive_count": setup.max_receive_count,
            "table": { "name": args.table, "result": word(table) },
            "environment": environment(aws, &sqs_endpoint, &dynamodb_endpoint, &queues.url, &args.table)
                .into_iter()
                .map(|(variable, value)| (variable.to_owned(), serde_json::Value::String(value)))
                .collect::<serde_json::Map<_, _>>(),
        }));
    }
    progress(&format!("queue {}: {}", setup.queue_name(), word(queues.queue)));
    progress(&format!(
        "dead-letter queue {}: {} (messages move there after {} receives)",
        setup.dlq_name(),
        word(queues.dlq),
        setup.max_receive_count
    ));
    progress(&format!("idempotency table {}: {}", args.table, word(table)));
    progress(
        "environment for the worker, the Lambda runner and this CLI (`eval \"$(conveyor local init ...)\"`):",
    );
    for (variable, value) in environment(aws, &sqs_endpoint, &dynamodb_endpoint, &queues.url, &args.table) {
        crate::outln!("export {variable}={value}");
    }
    Ok(())
}

/// The variables to export, in order.
fn environment(
    aws: &Aws,
    sqs_endpoint: &str,
    dynamodb_endpoint: &str,
    queue_url: &str,
    table: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_REGION", aws.region.clone()),
        ("AWS_ENDPOINT_URL_SQS", sqs_endpoint.to_owned()),
        ("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_endpoint.to_owned()),
        ("CONVEYOR_QUEUE_URL", queue_url.to_owned()),
        ("CONVEYOR_IDEMPOTENCY_TABLE", table.to_owned()),
    ]
}

fn word(created: Created) -> &'static str {
    match created {
        Created::Created => "created",
        Created::Existed => "already existed",
        Created::Updated => "already existed; its redrive policy was set",
    }
}

/// Creates the idempotency table unless it exists, with the one table definition the tests use too
/// (`conveyor_dynamodb::create_idempotency_table`, the layout of infra/modules/idempotency-table).
async fn ensure_table(
    client: &aws_sdk_dynamodb::Client,
    name: &str,
    endpoint: &str,
) -> anyhow::Result<Created> {
    match client.describe_table().table_name(name).send().await {
        Ok(_) => return Ok(Created::Existed),
        Err(error)
            if error
                .as_service_error()
                .is_some_and(|error| error.is_resource_not_found_exception()) => {}
        Err(error) => {
            return Err(anyhow::anyhow!(conveyor_sqs::admin::display_chain(&error)))
                .with_context(|| format!("DescribeTable {name} at {endpoint}: is DynamoDB Local running?"));
        }
    }
    conveyor_dynamodb::create_idempotency_table(client, name)
        .await
        .with_context(|| format!("creating table {name} at {endpoint}"))?;
    Ok(Created::Created)
}
