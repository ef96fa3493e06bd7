//! Throughput and memory figures for the worker (figures, not pass/fail):
//!
//! ```text
//! cargo run --release -p conveyor-worker --example bench
//! ```
//!
//! (a) LocalStack's raw capacity: 4 loops of ReceiveMessage(10) + DeleteMessageBatch on a pre-filled
//!     queue (the same number of loops the worker runs at max_in_flight = 100);
//! (b) no-op jobs/s through the worker against LocalStack on a same-size queue, and SQS requests per job,
//!     at max_in_flight 100 and at max_in_flight 10;
//! (c) no-op jobs/s against MemoryQueue on a single-threaded runtime (one core);
//! (d) resident memory with 500 jobs in flight (handlers waiting on a `Notify`).
//!
//! Sizes: `BENCH_SQS_MESSAGES` (default 5000) and `BENCH_MEMORY_MESSAGES` (default 500000).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use conveyor_core::{
    port::Queue,
    {Context, Handler, HandlerError, Pipeline, Router},
};
use conveyor_sqs::SqsQueue;
use conveyor_testing::MemoryQueue;
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use conveyor_worker::{Worker, WorkerStatus};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A handler that does nothing.
struct Noop;

impl Handler for Noop {
    type Job = serde::de::IgnoredAny;
    type Output = ();
    const JOB_TYPE: &'static str = "noop";

    async fn handle(&self, _job: serde::de::IgnoredAny, _ctx: Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A handler that waits until released.
struct Parked {
    release: Arc<Notify>,
    started: Arc<AtomicUsize>,
}

impl Handler for Parked {
    type Job = serde::de::IgnoredAny;
    type Output = ();
    const JOB_TYPE: &'static str = "parked";

    async fn handle(&self, _job: serde::de::IgnoredAny, _ctx: Context) -> Result<(), HandlerError> {
        let released = self.release.notified();
        self.started.fetch_add(1, Ordering::SeqCst);
        released.await;
        Ok(())
    }
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn config(url: &str, max_in_flight: usize) -> WorkerConfig {
    WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(url)])
        .with_max_in_flight(max_in_flight)
        .with_listen_addr(None)
}

/// No benchmark step may hang longer than this.
const BENCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `worker` until `done(status)`; returns the elapsed time.
async fn run_until(worker: Worker, done: impl Fn(&WorkerStatus) -> bool) -> Duration {
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    conveyor_testing::wait_until(BENCH_TIMEOUT, Duration::from_millis(2), async || done(&status))
        .await
        .expect("the benchmark run did not finish: is the local stack healthy?");
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    elapsed
}

async fn fill_sqs(client: &aws_sdk_sqs::Client, url: &str, count: usize) {
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
                    .message_body(format!("{{\"n\":{id}}}"))
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

/// (a): 4 loops of receive-10 + delete-batch until `count` messages were deleted; timed until the
/// last delete (not until the loops' last, empty, long polls return).
async fn raw_capacity(queue: Arc<SqsQueue>, count: usize) -> f64 {
    let deleted = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (queue, deleted) = (Arc::clone(&queue), Arc::clone(&deleted));
            tokio::spawn(async move {
                let mut finished = None;
                while deleted.load(Ordering::SeqCst) < count {
                    let messages = queue.receive(10, Duration::from_secs(1)).await.unwrap();
                    if messages.is_empty() {
                        continue;
                    }
                    let receipts: Vec<_> = messages.iter().map(|m| m.receipt_handle.clone()).collect();
                    queue.delete_batch(&receipts).await.unwrap();
                    if deleted.fetch_add(receipts.len(), Ordering::SeqCst) + receipts.len() >= count {
                        finished = Some(Instant::now());
                    }
                }
                finished
            })
        })
        .collect();
    let mut finished = None;
    for handle in loops {
        finished = finished.or(handle.await.unwrap());
    }
    count as f64 / (finished.unwrap_or_else(Instant::now) - started).as_secs_f64()
}

