//! Tenant fairness figures (figures, not pass/fail):
//!
//! ```text
//! cargo run --release -p conveyor-worker --example tenant_bench
//! ```
//!
//! One noisy tenant sends 10,000 jobs at once; 20 quiet tenants send 50 each, spread over the first
//! `TENANT_BENCH_QUIET_SECS` (10) seconds. Every job works 50 ms; one worker with `max_in_flight` 40
//! runs them. Printed: the quiet tenants' dwell time (first send to handler start) at p50 and p99, the
//! noisy tenant's, the total time and the SQS requests per job, with per-tenant limits off and on
//! (each tenant at most 20 running, deferred 1 s), side by side:
//!
//! - on LocalStack (real time, the real SQS client; the producer sends with `NewJob::tenant`, so each
//!   job carries its tenant as `MessageGroupId` on the standard queue);
//! - on `MemoryQueue` under a paused clock (the simulator's setting: virtual time, no latency).
//!
//! It first probes what LocalStack does with `MessageGroupId` on a standard queue: accepted? returned
//! on receive? refused when invalid? and fairness: after 1,000 messages of one group and 10 of
//! another, where in the receive order do the 10 come?
//!
//! Sizes: `TENANT_BENCH_NOISY` (10000), `TENANT_BENCH_QUIET` (50 per tenant), `TENANT_BENCH_QUIET_SECS`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_core::runtime::{TenantLimit, TenantLimits};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::MemoryQueue;
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

const WORK: Duration = Duration::from_millis(50);
const MAX_IN_FLIGHT: usize = 40;
const TENANT_LIMIT: usize = 20;
const QUIET_TENANTS: usize = 20;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    /// When the producer sent it, in milliseconds of the run's clock.
    sent_ms: u64,
}

/// Milliseconds on the run's clock: the wall clock on LocalStack, tokio's (paused) clock in memory.
#[derive(Clone, Copy)]
enum Clock {
    Wall,
    Virtual(tokio::time::Instant),
}

impl Clock {
    fn now_ms(self) -> u64 {
        match self {
            Clock::Wall => SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64,
            Clock::Virtual(start) => start.elapsed().as_millis() as u64,
        }
    }
}

/// Works 50 ms; records each run's dwell by tenant.
struct Timed {
    clock: Clock,
    dwell: Arc<Mutex<HashMap<String, Vec<u64>>>>,
}

impl Handler for Timed {
    type Job = Job;
    type Output = ();
    const JOB_TYPE: &'static str = "timed";

    async fn handle(&self, job: Job, ctx: Context) -> Result<(), HandlerError> {
        let dwell = self.clock.now_ms().saturating_sub(job.sent_ms);
        let tenant = ctx.tenant().unwrap_or("none").to_owned();
        self.dwell.lock().unwrap().entry(tenant).or_default().push(dwell);
        tokio::time::sleep(WORK).await;
        Ok(())
    }
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy)]
struct Load {
    noisy: usize,
    quiet: usize,
    quiet_secs: u64,
}

impl Load {
    fn total(self) -> usize {
        self.noisy + self.quiet * QUIET_TENANTS
    }
}

/// One run's figures.
struct Figures {
    quiet: (u64, u64),
    noisy: (u64, u64),
    total: Duration,
    requests_per_job: f64,
}

fn percentile(values: &mut [u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index]
}

fn figures(dwell: &HashMap<String, Vec<u64>>, total: Duration, requests: u64, jobs: usize) -> Figures {
    let mut quiet: Vec<u64> = dwell
        .iter()
        .filter(|(tenant, _)| tenant.starts_with("quiet"))
        .flat_map(|(_, values)| values.iter().copied())
        .collect();
    let mut noisy = dwell.get("noisy").cloned().unwrap_or_default();
    Figures {
        quiet: (percentile(&mut quiet, 0.5), percentile(&mut quiet, 0.99)),
        noisy: (percentile(&mut noisy, 0.5), percentile(&mut noisy, 0.99)),
        total,
        requests_per_job: requests as f64 / jobs as f64,
    }
}

