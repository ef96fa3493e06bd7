//! The pipeline with large payloads (claim check) on the in-memory doubles: every row of the failure
//! table that involves a pointer, and the DLQ copy that keeps it.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::message::JOB_TYPE_ATTRIBUTE;
use conveyor_core::port::{LEGACY_SIZE_ATTRIBUTE, PayloadPointer, SIZE_ATTRIBUTE};
use conveyor_core::runtime::dead_letter_copy;
use conveyor_core::{
    message::{AttributeValue, Message},
    runtime::{AckReason, Budget, Lease, Outcome, Processed},
    {Context, Handler, HandlerError, Payloads, Pipeline, Router},
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryPayloadStore};
use tokio::time::Instant;

const BUCKET: &str = "payloads";

/// Returns the length of the text it got, so the test sees the payload reached the handler.
struct Measure;

impl Handler for Measure {
    type Job = String;
    type Output = usize;
    const JOB_TYPE: &'static str = "measure";

    async fn handle(&self, text: String, _ctx: Context) -> Result<usize, HandlerError> {
        Ok(text.len())
    }
}

fn pointer_message(key: &str, marker: &str) -> Message {
    let mut message = Message::new(uuid(), PayloadPointer::new(BUCKET, key).to_body());
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("measure"));
    message
        .attributes
        .insert(marker.to_owned(), AttributeValue::number(123));
    message.receive_count = 1;
    message
}

fn uuid() -> String {
    format!("m-{}", fastrand::u64(..))
}

async fn run(pipeline: &Pipeline, message: &Message) -> Processed {
    let lease = Lease::new(Instant::now() + Duration::from_secs(30));
    let budget = Budget::default().with_max_attempts(Some(5));
    pipeline
        .process(Arc::new(message.clone()), Arc::from("jobs"), &lease, budget)
        .await
}

fn payloads(store: &Arc<MemoryPayloadStore>) -> Payloads {
    Payloads::new(store.clone())
}

#[tokio::test]
async fn a_pointer_is_resolved_the_handler_sees_the_payload_and_the_object_goes_after_the_ack() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    let payload = format!("\"{}\"", "é".repeat(3 * 1024 * 1024));
    for marker in [SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE] {
        store.put_now(BUCKET, "k1", &payload);
        let without_store = Pipeline::new(Router::new().route(Measure)).with_payloads(payloads(&store));
        assert!(
            !without_store.discards_payload_of(&pointer_message("k1", marker)),
            "without a completed claim the object is left to the lifecycle"
        );
        let pipeline = without_store.with_store(Arc::new(MemoryIdempotencyStore::new()));
        let message = pointer_message("k1", marker);
        let processed = run(&pipeline, &message).await;
        assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed), "{marker}");
        assert_eq!(
            processed.output.as_deref(),
            Some("6291456"),
            "{marker}: 3 Mi two-byte chars"
        );
        assert!(
            store.object(BUCKET, "k1").is_some(),
            "kept until the runtime confirms the delete"
        );
        assert!(pipeline.discards_payload_of(&message));
        pipeline.discard_payload(&message).await;
        assert!(
            store.object(BUCKET, "k1").is_none(),
            "{marker}: deleted after success"
        );
    }
}

/// A producer can point a job at any bucket; a consumer deletes after success only in its own
/// (`CONVEYOR_PAYLOAD_BUCKET`), and reads the rest.
#[tokio::test]
async fn an_object_in_another_bucket_is_read_but_never_deleted() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    store.put_now("someone-elses", "db.json", "\"secrets\"");
    let pipeline = Pipeline::new(Router::new().route(Measure))
        .with_store(Arc::new(MemoryIdempotencyStore::new()))
        .with_payloads(payloads(&store).own_bucket(BUCKET));
    let mut foreign = pointer_message("db.json", SIZE_ATTRIBUTE);
    foreign.body = PayloadPointer::new("someone-elses", "db.json").to_body();
    let processed = run(&pipeline, &foreign).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    pipeline.discard_payload(&foreign).await;
    assert!(
        store.object("someone-elses", "db.json").is_some(),
        "another bucket's object is not this consumer's to delete"
    );
    store.put_now(BUCKET, "k1", "\"x\"");
    let own = pointer_message("k1", SIZE_ATTRIBUTE);
    assert_eq!(
        run(&pipeline, &own).await.outcome,
        Outcome::Ack(AckReason::Completed)
    );
    pipeline.discard_payload(&own).await;
    assert!(
        store.object(BUCKET, "k1").is_none(),
        "its own bucket's object goes"
    );
}

