//! Requests per tick with 1 and with 10 workers: DynamoDB (the store's requests, counted by
//! [`MemoryScheduleStore`], which the DynamoDB store matches call for call) and SQS (`SendMessage`).
//! A per-second schedule for one hour of virtual time (tokio's paused clock).
//!
//! ```text
//! cargo run -p conveyor-schedule --example requests_per_tick
//! ```
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_schedule::{
    MemoryScheduleStore, Schedule, ScheduleStore, Scheduler, SchedulerClock, TickSender,
};
use conveyor_sqs::NewJob;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct CountingSender(AtomicU64);

#[async_trait]
impl TickSender for CountingSender {
    async fn send_tick(&self, _job: &NewJob<serde_json::Value>) -> Result<String, String> {
        let sent = self.0.fetch_add(1, Ordering::Relaxed);
        Ok(format!("m-{sent}"))
    }
}

async fn measure(workers: usize) -> (u64, u64, u64) {
    let store = Arc::new(MemoryScheduleStore::new());
    let sender = Arc::new(CountingSender::default());
    let schedule = Schedule::every("per-second", Duration::from_secs(1))
        .unwrap()
        .job_of("ping", 1, &serde_json::json!({}))
        .unwrap();
    let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800);
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let scheduler = Scheduler::with_shared_store(vec![schedule.clone()], store.clone(), sender.clone())
            .unwrap()
            .with_clock(SchedulerClock::simulated(origin, tokio::time::Instant::now(), 0));
        tasks.push(tokio::spawn(scheduler.run(shutdown.child_token())));
    }
    tokio::time::sleep(Duration::from_secs(3600)).await;
    shutdown.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    let runs = store.peek_state("per-second").runs;
    (runs, store.requests(), sender.0.load(Ordering::Relaxed))
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    println!(
        "a per-second schedule, one hour; requests per tick (lease 30 s: renewals and lease reads included)"
    );
    println!(
        "{:>7} {:>7} {:>16} {:>12} {:>16}",
        "workers", "ticks", "DynamoDB/tick", "SQS/tick", "DynamoDB/day"
    );
    for workers in [1, 10] {
        let (ticks, dynamodb, sqs) = measure(workers).await;
        let per_tick = dynamodb as f64 / ticks as f64;
        println!(
            "{workers:>7} {ticks:>7} {per_tick:>16.3} {:>12.3} {:>16.0}",
            sqs as f64 / ticks as f64,
            per_tick * 86_400.0
        );
    }
}