fn limits() -> TenantLimits {
    TenantLimits::new(TenantLimit::concurrent(TENANT_LIMIT)).with_defer_for(Duration::from_secs(1))
}

fn worker(url: &str, queue: Arc<dyn Queue>, pipeline: Pipeline, limited: bool) -> Worker {
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(url)])
        .with_max_in_flight(MAX_IN_FLIGHT)
        .with_listen_addr(None);
    let worker = Worker::new(config, pipeline, vec![queue]).unwrap();
    if limited {
        return worker.limit_tenants(limits()).unwrap();
    }
    worker
}

/// Sends the quiet tenants' jobs, spread over `load.quiet_secs`, round-robin over the tenants.
async fn send_quiet(load: Load, clock: Clock, send: impl AsyncFn(String, u64)) {
    let count = load.quiet * QUIET_TENANTS;
    let gap = Duration::from_secs(load.quiet_secs) / count.max(1) as u32;
    for n in 0..count {
        send(format!("quiet-{:02}", n % QUIET_TENANTS), clock.now_ms()).await;
        tokio::time::sleep(gap).await;
    }
}

async fn run_on_localstack(client: &aws_sdk_sqs::Client, load: Load, limited: bool) -> Figures {
    let name = if limited {
        "tenant-bench-on"
    } else {
        "tenant-bench-off"
    };
    let created = create_queue(client, &QueueSpec::standard(name)).await.unwrap();
    let producer = Producer::new(client.clone(), &created.url);
    let clock = Clock::Wall;
    let jobs: Vec<NewJob<Job>> = (0..load.noisy)
        .map(|_| {
            NewJob::new(
                "timed",
                Job {
                    sent_ms: clock.now_ms(),
                },
            )
            .tenant("noisy")
        })
        .collect();
    for chunk in jobs.chunks(500) {
        assert!(producer.send_batch(chunk).await.all_sent());
    }
    let queue = Arc::new(SqsQueue::connect(client.clone(), &created.url).await.unwrap());
    let before = queue.requests();
    let dwell = Arc::new(Mutex::new(HashMap::new()));
    let pipeline = Pipeline::new(Router::single(Timed {
        clock,
        dwell: Arc::clone(&dwell),
    }));
    let worker = worker(&created.url, queue.clone() as Arc<dyn Queue>, pipeline, limited);
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = std::time::Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let sender = &producer;
    send_quiet(load, clock, async |tenant, sent_ms| {
        let job = NewJob::new("timed", Job { sent_ms }).tenant(tenant);
        sender.send(&job).await.unwrap();
    })
    .await;
    let total = load.total() as u64;
    conveyor_testing::wait_until(Duration::from_secs(1800), Duration::from_millis(20), async || {
        status.report().succeeded >= total
    })
    .await
    .expect("the run did not finish: is LocalStack healthy?");
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    let requests = queue.requests() - before;
    let dwell = dwell.lock().unwrap();
    figures(&dwell, elapsed, requests, load.total())
}

fn run_in_memory(load: Load, limited: bool) -> Figures {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = Clock::Virtual(tokio::time::Instant::now());
        let queue = Arc::new(MemoryQueue::standard("tenant-bench"));
        let message = |tenant: &str, sent_ms: u64| OutgoingMessage {
            group_id: Some(tenant.to_owned()),
            ..OutgoingMessage::job("timed", serde_json::to_string(&Job { sent_ms }).unwrap())
        };
        for _ in 0..load.noisy {
            queue.push_message(message("noisy", 0)).unwrap();
        }
        let dwell = Arc::new(Mutex::new(HashMap::new()));
        let pipeline = Pipeline::new(Router::single(Timed {
            clock,
            dwell: Arc::clone(&dwell),
        }));
        let url = "http://memory.invalid/000000000000/tenant-bench";
        let worker = worker(url, queue.clone() as Arc<dyn Queue>, pipeline, limited);
        let status = worker.status();
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let memory = &queue;
        send_quiet(load, clock, async |tenant, sent_ms| {
            memory.send(message(&tenant, sent_ms)).await.unwrap();
        })
        .await;
        let total = load.total() as u64;
        conveyor_testing::wait_until(
            Duration::from_secs(36_000),
            Duration::from_millis(20),
            async || status.report().succeeded >= total,
        )
        .await
        .unwrap();
        let elapsed = started.elapsed();
        shutdown.cancel();
        running.await.unwrap().unwrap();
        let requests = queue.requests().total();
        let dwell = dwell.lock().unwrap();
        figures(&dwell, elapsed, requests, load.total())
    })
}

