//! What the function's environment turns on, read once: `CONVEYOR_IDEMPOTENCY_TABLE` (the DynamoDB
//! store built from it when the pipeline has none, with the `dynamodb` feature; otherwise the cold start
//! refused with what to do: `conveyor_core::runtime::store_from_env` has the cases), and the start line
//! logged at the first invocation, which says what is on.

use conveyor_core::Pipeline;
use conveyor_core::runtime::{
    ENV_IDEMPOTENCY_TABLE, StoreChoice, describe_store, describe_tenants, describe_tracking, store_from_env,
};

use crate::batch::BatchProcessor;
use crate::error::LambdaError;

/// `pipeline` with the store the environment names, when it names one the pipeline lacks.
pub(crate) async fn with_store_from_env(pipeline: Pipeline) -> Result<Pipeline, LambdaError> {
    let variable = std::env::var(ENV_IDEMPOTENCY_TABLE).ok();
    match store_from_env(variable.as_deref(), &pipeline, cfg!(feature = "dynamodb"))? {
        StoreChoice::Pipeline => Ok(pipeline),
        StoreChoice::Build { table } => Ok(build(pipeline, table).await),
    }
}

#[cfg(feature = "dynamodb")]
async fn build(pipeline: Pipeline, table: String) -> Pipeline {
    let client = conveyor_dynamodb::dynamodb_client_from_env().await;
    let store = conveyor_dynamodb::DynamoStore::new(client, table);
    pipeline.with_store(std::sync::Arc::new(store))
}

/// Never called: without the feature `store_from_env` refuses instead of choosing to build.
#[cfg(not(feature = "dynamodb"))]
async fn build(pipeline: Pipeline, _table: String) -> Pipeline {
    pipeline
}

/// Logs the start line once per execution environment, at its first invocation (when the event names
/// the queues): queues, idempotency, tracking, timers relay, flows sweep, tenants, tracing.
pub(crate) fn log_start_once(processor: &BatchProcessor, payload: &serde_json::Value) {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| log_start(processor, payload));
}

fn log_start(processor: &BatchProcessor, payload: &serde_json::Value) {
    let pipeline = processor.pipeline();
    let flows = match (pipeline.flows().is_some(), pipeline.store().is_some()) {
        (false, _) => "off",
        (true, true) => "on invocation ({\"conveyor\": \"sweep_flows\"})",
        (true, false) => "off (flows need the idempotency store)",
    };
    let timers = if pipeline.timers().is_some() {
        "on invocation ({\"conveyor\": \"relay_timers\"})"
    } else {
        "off"
    };
    tracing::info!(
        queues = %event_queues(payload),
        idempotency = %describe_store(pipeline),
        tracking = %describe_tracking(pipeline),
        timers_relay = %timers,
        schedules = %"off (EventBridge Scheduler sends a Lambda's schedules)",
        outbox_relay = %"off (the relay is a function of its own: conveyor_lambda::outbox)",
        flows_sweep = %flows,
        tenants = %describe_tenants(&processor.config().tenants),
        tracing = %tracing_export(),
        batch_concurrency = processor.config().batch_concurrency,
        "conveyor function started"
    );
}

/// The queues the event's records came from (their `eventSourceARN`s' last part), or what the
/// invocation is when it is not an SQS event.
fn event_queues(payload: &serde_json::Value) -> String {
    let mut queues: Vec<&str> = payload["Records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|record| record["eventSourceARN"].as_str())
        .map(|arn| arn.rsplit(':').next().unwrap_or(arn))
        .collect();
    queues.sort_unstable();
    queues.dedup();
    if queues.is_empty() {
        return "(not an SQS event: known at the first SQS batch)".to_owned();
    }
    queues.join(",")
}

/// Whether spans are exported over OTLP, and where.
fn tracing_export() -> String {
    #[cfg(feature = "otel")]
    return conveyor_otel::describe_export();
    #[cfg(not(feature = "otel"))]
    return "off (built without the otel feature)".to_owned();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queues_come_from_the_records_sources() {
        let event = serde_json::json!({"Records": [
            {"eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs"},
            {"eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs"},
            {"eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:other.fifo"},
        ]});
        assert_eq!(event_queues(&event), "jobs,other.fifo");
        assert!(event_queues(&serde_json::json!({"conveyor": "relay_timers"})).contains("not an SQS event"));
    }
}
