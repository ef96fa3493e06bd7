//! The same kind of handler as a Lambda function behind an SQS event source mapping (partial batch
//! responses, the invocation's deadline). Build it with
//! `cargo lambda build --release -p conveyor --example lambda_function --features lambda`; run it
//! locally with `cargo lambda watch` or the `conveyor lambda run` command (docs/running.md).

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
async fn main() -> Result<(), conveyor::lambda::LambdaError> {
    let pipeline = Pipeline::new(Router::new().route(Greet));
    conveyor::lambda::run(pipeline).await
}
