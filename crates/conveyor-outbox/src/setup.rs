//! [`create_outbox_table`]: the outbox table as `infra/modules/outbox-relay` creates it, for local runs
//! and tests.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus,
};

use crate::table::{self, OutboxTable};

/// Why the outbox table could not be created.
#[derive(Debug, thiserror::Error)]
#[error("creating outbox table {table}: {message}")]
pub struct CreateTableError {
    table: String,
    message: String,
}

/// Creates `table` (string keys as it names them, on-demand billing, the [`table::PENDING_INDEX`] index
/// (keys only), a `KEYS_ONLY` stream for the Lambda relay's trigger) and waits until it is active. A table
/// that already exists is left as it is.
pub async fn create_outbox_table(client: &Client, table: &OutboxTable) -> Result<(), CreateTableError> {
    let error = |message: String| CreateTableError {
        table: table.name.clone(),
        message,
    };
    let mut request = client
        .create_table()
        .table_name(&table.name)
        .billing_mode(BillingMode::PayPerRequest)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::KeysOnly)
                .build()
                .map_err(|e| error(e.to_string()))?,
        );
    let key = |name: &str, key_type: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()
            .map_err(|e| error(e.to_string()))
    };
    let attributes = [
        (table.partition_key.as_str(), ScalarAttributeType::S),
        (table.sort_key.as_str(), ScalarAttributeType::S),
        (table::PENDING, ScalarAttributeType::S),
        (table::CREATED_AT, ScalarAttributeType::N),
    ];
    for (name, attribute_type) in attributes {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(attribute_type)
                .build()
                .map_err(|e| error(e.to_string()))?,
        );
    }
    request = request
        .key_schema(key(&table.partition_key, KeyType::Hash)?)
        .key_schema(key(&table.sort_key, KeyType::Range)?)
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(table::PENDING_INDEX)
                .key_schema(key(table::PENDING, KeyType::Hash)?)
                .key_schema(key(table::CREATED_AT, KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(|e| error(e.to_string()))?,
        );
    match request.send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error().is_some_and(
                aws_sdk_dynamodb::operation::create_table::CreateTableError::is_resource_in_use_exception,
            ) =>
        {
            return Ok(());
        }
        Err(e) => {
            return Err(error(
                aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string(),
            ));
        }
    }
    for _ in 0..300 {
        let status = client
            .describe_table()
            .table_name(&table.name)
            .send()
            .await
            .map_err(|e| error(aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()))?
            .table
            .and_then(|description| description.table_status);
        if status == Some(TableStatus::Active) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
