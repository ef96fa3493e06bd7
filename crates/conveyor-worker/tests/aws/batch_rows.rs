//! A batch handler on LocalStack and DynamoDB Local: a worker writes each job's row with one
//! `BatchWriteItem` per batch (`tests/common/rows.rs`), into a table of the test's own; a few hundred
//! jobs, duplicates (the same key) and poison among them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::aws::{self, connect, send_all};
use crate::rows::{RowJob, RowTable, WriteRows};
use conveyor_core::message::{
    AttributeValue, FAILURE_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE,
};
use conveyor_core::port::{OutgoingMessage, Queue, QueueDepth};
use conveyor_core::{Pipeline, Router};
use conveyor_testing::localstack::{QueueSpec, create_queue, dynamodb_client};
use conveyor_worker::Worker;

/// Rows `0..ROWS`; every fifth is sent twice with the same key.
const ROWS: usize = 300;

pub(crate) fn row_message(body: String, key: Option<&str>) -> OutgoingMessage {
    let mut message = OutgoingMessage {
        body,
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("row"));
    if let Some(key) = key {
        message
            .attributes
            .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    }
    message
}

pub(crate) fn row(id: usize) -> OutgoingMessage {
    let job = RowJob {
        id: format!("row-{id}"),
        value: id as u64,
    };
    row_message(serde_json::to_string(&job).unwrap(), Some(&job.id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_writes_every_row_once_with_batch_write_item_and_dead_letters_the_poison() {
    let client = aws::sqs().await;
    let created = create_queue(
        &client,
        &QueueSpec::standard("batch-rows")
            .visibility_timeout_secs(10)
            .max_receive_count(3),
    )
    .await
    .unwrap();
    let queue = connect(&client, &created.url).await;
    let dlq = connect(&client, created.dlq_url.as_deref().unwrap()).await;
    let rows = RowTable::create(dynamodb_client().await, "batch-rows")
        .await
        .unwrap();
    let pipeline =
        Pipeline::new(Router::new().batch_route(WriteRows(Arc::clone(&rows)))).with_store(aws::store().await);
    let config = aws::config(&[(&created.url, 1)]).with_max_in_flight(50);
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap();

    let mut messages: Vec<OutgoingMessage> = (0..ROWS).map(row).collect();
    messages.extend((0..ROWS).step_by(5).map(row));
    // Poison: two rows without an id (refused by the handler), two bodies that do not decode.
    let no_id = |value: u64| {
        serde_json::to_string(&RowJob {
            id: String::new(),
            value,
        })
        .unwrap()
    };
    messages.push(row_message(no_id(1), None));
    messages.push(row_message(no_id(2), None));
    messages.push(row_message("not json".to_owned(), None));
    messages.push(row_message(r#"{"id": 7}"#.to_owned(), None));
    fastrand::shuffle(&mut messages);
    let sent = messages.len();
    send_all(&queue, messages).await;

    let running = crate::common::start(worker);
    conveyor_testing::wait_until(Duration::from_secs(50), Duration::from_millis(250), async || {
        rows.writes().len() == ROWS
            && queue
                .depth()
                .await
                .is_ok_and(|depth| depth == QueueDepth::default())
            && dlq.depth().await.is_ok_and(|depth| depth.visible == 4)
    })
    .await
    .unwrap();
    let report = running.stop().await;

    let writes = rows.writes();
    let doubled: Vec<(&String, &u32)> = writes.iter().filter(|(_, count)| **count != 1).collect();
    assert!(doubled.is_empty(), "rows written more than once: {doubled:?}");
    assert_eq!(rows.rows().await.unwrap().len(), ROWS, "every row in the table");
    let mut reasons = Vec::new();
    for message in dlq.receive(10, Duration::from_secs(1)).await.unwrap() {
        let failure = message.attributes[FAILURE_ATTRIBUTE]
            .string_value
            .clone()
            .unwrap();
        reasons.push(failure);
    }
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert_eq!(
        reasons
            .iter()
            .filter(|reason| reason.contains("has no id"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|reason| reason.contains("body is not a valid row job"))
            .count(),
        2,
        "{reasons:?}"
    );
    println!(
        "figure: batch handler on LocalStack: {sent} messages ({ROWS} rows, {} duplicates, 4 poison), \
         {} BatchWriteItem requests ({:.3} per row), {} receives beyond one per message sent once (duplicates deferred or acknowledged)",
        ROWS / 5,
        rows.requests(),
        rows.requests() as f64 / ROWS as f64,
        report.received.saturating_sub(ROWS as u64 + 4),
    );
}
