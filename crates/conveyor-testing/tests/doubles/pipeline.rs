//! One test per row of the failure table in conveyor-core's `src/pipeline.rs`, run through the real
//! `Pipeline` with `MemoryIdempotencyStore`, plus `reject()` against `MemoryQueue`.

// Test helpers outside #[test] functions unwrap too (clippy's allow-unwrap-in-tests covers only the latter).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use conveyor_core::message::{JOB_TYPE_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE};
use conveyor_core::port::{idempotency_key, payload_hash};
use conveyor_core::{
    message::{AttributeValue, Message},
    port::{IdempotencyRecord, IdempotencyStore, Queue, RecordStatus},
    runtime::{AckReason, Budget, Disposition, Failure, Lease, Outcome, Processed, reject},
    {Backoff, Context, Handler, HandlerError, HandlerSettings, Pipeline, RejectMode, Router},
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use serde::Deserialize;
use tokio::time::Instant;

const JOB_TYPE: &str = "test_job";
const LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
struct TestJob {
    n: u64,
}

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Succeed,
    SucceedWithLargeOutput,
    Retryable,
    Permanent,
    Panic,
    Sleep(Duration),
    StopWhenCancelled,
    IgnoreCancellation,
    /// Ignores its context, works this long, then fails retryably (as a handler that noticed only
    /// after its call returned that it was told to stop).
    SleepThenFail(Duration),
}

type Hook = Arc<dyn Fn() + Send + Sync>;

struct TestHandler {
    behaviour: Behaviour,
    runs: Arc<AtomicUsize>,
    settings: HandlerSettings,
    during_run: Option<Hook>,
}

impl Handler for TestHandler {
    type Job = TestJob;
    type Output = serde_json::Value;
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, job: TestJob, ctx: Context) -> Result<serde_json::Value, HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = &self.during_run {
            hook();
        }
        match self.behaviour {
            Behaviour::Succeed => Ok(serde_json::json!({ "n": job.n })),
            Behaviour::SucceedWithLargeOutput => Ok(serde_json::json!({ "blob": "x".repeat(1000) })),
            Behaviour::Retryable => Err(HandlerError::retryable("provider returned 503")),
            Behaviour::Permanent => Err(HandlerError::permanent("no such user")),
            Behaviour::Panic => panic!("handler bug"),
            Behaviour::Sleep(duration) => {
                tokio::time::sleep(duration).await;
                Ok(serde_json::Value::Null)
            }
            Behaviour::StopWhenCancelled => {
                ctx.cancelled().await;
                Err(HandlerError::retryable("stopped: cancelled"))
            }
            Behaviour::IgnoreCancellation => {
                std::future::pending::<()>().await;
                Ok(serde_json::Value::Null)
            }
            Behaviour::SleepThenFail(duration) => {
                tokio::time::sleep(duration).await;
                Err(HandlerError::permanent("stopped: told to"))
            }
        }
    }

    fn settings(&self) -> HandlerSettings {
        self.settings.clone()
    }
}

struct Fixture {
    store: Arc<MemoryIdempotencyStore>,
    runs: Arc<AtomicUsize>,
    pipeline: Pipeline,
}

/// The record was released: absent, or left free to claim at once (its lease ended).
fn released(record: Option<IdempotencyRecord>) -> bool {
    record.is_none_or(|record| record.is_free_at(SystemTime::now()))
}

fn settings() -> HandlerSettings {
    HandlerSettings::default()
        .with_timeout(Duration::from_secs(5))
        .with_backoff(Backoff::with_budget(Duration::from_secs(10)))
}

fn fixture_with(
    behaviour: Behaviour,
    store: MemoryIdempotencyStore,
    settings: HandlerSettings,
    during_run: impl FnOnce(Arc<MemoryIdempotencyStore>) -> Option<Hook>,
) -> Fixture {
    let store = Arc::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = TestHandler {
        behaviour,
        runs: Arc::clone(&runs),
        settings,
        during_run: during_run(Arc::clone(&store)),
    };
    let pipeline = Pipeline::new(Router::new().route(handler)).with_store(store.clone());
    Fixture {
        store,
        runs,
        pipeline,
    }
}

fn fixture(behaviour: Behaviour) -> Fixture {
    fixture_with(behaviour, MemoryIdempotencyStore::new(), settings(), |_| None)
}

