//! A long-poll worker on SQS: the whole `main` of an ECS service. It reads `CONVEYOR_QUEUE_URL` (and
//! the other `CONVEYOR_*` settings, docs/configuration.md), logs what it does, and shuts down
//! gracefully on SIGTERM. Against the local stack:
//!
//! ```sh
//! make local-aws && source localstack/env.sh
//! aws sqs create-queue --queue-name greetings
//! CONVEYOR_QUEUE_URL=http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/greetings \
//!   cargo run -p conveyor --example sqs_worker
//! ```

use conveyor::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Greeting {
    name: String,
}

struct Greet;

impl Handler for Greet {
    type Job = Greeting;
    type Output = ();
    const JOB_TYPE: &'static str = "greet";

    async fn handle(&self, job: Greeting, _ctx: Context) -> Result<(), HandlerError> {
        tracing::info!(name = %job.name, "hello");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), conveyor::worker::WorkerError> {
    let pipeline = Pipeline::new(Router::new().route(Greet));
    conveyor::worker::run(pipeline).await?;
    Ok(())
}