/// What LocalStack does with `MessageGroupId` on a standard queue.
async fn probe(client: &aws_sdk_sqs::Client) {
    let created = create_queue(client, &QueueSpec::standard("tenant-probe"))
        .await
        .unwrap();
    let queue = SqsQueue::connect(client.clone(), &created.url).await.unwrap();
    let message = |group: &str| OutgoingMessage {
        group_id: Some(group.to_owned()),
        ..OutgoingMessage::job("timed", "{}")
    };
    for _ in 0..1000 {
        queue.send(message("noisy")).await.unwrap();
    }
    for _ in 0..10 {
        queue.send(message("quiet")).await.unwrap();
    }
    let refused = queue.send(message("not valid")).await;
    let mut order = Vec::new();
    while order.len() < 1010 {
        let batch = queue.receive(10, Duration::from_secs(1)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        let receipts: Vec<_> = batch.iter().map(|m| m.receipt_handle.clone()).collect();
        order.extend(batch.into_iter().map(|m| m.group_id));
        queue.delete_batch(&receipts).await.unwrap();
    }
    let quiet: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, group)| group.as_deref() == Some("quiet"))
        .map(|(position, _)| position)
        .collect();
    println!(
        "LocalStack, MessageGroupId on a standard queue: accepted; returned on receive: {}; an invalid one \
         (a space) refused: {}; after 1,000 messages of one group and 10 of another, the 10 came at receive \
         positions {:?} of {} (first-in-first-out would be 1000..1009; fair queues would bring them early)",
        order.iter().all(Option::is_some),
        refused.is_err(),
        quiet,
        order.len()
    );
}

fn print(place: &str, off: &Figures, on: &Figures) {
    for (limits, figures) in [("off", off), (&format!("on (≤{TENANT_LIMIT}/tenant)"), on)] {
        println!(
            "{place:<10} limits {limits:<16} quiet dwell p50 {:>6} ms  p99 {:>6} ms | noisy p50 {:>6} ms  p99 {:>6} ms | \
             all done in {:>7.1} s | {:.2} SQS requests/job",
            figures.quiet.0,
            figures.quiet.1,
            figures.noisy.0,
            figures.noisy.1,
            figures.total.as_secs_f64(),
            figures.requests_per_job
        );
    }
}

fn main() {
    let load = Load {
        noisy: size("TENANT_BENCH_NOISY", 10_000),
        quiet: size("TENANT_BENCH_QUIET", 50),
        quiet_secs: size("TENANT_BENCH_QUIET_SECS", 10) as u64,
    };
    println!(
        "1 noisy tenant x {} jobs (sent at once), {QUIET_TENANTS} quiet tenants x {} jobs (over {} s); {} ms per job, \
         max_in_flight {MAX_IN_FLIGHT}",
        load.noisy,
        load.quiet,
        load.quiet_secs,
        WORK.as_millis()
    );
    let memory_off = run_in_memory(load, false);
    let memory_on = run_in_memory(load, true);
    print("memory", &memory_off, &memory_on);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        ensure_local_aws().await.unwrap();
        let client = sqs_client().await;
        probe(&client).await;
        let off = run_on_localstack(&client, load, false).await;
        let on = run_on_localstack(&client, load, true).await;
        print("localstack", &off, &on);
    });
}