#[tokio::test]
async fn kept_after_success_when_configured() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    store.put_now(BUCKET, "k1", "\"x\"");
    let pipeline =
        Pipeline::new(Router::new().route(Measure)).with_payloads(payloads(&store).keep_after_success());
    let message = pointer_message("k1", SIZE_ATTRIBUTE);
    assert_eq!(
        run(&pipeline, &message).await.outcome,
        Outcome::Ack(AckReason::Completed)
    );
    assert!(!pipeline.discards_payload_of(&message));
    pipeline.discard_payload(&message).await;
    assert!(store.object(BUCKET, "k1").is_some());
}

#[tokio::test]
async fn a_missing_object_is_a_permanent_failure_naming_bucket_and_key() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    let pipeline = Pipeline::new(Router::new().route(Measure)).with_payloads(payloads(&store));
    let processed = run(&pipeline, &pointer_message("gone-key", SIZE_ATTRIBUTE)).await;
    let Outcome::Reject(failure) = &processed.outcome else {
        panic!("expected a reject, got {:?}", processed.outcome)
    };
    assert!(
        failure.error.contains("s3://payloads/gone-key"),
        "{}",
        failure.error
    );
    assert_eq!(failure.handler, "measure");
    assert!(!processed.ran());
}

#[tokio::test]
async fn a_missing_object_of_a_completed_job_is_a_duplicate() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    store.put_now(BUCKET, "k1", "\"abc\"");
    let records = Arc::new(MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(Router::new().route(Measure))
        .with_store(records)
        .with_payloads(payloads(&store));
    let message = pointer_message("k1", SIZE_ATTRIBUTE);
    assert_eq!(
        run(&pipeline, &message).await.outcome,
        Outcome::Ack(AckReason::Completed)
    );
    pipeline.discard_payload(&message).await;
    // The same message again (the response or the delete was lost): its record says done.
    let again = run(&pipeline, &message).await;
    assert_eq!(again.outcome, Outcome::Ack(AckReason::Duplicate));
    assert_eq!(again.output.as_deref(), Some("3"));
}

#[tokio::test]
async fn an_unavailable_store_defers_without_running() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    store.put_now(BUCKET, "k1", "\"abc\"");
    store.set_unavailable(true);
    let pipeline = Pipeline::new(Router::new().route(Measure)).with_payloads(payloads(&store));
    let processed = run(&pipeline, &pointer_message("k1", SIZE_ATTRIBUTE)).await;
    let Outcome::Defer { reason, .. } = &processed.outcome else {
        panic!("expected a deferral, got {:?}", processed.outcome)
    };
    assert!(reason.contains("payload fetch failed"), "{reason}");
    // A missing bucket (configuration) defers too: only NotFound dead-letters.
    let pipeline = Pipeline::new(Router::new().route(Measure))
        .with_payloads(Payloads::new(Arc::new(MemoryPayloadStore::with_bucket("other"))));
    let processed = run(&pipeline, &pointer_message("k1", SIZE_ATTRIBUTE)).await;
    assert!(
        matches!(processed.outcome, Outcome::Defer { .. }),
        "{:?}",
        processed.outcome
    );
}

#[tokio::test]
async fn without_a_store_a_pointer_retries_with_what_to_set_and_a_bad_pointer_is_rejected() {
    let pipeline = Pipeline::new(Router::new().route(Measure));
    let processed = run(&pipeline, &pointer_message("k1", SIZE_ATTRIBUTE)).await;
    let Outcome::Retry { reason, .. } = &processed.outcome else {
        panic!("expected a retry, got {:?}", processed.outcome)
    };
    assert!(
        reason.contains("CONVEYOR_PAYLOAD_BUCKET") && reason.contains("s3://payloads/k1"),
        "{reason}"
    );

    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    let pipeline = Pipeline::new(Router::new().route(Measure)).with_payloads(payloads(&store));
    let mut bad = pointer_message("k1", SIZE_ATTRIBUTE);
    bad.body = "\"just text\"".to_owned();
    let processed = run(&pipeline, &bad).await;
    let Outcome::Reject(failure) = &processed.outcome else {
        panic!("expected a reject, got {:?}", processed.outcome)
    };
    assert!(failure.error.contains("ExtendedPayloadSize"), "{}", failure.error);
}

