//! The worker with idempotency on (figures, not pass/fail), against LocalStack and DynamoDB Local:
//!
//! ```text
//! cargo run --release -p conveyor-worker --example bench_idempotent
//! ```
//!
//! (a) the store's ceiling on this machine: `N` loops doing only a claim and a complete on fresh keys
//!     (what the worker adds per job), at N = 100 and N = 10;
//! (b) no-op jobs through the worker with the DynamoDB store at `max_in_flight` 100 and 10: jobs/s, its
//!     ratio to (a) at the same concurrency, SQS and DynamoDB requests per job, messages per receive;
//! (c) latency from `SendMessage` to the handler's start: on an idle queue (one job at a time), and
//!     under a steady load (jobs sent at a fixed rate while the worker runs); p50 and p99;
//! (d) send → success for a job that fails once (retryable) and succeeds on its retry, with the default
//!     backoff;
//! (e) send → handler start through the local Lambda runner (`conveyor lambda run`, the event source
//!     mapping's poll loop, with its defaults: batches of 10, no batching window, 2 concurrent
//!     invocations) and a function on the same DynamoDB store (`conveyor-lambda`'s `probe_function`
//!     example): idle and under a steady load. `make bench` builds both first (release).
//!
//! Sizes: `BENCH_SQS_MESSAGES` (default 3000) jobs for (a) and (b); 200 probes for (c), 20 for (d), 200
//! idle and 1000 steady for (e).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use conveyor_core::message::{Message, ReceiptHandle};
use conveyor_core::port::{
    ClaimOutcome, ClaimRequest, DeadLetter, EntryFailure, IdempotencyStore, OutgoingMessage, Queue,
    QueueDepth, QueueError, VisibilityChange,
};
use conveyor_core::runtime::Failure;
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{self, QueueSpec, create_queue, create_table, ensure_local_aws};
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use conveyor_worker::{Worker, WorkerStatus};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

/// No step may hang longer than this.
const BENCH_TIMEOUT: Duration = Duration::from_secs(600);

/// A job carrying when it was sent (microseconds since the epoch) and whether it fails its first run.
#[derive(serde::Deserialize)]
struct Probe {
    sent_us: u64,
    #[serde(default)]
    fail_first: bool,
}

/// Records send → start (and send → success) of each run.
#[derive(Default)]
struct Latencies {
    starts: Mutex<Vec<Duration>>,
    successes: Mutex<Vec<Duration>>,
}

struct Timed(Arc<Latencies>);

fn since(sent_us: u64) -> Duration {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(Duration::from_micros(sent_us))
}

fn now_us() -> u64 {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_micros()).unwrap_or(u64::MAX)
}

impl Handler for Timed {
    type Job = Probe;
    type Output = ();
    const JOB_TYPE: &'static str = "probe";

    async fn handle(&self, job: Probe, ctx: Context) -> Result<(), HandlerError> {
        let waited = since(job.sent_us);
        if ctx.receive_count() == 1 {
            self.0.starts.lock().unwrap().push(waited);
        }
        if job.fail_first && ctx.receive_count() == 1 {
            return Err(HandlerError::retryable("fails its first run"));
        }
        self.0.successes.lock().unwrap().push(waited);
        Ok(())
    }
}

/// The queue, with its receives and the messages they returned counted.
struct CountingQueue {
    inner: Arc<SqsQueue>,
    receives: AtomicU64,
    received: AtomicU64,
}