fn message(body: &str) -> Message {
    let mut message = Message::new(format!("m-{}", uuid_like()), body);
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(JOB_TYPE));
    message
}

fn uuid_like() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{:06}", NEXT.fetch_add(1, Ordering::SeqCst))
}

fn key_of(message: &Message) -> String {
    idempotency_key(JOB_TYPE, message.idempotency_key(), &message.id)
}

impl Fixture {
    async fn process(&self, message: &Message) -> (Processed, Lease) {
        let lease = Lease::new(Instant::now() + LEASE);
        let processed = self
            .pipeline
            .process(
                Arc::new(message.clone()),
                Arc::from("jobs"),
                &lease,
                Budget::default(),
            )
            .await;
        (processed, lease)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn record(&self, message: &Message) -> Option<IdempotencyRecord> {
        self.store.get(&key_of(message)).await.unwrap()
    }
}

fn assert_reject(processed: &Processed, containing: &str) -> Failure {
    let Outcome::Reject(failure) = &processed.outcome else {
        panic!("expected a reject, got {:?}", processed.outcome)
    };
    assert!(
        failure.error.contains(containing),
        "{:?} does not mention {containing:?}",
        failure.error
    );
    assert_eq!(failure.source_queue, "jobs");
    failure.clone()
}

fn retry_delay(processed: &Processed) -> Duration {
    let Outcome::Retry { delay, .. } = &processed.outcome else {
        panic!("expected a retry, got {:?}", processed.outcome)
    };
    *delay
}

fn retry_reason(processed: &Processed) -> &str {
    let Outcome::Retry { reason, .. } = &processed.outcome else {
        panic!("expected a retry, got {:?}", processed.outcome)
    };
    reason
}

fn defer_delay(processed: &Processed) -> Duration {
    let Outcome::Defer { delay, .. } = &processed.outcome else {
        panic!("expected a deferral, got {:?}", processed.outcome)
    };
    *delay
}

impl Fixture {
    /// Processes `message` as the last attempt a redrive policy of `max_attempts` allows.
    async fn process_last(&self, message: &Message, max_attempts: u32) -> Processed {
        let mut last = message.clone();
        last.receive_count = max_attempts;
        let lease = Lease::new(Instant::now() + LEASE);
        let budget = Budget::default().with_max_attempts(Some(max_attempts));
        self.pipeline
            .process(Arc::new(last), Arc::from("jobs"), &lease, budget)
            .await
    }
}

#[tokio::test]
async fn success_completes_the_record_and_acks() {
    let fixture = fixture(Behaviour::Succeed);
    let message = message("{\"n\":7}");
    let (processed, lease) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed.output.as_deref(), Some("{\"n\":7}"));
    assert!(processed.ran());
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output.as_deref(), Some("{\"n\":7}"));
    assert!(
        lease.claim().is_none(),
        "the claim was taken back from the lease before settling"
    );
}

#[tokio::test]
async fn unknown_job_type_retries_then_reaches_the_dlq_with_its_reason_without_touching_the_store() {
    let fixture = fixture(Behaviour::Succeed);
    let mut unknown = message("{\"n\":1}");
    unknown.attributes.insert(
        JOB_TYPE_ATTRIBUTE.to_owned(),
        AttributeValue::string("nobody_handles_this"),
    );
    let (processed, _) = fixture.process(&unknown).await;
    assert!(
        retry_reason(&processed).contains("unknown job type"),
        "producers may deploy first"
    );
    let processed = fixture.process_last(&unknown, 4).await;
    let failure = assert_reject(&processed, "unknown job type");
    assert!(
        failure.error.contains(JOB_TYPE),
        "the reason names the known types: {}",
        failure.error
    );
    assert!(failure.retries_exhausted);

    let mut untyped = message("{\"n\":1}");
    untyped.attributes.clear();
    // No type and no default route: the producer is wrong, not early; a deploy will not help.
    let (processed, _) = fixture.process(&untyped).await;
    assert_reject(&processed, "no default route");
    assert_eq!(fixture.runs(), 0);
    assert_eq!(fixture.store.requests().total(), 0);
}

