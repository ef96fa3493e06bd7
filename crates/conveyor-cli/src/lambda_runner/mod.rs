//! `conveyor lambda run`: a real Lambda bootstrap, run locally behind an emulated SQS event source
//! mapping.
//!
//! The runner serves the Lambda Runtime API on `127.0.0.1:<free port>` ([`runtime_api`]), starts the
//! bootstrap binary as a child process with the environment Lambda gives a custom runtime ([`child`]),
//! and polls the queue the way the event source mapping does ([`poller`]): it receives a batch, hands it
//! to the bootstrap as an `SqsEvent`, reads the `SqsBatchResponse`, deletes the successes and leaves the
//! reported failures in flight, so retries, backoff and redrive to the DLQ happen as on AWS. An
//! invocation error or timeout leaves the whole batch, as AWS does; after a timeout or a crash the
//! bootstrap is restarted (a new cold start), as Lambda replaces the execution environment.
//!
//! Nothing here is specific to Conveyor's adapter: any bootstrap built on `lambda_runtime` (or any
//! other custom runtime) runs under it.

pub mod child;
pub mod http;
pub mod poller;
pub mod runtime_api;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use conveyor_core::{Queue, ReceiptHandle};
use tokio::time::Instant;

use self::child::{Bootstrap, FunctionSettings};
use self::poller::{Poller, Verdict, verdict};
use self::runtime_api::{ApiEvent, Invocation, RuntimeApi};

/// How long a bootstrap may take from start to its first `next` request (Lambda's init limit).
pub const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Slack after the invocation deadline for the answer's HTTP request to arrive.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);
/// Restarts in a row without a completed invocation before the runner gives up.
const MAX_CONSECUTIVE_CRASHES: u32 = 3;

/// `conveyor lambda ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct LambdaArgs {
    /// The Lambda command.
    #[command(subcommand)]
    pub command: LambdaCommand,
}

/// The Lambda commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum LambdaCommand {
    /// Run a bootstrap binary against a queue the way an SQS event source mapping does: serve the
    /// Lambda Runtime API on loopback, poll the queue, invoke with each batch, delete what succeeded.
    ///
    /// The function gets Lambda's variables (AWS_LAMBDA_RUNTIME_API, AWS_LAMBDA_FUNCTION_NAME, AWS_REGION,
    /// ...), then the runner's whole environment except the names Lambda reserves (the shell plays the
    /// part of the function's configured environment variables: WEBHOOK_SIGNING_SECRET=... works), then
    /// the --env pairs. --region reaches it as AWS_REGION; for --endpoint-url and --profile set
    /// AWS_ENDPOINT_URL_SQS and AWS_PROFILE instead.
    Run(RunArgs),
}

/// Where a failing bootstrap's variables come from, said when it fails at init.
const ENVIRONMENT_HINT: &str = "the bootstrap gets this shell's environment (as a deployed function gets its \
    configured environment variables) plus each --env NAME=VALUE: set what it asks for either way, and on AWS \
    in the function's configuration (infra/modules/lambda-consumer's `environment`)";

/// Runs a `conveyor lambda` command with the CLI's SQS client.
pub async fn run_command(args: &LambdaArgs, client: aws_sdk_sqs::Client) -> anyhow::Result<()> {
    match &args.command {
        LambdaCommand::Run(run_args) => run(run_args, client).await.map(|_| ()),
    }
}

/// `conveyor lambda run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The bootstrap executable (e.g. target/debug/bootstrap).
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// The queue to poll (URL or name), as the event source mapping would.
    #[arg(long)]
    pub queue_url: conveyor_sqs::admin::QueueRef,
    /// Most records per invocation (1-10000; above 10 needs a batching window of at least 1 s).
    #[arg(long, default_value_t = 10)]
    pub batch_size: usize,
    /// How long to gather records before invoking (MaximumBatchingWindowInSeconds, in ms).
    #[arg(long, default_value_t = 0)]
    pub batching_window_ms: u64,
    /// The function timeout: the invocation deadline, after which the batch is left and the bootstrap
    /// restarted.
    #[arg(long, default_value_t = 10)]
    pub function_timeout_secs: u64,
    /// Stop when a receive returns nothing and the queue holds no message (visible, in flight or delayed).
    #[arg(long)]
    pub until_empty: bool,
    /// Stop after this many batches.
    #[arg(long)]
    pub max_batches: Option<u64>,
    /// Stop after this long without receiving a message.
    #[arg(long)]
    pub max_idle_secs: Option<u64>,
    /// An environment variable for the function (repeatable): --env CONVEYOR_IDEMPOTENCY_TABLE=jobs.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,
    /// AWS_LAMBDA_FUNCTION_NAME.
    #[arg(long, default_value = "conveyor-local")]
    pub function_name: String,
    /// AWS_LAMBDA_FUNCTION_MEMORY_SIZE.
    #[arg(long, default_value_t = 128)]
    pub memory_mb: u32,
}

