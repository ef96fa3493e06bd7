//! Large payloads (claim check) in the worker, on the in-memory doubles under a paused clock: the
//! object goes only after the message's delete is confirmed, and a dead-lettered job keeps it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::port::{PayloadPointer, SIZE_ATTRIBUTE};
use conveyor_core::{
    message::AttributeValue,
    port::{OutgoingMessage, Queue},
    {Payloads, Pipeline, Router},
};
use conveyor_testing::{MemoryPayloadStore, MemoryQueue, MessageState, ScriptedQueue};
use conveyor_worker::Worker;

use common::*;

const BUCKET: &str = "payloads";

/// `job`'s message with its body in the store under `key` and the pointer in its place.
fn pointer_message(store: &MemoryPayloadStore, key: &str, job: &TestJob) -> OutgoingMessage {
    let mut message = message("plain", job);
    store.put_now(BUCKET, key, &message.body);
    message.attributes.insert(
        SIZE_ATTRIBUTE.to_owned(),
        AttributeValue::number(message.body.len()),
    );
    message.body = PayloadPointer::new(BUCKET, key).to_body();
    message
}

fn worker(queue: Arc<dyn Queue>, log: &Arc<Log>, store: &Arc<MemoryPayloadStore>, name: &str) -> Worker {
    // A store: only a completed claim lets the object go (every other copy is then a duplicate).
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(log)))
        .with_store(Arc::new(conveyor_testing::MemoryIdempotencyStore::new()))
        .with_payloads(Payloads::new(store.clone()));
    Worker::new(config(&[(name, 1)]), pipeline, vec![queue]).unwrap()
}

/// While the message's deletes fail the object stays (a redelivery must still find it); once the delete
/// goes through, the object goes.
#[tokio::test(start_paused = true)]
async fn the_object_goes_only_after_the_delete_is_confirmed() {
    let log = Log::new();
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    let inner = Arc::new(MemoryQueue::standard("large").with_visibility_timeout(Duration::from_secs(30)));
    let queue = ScriptedQueue::new(Arc::clone(&inner));
    queue.fail_deletes(true);
    inner
        .push_message(pointer_message(&store, "k-1", &job(1)))
        .unwrap();
    let running = start(worker(queue.clone(), &log, &store, "large"));
    eventually(5, "the job", || log.count(Kind::Succeeded) == 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(inner.snapshot()[0].state, MessageState::InFlight);
    assert!(
        store.object(BUCKET, "k-1").is_some(),
        "kept while the delete fails"
    );
    queue.fail_deletes(false);
    eventually(10, "the delete and the object's", || {
        inner.is_empty() && store.object(BUCKET, "k-1").is_none()
    })
    .await;
    running.stop().await;
    assert_eq!(log.count(Kind::Started), 1);
}

/// A permanent failure: the DLQ copy is the pointer, with its marker, and the object stays.
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_job_keeps_its_object_and_its_pointer() {
    let log = Log::new();
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    let dlq = Arc::new(MemoryQueue::standard("large-dlq"));
    let queue = Arc::new(
        MemoryQueue::standard("large")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq, 3),
    );
    let poison = TestJob {
        fail: Fail::Permanent,
        ..job(2)
    };
    let sent = pointer_message(&store, "k-2", &poison);
    queue.push_message(sent.clone()).unwrap();
    let running = start(worker(queue.clone(), &log, &store, "large"));
    eventually(5, "the DLQ copy", || queue.messages_in_dlq().len() == 1).await;
    running.stop().await;
    let copy = &queue.messages_in_dlq()[0];
    assert_eq!(copy.body, sent.body, "the pointer travels");
    assert_eq!(copy.attributes[SIZE_ATTRIBUTE], sent.attributes[SIZE_ATTRIBUTE]);
    assert!(
        store.object(BUCKET, "k-2").is_some(),
        "the object stays with its DLQ message"
    );
    assert_eq!(
        store
            .requests()
            .deletes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
