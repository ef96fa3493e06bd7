//! The example application as a Lambda function behind an SQS event source mapping (`provided.al2023`).
//!
//! The same handlers as the ECS worker (`src/bin/worker.rs`); only this `main` differs. Idempotency is
//! on DynamoDB when `CONVEYOR_IDEMPOTENCY_TABLE` is set (a warning says so when it is not). Build and
//! packaging: `crates/conveyor-lambda/README.md`; run it locally with `conveyor lambda run`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    conveyor_lambda::init_tracing();
    let pipeline = conveyor_examples::app_pipeline().await?;
    conveyor_lambda::run(pipeline).await?;
    Ok(())
}