fn parse_env_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

impl RunArgs {
    fn validate(&self, fifo: bool) -> anyhow::Result<()> {
        if !(1..=10_000).contains(&self.batch_size) {
            bail!("--batch-size {} is outside 1..=10000", self.batch_size);
        }
        if self.batch_size > 10 && self.batching_window_ms < 1000 {
            bail!(
                "--batch-size {} is over 10: the event source mapping then needs --batching-window-ms of at \
                 least 1000",
                self.batch_size
            );
        }
        if fifo && self.batch_size > 10 {
            bail!(
                "--batch-size {} is over 10, the most a FIFO queue's event source mapping takes",
                self.batch_size
            );
        }
        if self.batching_window_ms > 300_000 {
            bail!(
                "--batching-window-ms {} is over the 300 s maximum",
                self.batching_window_ms
            );
        }
        if !(1..=900).contains(&self.function_timeout_secs) {
            bail!(
                "--function-timeout-secs {} is outside Lambda's 1..=900",
                self.function_timeout_secs
            );
        }
        if !self.bootstrap.is_file() {
            bail!(
                "--bootstrap {} is not a file; build it first (cargo build -p conveyor-examples --bin bootstrap)",
                self.bootstrap.display()
            );
        }
        Ok(())
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Invocations.
    pub batches: u64,
    /// Records handed to the function.
    pub records: u64,
    /// Records deleted after a successful invocation.
    pub deleted: u64,
    /// Records the function listed in `batchItemFailures`.
    pub failures: u64,
    /// Invocations that ended in an error (function error, or a response Lambda would refuse).
    pub invocation_errors: u64,
    /// Invocations that ran past the function timeout.
    pub timeouts: u64,
    /// Bootstrap restarts (after a timeout or a crash).
    pub restarts: u64,
    /// Start-up time of each bootstrap process: spawn to its first `next` request.
    pub cold_starts: Vec<Duration>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "summary: {} batches, {} records, {} deleted, {} failures reported, {} invocation errors, \
             {} timeouts, {} restarts",
            self.batches,
            self.records,
            self.deleted,
            self.failures,
            self.invocation_errors,
            self.timeouts,
            self.restarts
        )?;
        if let Some(first) = self.cold_starts.first() {
            write!(f, "; cold start {:.1} ms (spawn to first /next)", millis(*first))?;
        }
        Ok(())
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// How one invocation ended.
#[derive(Debug)]
enum Ended {
    Response(Vec<u8>),
    Error {
        error_type: Option<String>,
        body: Vec<u8>,
    },
    TimedOut,
    Exited(String),
    Undelivered,
}

/// Runs until a stop condition (`--until-empty`, `--max-batches`, `--max-idle-secs`) or Ctrl-C; prints
/// one line per batch and the summary. The bootstrap is killed on the way out, whatever happened.
pub async fn run(args: &RunArgs, client: aws_sdk_sqs::Client) -> anyhow::Result<Summary> {
    let region = client
        .config()
        .region()
        .map_or_else(|| "us-east-1".to_owned(), |region| region.to_string());
    let queue_url = conveyor_sqs::admin::resolve_queue_url(&client, &args.queue_url).await?;
    let queue = conveyor_sqs::SqsQueue::connect(client.clone(), queue_url.clone())
        .await
        .with_context(|| format!("cannot read the attributes of {queue_url}"))?;
    args.validate(queue.is_fifo())?;
    let arn = queue.arn().to_owned();
    if arn.is_empty() {
        bail!("GetQueueAttributes returned no QueueArn for {queue_url}");
    }
    let account = arn.split(':').nth(4).unwrap_or("000000000000").to_owned();
    let poll_wait = if args.until_empty || args.max_idle_secs.is_some() {
        Duration::from_secs(1)
    } else {
        conveyor_core::limits::MAX_WAIT_TIME
    };
    let poller = Poller::new(
        client,
        queue_url.clone(),
        arn,
        region.clone(),
        args.batch_size,
        Duration::from_millis(args.batching_window_ms),
        poll_wait,
    );
    let settings = FunctionSettings {
        bootstrap: args.bootstrap.clone(),
        function_name: args.function_name.clone(),
        memory_mb: args.memory_mb,
        region: region.clone(),
        env: args.env.clone(),
    };
    let function_arn = format!(
        "arn:aws:lambda:{region}:{account}:function:{}",
        args.function_name
    );

    let mut api = RuntimeApi::bind()
        .await
        .context("cannot bind the Runtime API on 127.0.0.1")?;
    let mut bootstrap = Bootstrap::spawn(&settings, api.addr())?;
    let mut summary = Summary::default();
    let mut runner = Runner {
        args,
        api: &mut api,
        bootstrap: &mut bootstrap,
        settings: &settings,
        queue: &queue,
        poller: &poller,
        function_arn,
        summary: &mut summary,
    };
    let outcome = tokio::select! {
        outcome = runner.drive() => outcome,
        _ = tokio::signal::ctrl_c() => {
            crate::errln!("interrupted: messages of an unfinished batch come back after their visibility timeout");
            Ok(())
        }
    };
    bootstrap.kill().await;
    outcome?;
    crate::outln!("{summary}");
    Ok(summary)
}

struct Runner<'a> {
    args: &'a RunArgs,
    api: &'a mut RuntimeApi,
    bootstrap: &'a mut Bootstrap,
    settings: &'a FunctionSettings,
    queue: &'a conveyor_sqs::SqsQueue,
    poller: &'a Poller,
    function_arn: String,
    summary: &'a mut Summary,
}

