//! A batch handler behind the Lambda adapter: an invocation's records of one type reach it together,
//! and the partial batch response lists exactly the failed records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::message::{
    AttributeValue, FAILURE_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE,
};
use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_core::{Batch, BatchHandler, BatchResult, HandlerError, Pipeline, Router};
use conveyor_lambda::{BatchProcessor, FixedQueue, LambdaConfig};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use serde::Deserialize;

use super::{event_of, in_ten_seconds, listed};

#[derive(Debug, Deserialize)]
struct Row {
    name: String,
    #[serde(default)]
    action: String,
}

/// Records each call's job names; each job's result follows its `action`.
#[derive(Clone, Default)]
struct Rows {
    calls: Arc<Mutex<Vec<Vec<String>>>>,
}

impl BatchHandler for Rows {
    type Job = Row;
    type Output = ();
    const JOB_TYPE: &'static str = "rows";

    async fn handle_batch(&self, batch: Batch<Row>) -> BatchResult<()> {
        let names = batch.jobs().iter().map(|job| job.job.name.clone()).collect();
        self.calls.lock().unwrap().push(names);
        Ok(batch
            .jobs()
            .iter()
            .map(|job| match job.job.action.as_str() {
                "retry" => Err(HandlerError::retry_after(
                    "unprocessed item",
                    Duration::from_secs(30),
                )),
                "permanent" => Err(HandlerError::permanent("no such table row")),
                _ => Ok(()),
            })
            .collect())
    }
}

struct Rig {
    queue: Arc<MemoryQueue>,
    rows: Rows,
    processor: BatchProcessor,
}

fn rig(queue: MemoryQueue) -> Rig {
    let queue = Arc::new(queue);
    let rows = Rows::default();
    let store = Arc::new(MemoryIdempotencyStore::new()) as Arc<dyn IdempotencyStore>;
    let pipeline = Pipeline::new(Router::new().batch_route(rows.clone())).with_store(store);
    let resolver = FixedQueue(Arc::clone(&queue) as Arc<dyn Queue>);
    let processor =
        BatchProcessor::new(pipeline, LambdaConfig::default(), Arc::new(resolver)).without_metrics();
    Rig {
        queue,
        rows,
        processor,
    }
}

impl Rig {
    fn push(&self, name: &str, action: &str, key: Option<&str>, group: Option<&str>) -> String {
        let mut message = OutgoingMessage {
            body: serde_json::json!({"name": name, "action": action}).to_string(),
            group_id: group.map(str::to_owned),
            deduplication_id: group.map(|_| name.to_owned()),
            ..OutgoingMessage::default()
        };
        message
            .attributes
            .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("rows"));
        if let Some(key) = key {
            message
                .attributes
                .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
        }
        self.queue.push_message(message).unwrap()
    }

    fn calls(&self) -> Vec<Vec<String>> {
        self.rows.calls.lock().unwrap().clone()
    }
}

#[tokio::test(start_paused = true)]
async fn an_invocations_records_reach_the_batch_handler_together_and_only_failures_are_listed() {
    let dlq = Arc::new(MemoryQueue::standard("rows-dlq"));
    let rig = rig(MemoryQueue::standard("rows")
        .with_visibility_timeout(Duration::from_secs(300))
        .with_dead_letter_queue(Arc::clone(&dlq), 5));
    rig.push("ok1", "ok", Some("row-1"), None);
    let retry = rig.push("retry", "retry", None, None);
    rig.push("poison", "permanent", None, None);
    rig.push("ok2", "ok", None, None);
    // The same key as ok1, in the same invocation: claimed by ok1, so this copy never reaches the
    // handler; it is deferred with a copy (not listed, no receive spent).
    let duplicate = rig.push("ok1-again", "ok", Some("row-1"), None);
    let received = rig.queue.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(received.len(), 5);

    let report = rig
        .processor
        .process_batch_report(event_of(&rig.queue, &received), in_ten_seconds())
        .await;
    assert_eq!(
        listed(&report),
        vec![retry],
        "exactly the failed record is listed"
    );
    assert_eq!(
        rig.calls(),
        vec![vec!["ok1", "retry", "poison", "ok2"]],
        "one call, the claimed jobs only"
    );
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].body.contains("poison"));
    let failure = dead[0].attributes[FAILURE_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    assert!(failure.contains("no such table row"), "{failure}");
    let metrics = &report.metrics[0];
    assert_eq!(
        (
            metrics.received,
            metrics.succeeded,
            metrics.retried,
            metrics.dead_lettered
        ),
        (5, 2, 1, 1),
        "{metrics:?}"
    );
    let copies: Vec<String> = rig
        .queue
        .snapshot()
        .into_iter()
        .filter(|message| message.body.contains("ok1-again") && message.id != duplicate)
        .map(|message| message.id)
        .collect();
    assert_eq!(copies.len(), 1, "the duplicate waits as a deferred copy");
}

#[tokio::test(start_paused = true)]
async fn a_fifo_event_is_gathered_across_groups_and_keeps_each_groups_order() {
    let rig = rig(MemoryQueue::fifo("rows").with_visibility_timeout(Duration::from_secs(300)));
    rig.push("a1", "ok", None, Some("a"));
    rig.push("a2", "ok", None, Some("a"));
    rig.push("a3", "ok", None, Some("a"));
    rig.push("b1", "ok", None, Some("b"));
    let b2 = rig.push("b2", "retry", None, Some("b"));
    let b3 = rig.push("b3", "ok", None, Some("b"));
    let received = rig.queue.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(received.len(), 6, "both groups in one event");

    let report = rig
        .processor
        .process_batch_report(event_of(&rig.queue, &received), in_ten_seconds())
        .await;
    assert_eq!(
        listed(&report),
        vec![b2, b3],
        "b2 failed and b3 stays behind it, in order"
    );
    assert_eq!(
        rig.calls(),
        vec![vec!["a1", "b1"], vec!["a2", "b2"], vec!["a3"]],
        "one job per group per call, each group in order"
    );
}
