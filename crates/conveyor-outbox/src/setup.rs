//! [`create_outbox_table`]: the outbox table as `infra/modules/outbox-relay` creates it, for local runs
//! and tests.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, StreamSpecification,
    StreamViewType, TableStatus, TimeToLiveSpecification,
};

use crate::table::OutboxTable;

/// Why the outbox table could not be created.
#[derive(Debug, thiserror::Error)]
#[error("creating outbox table {table}: {message}")]
pub struct CreateTableError {
    table: String,
    message: String,
}

/// Creates `table` (string keys as it names them, on-demand billing, a `NEW_IMAGE` stream, TTL on its
/// TTL attribute) and waits until it is active. A table that already exists is left as it is.
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
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .map_err(|e| error(e.to_string()))?,
        );
    for (name, key_type) in table.key_names().zip([KeyType::Hash, KeyType::Range]) {
        request = request
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(|e| error(e.to_string()))?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(key_type)
                    .build()
                    .map_err(|e| error(e.to_string()))?,
            );
    }
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
    client
        .update_time_to_live()
        .table_name(&table.name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(&table.ttl_attribute)
                .build()
                .map_err(|e| error(e.to_string()))?,
        )
        .send()
        .await
        .map_err(|e| error(aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()))?;
    Ok(())
}
