//! A worker with no AWS at all: the real worker runtime on an in-memory queue with SQS's semantics
//! (visibility timeouts, receive counts, a DLQ). Run it with
//! `cargo run -p conveyor --example memory_worker --features testing`.

use std::sync::Arc;
use std::time::Duration;

use conveyor::prelude::*;
use conveyor::testing::MemoryQueue;
use conveyor::worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Serialize, Deserialize)]
struct Greeting {
    name: String,
}

/// Says hello, and tells `main` it did.
struct Greet {
    done: mpsc::UnboundedSender<String>,
}

impl Handler for Greet {
    type Job = Greeting;
    type Output = ();
    const JOB_TYPE: &'static str = "greet";

    async fn handle(&self, job: Greeting, _ctx: Context) -> Result<(), HandlerError> {
        println!("hello, {}", job.name);
        let _ = self.done.send(job.name);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // What `conveyor::worker::run` does by itself: text logs on stderr (`RUST_LOG`, `CONVEYOR_LOG_FORMAT`).
    conveyor::worker::init_logging()?;
    let queue = Arc::new(MemoryQueue::standard("greetings"));
    for name in ["Ada", "Grace", "Barbara"] {
        let body = serde_json::to_string(&Greeting { name: name.into() })?;
        queue.push_message(conveyor::core::port::OutgoingMessage::job("greet", body))?;
    }

    let (done, mut finished) = mpsc::unbounded_channel();
    let pipeline = Pipeline::new(Router::new().route(Greet { done }));
    let config = WorkerConfig::default()
        // The config lines up with the queues passed to the worker; an in-memory queue's URL is only a name.
        .with_queues(vec![QueueConfig::new(
            "https://sqs.us-east-1.amazonaws.com/000000000000/greetings",
        )])
        .with_listen_addr(None)
        // Shutdown lets a long poll in flight return rather than drop it: 1 s polls end this one fast.
        .with_receive_wait(Duration::from_secs(1))
        .with_drain_deadline(Some(Duration::from_secs(5)));
    let worker = Worker::new(config, pipeline, vec![queue])?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    for _ in 0..3 {
        finished.recv().await;
    }
    shutdown.cancel();
    let report = running.await??;
    println!("{} jobs succeeded", report.succeeded);
    Ok(())
}

#[test]
fn it_greets_three_people() {
    main().unwrap();
}
