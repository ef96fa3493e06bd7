//! Tenant fairness figures (figures, not pass/fail):
//!
//! ```text
//! cargo run --release -p conveyor-sim --example tenant_bench
//! ```
//!
//! One noisy tenant sends 10,000 jobs at once; 20 quiet tenants send 50 each, spread over the first
//! `TENANT_BENCH_QUIET_SECS` (10) seconds. Every job works 50 ms; one worker with `max_in_flight` 40
//! runs them. Printed: the quiet tenants' dwell time (first send to handler start) at p50 and p99, the
//! noisy tenant's, the total time and the SQS requests per job, side by side:
//!
//! - on the simulator ([`conveyor_sim::dwell`]: the real worker over the in-memory queue on a paused
//!   clock), with SQS's fair queues off and on, and per-tenant limits (each tenant at most 20 running,
//!   deferred 1 s) off and on: four rows;
//! - on LocalStack (real time, the real SQS client; the producer sends with `NewJob::tenant`, so each
//!   job carries its tenant as `MessageGroupId` on the standard queue), limits off and on. LocalStack
//!   4.8 has no fair ordering (the probe below shows it), so its rows compare with the simulator's
//!   "fair queues off" rows.
//!
//! It first probes what LocalStack does with `MessageGroupId` on a standard queue: accepted? returned
//! on receive? refused when invalid? and fairness: after 1,000 messages of one group and 10 of
//! another, where in the receive order do the 10 come?
//!
//! Sizes: `TENANT_BENCH_NOISY` (10000), `TENANT_BENCH_QUIET` (50 per tenant), `TENANT_BENCH_QUIET_SECS`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_core::{Pipeline, Router};
use conveyor_sim::dwell::{
    self, Clock, Dwell, Figures, JOB_TYPE, Job, Load, MAX_IN_FLIGHT, QUIET_TENANTS, Setting, TENANT_LIMIT,
    Timed, WORK,
};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use tokio_util::sync::CancellationToken;

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
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
                JOB_TYPE,
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
    let dwell = Dwell::default();
    let pipeline = Pipeline::new(Router::single(Timed {
        clock,
        dwell: Arc::clone(&dwell),
    }));
    let worker = dwell::worker(&created.url, queue.clone() as Arc<dyn Queue>, pipeline, limited).unwrap();
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = std::time::Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let (tenants, gap) = dwell::quiet_sends(load);
    for tenant in tenants {
        let job = NewJob::new(
            JOB_TYPE,
            Job {
                sent_ms: clock.now_ms(),
            },
        )
        .tenant(tenant);
        producer.send(&job).await.unwrap();
        tokio::time::sleep(gap).await;
    }
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
    dwell::figures(&dwell, elapsed, requests, load.total())
}

/// What LocalStack does with `MessageGroupId` on a standard queue.
async fn probe(client: &aws_sdk_sqs::Client) {
    let created = create_queue(client, &QueueSpec::standard("tenant-probe"))
        .await
        .unwrap();
    let queue = SqsQueue::connect(client.clone(), &created.url).await.unwrap();
    let message = |group: &str| OutgoingMessage {
        group_id: Some(group.to_owned()),
        ..OutgoingMessage::job(JOB_TYPE, "{}")
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

fn print(place: &str, rows: &[(&str, Figures)]) {
    for (setting, figures) in rows {
        println!(
            "{place:<10} {setting:<34} quiet dwell p50 {:>6} ms  p99 {:>6} ms | noisy p50 {:>6} ms  p99 {:>6} ms | \
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
         max_in_flight {MAX_IN_FLIGHT}; limits: each tenant at most {TENANT_LIMIT} running",
        load.noisy,
        load.quiet,
        load.quiet_secs,
        WORK.as_millis()
    );
    let settings = [
        ("fair queues off, limits off", false, false),
        ("fair queues off, limits on", false, true),
        ("fair queues on,  limits off", true, false),
        ("fair queues on,  limits on", true, true),
    ];
    let simulated: Vec<(&str, Figures)> = settings
        .iter()
        .map(|(name, fair_queues, tenant_limits)| {
            let setting = Setting {
                fair_queues: *fair_queues,
                tenant_limits: *tenant_limits,
            };
            (*name, dwell::run(load, setting).unwrap())
        })
        .collect();
    print("simulator", &simulated);
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
        print(
            "localstack",
            &[
                ("no fair ordering, limits off", off),
                ("no fair ordering, limits on", on),
            ],
        );
    });
}
