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
//! Like the event source mapping, it runs up to `--maximum-concurrency` invocations at once, each in its
//! own execution environment ([`environment`]: a Runtime API endpoint and a bootstrap process): one
//! polls while the queue is quiet, one more joins after each full receive, and those above the first
//! stop polling when a receive comes back empty. On a FIFO queue a message group is in at most one
//! invocation at a time ([`fifo`]). An event over 6 MB is cut ([`poller::Poller::cut_to_payload`]).
//!
//! With `--concurrency N` one execution environment serves N invocations at once, as on Lambda Managed
//! Instances: the bootstrap gets `AWS_LAMBDA_MAX_CONCURRENCY=N`, its Runtime API holds up to N `next`
//! requests open, and each invocation carries its own request id and deadline header. The
//! `--maximum-concurrency` invocations of the run then share ⌈max / N⌉ environments (invocation
//! slots 1..=N in environment 1, N+1..=2N in environment 2, ...).
//!
//! Nothing here is specific to Conveyor's adapter: any bootstrap built on `lambda_runtime` (or any
//! other custom runtime) runs under it.

pub(crate) mod child;
pub(crate) mod environment;
pub(crate) mod fifo;
pub(crate) mod poller;
pub(crate) mod runtime_api;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_sdk_sqs::types::Message;
use conveyor_core::limits::MAX_RECEIVE_MESSAGES;
use conveyor_core::{
    message::ReceiptHandle,
    port::{Queue, VisibilityChange},
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::child::FunctionSettings;
use self::environment::{Ended, Environment};
use self::fifo::Groups;
use self::poller::{MAX_INVOCATION_PAYLOAD, Poller, Verdict, verdict};
use self::runtime_api::{Invocation, lock};
use crate::output::{Format, print_json};

/// Invocations in a row that failed to initialise, crashed or timed out before the runner reports a
/// crash loop (and goes on, as Lambda does).
const CRASH_LOOP: u32 = 3;

/// `conveyor lambda ...`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LambdaArgs {
    /// The Lambda command.
    #[command(subcommand)]
    pub command: LambdaCommand,
}

/// The Lambda commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum LambdaCommand {
    /// Run a bootstrap binary against a queue the way an SQS event source mapping does: serve the
    /// Lambda Runtime API on loopback, poll the queue, invoke with each batch, delete what succeeded.
    ///
    /// The function gets Lambda's variables (AWS_LAMBDA_RUNTIME_API, AWS_LAMBDA_FUNCTION_NAME, AWS_REGION,
    /// ...), then the runner's whole environment except the names Lambda reserves (the shell plays the
    /// part of the function's configured environment variables: WEBHOOK_SIGNING_SECRET=... works), then
    /// the --env pairs. --region reaches it as AWS_REGION; for the endpoint flags and --profile set
    /// AWS_ENDPOINT_URL_<SERVICE> (or AWS_ENDPOINT_URL) and AWS_PROFILE instead.
    Run(RunArgs),
}

/// Where a failing bootstrap's variables come from, said when it fails at init.
pub(crate) const ENVIRONMENT_HINT: &str = "the bootstrap gets this shell's environment (as a deployed function gets its \
    configured environment variables) plus each --env NAME=VALUE: set what it asks for either way, and on AWS \
    in the function's configuration (infra/modules/lambda-consumer's `environment`)";

/// Runs a `conveyor lambda` command with the CLI's SQS client.
pub(crate) async fn run_command(
    args: &LambdaArgs,
    client: aws_sdk_sqs::Client,
    format: Format,
) -> anyhow::Result<()> {
    match &args.command {
        LambdaCommand::Run(run_args) => run(run_args, client, format).await.map(|_| ()),
    }
}

