//! DynamoDB Local for the tests and the benchmark, through `conveyor_testing::localstack` (which runs
//! `localstack/start.sh` once per process), with clients that use this crate's own timeouts and
//! retries.
#![allow(dead_code, unused_imports)] // each test binary (and the benchmark) uses a different subset

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use conveyor_testing::localstack;

pub(crate) use conveyor_testing::localstack::{create_table, unique_name};

/// A client for `endpoint` with dummy credentials and the store's timeouts and retries.
pub(crate) fn client_for(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "conveyor-dynamodb-tests",
        ))
        .endpoint_url(endpoint)
        .timeout_config(conveyor_dynamodb::timeout_config())
        .retry_config(conveyor_dynamodb::retry_config())
        .build();
    Client::from_conf(config)
}

/// Starts the local stack if needed and returns a client for DynamoDB Local.
pub(crate) async fn local_client() -> anyhow::Result<Client> {
    localstack::ensure_local_aws().await?;
    Ok(client_for(&localstack::dynamodb_endpoint()))
}