#[tokio::test]
async fn a_newer_schema_version_retries_and_a_malformed_one_is_rejected() {
    let fixture = fixture(Behaviour::Succeed);
    let mut newer = message("{\"n\":1}");
    newer
        .attributes
        .insert(SCHEMA_VERSION_ATTRIBUTE.to_owned(), AttributeValue::number(2));
    let (processed, _) = fixture.process(&newer).await;
    assert!(retry_reason(&processed).contains("newer"));
    assert_reject(&fixture.process_last(&newer, 5).await, "newer");

    let mut garbled = message("{\"n\":1}");
    garbled
        .attributes
        .insert(SCHEMA_VERSION_ATTRIBUTE.to_owned(), AttributeValue::string("two"));
    let (processed, _) = fixture.process(&garbled).await;
    assert_reject(&processed, "positive integer");
    assert_eq!(fixture.runs(), 0);
    assert_eq!(fixture.store.requests().claim, 0);
}

#[tokio::test]
async fn a_body_that_does_not_decode_is_rejected_before_claiming() {
    let fixture = fixture(Behaviour::Succeed);
    let (processed, _) = fixture.process(&message("{\"n\":\"not a number\"}")).await;
    assert_reject(&processed, "not a valid test_job job");
    assert_eq!(fixture.runs(), 0);
    assert_eq!(fixture.store.requests().claim, 0, "decode comes before claim");
}

#[tokio::test]
async fn store_unavailable_defers_and_never_runs_unclaimed() {
    let fixture = fixture(Behaviour::Succeed);
    fixture.store.set_unavailable(true);
    let (processed, _) = fixture.process(&message("{\"n\":1}")).await;
    let delay = defer_delay(&processed);
    assert!(
        delay <= Duration::from_secs(30),
        "a deferral of up to 30 s that spends no receive, got {delay:?}"
    );
    let processed = fixture.process_last(&message("{\"n\":1}"), 3).await;
    defer_delay(&processed);
    assert_eq!(fixture.runs(), 0, "fail closed");
    assert_eq!(fixture.store.requests().claim, 2);
}

#[tokio::test]
async fn a_completed_key_is_acked_as_duplicate_with_the_stored_output() {
    let fixture = fixture(Behaviour::Succeed);
    let message = message("{\"n\":3}");
    fixture.store.insert(IdempotencyRecord {
        key: key_of(&message),
        status: RecordStatus::Completed,
        expires_at: SystemTime::now() + Duration::from_secs(3600),
        lease_until: None,
        output: Some("{\"n\":3,\"earlier\":true}".to_owned()),
        validation: None,
        token: Some(1),
        last_attempt: false,
    });
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Duplicate));
    assert_eq!(processed.output.as_deref(), Some("{\"n\":3,\"earlier\":true}"));
    assert!(!processed.ran());
    assert_eq!(fixture.runs(), 0);
}

#[tokio::test]
async fn in_progress_elsewhere_defers_until_the_other_lease_ends() {
    let fixture = fixture(Behaviour::Succeed);
    let message = message("{\"n\":4}");
    let other_lease = Duration::from_secs(90);
    fixture.store.insert(IdempotencyRecord {
        key: key_of(&message),
        status: RecordStatus::InProgress,
        expires_at: SystemTime::now() + Duration::from_secs(3600),
        lease_until: Some(SystemTime::now() + other_lease),
        output: None,
        validation: None,
        token: Some(2),
        last_attempt: false,
    });
    let (processed, _) = fixture.process(&message).await;
    let delay = defer_delay(&processed);
    assert!(
        delay >= other_lease - Duration::from_secs(1) && delay <= other_lease + Duration::from_secs(2),
        "deferred by {delay:?}, the other lease ends in {other_lease:?}"
    );
    // Even on its last allowed receive a duplicate is deferred, never dead-lettered.
    defer_delay(&fixture.process_last(&message, 2).await);
    assert_eq!(fixture.runs(), 0);
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(record.token, Some(2), "the other claim is untouched");
}

#[tokio::test]
async fn same_key_with_another_payload_is_rejected() {
    let validating = settings().with_validate_payload(true);
    let fixture = fixture_with(
        Behaviour::Succeed,
        MemoryIdempotencyStore::new(),
        validating,
        |_| None,
    );
    let mut message = message("{\"n\":5}");
    message.attributes.insert(
        conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
        AttributeValue::string("order:5"),
    );
    fixture.store.insert(IdempotencyRecord {
        key: key_of(&message),
        status: RecordStatus::Completed,
        expires_at: SystemTime::now() + Duration::from_secs(3600),
        lease_until: None,
        output: Some("null".to_owned()),
        validation: Some(payload_hash("{\"n\":6}")),
        token: Some(1),
        last_attempt: false,
    });
    let (processed, _) = fixture.process(&message).await;
    assert_reject(&processed, "different payload");
    assert_eq!(fixture.runs(), 0);
}

