//! Requests per job-day of delay for each carrier: the arithmetic of `docs/delays.md`, and the SQS hops
//! measured on the real worker over the in-memory queue and store (request counters), one job delayed
//! one (virtual) day on SQS's 15-minute hop.
//!
//! `cargo run -p conveyor-sim --example delay_cost`

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE};
use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_core::runtime::{DUE_ATTRIBUTE, due_value};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const DAY: Duration = Duration::from_secs(24 * 3600);
const HOP: Duration = Duration::from_secs(15 * 60);
const CHUNK: usize = 64 * 1024;

struct Nothing;

impl Handler for Nothing {
    type Job = serde_json::Value;
    type Output = ();
    const JOB_TYPE: &'static str = "delayed";

    async fn handle(&self, _job: serde_json::Value, _ctx: Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// What one job delayed a day cost, counted by the doubles.
struct Measured {
    sends: u64,
    received: u64,
    delete_calls: u64,
    store_gets: u64,
}

async fn measure() -> anyhow::Result<Measured> {
    let start = Instant::now();
    let epoch = SystemTime::now();
    let queue = Arc::new(MemoryQueue::standard("delayed"));
    let store = Arc::new(MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(Router::single(Nothing))
        .with_store(Arc::clone(&store) as Arc<dyn IdempotencyStore>)
        .with_clock(Arc::new(move || epoch + start.elapsed()));
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new("http://sim.invalid/delayed")])
        .with_listen_addr(None);
    let worker = Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>])?;
    let graceful = CancellationToken::new();
    let running = tokio::spawn(worker.run_with(graceful.clone(), CancellationToken::new()));
    let mut message = OutgoingMessage {
        body: "{}".to_owned(),
        delay: Some(HOP),
        ..OutgoingMessage::default()
    };
    message.attributes.insert(
        DUE_ATTRIBUTE.to_owned(),
        AttributeValue::number(due_value(epoch + DAY)),
    );
    message
        .attributes
        .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string("k"));
    queue.send(message).await?;
    let before = queue.requests();
    tokio::time::sleep(DAY + Duration::from_secs(120)).await;
    graceful.cancel();
    running.await??;
    let after = queue.requests();
    Ok(Measured {
        sends: after.send - before.send,
        received: after.messages_received - before.messages_received,
        delete_calls: after.delete - before.delete,
        store_gets: store.requests().get,
    })
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let measured = runtime.block_on(measure())?;
    let hops = DAY.as_secs() / HOP.as_secs();
    println!("requests per job-day of delay (docs/delays.md)");
    println!();
    println!("SQS hops, measured (one job, one virtual day, real worker over the in-memory queue):");
    println!(
        "  {} SendMessage, {} messages received, {} DeleteMessageBatch calls, {} GetItem (cancel marker) -> {} SQS requests + {} DynamoDB reads",
        measured.sends,
        measured.received,
        measured.delete_calls,
        measured.store_gets,
        measured.sends + measured.received + measured.delete_calls,
        measured.store_gets
    );
    println!();
    println!(
        "SQS hops, arithmetic: hops = 1 day / 15 min = {hops}; per hop a send and a receive of C chunks, a delete"
    );
    for (label, bytes) in [
        ("1 KB job (or a pointer)", 1024_usize),
        ("256 KB job", 256 * 1024),
        ("1 MiB job", 1024 * 1024),
    ] {
        let chunks = bytes.div_ceil(CHUNK) as u64;
        let sqs = hops * (2 * chunks + 1);
        println!(
            "  {label:<24} C = {chunks:>2}: {sqs:>5} SQS requests (US${:.6}), {hops} DynamoDB reads, {hops} Lambda invocations behind an event source mapping",
            sqs as f64 * 0.40e-6
        );
    }
    println!();
    println!("EventBridge Scheduler at() schedule (not built here), per job whatever the delay:");
    println!(
        "  1 CreateSchedule (not billed) + 1 invocation (US$0.000001) + 1 SendMessage of C chunks + receive + delete"
    );
    for days in [1u64, 7, 14] {
        println!(
            "  small job delayed {days:>2} days: {:.2} requests per job-day",
            4.0 / days as f64
        );
    }
    println!();
    println!(
        "DynamoDB timer table (not built here), per job: 1 PutItem + 1 DeleteItem + 1 SendMessage, plus the"
    );
    println!(
        "  poller's 1,440 queries a day shared by every waiting job: (3 / days) + 1,440 / jobs per job-day"
    );
    Ok(())
}
