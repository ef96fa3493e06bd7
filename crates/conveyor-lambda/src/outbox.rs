//! The outbox relay as a Lambda function. Two events reach it:
//! - **Stream events** from the outbox table's DynamoDB stream (an event source mapping): each record's
//!   keys name an aggregate (keys only: the image is not read), and the relay sends those aggregates'
//!   unsent jobs from the table, in order (`conveyor_outbox::Relay`).
//! - **Sweeps** (any other event, such as the EventBridge schedule `infra/modules/outbox-relay` sets up
//!   every minute): the aggregates with jobs older than [`SWEEP_AFTER`] are relayed, so a job whose
//!   record the stream no longer holds (24 hours), whose send failed, or whose trigger was lost is
//!   still sent; the backlog's age and parked jobs are printed as EMF metrics for the alarm.
//!
//! Design note (order): the stream is only a trigger. Order comes from the table (each aggregate's
//! sequence) and the relay's conditional removals, so concurrent invocations on different shards, a
//! retried batch or a sweep running beside them cannot reorder an aggregate's jobs (see
//! `conveyor_outbox`'s relay design note). A batch is reported for retry only when the table could not
//! be read; a job SQS refused stays first in its aggregate, tried again by the next sweep and parked
//! after its attempts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use conveyor_outbox::{OutboxTable, Relay, RelayReport, Unfenced};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tracing::Instrument;

use crate::error::LambdaError;

/// How old a job must be before a sweep relays it (younger ones are the stream's).
pub const SWEEP_AFTER: Duration = Duration::from_secs(30);
/// Aggregates relayed per sweep pass.
const SWEEP_AGGREGATES: usize = 100;
/// A sweep stops starting passes when less than this is left of the invocation.
const SWEEP_RESERVE: Duration = Duration::from_secs(10);

/// The aggregates a stream event's records name (from their keys), in record order.
pub fn aggregates(table: &OutboxTable, event: &Event) -> Vec<String> {
    event
        .records
        .iter()
        .filter_map(|record| {
            let key = record.change.keys.inner().get(&table.partition_key)?;
            let serde_dynamo::AttributeValue::S(value) = key else {
                return None;
            };
            OutboxTable::aggregate_of(value).map(str::to_owned)
        })
        .collect()
}

/// Relays one stream event; reports every record for retry only when the table could not be read.
pub async fn relay_stream_event(relay: &Relay, table: &OutboxTable, event: &Event) -> DynamoDbEventResponse {
    let aggregates = aggregates(table, event);
    let report = relay.relay(&aggregates, &Unfenced).await;
    log_report("outbox stream records relayed", event.records.len(), &report);
    let mut response = DynamoDbEventResponse::default();
    if report.store_errors > 0 && report.sent == 0 {
        response.batch_item_failures = event
            .records
            .iter()
            .filter_map(|record| record.change.sequence_number.clone())
            .map(|sequence| {
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(sequence);
                failure
            })
            .collect();
    }
    response
}

/// Relays what waits longer than `min_age` ([`SWEEP_AFTER`] in the function), pass after pass until a
/// pass finds nothing to send or `deadline` is near; then prints the backlog's EMF line.
pub async fn sweep(relay: &Relay, min_age: Duration, deadline: SystemTime) -> RelayReport {
    let mut total = RelayReport::default();
    loop {
        let report = relay.sweep(min_age, SWEEP_AGGREGATES, &Unfenced).await;
        total.add(&report);
        let near = deadline
            .duration_since(SystemTime::now())
            .map_or(true, |left| left < SWEEP_RESERVE);
        if report.sent == 0 || near {
            break;
        }
    }
    log_report("outbox sweep", 0, &total);
    match relay.store().backlog(100).await {
        Ok(backlog) => println!("{}", backlog_emf(&backlog, SystemTime::now())),
        Err(error) => tracing::warn!(%error, "reading the outbox backlog failed"),
    }
    total
}

/// The backlog as one EMF line: `OldestUnsentSeconds` and `ParkedJobs` in namespace `Conveyor/Outbox`.
pub fn backlog_emf(backlog: &conveyor_outbox::Backlog, now: SystemTime) -> String {
    let now_millis =
        u64::try_from(now.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX);
    let age = backlog
        .oldest_pending_millis
        .map_or(0, |oldest| now_millis.saturating_sub(oldest) / 1000);
    serde_json::json!({
        "_aws": {
            "Timestamp": now_millis,
            "CloudWatchMetrics": [{
                "Namespace": "Conveyor/Outbox",
                "Dimensions": [[]],
                "Metrics": [
                    {"Name": "OldestUnsentSeconds", "Unit": "Seconds"},
                    {"Name": "ParkedJobs", "Unit": "Count"}
                ]
            }]
        },
        "OldestUnsentSeconds": age,
        "ParkedJobs": backlog.parked.len(),
    })
    .to_string()
}

fn log_report(what: &str, records: usize, report: &RelayReport) {
    tracing::info!(
        records,
        aggregates = report.aggregates,
        sent = report.sent,
        raced = report.raced,
        failed = report.failed,
        parked = report.parked,
        blocked = report.blocked,
        store_errors = report.store_errors,
        "{what}"
    );
}

/// Runs the relay function: the outbox table from the environment (`CONVEYOR_OUTBOX_TABLE` and its
/// companions, see `conveyor_outbox::table`), clients built once, at the cold start.
pub async fn run_outbox_relay() -> Result<(), LambdaError> {
    let table = OutboxTable::from_env().ok_or_else(|| LambdaError::Environment {
        name: conveyor_outbox::table::TABLE_ENV,
        value: String::new(),
        problem: "set it to the outbox table's name (the table whose stream triggers this function)"
            .to_owned(),
    })?;
    let relay =
        conveyor_outbox::relay_for(table.clone())
            .await
            .map_err(|error| LambdaError::Environment {
                name: conveyor_outbox::MAX_ATTEMPTS_ENV,
                value: std::env::var(conveyor_outbox::MAX_ATTEMPTS_ENV).unwrap_or_default(),
                problem: error.to_string(),
            })?;
    let handler = service_fn(move |event: LambdaEvent<Value>| {
        let relay = relay.clone();
        let table = table.clone();
        // Boxed: the relay's future is deep, and a binary's `main` would otherwise need a larger
        // `recursion_limit` to compute its layout.
        let invocation: std::pin::Pin<Box<dyn std::future::Future<Output = Value> + Send>> =
            Box::pin(async move {
                let span = tracing::info_span!("invocation", request_id = %event.context.request_id);
                handle(&relay, &table, event).instrument(span).await
            });
        async move { Ok::<_, std::convert::Infallible>(invocation.await) }
    });
    lambda_runtime::run(handler)
        .await
        .map_err(|error| LambdaError::Runtime(error.to_string()))
}

/// A stream event (it has `Records`) is relayed; anything else is a sweep.
async fn handle(relay: &Relay, table: &OutboxTable, event: LambdaEvent<Value>) -> Value {
    let is_stream = event.payload.get("Records").is_some();
    if is_stream {
        match serde_json::from_value::<Event>(event.payload) {
            Ok(stream) => {
                let response = relay_stream_event(relay, table, &stream).await;
                return serde_json::to_value(response).unwrap_or(Value::Null);
            }
            Err(error) => {
                tracing::error!(%error, "an event with Records is not a DynamoDB stream event; swept instead");
            }
        }
    }
    let deadline = UNIX_EPOCH + Duration::from_millis(event.context.deadline);
    let report = sweep(relay, SWEEP_AFTER, deadline).await;
    serde_json::json!({ "sent": report.sent, "parked": report.parked, "failed": report.failed })
}