#[async_trait]
impl Queue for CountingQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }
    fn visibility_timeout(&self) -> Duration {
        self.inner.visibility_timeout()
    }
    fn max_receive_count(&self) -> Option<u32> {
        self.inner.max_receive_count()
    }
    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility_timeout: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        let messages = self
            .inner
            .receive_with_visibility(max_messages, wait, visibility_timeout)
            .await?;
        self.receives.fetch_add(1, Ordering::Relaxed);
        self.received.fetch_add(messages.len() as u64, Ordering::Relaxed);
        Ok(messages)
    }
    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        self.inner.delete_batch(receipts).await
    }
    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        self.inner.change_visibility_batch(changes).await
    }
    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        self.inner.send(message).await
    }
    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        self.inner.dead_letter(message, failure).await
    }
    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.inner.depth().await
    }
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn percentile(samples: &[Duration], fraction: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

async fn fill(client: &aws_sdk_sqs::Client, url: &str, count: usize) {
    futures_util::stream::iter(
        (0..count)
            .collect::<Vec<_>>()
            .chunks(10)
            .map(<[usize]>::to_vec)
            .collect::<Vec<_>>(),
    )
    .for_each_concurrent(16, |chunk| async move {
        let entries = chunk
            .iter()
            .map(|id| {
                SendMessageBatchRequestEntry::builder()
                    .id(id.to_string())
                    .message_body(format!("{{\"sent_us\":{}}}", now_us()))
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
    })
    .await;
}

/// (a): `loops` loops of claim + complete on fresh keys until `count` jobs; jobs/s.
async fn store_ceiling(store: Arc<DynamoStore>, count: usize, loops: usize) -> f64 {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..loops)
        .map(|_| {
            let (store, next) = (Arc::clone(&store), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count as u64 {
                        return;
                    }
                    let now = SystemTime::now();
                    let request = ClaimRequest {
                        key: format!("ceiling-{loops}-{n}"),
                        lease_until: now + Duration::from_secs(60),
                        expires_at: now + Duration::from_secs(3600),
                        validation: None,
                        restart_runs: false,
                        last_attempt: false,
                    };
                    let ClaimOutcome::Acquired(claim) = store.claim(&request).await.unwrap() else {
                        panic!("a fresh key was not free");
                    };
                    store
                        .complete(&claim, None, now + Duration::from_secs(3600))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    count as f64 / started.elapsed().as_secs_f64()
}

struct Run {
    jobs_per_second: f64,
    sqs_per_job: f64,
    dynamodb_per_job: f64,
    messages_per_receive: f64,
}

fn worker(
    queue: Arc<CountingQueue>,
    store: Arc<DynamoStore>,
    max_in_flight: usize,
    latencies: Arc<Latencies>,
) -> Worker {
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(queue.inner.url())])
        .with_max_in_flight(max_in_flight)
        .with_listen_addr(None);
    let pipeline = Pipeline::new(Router::single(Timed(latencies))).with_store(store);
    Worker::new(config, pipeline, vec![queue as Arc<dyn Queue>]).unwrap()
}

async fn counting_queue(client: &aws_sdk_sqs::Client, name: &str) -> Arc<CountingQueue> {
    let created = create_queue(client, &QueueSpec::standard(name)).await.unwrap();
    Arc::new(CountingQueue {
        inner: Arc::new(SqsQueue::connect(client.clone(), &created.url).await.unwrap()),
        receives: AtomicU64::new(0),
        received: AtomicU64::new(0),
    })
}

/// Runs `worker` until `done(status)`, calling `during` meanwhile; returns the elapsed time.
async fn run_until(
    worker: Worker,
    during: impl Future<Output = ()>,
    done: impl Fn(&WorkerStatus) -> bool,
) -> Duration {
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    during.await;
    conveyor_testing::wait_until(BENCH_TIMEOUT, Duration::from_millis(2), async || done(&status))
        .await
        .expect("the benchmark run did not finish: is the local stack healthy?");
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    elapsed
}

/// (b): the worker on a pre-filled queue of `count` jobs with the DynamoDB store.
async fn worker_with_store(
    client: &aws_sdk_sqs::Client,
    store: Arc<DynamoStore>,
    count: usize,
    max_in_flight: usize,
) -> Run {
    let queue = counting_queue(client, &format!("bench-idem-{max_in_flight}")).await;
    fill(client, queue.inner.url(), count).await;
    let (sqs_before, store_before) = (queue.inner.requests(), store.requests());
    let latencies = Arc::new(Latencies::default());
    let worker = worker(Arc::clone(&queue), Arc::clone(&store), max_in_flight, latencies);
    let elapsed = run_until(worker, async {}, |status| {
        status.report().succeeded >= count as u64
    })
    .await;
    let receives = queue.receives.load(Ordering::Relaxed);
    Run {
        jobs_per_second: count as f64 / elapsed.as_secs_f64(),
        sqs_per_job: (queue.inner.requests() - sqs_before) as f64 / count as f64,
        dynamodb_per_job: (store.requests() - store_before) as f64 / count as f64,
        messages_per_receive: queue.received.load(Ordering::Relaxed) as f64 / receives.max(1) as f64,
    }
}

/// (c) and (d): probes sent `every` apart (idle: one at a time) while the worker runs.
async fn probes(
    client: &aws_sdk_sqs::Client,
    store: Arc<DynamoStore>,
    name: &str,
    count: usize,
    every: Duration,
    fail_first: bool,
) -> Arc<Latencies> {
    let queue = counting_queue(client, name).await;
    let latencies = Arc::new(Latencies::default());
    let worker = worker(Arc::clone(&queue), store, 100, Arc::clone(&latencies));
    let url = queue.inner.url().to_owned();
    let sending = async {
        // Let the worker's first long polls start, as on a running service.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut ticks = tokio::time::interval(every);
        for _ in 0..count {
            ticks.tick().await;
            client
                .send_message()
                .queue_url(&url)
                .message_body(format!(
                    "{{\"sent_us\":{},\"fail_first\":{fail_first}}}",
                    now_us()
                ))
                .send()
                .await
                .unwrap();
        }
    };
    run_until(worker, sending, |status| {
        status.report().succeeded >= count as u64
    })
    .await;
    latencies
}

/// A release binary `make bench` builds beside this one (`target/release/<relative>`).
fn release_binary(relative: &str, build: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let release = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = release.join(relative);
    assert!(
        path.is_file(),
        "{} is missing: build it with `{build}` (make bench does)",
        path.display()
    );
    path
}

/// (e): `count` probes sent `every` apart through `conveyor lambda run` and the probe function; the
/// send → start of each first run.
async fn lambda_runner_probes(
    client: &aws_sdk_sqs::Client,
    table: &str,
    name: &str,
    count: usize,
    every: Duration,
) -> Vec<Duration> {
    let conveyor = release_binary("conveyor", "cargo build --release -p conveyor-cli --bin conveyor");
    let function = release_binary(
        "examples/probe_function",
        "cargo build --release -p conveyor-lambda --example probe_function",
    );
    // Six function timeouts (the runner's default is 10 s), as AWS advises for a mapping's queue.
    let queue = create_queue(client, &QueueSpec::standard(name).visibility_timeout_secs(60))
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!("{}.log", localstack::unique_name(name)));
    let mut runner = tokio::process::Command::new(conveyor)
        .args(["lambda", "run", "--queue-url", &queue.url, "--bootstrap"])
        .arg(function)
        .arg("--env")
        .arg(format!("CONVEYOR_PROBE_LOG={}", log.display()))
        .arg("--env")
        .arg(format!("CONVEYOR_IDEMPOTENCY_TABLE={table}"))
        .envs(localstack::aws_env())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Let the runner start its function and its first long poll, as on a running mapping.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut ticks = tokio::time::interval(every);
    for _ in 0..count {
        ticks.tick().await;
        client
            .send_message()
            .queue_url(&queue.url)
            .message_body(format!("{{\"sent_us\":{}}}", now_us()))
            .message_attributes(
                "conveyor.type",
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("probe")
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
    }
    let read = || -> Vec<Duration> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .map(Duration::from_micros)
            .collect()
    };
    let deadline = Instant::now() + BENCH_TIMEOUT;
    while read().len() < count {
        assert!(
            Instant::now() < deadline,
            "the Lambda runner did not start {count} probes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runner.kill().await.unwrap();
    let starts = read();
    let _ = std::fs::remove_file(&log);
    starts
}

fn main() {
    let count = size("BENCH_SQS_MESSAGES", 3_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        ensure_local_aws().await.unwrap();
        let sqs = localstack::sqs_client().await;
        let dynamodb = localstack::dynamodb_client().await;
        let table = create_table(&dynamodb, "bench-idem").await.unwrap();
        let store = Arc::new(DynamoStore::new(dynamodb, &table));

        let ceiling_100 = store_ceiling(Arc::clone(&store), count, 100).await;
        let ceiling_10 = store_ceiling(Arc::clone(&store), count, 10).await;
        let at_100 = worker_with_store(&sqs, Arc::clone(&store), count, 100).await;
        let at_10 = worker_with_store(&sqs, Arc::clone(&store), count, 10).await;
        let idle = probes(&sqs, Arc::clone(&store), "bench-idle", 200, Duration::from_millis(50), false).await;
        let steady_rate = (at_100.jobs_per_second / 2.0).max(1.0);
        let steady = probes(
            &sqs,
            Arc::clone(&store),
            "bench-steady",
            count,
            Duration::from_secs_f64(1.0 / steady_rate),
            false,
        )
        .await;
        let retried = probes(&sqs, Arc::clone(&store), "bench-retry", 20, Duration::from_millis(200), true).await;
        let lambda_idle = lambda_runner_probes(&sqs, &table, "bench-lambda-idle", 200, Duration::from_millis(50)).await;
        let lambda_rate = 100.0;
        let lambda_steady = lambda_runner_probes(
            &sqs,
            &table,
            "bench-lambda-steady",
            1_000,
            Duration::from_secs_f64(1.0 / lambda_rate),
        )
        .await;

        println!();
        println!("| measure | figure | target |");
        println!("|---|---|---|");
        for (loops, ceiling, run) in [(100, ceiling_100, &at_100), (10, ceiling_10, &at_10)] {
            println!(
                "| (a) the store's ceiling: {loops} loops of claim + complete, {count} jobs | {ceiling:.0} jobs/s | |"
            );
            println!(
                "| (b) worker with the DynamoDB store, max_in_flight {loops}, {count} no-op jobs | {:.0} jobs/s ({:.2}x of a) | >= 0.8x |",
                run.jobs_per_second,
                run.jobs_per_second / ceiling
            );
            println!(
                "| (b) SQS requests per job, messages per receive, DynamoDB requests per job | {:.3}, {:.1}, {:.2} | <= 0.21, 2.00 |",
                run.sqs_per_job, run.messages_per_receive, run.dynamodb_per_job
            );
        }
        let starts = |latencies: &Latencies| latencies.starts.lock().unwrap().clone();
        let idle_starts = starts(&idle);
        let steady_starts = starts(&steady);
        println!(
            "| (c) send → start, idle queue, 200 jobs one at a time | p50 {:.1} ms, p99 {:.1} ms | p50 < 50 ms |",
            millis(percentile(&idle_starts, 0.5)),
            millis(percentile(&idle_starts, 0.99))
        );
        println!(
            "| (c) send → start, steady load of {steady_rate:.0} jobs/s (half of b at 100), {count} jobs | p50 {:.1} ms, p99 {:.1} ms | |",
            millis(percentile(&steady_starts, 0.5)),
            millis(percentile(&steady_starts, 0.99))
        );
        let successes = retried.successes.lock().unwrap().clone();
        println!(
            "| (d) send → success of a job that fails once, default backoff, 20 jobs | p50 {:.0} ms, p99 {:.0} ms | |",
            millis(percentile(&successes, 0.5)),
            millis(percentile(&successes, 0.99))
        );
        println!(
            "| (e) send → start, `conveyor lambda run` (batch 10, no window), idle queue, 200 jobs one at a time | p50 {:.1} ms, p99 {:.1} ms | |",
            millis(percentile(&lambda_idle, 0.5)),
            millis(percentile(&lambda_idle, 0.99))
        );
        println!(
            "| (e) send → start, `conveyor lambda run`, steady load of {lambda_rate:.0} jobs/s, 1000 jobs | p50 {:.1} ms, p99 {:.1} ms | |",
            millis(percentile(&lambda_steady, 0.5)),
            millis(percentile(&lambda_steady, 0.99))
        );
    });
}
