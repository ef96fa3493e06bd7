//! The transactional outbox's relay as a Lambda function behind the outbox table's DynamoDB stream and a
//! one-minute sweep schedule (`provided.al2023`, deployed by `infra/modules/outbox-relay`): the records'
//! aggregates and the sweeps go through `conveyor_outbox::Relay`. Configuration: `CONVEYOR_OUTBOX_TABLE` (and
//! `CONVEYOR_OUTBOX_PARTITION_KEY`, `CONVEYOR_OUTBOX_SORT_KEY` for other key names). Package it as the
//! example `bootstrap` is packaged (`crates/conveyor-lambda/README.md`), renamed `bootstrap`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    conveyor_lambda::init_tracing();
    conveyor_lambda::outbox::run_outbox_relay().await?;
    Ok(())
}
