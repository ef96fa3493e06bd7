//! A quick figure, not a test: how many send → receive → delete cycles `MemoryQueue` does per second on
//! one thread, in batches of 10 as the worker uses it.
//!
//! `cargo run -p conveyor-testing --example memory_queue_throughput --release [messages]`

use std::time::{Duration, Instant};

use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_testing::MemoryQueue;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let messages: usize = std::env::args().nth(1).map_or(Ok(500_000), |arg| arg.parse())?;
    let queue = MemoryQueue::standard("throughput");
    let body = "{\"user_id\":42,\"template\":\"welcome\"}".to_owned();
    let started = Instant::now();
    let mut done = 0;
    while done < messages {
        for _ in 0..10 {
            queue
                .send(OutgoingMessage {
                    body: body.clone(),
                    ..OutgoingMessage::default()
                })
                .await?;
        }
        let batch = queue.receive(10, Duration::ZERO).await?;
        let receipts: Vec<_> = batch.into_iter().map(|message| message.receipt_handle).collect();
        let failures = queue.delete_batch(&receipts).await?;
        anyhow::ensure!(failures.is_empty(), "delete failures: {failures:?}");
        done += receipts.len();
    }
    let elapsed = started.elapsed();
    let requests = queue.requests();
    println!(
        "{done} messages sent, received and deleted in {elapsed:?}: {:.0} messages/s on one thread ({} requests)",
        done as f64 / elapsed.as_secs_f64(),
        requests.total()
    );
    anyhow::ensure!(queue.is_empty(), "{} messages left", queue.len());
    Ok(())
}
