//! Requests per tick on LocalStack (SQS) and DynamoDB Local, counted on the wire (the fault layer's call
//! counts, no fault): a per-second schedule for 40 s of real time with 1 and with 10 schedulers. The same
//! file builds against the scheduler before the leader lease (main at d6f910c), for the "before" figures.
//!
//! ```text
//! ./localstack/start.sh && cargo run -p conveyor-schedule --example requests_on_dynamodb
//! ```
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_schedule::{Schedule, Scheduler, TickStore};
use conveyor_sqs::Producer;
use conveyor_testing::faults::{Faults, with_faults_dynamodb, with_faults_sqs};
use conveyor_testing::localstack::{self, QueueSpec};
use tokio_util::sync::CancellationToken;

const SECONDS: u64 = 40;

async fn measure(workers: usize) -> (u64, u64, u64) {
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "sched-req").await.unwrap();
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("sched-req"))
        .await
        .unwrap();
    let faults = Faults::new(1);
    let counted_dynamodb = with_faults_dynamodb(&dynamodb, &faults);
    let counted_sqs = with_faults_sqs(&sqs, &faults);
    let schedule = Schedule::every("per-second", Duration::from_secs(1))
        .unwrap()
        .job_of("ping", 1, &serde_json::json!({}))
        .unwrap()
        // No tick before the schedulers start: every tick is served on time, as in steady state.
        .starting(SystemTime::now() + Duration::from_secs(2));
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let scheduler = Scheduler::new(
            vec![schedule.clone()],
            TickStore::new(counted_dynamodb.clone(), &table),
            Arc::new(Producer::new(counted_sqs.clone(), &queue.url)),
        )
        .unwrap();
        tasks.push(tokio::spawn(scheduler.run(shutdown.child_token())));
    }
    tokio::time::sleep(Duration::from_secs(SECONDS)).await;
    shutdown.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    if std::env::var("DEBUG_HISTORY").is_ok() {
        use conveyor_schedule::ScheduleStore;
        let state = TickStore::new(dynamodb.clone(), &table)
            .state("per-second")
            .await
            .unwrap();
        for entry in state.history {
            println!("{:?} {:?} {}", entry.tick, entry.at, entry.outcome);
        }
    }
    let dynamodb_calls: u64 = ["GetItem", "UpdateItem", "PutItem"]
        .iter()
        .map(|op| faults.calls(op))
        .sum();
    (
        faults.calls("SendMessage"),
        dynamodb_calls,
        faults.calls("SendMessage"),
    )
}

#[tokio::main]
async fn main() {
    if std::env::var("DEBUG_HISTORY").is_ok() {
        tracing_subscriber::fmt()
            .with_env_filter("conveyor_schedule=debug")
            .init();
    }
    localstack::ensure_local_aws().await.unwrap();
    println!("a per-second schedule, {SECONDS} s; requests counted on the wire");
    println!(
        "{:>7} {:>7} {:>14} {:>9}",
        "workers", "ticks", "DynamoDB/tick", "SQS/tick"
    );
    for workers in [1, 10] {
        let (ticks, dynamodb, sqs) = measure(workers).await;
        println!(
            "{workers:>7} {ticks:>7} {:>14.2} {:>9.2}",
            dynamodb as f64 / ticks as f64,
            sqs as f64 / ticks as f64
        );
    }
}