impl Runner<'_> {
    async fn drive(&mut self) -> anyhow::Result<()> {
        self.wait_ready().await?;
        let mut last_message = Instant::now();
        let mut crashes = 0u32;
        loop {
            if self
                .args
                .max_batches
                .is_some_and(|max| self.summary.batches >= max)
            {
                return Ok(());
            }
            let messages = self.poller.next_batch().await?;
            if messages.is_empty() {
                if self.args.until_empty {
                    let depth = self
                        .queue
                        .depth()
                        .await
                        .context("cannot read the queue's depth")?;
                    if depth.visible + depth.in_flight + depth.delayed == 0 {
                        return Ok(());
                    }
                }
                if let Some(idle) = self.args.max_idle_secs
                    && last_message.elapsed() >= Duration::from_secs(idle)
                {
                    return Ok(());
                }
                continue;
            }
            last_message = Instant::now();
            let clean = self.invoke(&messages).await?;
            if clean {
                crashes = 0;
                continue;
            }
            crashes += 1;
            if crashes >= MAX_CONSECUTIVE_CRASHES {
                bail!(
                    "the bootstrap crashed or timed out {crashes} times in a row; its output is above (bootstrap| lines)"
                );
            }
            self.restart().await?;
        }
    }

    /// Waits for a fresh bootstrap's first `next` request; an exit or an init error before it is fatal.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let limit = self.bootstrap.spawned_at() + INIT_TIMEOUT;
        loop {
            tokio::select! {
                event = self.api.next_event() => match event {
                    // A request from the process this one replaced does not count.
                    Some(ApiEvent::NextRequested { at }) if at >= self.bootstrap.spawned_at() => {
                        let cold_start = at - self.bootstrap.spawned_at();
                        self.summary.cold_starts.push(cold_start);
                        return Ok(());
                    }
                    Some(ApiEvent::InitError { error_type, body }) => bail!(
                        "the bootstrap failed to initialise: {}",
                        describe_error(error_type.as_deref(), &body)
                    ),
                    Some(_) => {}
                    None => bail!("the Runtime API stopped"),
                },
                status = self.bootstrap.wait() => bail!(
                    "the bootstrap exited during init ({}); its output is above (bootstrap| lines); {ENVIRONMENT_HINT}",
                    status.map_or_else(|error| error.to_string(), |status| status.to_string())
                ),
                () = tokio::time::sleep_until(limit) => bail!(
                    "the bootstrap did not ask for an event within {INIT_TIMEOUT:?} of starting"
                ),
            }
        }
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        self.api.withdraw();
        self.bootstrap.kill().await;
        *self.bootstrap = Bootstrap::spawn(self.settings, self.api.addr())?;
        self.summary.restarts += 1;
        self.wait_ready().await
    }

    /// One batch: invoke, then settle. False when the bootstrap must be restarted.
    async fn invoke(&mut self, messages: &[aws_sdk_sqs::types::Message]) -> anyhow::Result<bool> {
        let started = Instant::now();
        let batch = self.summary.batches + 1;
        self.summary.batches = batch;
        self.summary.records += messages.len() as u64;
        let event = serde_json::to_vec(&self.poller.event(messages)).context("encoding the SqsEvent")?;
        let timeout = Duration::from_secs(self.args.function_timeout_secs);
        let id = uuid::Uuid::new_v4().to_string();
        self.api.submit(Invocation {
            id: id.clone(),
            body: event,
            timeout,
            function_arn: self.function_arn.clone(),
            trace_id: trace_id(),
        });
        let ended = self.wait_for(&id, timeout).await;
        let records = messages.len();
        let elapsed = millis(started.elapsed());
        let prefix = format!("batch {batch}: {records} records");
        match ended {
            Ended::Response(body) => {
                let ids: HashSet<String> = messages.iter().filter_map(|m| m.message_id.clone()).collect();
                match verdict(&body, &ids) {
                    Verdict::Partial(failed) => {
                        let deleted = self.delete_all_but(messages, &failed).await;
                        self.summary.deleted += deleted;
                        self.summary.failures += failed.len() as u64;
                        crate::outln!("{prefix}, {} failures, {elapsed:.0} ms", failed.len());
                    }
                    Verdict::WholeBatchFailed(reason) => {
                        self.summary.invocation_errors += 1;
                        crate::outln!(
                            "{prefix}, response refused ({reason}), batch left in the queue, {elapsed:.0} ms"
                        );
                    }
                }
                Ok(true)
            }
            Ended::Error { error_type, body } => {
                self.summary.invocation_errors += 1;
                crate::outln!(
                    "{prefix}, invocation error ({}), batch left in the queue, {elapsed:.0} ms",
                    describe_error(error_type.as_deref(), &body)
                );
                Ok(true)
            }
            Ended::TimedOut => {
                self.summary.timeouts += 1;
                crate::outln!(
                    "{prefix}, timed out after {} s, batch left in the queue; restarting the bootstrap",
                    timeout.as_secs()
                );
                Ok(false)
            }
            Ended::Exited(status) => {
                self.summary.invocation_errors += 1;
                crate::outln!(
                    "{prefix}, the bootstrap exited ({status}), batch left in the queue; restarting it"
                );
                Ok(false)
            }
            Ended::Undelivered => {
                self.summary.invocation_errors += 1;
                crate::outln!(
                    "{prefix}, the bootstrap's connection failed, batch left in the queue; restarting it"
                );
                Ok(false)
            }
        }
    }

    /// Waits for the invocation's end: an answer, the deadline, or the process's exit.
    async fn wait_for(&mut self, id: &str, timeout: Duration) -> Ended {
        // Until the bootstrap takes the event, allow for a slow start on top of the timeout.
        let mut limit = Instant::now() + timeout + INIT_TIMEOUT;
        loop {
            tokio::select! {
                event = self.api.next_event() => match event {
                    Some(ApiEvent::Started { id: started, deadline }) if started == id => {
                        limit = deadline + DEADLINE_GRACE;
                    }
                    Some(ApiEvent::Response { id: answered, body }) if answered == id => {
                        return Ended::Response(body);
                    }
                    Some(ApiEvent::Error { id: answered, error_type, body }) if answered == id => {
                        return Ended::Error { error_type, body };
                    }
                    Some(ApiEvent::Undelivered { id: lost }) if lost == id => return Ended::Undelivered,
                    Some(ApiEvent::InitError { error_type, body }) => {
                        crate::errln!("bootstrap init error: {}", describe_error(error_type.as_deref(), &body));
                        crate::errln!("hint: {ENVIRONMENT_HINT}");
                    }
                    Some(_) => {}
                    None => return Ended::Exited("the Runtime API stopped".to_owned()),
                },
                status = self.bootstrap.wait() => {
                    return Ended::Exited(status.map_or_else(|error| error.to_string(), |status| status.to_string()));
                }
                () = tokio::time::sleep_until(limit) => return Ended::TimedOut,
            }
        }
    }

    /// Deletes every message not in `failed`; returns how many were deleted.
    async fn delete_all_but(
        &self,
        messages: &[aws_sdk_sqs::types::Message],
        failed: &HashSet<String>,
    ) -> u64 {
        let receipts: Vec<ReceiptHandle> = messages
            .iter()
            .filter(|message| message.message_id.as_ref().is_none_or(|id| !failed.contains(id)))
            .filter_map(|message| message.receipt_handle.clone().map(ReceiptHandle))
            .collect();
        if receipts.is_empty() {
            return 0;
        }
        match self.queue.delete_batch(&receipts).await {
            Ok(entry_failures) => {
                for failure in &entry_failures {
                    crate::errln!("delete failed for entry {}: {}", failure.index, failure.error);
                }
                (receipts.len() - entry_failures.len()) as u64
            }
            Err(error) => {
                crate::errln!(
                    "DeleteMessageBatch failed ({error}); those messages come back after their visibility timeout"
                );
                0
            }
        }
    }
}