#[tokio::test]
async fn a_retryable_error_retries_with_backoff_and_releases_the_claim() {
    let fixture = fixture(Behaviour::Retryable);
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert!(retry_delay(&processed) <= settings().backoff.ceiling(1, None));
    assert_eq!(fixture.runs(), 1);
    assert!(
        released(fixture.record(&message).await),
        "released so the retry can claim"
    );
    assert_eq!(fixture.store.requests().release, 1);
}

#[tokio::test]
async fn a_permanent_error_rejects_and_releases_the_claim() {
    let fixture = fixture(Behaviour::Permanent);
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    let failure = assert_reject(&processed, "no such user");
    assert_eq!(failure.handler, JOB_TYPE);
    assert!(released(fixture.record(&message).await));
}

#[tokio::test]
async fn a_panic_retries_and_releases_the_claim() {
    let fixture = fixture(Behaviour::Panic);
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    let Outcome::Retry { reason, .. } = &processed.outcome else {
        panic!("expected a retry, got {:?}", processed.outcome)
    };
    assert!(reason.contains("handler bug"), "{reason}");
    assert!(released(fixture.record(&message).await));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_retries_and_releases_the_claim() {
    let fixture = fixture(Behaviour::Sleep(Duration::from_secs(600)));
    let message = message("{\"n\":1}");
    let started = Instant::now();
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(5) + conveyor_core::runtime::CANCEL_GRACE,
        "told to stop at the handler's 5 s timeout, dropped after the grace it ignored"
    );
    let Outcome::Retry { reason, .. } = &processed.outcome else {
        panic!("expected a retry, got {:?}", processed.outcome)
    };
    assert!(reason.contains("timed out"), "{reason}");
    assert!(released(fixture.record(&message).await));
}

/// The worker's shape in issue 51: a 5 s handler timeout, a handler that ignores its context and
/// returns `Ok` at 6 s (its effect cannot be taken back). The result arrived before the run was
/// dropped: it stands, the claim completes, and a redelivery is a duplicate.
#[tokio::test(start_paused = true)]
async fn an_ok_returned_within_the_grace_after_the_timeout_completes_the_claim() {
    let fixture = fixture(Behaviour::Sleep(Duration::from_secs(6)));
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    let (again, _) = fixture.process(&message).await;
    assert_eq!(again.outcome, Outcome::Ack(AckReason::Duplicate));
    assert_eq!(fixture.runs(), 1, "run once");
}

/// The Lambda's shape in issue 51: a 10 s function, the handlers' cutoff at 8.9 s (the run deadline),
/// every store call by 9.9 s; a handler that ignores its context and returns `Ok` at 9.3 s.
#[tokio::test(start_paused = true)]
async fn an_ok_returned_after_a_lambda_cutoff_within_the_settle_deadline_completes_the_claim() {
    let fixture = fixture_with(
        Behaviour::Sleep(Duration::from_millis(9_300)),
        MemoryIdempotencyStore::new(),
        settings().with_timeout(Duration::from_secs(60)),
        |_| None,
    );
    let message = message("{\"n\":1}");
    let start = Instant::now();
    let lease = Lease::new(start + Duration::from_secs(10));
    let budget = Budget::default()
        .with_run_deadline(Some(start + Duration::from_millis(8_900)))
        .with_settle_deadline(Some(start + Duration::from_millis(9_900)))
        .with_release_retries_until(Some(start + Duration::from_millis(8_900)));
    let processed = fixture
        .pipeline
        .process(Arc::new(message.clone()), Arc::from("jobs"), &lease, budget)
        .await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(
        fixture.record(&message).await.unwrap().status,
        RecordStatus::Completed
    );
}

