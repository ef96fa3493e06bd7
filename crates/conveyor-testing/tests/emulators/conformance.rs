//! Both conformance suites against the AWS adapters: `SqsQueue` on LocalStack and `DynamoStore` on
//! DynamoDB Local (started by `localstack/start.sh` through `ensure_local_aws` when not running).

use std::sync::Arc;

use async_trait::async_trait;
use conveyor_core::port::Queue;
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{
    create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client,
};
use conveyor_testing::queue_conformance::{self, QueueFactory, QueueUnderTest};
use conveyor_testing::{QueueSpec, flow_conformance, store_conformance, tracking_conformance};

struct LocalStackQueues {
    client: aws_sdk_sqs::Client,
}

#[async_trait]
impl QueueFactory for LocalStackQueues {
    async fn create(&self, spec: &QueueSpec) -> anyhow::Result<QueueUnderTest> {
        let created = create_queue(&self.client, spec).await?;
        let queue = SqsQueue::connect(self.client.clone(), &created.url).await?;
        let dead_letter_queue = match &created.dlq_url {
            Some(url) => {
                let dlq: Arc<dyn Queue> = Arc::new(SqsQueue::connect(self.client.clone(), url).await?);
                Some(dlq)
            }
            None => None,
        };
        Ok(QueueUnderTest {
            queue: Arc::new(queue),
            dead_letter_queue,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_queue_on_localstack_passes_the_queue_suite() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let factory = LocalStackQueues {
        client: sqs_client().await,
    };
    queue_conformance::run_all(&factory).await?;
    Ok(())
}

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