#[tokio::test]
async fn the_dlq_copy_carries_the_pointer_and_the_attributes_and_the_object_stays() {
    let store = Arc::new(MemoryPayloadStore::with_bucket(BUCKET));
    store.put_now(BUCKET, "k1", "\"abc\"");
    let mut message = pointer_message("k1", SIZE_ATTRIBUTE);
    // A full set of attributes: the marker must stay in place, not move into the overflow.
    for name in ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"] {
        message
            .attributes
            .insert(name.to_owned(), AttributeValue::string("v"));
    }
    assert_eq!(message.attributes.len(), 10);
    let failure = conveyor_core::runtime::Failure::now("boom", 1, "jobs", "measure");
    let copy = dead_letter_copy(&message, &failure, false);
    assert_eq!(copy.body, message.body, "the pointer travels");
    assert_eq!(
        copy.attributes[SIZE_ATTRIBUTE],
        message.attributes[SIZE_ATTRIBUTE]
    );
    assert!(store.object(BUCKET, "k1").is_some());

    let small = pointer_message("k1", SIZE_ATTRIBUTE);
    let copy = dead_letter_copy(&small, &failure, false);
    for (name, value) in &small.attributes {
        assert_eq!(copy.attributes.get(name), Some(value), "{name} unchanged");
    }
}

/// A payload store that counts touches (the memory store's objects do not expire, so it has none).
struct CountingTouches {
    inner: Arc<MemoryPayloadStore>,
    touches: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl conveyor_core::port::PayloadStore for CountingTouches {
    async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: Vec<u8>,
    ) -> Result<(), conveyor_core::port::PayloadError> {
        self.inner.put(bucket, key, body).await
    }
    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, conveyor_core::port::PayloadError> {
        self.inner.get(bucket, key).await
    }
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), conveyor_core::port::PayloadError> {
        self.inner.delete(bucket, key).await
    }
    async fn touch(&self, _bucket: &str, _key: &str) -> Result<(), conveyor_core::port::PayloadError> {
        self.touches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// A message deferred unrun by a runtime (a Lambda cutoff, a worker's shutdown, an open circuit) never
/// goes through `process`: the runtime asks the pipeline first, which touches the object when a copy
/// in a new period of `touch_every` is made, as its own deferrals do.
#[tokio::test]
async fn an_unrun_copy_touches_its_object_once_per_period() {
    let store = Arc::new(CountingTouches {
        inner: Arc::new(MemoryPayloadStore::with_bucket(BUCKET)),
        touches: std::sync::atomic::AtomicU64::new(0),
    });
    let day = Duration::from_secs(86_400);
    let pipeline = Pipeline::new(Router::new().route(Measure))
        .with_payloads(Payloads::new(store.clone()).touch_every(day));
    let touches = || store.touches.load(std::sync::atomic::Ordering::SeqCst);

    // Sent now, first sent now: a copy now is in the same period, no touch.
    let mut fresh = pointer_message("k1", SIZE_ATTRIBUTE);
    fresh.sent_at = Some(std::time::SystemTime::now());
    pipeline.before_unrun_copy(&fresh).await;
    assert_eq!(touches(), 0, "a copy in the message's own period touches nothing");

    // Sent two days ago (a job hopping since): a copy now starts a new period, touched.
    let mut old = pointer_message("k3", SIZE_ATTRIBUTE);
    old.sent_at = Some(std::time::SystemTime::now() - 2 * day);
    pipeline.before_unrun_copy(&old).await;
    assert_eq!(touches(), 1, "a copy in a later period touches");

    // Times unknown (no sent time): touched, to be safe.
    pipeline
        .before_unrun_copy(&pointer_message("k2", SIZE_ATTRIBUTE))
        .await;
    assert_eq!(touches(), 2, "an unknown age touches");

    // A message without a pointer: nothing to touch.
    pipeline.before_unrun_copy(&Message::new("m-plain", "{}")).await;
    assert_eq!(touches(), 2);
}