/// (b): the worker on a pre-filled LocalStack queue of `count` no-op jobs; (jobs/s, SQS requests per job).
async fn worker_on_localstack(
    client: &aws_sdk_sqs::Client,
    name: &str,
    count: usize,
    max_in_flight: usize,
) -> (f64, f64) {
    let created = create_queue(client, &QueueSpec::standard(name)).await.unwrap();
    fill_sqs(client, &created.url, count).await;
    let queue = Arc::new(SqsQueue::connect(client.clone(), &created.url).await.unwrap());
    let before = queue.requests();
    let pipeline = Pipeline::new(Router::single(Noop));
    let worker = Worker::new(
        config(&created.url, max_in_flight),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap();
    let elapsed = run_until(worker, |status| status.report().succeeded >= count as u64).await;
    let requests = queue.requests() - before;
    (
        count as f64 / elapsed.as_secs_f64(),
        requests as f64 / count as f64,
    )
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    let sqs_messages = size("BENCH_SQS_MESSAGES", 5_000);
    let memory_messages = size("BENCH_MEMORY_MESSAGES", 500_000);
    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();

    // (d) first, while the process is fresh: memory with 500 jobs in flight.
    let (idle_rss, busy_rss) = multi.block_on(async {
        let idle = resident_mib();
        let queue =
            Arc::new(MemoryQueue::standard("parked").with_visibility_timeout(Duration::from_secs(300)));
        for n in 0..500 {
            queue.push(format!("{{\"n\":{n}}}")).unwrap();
        }
        let release = Arc::new(Notify::new());
        let started = Arc::new(AtomicUsize::new(0));
        let handler = Parked {
            release: Arc::clone(&release),
            started: Arc::clone(&started),
        };
        let pipeline = Pipeline::new(Router::single(handler));
        let worker = Worker::new(
            config("http://memory.invalid/0/parked", 500),
            pipeline,
            vec![queue as Arc<dyn Queue>],
        )
        .unwrap();
        let status = worker.status();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        conveyor_testing::wait_until(BENCH_TIMEOUT, Duration::from_millis(5), async || {
            started.load(Ordering::SeqCst) >= 500 && status.in_flight() >= 500
        })
        .await
        .expect("500 jobs never got in flight");
        let busy = resident_mib();
        release.notify_waiters();
        shutdown.cancel();
        running.await.unwrap().unwrap();
        (idle, busy)
    });

    // (a) and (b): LocalStack.
    let (raw, (worker_rate, requests_per_job), (small_rate, small_requests)) = multi.block_on(async {
        ensure_local_aws().await.unwrap();
        let client = sqs_client().await;
        let raw_queue = create_queue(&client, &QueueSpec::standard("bench-raw"))
            .await
            .unwrap();
        fill_sqs(&client, &raw_queue.url, sqs_messages).await;
        let raw = raw_capacity(
            Arc::new(SqsQueue::connect(client.clone(), &raw_queue.url).await.unwrap()),
            sqs_messages,
        )
        .await;

        let big = worker_on_localstack(&client, "bench-worker", sqs_messages, 100).await;
        let small = worker_on_localstack(&client, "bench-small", sqs_messages, 10).await;
        (raw, big, small)
    });

    // (c): MemoryQueue on one core.
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let memory_rate = single.block_on(async {
        let queue = Arc::new(MemoryQueue::standard("bench"));
        for n in 0..memory_messages {
            queue.push(format!("{{\"n\":{n}}}")).unwrap();
        }
        let pipeline = Pipeline::new(Router::single(Noop));
        let worker = Worker::new(
            config("http://memory.invalid/0/bench", 500),
            pipeline,
            vec![queue as Arc<dyn Queue>],
        )
        .unwrap();
        let elapsed = run_until(worker, |status| {
            status.report().succeeded >= memory_messages as u64
        })
        .await;
        memory_messages as f64 / elapsed.as_secs_f64()
    });

    println!();
    println!("| measure | figure | target |");
    println!("|---|---|---|");
    println!(
        "| (a) LocalStack raw capacity, 4 loops of receive-10 + delete-batch, {sqs_messages} messages | {raw:.0} msg/s | |"
    );
    println!(
        "| (b) worker, no-op jobs on LocalStack, {sqs_messages} messages, max_in_flight 100 | {worker_rate:.0} jobs/s ({:.0}% of a) | >= 90% of (a) |",
        100.0 * worker_rate / raw
    );
    println!("| (b) SQS requests per job | {requests_per_job:.3} | <= 0.21 |");
    println!(
        "| (b) worker, no-op jobs on LocalStack, {sqs_messages} messages, max_in_flight 10 | {small_rate:.0} jobs/s, {small_requests:.3} SQS requests per job | <= 0.21 requests per job |"
    );
    println!(
        "| (c) worker, no-op jobs on MemoryQueue, one core, {memory_messages} messages, max_in_flight 500 | {memory_rate:.0} jobs/s | >= 100000 |"
    );
    println!(
        "| (d) resident memory, 500 jobs in flight (process before the worker: {idle_rss:.1} MiB) | {busy_rss:.1} MiB | < 50 MiB |"
    );
}
