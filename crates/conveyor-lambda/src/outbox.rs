//! The outbox relay as a Lambda function behind the outbox table's DynamoDB stream (event source mapping
//! with `ReportBatchItemFailures`): the records of one invocation go through `conveyor_outbox::Relay`,
//! and the first record not relayed, with every record after it, is reported in `batchItemFailures`.
//!
//! Design note (order): a DynamoDB stream batch comes from one shard, in order. Lambda checkpoints at the
//! lowest sequence number reported and retries from there, so reporting the first failure and everything
//! after it keeps each aggregate's order; records after the failure that were sent are sent again on the
//! retry, and the consumer settles those duplicates once (FIFO queues also deduplicate them by item id).

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use conveyor_outbox::{Image, OutboxTable, Relay, StreamRecord, Value};
use lambda_runtime::{LambdaEvent, service_fn};
use tracing::Instrument;

use crate::error::LambdaError;

/// Relays one stream event; returns the records to retry.
pub async fn relay_stream_event(relay: &Relay, event: &Event) -> DynamoDbEventResponse {
    let records: Vec<StreamRecord> = event.records.iter().map(stream_record).collect();
    let report = relay.relay(&records).await;
    tracing::info!(
        records = records.len(),
        sent = report.sent,
        ignored = report.ignored + report.already_removed,
        unreadable = report.unreadable,
        delete_failures = report.delete_failures,
        requests = report.requests,
        "outbox records relayed"
    );
    let batch_item_failures = report
        .first_failure
        .map(|first| {
            records[first..]
                .iter()
                .map(|record| {
                    let mut failure = DynamoDbBatchItemFailure::default();
                    failure.item_identifier = Some(record.sequence_number.clone());
                    failure
                })
                .collect()
        })
        .unwrap_or_default();
    let mut response = DynamoDbEventResponse::default();
    response.batch_item_failures = batch_item_failures;
    response
}

/// Runs the relay function: the outbox table from the environment (`CONVEYOR_OUTBOX_TABLE` and its
/// companions, see `conveyor_outbox::table`), SQS and DynamoDB clients built once, at the cold start.
pub async fn run_outbox_relay() -> Result<(), LambdaError> {
    let table = OutboxTable::from_env().ok_or_else(|| LambdaError::Environment {
        name: conveyor_outbox::table::TABLE_ENV,
        value: String::new(),
        problem: "set it to the outbox table's name (the table whose stream triggers this function)"
            .to_owned(),
    })?;
    let relay = Relay::new(
        conveyor_sqs::sqs_client_from_env().await,
        conveyor_dynamodb::dynamodb_client_from_env().await,
        table,
    );
    let handler = service_fn(move |event: LambdaEvent<Event>| {
        let relay = relay.clone();
        // Boxed: the relay's future is deep, and a binary's `main` would otherwise need a larger
        // `recursion_limit` to compute its layout.
        let invocation: std::pin::Pin<Box<dyn std::future::Future<Output = DynamoDbEventResponse> + Send>> =
            Box::pin(async move {
                let span = tracing::info_span!(
                    "invocation",
                    request_id = %event.context.request_id,
                    records = event.payload.records.len()
                );
                relay_stream_event(&relay, &event.payload).instrument(span).await
            });
        async move { Ok::<_, std::convert::Infallible>(invocation.await) }
    });
    lambda_runtime::run(handler)
        .await
        .map_err(|error| LambdaError::Runtime(error.to_string()))
}

/// A Lambda stream record in the relay's shape.
fn stream_record(record: &aws_lambda_events::event::dynamodb::EventRecord) -> StreamRecord {
    let change = &record.change;
    let mut converted = StreamRecord::new(
        change.sequence_number.clone().unwrap_or_default(),
        &record.event_name,
        Some(image(&change.keys)),
        Some(image(&change.new_image)),
    );
    converted.created_at_millis =
        u64::try_from(change.approximate_creation_date_time.timestamp_millis()).ok();
    converted
}

fn image(item: &serde_dynamo::Item) -> Image {
    item.inner()
        .iter()
        .map(|(name, attribute)| (name.clone(), value(attribute)))
        .collect()
}

fn value(attribute: &serde_dynamo::AttributeValue) -> Value {
    use serde_dynamo::AttributeValue as A;
    match attribute {
        A::S(text) => Value::S(text.clone()),
        A::N(text) => Value::N(text.clone()),
        A::B(bytes) => Value::B(bytes.clone()),
        A::M(map) => Value::M(
            map.iter()
                .map(|(name, inner)| (name.clone(), value(inner)))
                .collect(),
        ),
        _ => Value::Other,
    }
}