/// An error returned within the grace after the timeout is the timeout's failure, whatever its kind:
/// the handler was told to stop, so it retries with the backoff (never a rejection for "I stopped").
#[tokio::test(start_paused = true)]
async fn an_error_returned_within_the_grace_after_the_timeout_retries_as_a_timeout() {
    let fixture = fixture(Behaviour::SleepThenFail(Duration::from_secs(6)));
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert!(
        retry_reason(&processed).contains("timed out after 5s"),
        "{processed:?}"
    );
    assert!(released(fixture.record(&message).await));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_goes_back_at_once_and_releases_the_claim() {
    for behaviour in [Behaviour::StopWhenCancelled, Behaviour::IgnoreCancellation] {
        let fixture = fixture(behaviour);
        let message = message("{\"n\":1}");
        let lease = Lease::new(Instant::now() + LEASE);
        let run = fixture.pipeline.process(
            Arc::new(message.clone()),
            Arc::from("jobs"),
            &lease,
            Budget::default(),
        );
        let cancel = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lease.cancellation().cancel();
        };
        let (processed, ()) = tokio::join!(run, cancel);
        assert_eq!(retry_delay(&processed), Duration::ZERO, "{behaviour:?}");
        assert_eq!(fixture.runs(), 1);
        assert!(
            released(fixture.record(&message).await),
            "{behaviour:?}: claim released"
        );
    }
}

/// The completion is tried again for `COMPLETE_RETRY_LIMIT` (15 minutes, on the paused clock here),
/// then the job is acknowledged anyway: the record lapses with its lease.
#[tokio::test(start_paused = true)]
async fn complete_failing_with_the_store_down_still_acks() {
    let fixture = fixture_with(
        Behaviour::Succeed,
        MemoryIdempotencyStore::new(),
        settings(),
        |store| Some(Arc::new(move || store.set_unavailable(true))),
    );
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    fixture.store.set_unavailable(false);
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(
        record.status,
        RecordStatus::InProgress,
        "the record lapses with its lease"
    );
}

/// A completion the store did not answer lands once the store is back, while the message is held: a
/// later duplicate finds the job completed instead of running it again.
#[tokio::test(start_paused = true)]
async fn a_completion_lost_in_a_store_outage_lands_when_the_store_is_back() {
    let fixture = fixture_with(
        Behaviour::Succeed,
        MemoryIdempotencyStore::new(),
        settings(),
        |store| {
            Some(Arc::new(move || {
                store.set_unavailable(true);
                let store = store.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_secs(40)).await;
                    store.set_unavailable(false);
                });
            }))
        },
    );
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(
        record.status,
        RecordStatus::Completed,
        "the completion was tried until it landed"
    );
}

#[tokio::test]
async fn complete_fenced_after_a_takeover_still_acks_and_keeps_the_new_claim() {
    let fixture = fixture_with(
        Behaviour::Succeed,
        MemoryIdempotencyStore::new(),
        settings(),
        |store| {
            Some(Arc::new(move || {
                for record in store.records() {
                    store.insert(IdempotencyRecord {
                        token: Some(99),
                        last_attempt: false,
                        ..record
                    });
                }
            }))
        },
    );
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(record.token, Some(99));
    assert_eq!(
        record.status,
        RecordStatus::InProgress,
        "the fenced complete changed nothing"
    );
}

#[tokio::test]
async fn output_too_large_completes_without_output() {
    let fixture = fixture_with(
        Behaviour::SucceedWithLargeOutput,
        MemoryIdempotencyStore::new().with_max_output_bytes(100),
        settings(),
        |_| None,
    );
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output, None);
    assert_eq!(
        fixture.store.requests().complete,
        2,
        "tried with the output, then without"
    );
}

#[tokio::test]
async fn release_failing_leaves_the_outcome_unchanged() {
    let fixture = fixture_with(
        Behaviour::Retryable,
        MemoryIdempotencyStore::new(),
        settings(),
        |store| Some(Arc::new(move || store.set_unavailable(true))),
    );
    let message = message("{\"n\":1}");
    let (processed, _) = fixture.process(&message).await;
    assert!(matches!(processed.outcome, Outcome::Retry { .. }));
    fixture.store.set_unavailable(false);
    let record = fixture.record(&message).await.unwrap();
    assert_eq!(
        record.status,
        RecordStatus::InProgress,
        "the claim stays until its lease lapses"
    );
}

