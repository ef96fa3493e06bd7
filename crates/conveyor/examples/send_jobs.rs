//! A producer: sends three jobs to `CONVEYOR_QUEUE_URL`, one with an idempotency key (sent twice, run
//! once by an idempotent handler) and one delayed by a minute. Run it next to the `sqs_worker` example:
//! `cargo run -p conveyor --example send_jobs`.

use std::time::Duration;

use anyhow::Context as _;
use conveyor::prelude::*;
use serde::Serialize;

#[derive(Serialize)]
struct Greeting {
    name: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let queue_url = std::env::var("CONVEYOR_QUEUE_URL")
        .context("set CONVEYOR_QUEUE_URL to the queue's URL (aws sqs get-queue-url --queue-name ...)")?;
    let client = conveyor::sqs::sqs_client_from_env().await;
    let producer = Producer::new(client, queue_url);

    let hello = |name: &str| NewJob::new("greet", Greeting { name: name.into() });
    let id = producer.send(&hello("Ada")).await?;
    println!("sent {id}");
    let id = producer.send(&hello("Grace").key("greeting:grace")).await?;
    println!("sent {id} (key greeting:grace)");
    let id = producer
        .send(&hello("Barbara").delay(Duration::from_secs(60)))
        .await?;
    println!("sent {id}, due in a minute");
    Ok(())
}