/// `conveyor lambda run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
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
    /// The function timeout: the invocation deadline, after which the batch is left (it comes back after
    /// its visibility timeout) and the environment replaced.
    #[arg(long, default_value_t = 10)]
    pub function_timeout_secs: u64,
    /// Most invocations at once (the event source mapping's ScalingConfig MaximumConcurrency, 2-1000 on
    /// AWS; 1 runs one at a time): one more joins after each full receive, and they stop polling when a
    /// receive comes back empty.
    #[arg(long, default_value_t = 2)]
    pub maximum_concurrency: usize,
    /// Invocations one execution environment serves at once, as Lambda Managed Instances' per-environment
    /// maximum concurrency: the bootstrap gets AWS_LAMBDA_MAX_CONCURRENCY=N and up to N invocations are
    /// outstanding on its Runtime API, each with its own deadline. Unset: one at a time, and the variable
    /// unset, as on classic Lambda. At most --maximum-concurrency.
    #[arg(long)]
    pub concurrency: Option<usize>,
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
    /// Invoke as a function with X-Ray Active Tracing: the trace header says Sampled=1. Without it
    /// Sampled=0, as Lambda sends a function without Active Tracing (its default).
    #[arg(long)]
    pub active_tracing: bool,
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
        if fifo && self.batching_window_ms > 0 {
            bail!(
                "--batching-window-ms {} on a FIFO queue: an event source mapping on a FIFO queue takes no \
                 batching window (MaximumBatchingWindowInSeconds); drop the option",
                self.batching_window_ms
            );
        }
        if !(1..=1000).contains(&self.maximum_concurrency) {
            bail!(
                "--maximum-concurrency {} is outside 1..=1000 (AWS takes 2..=1000)",
                self.maximum_concurrency
            );
        }
        if let Some(concurrency) = self.concurrency
            && !(1..=self.maximum_concurrency).contains(&concurrency)
        {
            bail!(
                "--concurrency {concurrency} is outside 1..=--maximum-concurrency ({}): one environment cannot \
                 serve more invocations than the run makes at once; raise --maximum-concurrency",
                self.maximum_concurrency
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
pub(crate) struct Summary {
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
    /// Invocations that failed because the environment failed to initialise.
    pub init_errors: u64,
    /// Environments replaced after a timeout or a crash.
    pub restarts: u64,
    /// Most invocations running at once.
    pub peak_concurrency: usize,
    /// Records returned to the queue unrun because the batch was over the payload limit.
    pub cut: u64,
    /// Most invocations in a row that failed to initialise, crashed or timed out.
    pub longest_failure_streak: u32,
    /// Start-up time of each bootstrap process: spawn to its first `next` request.
    pub cold_starts: Vec<Duration>,
    /// From the first invocation's start to the last one's settlement.
    pub busy: Duration,
    /// The largest peak resident memory of the bootstrap processes running at the end (KiB; Linux).
    pub peak_rss_kib: Option<u64>,
}

impl Summary {
    /// The summary as one JSON document (`--output json`); durations in milliseconds.
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "batches": self.batches,
            "records": self.records,
            "deleted": self.deleted,
            "failures": self.failures,
            "invocation_errors": self.invocation_errors,
            "timeouts": self.timeouts,
            "init_errors": self.init_errors,
            "restarts": self.restarts,
            "peak_concurrency": self.peak_concurrency,
            "cut": self.cut,
            "longest_failure_streak": self.longest_failure_streak,
            "cold_starts_ms": self.cold_starts.iter().map(|start| millis(*start)).collect::<Vec<_>>(),
            "busy_ms": millis(self.busy),
            "bootstrap_peak_rss_kib": self.peak_rss_kib,
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "summary: {} batches, {} records, {} deleted, {} failures reported, {} invocation errors, \
             {} timeouts, {} init errors, {} restarts; at most {} invocations at once",
            self.batches,
            self.records,
            self.deleted,
            self.failures,
            self.invocation_errors,
            self.timeouts,
            self.init_errors,
            self.restarts,
            self.peak_concurrency,
        )?;
        if self.cut > 0 {
            write!(
                f,
                "; {} records over the 6 MB payload limit returned unrun",
                self.cut
            )?;
        }
        if self.longest_failure_streak >= CRASH_LOOP {
            write!(
                f,
                "; crash loop: {} failed invocations in a row",
                self.longest_failure_streak
            )?;
        }
        if let Some(first) = self.cold_starts.first() {
            write!(f, "; cold start {:.1} ms (spawn to first /next)", millis(*first))?;
        }
        if let Some(kib) = self.peak_rss_kib {
            write!(f, "; bootstrap peak RSS {:.1} MiB", kib as f64 / 1024.0)?;
        }
        if !self.busy.is_zero() {
            write!(
                f,
                "; {} records in {:.2} s ({:.0} records/s)",
                self.records,
                self.busy.as_secs_f64(),
                self.records as f64 / self.busy.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Runs until a stop condition (`--until-empty`, `--max-batches`, `--max-idle-secs`) or Ctrl-C; prints
/// one line per batch and the summary. Every bootstrap is killed on the way out, whatever happened.
pub(crate) async fn run(
    args: &RunArgs,
    client: aws_sdk_sqs::Client,
    format: Format,
) -> anyhow::Result<Summary> {
    let region = client
        .config()
        .region()
        .map_or_else(|| "us-east-1".to_owned(), |region| region.to_string());
    let queue_url = conveyor_sqs::admin::resolve_queue_url(&client, &args.queue_url).await?;
    let queue = conveyor_sqs::SqsQueue::connect(client.clone(), queue_url.clone())
        .await
        .with_context(|| format!("cannot read the attributes of {queue_url}"))?;
    let fifo = queue.is_fifo();
    args.validate(fifo)?;
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
    let settings = Arc::new(FunctionSettings {
        bootstrap: args.bootstrap.clone(),
        function_name: args.function_name.clone(),
        memory_mb: args.memory_mb,
        region: region.clone(),
        env: args.env.clone(),
        max_concurrency: args.concurrency,
    });
    let function_arn = format!(
        "arn:aws:lambda:{region}:{account}:function:{}",
        args.function_name
    );

    let (scale, _) = watch::channel(1usize);
    let (stop, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        args: args.clone(),
        lines_to_stderr: format != Format::Table,
        visibility: queue.visibility_timeout(),
        poller,
        queue,
        fifo,
        function_arn,
        summary: Mutex::new(Summary::default()),
        groups: Mutex::new(Groups::default()),
        scale,
        stop,
        reserved: AtomicU64::new(0),
        batch_numbers: AtomicU64::new(0),
        running: AtomicUsize::new(0),
        failure_streak: AtomicU32::new(0),
        last_message: Mutex::new(Instant::now()),
        busy: Mutex::new(None),
    });
    let per_environment = args.concurrency.unwrap_or(1);
    let mut environments = Vec::new();
    let mut lanes = JoinSet::new();
    for number in 1..=args.maximum_concurrency {
        if (number - 1) % per_environment == 0 {
            let environment = Environment::bind(environments.len() + 1, Arc::clone(&settings))
                .await
                .context("cannot bind the Runtime API on 127.0.0.1")?;
            environments.push(Arc::new(environment));
        }
        let Some(environment) = environments.last() else {
            bail!("no execution environment for invocation slot {number}");
        };
        lanes.spawn(lane(Arc::clone(&shared), number, Arc::clone(environment)));
    }
    let interrupt = crate::errors::ctrl_c();
    crate::errln!(
        "polling {} for function {} as its event source mapping would; Ctrl-C stops",
        queue_url,
        args.function_name
    );
    let mut interrupted = false;
    let outcome = tokio::select! {
        outcome = join_lanes(&mut lanes, &shared) => outcome,
        () = interrupt => {
            crate::errln!("interrupted: messages of an unfinished batch come back after their visibility timeout");
            interrupted = true;
            Ok(())
        }
    };
    lanes.shutdown().await;
    let mut peak_rss_kib = None;
    for environment in &environments {
        peak_rss_kib = peak_rss_kib.max(environment.shut_down().await);
    }
    let held = lock(&shared.groups).drain();
    shared.change_visibility(&held, Duration::ZERO).await;
    outcome?;
    let mut summary = lock(&shared.summary).clone();
    summary.peak_rss_kib = peak_rss_kib;
    if let Some((first, last)) = *lock(&shared.busy) {
        summary.busy = last - first;
    }
    if format == Format::Json {
        print_json(&summary.to_json())?;
    } else {
        crate::sayln!(format, "{summary}");
    }
    if interrupted {
        bail!(crate::errors::Interrupted(format!(
            "stopped by Ctrl-C after {} batches ({} records)",
            summary.batches, summary.records
        )));
    }
    Ok(summary)
}

/// Waits for every lane; the first error stops the others.
async fn join_lanes(lanes: &mut JoinSet<anyhow::Result<()>>, shared: &Shared) -> anyhow::Result<()> {
    while let Some(joined) = lanes.join_next().await {
        let result = joined
            .map_err(|error| anyhow::anyhow!("an invocation lane failed: {error}"))
            .and_then(|result| result);
        if let Err(error) = result {
            shared.stop.send_replace(true);
            return Err(error);
        }
    }
    Ok(())
}

/// What the lanes share.
struct Shared {
    args: RunArgs,
    /// `--output json` or `text`: the invocations' lines go to stderr; stdout carries only the summary
    /// (json) or nothing (text, whose stdout is rows only, and the run prints no table).
    lines_to_stderr: bool,
    poller: Poller,
    queue: conveyor_sqs::SqsQueue,
    fifo: bool,
    visibility: Duration,
    function_arn: String,
    summary: Mutex<Summary>,
    groups: Mutex<Groups>,
    /// How many environments are wanted now (1..=--maximum-concurrency).
    scale: watch::Sender<usize>,
    stop: watch::Sender<bool>,
    /// Batches started or about to be (for --max-batches).
    reserved: AtomicU64,
    batch_numbers: AtomicU64,
    running: AtomicUsize,
    failure_streak: AtomicU32,
    last_message: Mutex<Instant>,
    /// The first invocation's start and the last settlement's end.
    busy: Mutex<Option<(Instant, Instant)>>,
}

impl Shared {
    /// Prints one invocation's line: on stdout, or on stderr with `--output json`.
    fn say(&self, line: std::fmt::Arguments<'_>) {
        if self.lines_to_stderr {
            crate::errln!("{line}");
        } else {
            crate::outln!("{line}");
        }
    }

    /// Reserves a batch under --max-batches; false when the limit is reached.
    fn reserve_batch(&self) -> bool {
        let Some(max) = self.args.max_batches else {
            return true;
        };
        let reserved = self.reserved.fetch_add(1, Ordering::SeqCst);
        if reserved < max {
            return true;
        }
        self.reserved.fetch_sub(1, Ordering::SeqCst);
        false
    }

    fn unreserve_batch(&self) {
        if self.args.max_batches.is_some() {
            self.reserved.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A full receive: one more environment, up to the maximum (the event source mapping scales up
    /// while the queue has a backlog).
    fn scale_up(&self) {
        let max = self.args.maximum_concurrency;
        self.scale.send_if_modified(|wanted| {
            if *wanted >= max {
                return false;
            }
            *wanted += 1;
            true
        });
    }

    /// Environment `number` found the queue empty: it and those above it stop polling (the first one
    /// always polls).
    fn scale_down(&self, number: usize) {
        let keep = number.saturating_sub(1).max(1);
        self.scale.send_if_modified(|wanted| {
            if *wanted <= keep {
                return false;
            }
            *wanted = keep;
            true
        });
    }

    /// After an empty receive: true when a stop condition holds.
    async fn idle_stop(&self) -> anyhow::Result<bool> {
        if self.args.until_empty {
            let depth = self
                .queue
                .depth()
                .await
                .context("cannot read the queue's depth")?;
            if depth.visible + depth.in_flight + depth.delayed == 0 {
                return Ok(true);
            }
        }
        if let Some(idle) = self.args.max_idle_secs {
            return Ok(lock(&self.last_message).elapsed() >= Duration::from_secs(idle));
        }
        Ok(false)
    }

    /// Sets the visibility timeout of `messages` (0: visible again at once).
    async fn change_visibility(&self, messages: &[Message], timeout: Duration) {
        let changes: Vec<VisibilityChange> = messages
            .iter()
            .filter_map(|message| message.receipt_handle.clone())
            .map(|receipt| VisibilityChange {
                receipt_handle: ReceiptHandle(receipt),
                timeout,
            })
            .collect();
        if changes.is_empty() {
            return;
        }
        match self.queue.change_visibility_batch(&changes).await {
            Ok(failures) => {
                for failure in &failures {
                    crate::errln!(
                        "visibility change failed for entry {}: {}",
                        failure.index,
                        failure.error
                    );
                }
            }
            Err(error) => crate::errln!(
                "ChangeMessageVisibilityBatch failed ({error}); those messages come back after their visibility timeout"
            ),
        }
    }
}

/// One invocation slot's loop (slot `number` of the run, in `environment`): poll (or take held FIFO
/// messages), invoke, settle, while it is wanted.
async fn lane(shared: Arc<Shared>, number: usize, environment: Arc<Environment>) -> anyhow::Result<()> {
    let result = lane_loop(&shared, number, &environment).await;
    if result.is_err() {
        shared.stop.send_replace(true);
    }
    result
}

async fn lane_loop(shared: &Shared, number: usize, environment: &Environment) -> anyhow::Result<()> {
    let mut wanted = shared.scale.subscribe();
    let mut stop = shared.stop.subscribe();
    loop {
        // Park while this environment is not wanted.
        while *wanted.borrow_and_update() < number && !*stop.borrow() {
            tokio::select! {
                _ = wanted.changed() => {}
                _ = stop.changed() => {}
            }
        }
        if *stop.borrow() {
            return Ok(());
        }
        if !shared.reserve_batch() {
            shared.stop.send_replace(true);
            return Ok(());
        }
        let held = if shared.fifo {
            lock(&shared.groups).take_ready(number, shared.args.batch_size)
        } else {
            Vec::new()
        };
        if !held.is_empty() {
            // SQS would hand these out now: give them a fresh visibility timeout, as a receive does.
            shared.change_visibility(&held, shared.visibility).await;
            invoke(shared, number, environment, held).await?;
            continue;
        }
        let messages = shared.poller.next_batch().await?;
        if messages.is_empty() {
            shared.unreserve_batch();
            shared.scale_down(number);
            if shared.idle_stop().await? {
                shared.stop.send_replace(true);
                return Ok(());
            }
            continue;
        }
        *lock(&shared.last_message) = Instant::now();
        if messages.len() >= shared.args.batch_size.min(MAX_RECEIVE_MESSAGES) {
            shared.scale_up();
        }
        let (messages, rest) = shared.poller.cut_to_payload(messages, MAX_INVOCATION_PAYLOAD);
        if !rest.is_empty() {
            shared.change_visibility(&rest, Duration::ZERO).await;
            lock(&shared.summary).cut += rest.len() as u64;
            shared.say(format_args!(
                "environment {}: batch cut to {} records to fit the 6 MB invocation payload limit; \
                 {} returned to the queue (visible again at once)",
                environment.number(),
                messages.len(),
                rest.len()
            ));
        }
        let messages = if shared.fifo {
            let (run, held) = lock(&shared.groups).admit(number, messages);
            if held > 0 {
                shared.say(format_args!(
                    "environment {}: {held} records held: their message group is in flight in another \
                     invocation (SQS would not have delivered them yet)",
                    environment.number()
                ));
            }
            run
        } else {
            messages
        };
        if messages.is_empty() {
            shared.unreserve_batch();
            continue;
        }
        invoke(shared, number, environment, messages).await?;
    }
}

/// One invocation with `messages`, then its settlement: deletes what succeeded, leaves the rest.
async fn invoke(
    shared: &Shared,
    lane: usize,
    environment: &Environment,
    messages: Vec<Message>,
) -> anyhow::Result<()> {
    let number = environment.number();
    let batch = shared.batch_numbers.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let mut summary = lock(&shared.summary);
        summary.batches += 1;
        summary.records += messages.len() as u64;
    }
    let event = serde_json::to_vec(&shared.poller.event(&messages)).context("encoding the SqsEvent")?;
    let timeout = Duration::from_secs(shared.args.function_timeout_secs);
    let running = shared.running.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let mut summary = lock(&shared.summary);
        summary.peak_concurrency = summary.peak_concurrency.max(running);
    }
    let started = Instant::now();
    let invoked = environment
        .invoke(Invocation {
            id: uuid::Uuid::new_v4().to_string(),
            body: event,
            timeout,
            function_arn: shared.function_arn.clone(),
            trace_id: trace_id(shared.args.active_tracing),
        })
        .await;
    let answered = Instant::now();
    shared.running.fetch_sub(1, Ordering::SeqCst);
    if let Some(cold_start) = invoked.cold_start {
        lock(&shared.summary).cold_starts.push(cold_start);
    }
    let elapsed = millis(answered - started);
    let before_deadline = invoked.deadline.map_or_else(String::new, |deadline| {
        format!(
            ", {:.0} ms before the deadline",
            millis(deadline.saturating_duration_since(answered))
        )
    });
    let prefix = format!("batch {batch}: {} records", messages.len());
    let suffix = format!("{elapsed:.0} ms{before_deadline} (environment {number})");
    let mut deleted = HashSet::new();
    let failed_environment = invoked.ended.replaces_environment();
    match invoked.ended {
        Ended::Response(body) => {
            let ids: HashSet<String> = messages.iter().filter_map(|m| m.message_id.clone()).collect();
            match verdict(&body, &ids) {
                Verdict::Partial(failed) => {
                    deleted = shared.delete_all_but(&messages, &failed).await;
                    let mut summary = lock(&shared.summary);
                    summary.deleted += deleted.len() as u64;
                    summary.failures += failed.len() as u64;
                    drop(summary);
                    shared.say(format_args!("{prefix}, {} failures, {suffix}", failed.len()));
                }
                Verdict::WholeBatchFailed(reason) => {
                    lock(&shared.summary).invocation_errors += 1;
                    shared.say(format_args!(
                        "{prefix}, response refused ({reason}), batch left in the queue, {suffix}"
                    ));
                }
            }
        }
        Ended::Error { error_type, body } => {
            lock(&shared.summary).invocation_errors += 1;
            shared.say(format_args!(
                "{prefix}, invocation error ({}), batch left in the queue, {suffix}",
                describe_error(error_type.as_deref(), &body)
            ));
        }
        Ended::TimedOut => {
            let mut summary = lock(&shared.summary);
            summary.timeouts += 1;
            summary.restarts += 1;
            drop(summary);
            shared.say(format_args!(
                "{prefix}, timed out after {} s, batch left in the queue (back after its visibility timeout); \
                 the environment is replaced (environment {number})",
                timeout.as_secs()
            ));
        }
        Ended::Exited(status) => {
            let mut summary = lock(&shared.summary);
            summary.invocation_errors += 1;
            summary.restarts += 1;
            drop(summary);
            shared.say(format_args!(
                "{prefix}, the bootstrap exited ({status}), batch left in the queue (back after its visibility \
                 timeout); the environment is replaced (environment {number})"
            ));
        }
        Ended::Undelivered => {
            let mut summary = lock(&shared.summary);
            summary.invocation_errors += 1;
            summary.restarts += 1;
            drop(summary);
            shared.say(format_args!(
                "{prefix}, the bootstrap's connection failed, batch left in the queue (back after its visibility \
                 timeout); the environment is replaced (environment {number})"
            ));
        }
        Ended::InitFailed(reason) => {
            lock(&shared.summary).init_errors += 1;
            shared.say(format_args!(
                "{prefix}, init error, batch left in the queue (back after its visibility timeout); the next \
                 invocation initialises again (environment {number}): {reason}"
            ));
        }
    }
    if failed_environment {
        let streak = shared.failure_streak.fetch_add(1, Ordering::SeqCst) + 1;
        {
            let mut summary = lock(&shared.summary);
            summary.longest_failure_streak = summary.longest_failure_streak.max(streak);
        }
        if streak == CRASH_LOOP || (streak > CRASH_LOOP && streak.is_multiple_of(10)) {
            crate::errln!(
                "crash loop: {streak} invocations in a row failed to initialise, crashed or timed out; the runner \
                 goes on as Lambda does (each batch comes back after its visibility timeout, and to the DLQ after \
                 maxReceiveCount); the bootstrap's output is above (bootstrap| lines)"
            );
        }
    } else {
        shared.failure_streak.store(0, Ordering::SeqCst);
    }
    {
        let mut busy = lock(&shared.busy);
        let first = busy.map_or(started, |(first, _)| first.min(started));
        *busy = Some((first, Instant::now()));
    }
    if shared.fifo {
        let released = lock(&shared.groups).finish(lane, &messages, &deleted);
        if released > 0 {
            shared.say(format_args!(
                "environment {number}: {released} held records of a group with failed records stay in flight and \
                 come back after their visibility timeout, behind them"
            ));
        }
    }
    Ok(())
}

impl Shared {
    /// Deletes every message not in `failed`; returns the ids deleted.
    async fn delete_all_but(&self, messages: &[Message], failed: &HashSet<String>) -> HashSet<String> {
        let chosen: Vec<&Message> = messages
            .iter()
            .filter(|message| message.message_id.as_ref().is_none_or(|id| !failed.contains(id)))
            .filter(|message| message.receipt_handle.is_some())
            .collect();
        let receipts: Vec<ReceiptHandle> = chosen
            .iter()
            .filter_map(|message| message.receipt_handle.clone().map(ReceiptHandle))
            .collect();
        if receipts.is_empty() {
            return HashSet::new();
        }
        let failures = match self.queue.delete_batch(&receipts).await {
            Ok(entry_failures) => entry_failures,
            Err(error) => {
                crate::errln!(
                    "DeleteMessageBatch failed ({error}); those messages come back after their visibility timeout"
                );
                return HashSet::new();
            }
        };
        let mut not_deleted = HashSet::new();
        for failure in &failures {
            crate::errln!("delete failed for entry {}: {}", failure.index, failure.error);
            not_deleted.insert(failure.index);
        }
        chosen
            .iter()
            .enumerate()
            .filter(|(index, _)| !not_deleted.contains(index))
            .filter_map(|(_, message)| message.message_id.clone())
            .collect()
    }
}

/// `errorType: errorMessage` from a Runtime API error document, or its text.
pub(crate) fn describe_error(error_type: Option<&str>, body: &[u8]) -> String {
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

/// The trace header Lambda sends (`Lambda-Runtime-Trace-Id`):
/// `Root=1-<epoch hex>-<24 hex>;Parent=<16 hex>;Sampled=0|1;Lineage=1:<8 hex>:0`, `Sampled=1` for a
/// function with X-Ray Active Tracing.
fn trace_id(sampled: bool) -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let random = uuid::Uuid::new_v4().simple().to_string();
    let parent = uuid::Uuid::new_v4().simple().to_string();
    format!(
        "Root=1-{seconds:08x}-{};Parent={};Sampled={};Lineage=1:{}:0",
        &random[..24],
        &parent[..16],
        u8::from(sampled),
        &parent[16..24]
    )
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

    fn args(extra: &[&str]) -> RunArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let bootstrap = std::env::current_exe().unwrap();
        let mut argv = vec![
            "run".to_owned(),
            "--queue-url".to_owned(),
            "jobs".to_owned(),
            "--bootstrap".to_owned(),
            bootstrap.display().to_string(),
        ];
        argv.extend(extra.iter().map(|arg| (*arg).to_owned()));
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().run
    }

    #[test]
    fn what_an_event_source_mapping_refuses_is_refused() {
        let defaults = args(&[]);
        assert_eq!(defaults.maximum_concurrency, 2);
        assert!(defaults.validate(true).is_ok() && defaults.validate(false).is_ok());
        let window = args(&["--batching-window-ms", "500"]);
        assert!(window.validate(false).is_ok());
        let refused = window.validate(true).unwrap_err().to_string();
        assert!(
            refused.contains("FIFO queue takes no batching window"),
            "{refused}"
        );
        assert!(
            args(&["--batch-size", "20", "--batching-window-ms", "1000"])
                .validate(false)
                .is_ok()
        );
        assert!(args(&["--batch-size", "20"]).validate(false).is_err());
        assert!(args(&["--maximum-concurrency", "0"]).validate(false).is_err());
        assert!(args(&["--maximum-concurrency", "1001"]).validate(false).is_err());
        assert!(args(&["--function-timeout-secs", "901"]).validate(false).is_err());
        assert!(args(&["--concurrency", "2"]).validate(false).is_ok());
        let refused = args(&["--concurrency", "3"])
            .validate(false)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("raise --maximum-concurrency"), "{refused}");
        assert!(args(&["--concurrency", "0"]).validate(false).is_err());
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
    fn trace_headers_have_lambdas_shape() {
        for sampled in [false, true] {
            let header = trace_id(sampled);
            let parts: Vec<&str> = header.split(';').collect();
            assert_eq!(parts.len(), 4, "{header}");
            let root = parts[0].strip_prefix("Root=1-").unwrap();
            let (time, random) = root.split_once('-').unwrap();
            assert_eq!((time.len(), random.len()), (8, 24), "{header}");
            let parent = parts[1].strip_prefix("Parent=").unwrap();
            assert!(
                parent.len() == 16 && parent.chars().all(|c| c.is_ascii_hexdigit()),
                "{header}"
            );
            let expected = if sampled { "Sampled=1" } else { "Sampled=0" };
            assert_eq!(parts[2], expected);
            assert!(parts[3].starts_with("Lineage=1:"), "{header}");
        }
    }

    #[test]
    fn the_summary_names_every_count() {
        let summary = Summary {
            batches: 2,
            records: 11,
            deleted: 10,
            failures: 1,
            peak_concurrency: 2,
            cut: 3,
            longest_failure_streak: 4,
            cold_starts: vec![Duration::from_micros(12_300)],
            busy: Duration::from_millis(500),
            peak_rss_kib: Some(9728),
            ..Summary::default()
        };
        assert_eq!(
            summary.to_string(),
            "summary: 2 batches, 11 records, 10 deleted, 1 failures reported, 0 invocation errors, 0 timeouts, \
             0 init errors, 0 restarts; at most 2 invocations at once; 3 records over the 6 MB payload limit \
             returned unrun; crash loop: 4 failed invocations in a row; cold start 12.3 ms (spawn to first /next); \
             bootstrap peak RSS 9.5 MiB; 11 records in 0.50 s (22 records/s)"
        );
    }
}