#[tokio::test]
async fn the_claims_lease_is_the_messages_visibility_deadline_plus_the_skew_allowance() {
    let fixture = fixture(Behaviour::Sleep(Duration::from_millis(1)));
    let message = message("{\"n\":1}");
    let lease = Lease::new(Instant::now() + LEASE);
    let expected = SystemTime::now() + LEASE + conveyor_core::runtime::CLOCK_SKEW_ALLOWANCE;
    fixture
        .pipeline
        .process(
            Arc::new(message.clone()),
            Arc::from("jobs"),
            &lease,
            Budget::default(),
        )
        .await;
    // The record is completed now; its in-progress lease was written from the lease's deadline.
    let record = fixture.record(&message).await.unwrap();
    let written = record.lease_until.unwrap();
    let difference = written
        .duration_since(expected)
        .or_else(|_| expected.duration_since(written))
        .unwrap();
    assert!(
        difference < Duration::from_secs(1),
        "lease written {difference:?} away from the deadline"
    );
}

fn failure() -> Failure {
    Failure::now("no such user", 1, "jobs", JOB_TYPE)
}

/// A queue `jobs` with its DLQ `jobs-dlq` (max receive count 5).
fn queue_with_dlq() -> (MemoryQueue, Arc<MemoryQueue>) {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = MemoryQueue::standard("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5);
    (queue, dlq)
}

async fn received(queue: &MemoryQueue) -> Message {
    queue.push("{\"n\":1}").unwrap();
    queue.receive(1, Duration::ZERO).await.unwrap().remove(0)
}

#[tokio::test]
async fn reject_sends_to_the_dlq_then_says_delete() {
    let (queue, _dlq) = queue_with_dlq();
    let message = received(&queue).await;
    let disposition = reject(
        &queue,
        &message,
        &failure(),
        RejectMode::SendToDlq,
        Duration::from_secs(9),
    )
    .await;
    assert_eq!(disposition, Disposition::Delete);
    let copies = queue.messages_in_dlq();
    assert_eq!(copies.len(), 1);
    assert!(
        copies[0]
            .attributes
            .contains_key(conveyor_core::message::FAILURE_ATTRIBUTE)
    );
    assert_eq!(
        queue.len(),
        1,
        "reject does not delete; the runtime does after Delete"
    );
}

#[tokio::test]
async fn reject_without_a_dlq_leaves_the_message_for_its_backoff() {
    let queue = MemoryQueue::standard("jobs");
    let message = received(&queue).await;
    let fallback = Duration::from_secs(9);
    let disposition = reject(&queue, &message, &failure(), RejectMode::SendToDlq, fallback).await;
    assert_eq!(disposition, Disposition::Visible(fallback));
}

#[tokio::test]
async fn reject_with_the_dlq_send_failing_leaves_the_message_for_its_backoff() {
    let (queue, dlq) = queue_with_dlq();
    let message = received(&queue).await;
    dlq.set_unavailable(true);
    let fallback = Duration::from_secs(9);
    let disposition = reject(&queue, &message, &failure(), RejectMode::SendToDlq, fallback).await;
    assert_eq!(disposition, Disposition::Visible(fallback));
    assert!(dlq.is_empty());
}

#[tokio::test]
async fn reject_left_to_redrive_makes_the_message_visible_at_once() {
    let (queue, dlq) = queue_with_dlq();
    let message = received(&queue).await;
    let disposition = reject(
        &queue,
        &message,
        &failure(),
        RejectMode::LeaveToRedrive,
        Duration::from_secs(9),
    )
    .await;
    assert_eq!(disposition, Disposition::Visible(Duration::ZERO));
    assert!(dlq.is_empty());
    assert_eq!(queue.requests().dead_letter, 0);
}

#[tokio::test]
async fn a_body_without_the_configured_key_field_is_rejected_unclaimed() {
    let keyed = settings().with_key_style(conveyor_core::KeyStyle::Powertools(
        conveyor_core::PowertoolsKey {
            flavor: conveyor_core::PowertoolsFlavor::Python,
            prefix: "orders-fn.app.handle".into(),
            source: conveyor_core::KeySource::BodyField("order_id".into()),
        },
    ));
    let fixture = fixture_with(Behaviour::Succeed, MemoryIdempotencyStore::new(), keyed, |_| None);
    let (processed, _) = fixture.process(&message("{\"n\":1}")).await;
    assert_reject(&processed, "no idempotency key field `order_id`");
    assert_eq!(fixture.runs(), 0);
    assert_eq!(fixture.store.requests().claim, 0, "never claimed");
}

/// A job due in two hours, on a clock the test moves: hops of at most 15 minutes until due, never
/// run, never claimed, then run once (row "not due yet").
#[tokio::test]
async fn a_job_not_due_yet_hops_without_running_or_claiming_then_runs_when_due() {
    use conveyor_core::limits::MAX_DELAY;
    use conveyor_core::runtime::{DUE_ATTRIBUTE, due_value};
    use std::sync::Mutex;

    // Whole milliseconds, as the due attribute carries them.
    let start = SystemTime::UNIX_EPOCH
        + Duration::from_millis(conveyor_core::runtime::epoch_millis(SystemTime::now()));
    let now = Arc::new(Mutex::new(start));
    let clock_now = Arc::clone(&now);
    let mut fixture = fixture(Behaviour::Succeed);
    fixture.pipeline = fixture
        .pipeline
        .clone()
        .with_clock(Arc::new(move || *clock_now.lock().unwrap()));
    let mut delayed = message(r#"{"n": 7}"#);
    delayed.attributes.insert(
        DUE_ATTRIBUTE.into(),
        AttributeValue::number(due_value(start + Duration::from_secs(7200))),
    );

    let (first, _) = fixture.process(&delayed).await;
    assert_eq!(defer_delay(&first), MAX_DELAY);
    assert_eq!(first.job_type, Some(JOB_TYPE), "metrics keep the job type");
    *now.lock().unwrap() = start + Duration::from_secs(7000);
    let (last_hop, _) = fixture.process(&delayed).await;
    assert_eq!(defer_delay(&last_hop), Duration::from_secs(200));
    assert_eq!(fixture.runs(), 0);
    assert!(fixture.record(&delayed).await.is_none(), "a hop claims nothing");

    *now.lock().unwrap() = start + Duration::from_secs(7201);
    let (due, _) = fixture.process(&delayed).await;
    assert_eq!(due.outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(fixture.runs(), 1);
}

/// Row "delayed job cancelled": a delayed job sent before the cancel is dropped without running (at a
/// hop or when due); one sent with the same key after the cancel runs; a lapsed claim is not reported
/// as running; a completed key says so.
#[tokio::test]
async fn a_cancel_drops_the_jobs_sent_before_it_and_runs_the_ones_sent_after() {
    use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;
    use conveyor_core::runtime::{DUE_ATTRIBUTE, due_value};
    use conveyor_core::{Cancelled, KeyStyle, runtime::cancel};

    let fixture = fixture(Behaviour::Succeed);
    let delayed = |key: &str, sent_at: SystemTime| {
        let mut job = message(r#"{"n": 1}"#);
        job.attributes
            .insert(IDEMPOTENCY_KEY_ATTRIBUTE.into(), AttributeValue::string(key));
        job.attributes
            .insert(DUE_ATTRIBUTE.into(), AttributeValue::number(due_value(sent_at)));
        job.sent_at = Some(sent_at);
        job
    };
    let store = fixture.store.as_ref();
    let before = SystemTime::now() - Duration::from_secs(10);
    let old = delayed("report:2026-11", before);
    assert_eq!(
        cancel(store, &KeyStyle::Conveyor, JOB_TYPE, "report:2026-11")
            .await
            .unwrap(),
        Cancelled::Cancelled
    );
    assert_eq!(
        cancel(store, &KeyStyle::Conveyor, JOB_TYPE, "report:2026-11")
            .await
            .unwrap(),
        Cancelled::Cancelled,
        "a second cancel moves the cut-off forward"
    );
    let (processed, _) = fixture.process(&old).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Cancelled));
    assert_eq!(fixture.runs(), 0);

    let again = delayed("report:2026-11", SystemTime::now() + Duration::from_millis(5));
    let (ran, _) = fixture.process(&again).await;
    assert_eq!(
        ran.outcome,
        Outcome::Ack(AckReason::Completed),
        "sent after the cancel: it runs"
    );
    assert_eq!(fixture.runs(), 1);
    assert_eq!(
        cancel(store, &KeyStyle::Conveyor, JOB_TYPE, "report:2026-11")
            .await
            .unwrap(),
        Cancelled::AlreadyCompleted
    );
}
