//! Writing a backlog of outbox jobs quickly (25 per `BatchWriteItem`), for the backlog test and the
//! benchmark (`make bench`). Not how an application writes them: that is its own transaction with the
//! aggregate's head.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};

use crate::OutboxWrite;

/// Writes the jobs and heads of `writes` with `BatchWriteItem`; returns how many requests it took.
#[doc(hidden)]
pub async fn write_backlog(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    writes: &[OutboxWrite],
) -> Result<u64, aws_sdk_dynamodb::Error> {
    let items: Vec<HashMap<String, AttributeValue>> = writes
        .iter()
        .flat_map(|write| write.items().iter().chain(write.head_item()).cloned())
        .collect();
    write_items(client, table, &items).await
}

/// Writes `items` as they are with `BatchWriteItem`, retrying unprocessed ones; returns how many
/// requests it took.
#[doc(hidden)]
pub async fn write_items(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    items: &[HashMap<String, AttributeValue>],
) -> Result<u64, aws_sdk_dynamodb::Error> {
    let mut requests = 0;
    for chunk in items.chunks(25) {
        let mut writes: Vec<WriteRequest> = chunk
            .iter()
            .filter_map(|item| PutRequest::builder().set_item(Some(item.clone())).build().ok())
            .map(|put| WriteRequest::builder().put_request(put).build())
            .collect();
        while !writes.is_empty() {
            requests += 1;
            let output = client
                .batch_write_item()
                .request_items(table, writes)
                .send()
                .await?;
            writes = output
                .unprocessed_items
                .and_then(|mut left| left.remove(table))
                .unwrap_or_default();
        }
    }
    Ok(requests)
}
