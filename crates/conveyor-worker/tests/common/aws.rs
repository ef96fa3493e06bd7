//! LocalStack and DynamoDB Local helpers for the worker's tests.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{create_table, dynamodb_client, ensure_local_aws, sqs_client};
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use futures_util::StreamExt;

use super::TestJob;

/// Starts the emulators if needed and returns an SQS client.
pub(crate) async fn sqs() -> aws_sdk_sqs::Client {
    ensure_local_aws().await.unwrap();
    sqs_client().await
}

/// A fresh idempotency table.
pub(crate) async fn store() -> Arc<dyn IdempotencyStore> {
    dynamo_store().await
}

/// A fresh idempotency table, as the DynamoDB store itself (for its other ports: timers, flows).
pub(crate) async fn dynamo_store() -> Arc<DynamoStore> {
    ensure_local_aws().await.unwrap();
    let client = dynamodb_client().await;
    let table = create_table(&client, "worker").await.unwrap();
    Arc::new(DynamoStore::new(client, table))
}

pub(crate) async fn connect(client: &aws_sdk_sqs::Client, url: &str) -> Arc<SqsQueue> {
    Arc::new(SqsQueue::connect(client.clone(), url).await.unwrap())
}

/// Sends all messages, 10 at a time in parallel.
pub(crate) async fn send_all(queue: &SqsQueue, messages: Vec<OutgoingMessage>) {
    futures_util::stream::iter(messages)
        .for_each_concurrent(10, |message| async move {
            queue.send(message).await.unwrap();
        })
        .await;
}

/// A worker config for these queue URLs (weights as given), no operations endpoint.
pub(crate) fn config(queues: &[(&str, u32)]) -> WorkerConfig {
    WorkerConfig::default()
        .with_queues(
            queues
                .iter()
                .map(|(url, weight)| QueueConfig::new(*url).with_weight(*weight))
                .collect(),
        )
        .with_max_in_flight(10)
        .with_drain_deadline(Some(Duration::from_secs(10)))
        .with_listen_addr(None)
}

/// Receives every visible message (without deleting), until `expected` distinct ones were seen or
/// `timeout` passed; returns their job ids.
pub(crate) async fn visible_ids(queue: &SqsQueue, expected: usize, timeout: Duration) -> HashSet<u64> {
    let mut ids = HashSet::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while ids.len() < expected && tokio::time::Instant::now() < deadline {
        for message in queue.receive(10, Duration::from_secs(1)).await.unwrap() {
            let job: TestJob = serde_json::from_str(&message.body).unwrap();
            ids.insert(job.id);
        }
    }
    ids
}
