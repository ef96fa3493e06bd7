//! Creating the idempotency table with the layout `infra/modules/idempotency-table` gives it: the one
//! definition outside Terraform, used by `conveyor local init` and by the tests.

use std::time::Duration;

use crate::defaults::{EXPIRATION_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE, JOBS_INDEX, JOBS_INDEX_PROJECTION};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
};

use crate::jobs::{JOB_SHARD, JOB_SORT};
use tokio::time::Instant;

/// How long a new table may take to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(30);
/// How often its status is read meanwhile.
const STATUS_POLL: Duration = Duration::from_millis(100);

/// Why the table could not be created.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A DynamoDB call failed.
    #[error("{call} on table {table} failed: {message}")]
    Call {
        /// The API call.
        call: &'static str,
        /// The table.
        table: String,
        /// What DynamoDB (or the connection) said.
        message: String,
    },
    /// The table was created but did not become active in time.
    #[error("table {0} did not become active within 30 s")]
    NotActive(String),
}

/// Creates the idempotency table `name` (partition key `id` of type S, on-demand billing, TTL on
/// `expiration`, the `conveyor-jobs-sharded` index that lists tracked jobs: partition key `job_shard`
/// (S), sort key `job_sort` (S), [`JOBS_INDEX_PROJECTION`] projected) and waits until it is active.
pub async fn create_idempotency_table(client: &Client, name: &str) -> Result<(), TableError> {
    let failed = |call: &'static str| {
        move |error: String| TableError::Call {
            call,
            table: name.to_owned(),
            message: error,
        }
    };
    let attribute = |name: &str, kind: ScalarAttributeType| {
        built(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build(),
        )
    };
    let key = |name: &str, kind: KeyType| {
        built(
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build(),
        )
    };
    let jobs_index = built(
        GlobalSecondaryIndex::builder()
            .index_name(JOBS_INDEX)
            .key_schema(key(JOB_SHARD, KeyType::Hash).map_err(failed("CreateTable"))?)
            .key_schema(key(JOB_SORT, KeyType::Range).map_err(failed("CreateTable"))?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::Include)
                    .set_non_key_attributes(Some(
                        JOBS_INDEX_PROJECTION
                            .iter()
                            .map(|name| (*name).to_owned())
                            .collect(),
                    ))
                    .build(),
            )
            .build(),
    )
    .map_err(failed("CreateTable"))?;
    client
        .create_table()
        .table_name(name)
        .attribute_definitions(
            attribute(IDEMPOTENCY_KEY_ATTRIBUTE, ScalarAttributeType::S).map_err(failed("CreateTable"))?,
        )
        .attribute_definitions(attribute(JOB_SHARD, ScalarAttributeType::S).map_err(failed("CreateTable"))?)
        .attribute_definitions(attribute(JOB_SORT, ScalarAttributeType::S).map_err(failed("CreateTable"))?)
        .key_schema(key(IDEMPOTENCY_KEY_ATTRIBUTE, KeyType::Hash).map_err(failed("CreateTable"))?)
        .global_secondary_indexes(jobs_index)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .map_err(|error| DisplayErrorContext(error).to_string())
        .map_err(failed("CreateTable"))?;
    wait_until_active(client, name).await?;
    let ttl = built(
        TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(EXPIRATION_ATTRIBUTE)
            .build(),
    )
    .map_err(failed("UpdateTimeToLive"))?;
    client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(ttl)
        .send()
        .await
        .map_err(|error| DisplayErrorContext(error).to_string())
        .map_err(failed("UpdateTimeToLive"))?;
    Ok(())
}

/// A builder's result, its error as text.
fn built<T>(build: Result<T, aws_sdk_dynamodb::error::BuildError>) -> Result<T, String> {
    build.map_err(|error| error.to_string())
}

async fn wait_until_active(client: &Client, name: &str) -> Result<(), TableError> {
    let give_up = Instant::now() + ACTIVE_WITHIN;
    while Instant::now() < give_up {
        let status = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .ok()
            .and_then(|described| described.table?.table_status);
        if status == Some(TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
    Err(TableError::NotActive(name.to_owned()))
}
