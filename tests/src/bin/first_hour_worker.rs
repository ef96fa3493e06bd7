//! The README's worker `main`, as a user copies it into a crate of their own on the facade (features
//! `worker` and `dynamodb`): no `.with_store(..)`; `CONVEYOR_IDEMPOTENCY_TABLE` names the table.
//! The handler and its pipeline are `conveyor_e2e::first_hour`'s.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    conveyor::worker::run(conveyor_e2e::first_hour::pipeline()).await?;
    Ok(())
}