/// `errorType: errorMessage` from a Runtime API error document, or its text.
fn describe_error(error_type: Option<&str>, body: &[u8]) -> String {
    let document: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| {
        document
            .as_ref()
            .and_then(|doc| doc.get(name))
            .and_then(|value| value.as_str())
            .map(str::to_owned)
    };
    let kind = field("errorType")
        .or_else(|| error_type.map(str::to_owned))
        .unwrap_or_default();
    let message = field("errorMessage").unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let message = message.trim();
    if kind.is_empty() {
        return message.to_owned();
    }
    format!("{kind}: {message}")
}

/// An X-Ray style trace header: `Root=1-<epoch hex>-<24 hex>;Sampled=0`.
fn trace_id() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("Root=1-{seconds:08x}-{};Sampled=0", &random[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs_parse() {
        assert_eq!(
            parse_env_pair("A=b=c").unwrap(),
            ("A".to_owned(), "b=c".to_owned())
        );
        assert_eq!(parse_env_pair("A=").unwrap(), ("A".to_owned(), String::new()));
        assert!(parse_env_pair("=x").is_err());
        assert!(parse_env_pair("novalue").is_err());
    }

    #[test]
    fn errors_are_described_from_the_runtime_document() {
        let body =
            br#"{"errorType":"Conveyor.NotAnSqsEvent","errorMessage":"this function consumes SQS events"}"#;
        assert_eq!(
            describe_error(Some("unhandled"), body),
            "Conveyor.NotAnSqsEvent: this function consumes SQS events"
        );
        assert_eq!(describe_error(Some("Runtime.X"), b"boom"), "Runtime.X: boom");
    }

    #[test]
    fn trace_ids_have_the_xray_shape() {
        let id = trace_id();
        let root = id.strip_prefix("Root=1-").unwrap();
        let (time, rest) = root.split_once('-').unwrap();
        assert_eq!(time.len(), 8);
        assert!(rest.starts_with(&rest[..24]) && rest.ends_with(";Sampled=0"));
    }

    #[test]
    fn the_summary_names_every_count() {
        let summary = Summary {
            batches: 2,
            records: 11,
            deleted: 10,
            failures: 1,
            cold_starts: vec![Duration::from_micros(12_300)],
            ..Summary::default()
        };
        assert_eq!(
            summary.to_string(),
            "summary: 2 batches, 11 records, 10 deleted, 1 failures reported, 0 invocation errors, 0 timeouts, \
             0 restarts; cold start 12.3 ms (spawn to first /next)"
        );
    }
}
