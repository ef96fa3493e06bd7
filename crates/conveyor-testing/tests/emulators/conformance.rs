//! The store suites against `DynamoStore` on DynamoDB Local (started by `localstack/start.sh` through
//! `ensure_local_aws` when not running). The queue suite runs against `SqsQueue` on LocalStack, moto and
//! fauxqs in `fidelity.rs`, where LocalStack must pass every case of it.

use std::sync::Arc;

use conveyor_dynamodb::DynamoStore;
use conveyor_testing::localstack::{create_table, dynamodb_client, ensure_local_aws};
use conveyor_testing::{flow_conformance, store_conformance, tracking_conformance};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_store_on_dynamodb_local_passes_the_store_suite() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = dynamodb_client().await;
    let table = create_table(&client, "conformance").await?;
    store_conformance::run_all(Arc::new(DynamoStore::new(client, table))).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_store_on_dynamodb_local_passes_the_tracking_suite() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = dynamodb_client().await;
    let table = create_table(&client, "tracking").await?;
    tracking_conformance::run_all(Arc::new(DynamoStore::new(client, table))).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_store_on_dynamodb_local_passes_the_flows_suite() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = dynamodb_client().await;
    let table = create_table(&client, "flows").await?;
    flow_conformance::run_all(Arc::new(DynamoStore::new(client, table))).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_store_on_dynamodb_local_passes_the_timers_suite() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = dynamodb_client().await;
    let table = create_table(&client, "timers").await?;
    conveyor_testing::timer_conformance::run_all(Arc::new(DynamoStore::new(client, table))).await?;
    Ok(())
}
