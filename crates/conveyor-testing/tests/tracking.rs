//! Job tracking through the real `Pipeline` on `MemoryIdempotencyStore`: the record tells the truth
//! after a retry, a dead letter and a duplicate; a short tracked job costs no more store requests than
//! an untracked one; progress writes stay within the throttle and the last report always lands.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use conveyor_core::message::JOB_TYPE_ATTRIBUTE;
use conveyor_core::port::idempotency_key;
use conveyor_core::{
    message::{AttributeValue, Message},
    port::IdempotencyStore,
    runtime::{AckReason, Budget, Lease, Outcome, Processed},
    {Context, Handler, HandlerError, HandlerSettings, JobRecord, JobStatus, Pipeline, Router},
};
use conveyor_testing::MemoryIdempotencyStore;
use tokio::time::Instant;

const JOB_TYPE: &str = "report";

/// Fails its first `failures` runs with a retryable error (or permanently), then reports progress
/// `reports` times, `step` apart, and succeeds.
struct Report {
    failures: u32,
    permanent: bool,
    reports: u32,
    step: Duration,
    runs: AtomicU32,
    tracked: bool,
}

impl Report {
    fn new() -> Self {
        Self {
            failures: 0,
            permanent: false,
            reports: 0,
            step: Duration::ZERO,
            runs: AtomicU32::new(0),
            tracked: true,
        }
    }
}

impl Handler for Report {
    type Job = serde_json::Value;
    type Output = serde_json::Value;
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, _job: serde_json::Value, ctx: Context) -> Result<serde_json::Value, HandlerError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        if run <= self.failures {
            if self.permanent {
                return Err(HandlerError::permanent("report 404: no such account"));
            }
            return Err(HandlerError::retryable(format!("warehouse 503 on run {run}")));
        }
        for index in 1..=self.reports {
            let percent = u8::try_from(index * 100 / self.reports).unwrap();
            ctx.progress(percent, format!("query {index} of {}", self.reports));
            tokio::time::sleep(self.step).await;
        }
        Ok(serde_json::json!({ "rows": 12 }))
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_tracked(self.tracked)
    }
}

fn message(id: &str, receive_count: u32) -> Arc<Message> {
    let mut message = Message::new(id, "{}");
    message.receive_count = receive_count;
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(JOB_TYPE));
    message
        .attributes
        .insert("conveyor.key".to_owned(), AttributeValue::string("r-1"));
    Arc::new(message)
}

async fn run(pipeline: &Pipeline, message: Arc<Message>) -> Processed {
    let lease = Lease::new(Instant::now() + Duration::from_secs(3600));
    let budget = Budget::default().with_max_attempts(Some(3));
    pipeline.process(message, Arc::from("jobs"), &lease, budget).await
}

fn setup(handler: Report) -> (Arc<MemoryIdempotencyStore>, Pipeline) {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(Router::new().route(handler)).with_store(store.clone());
    (store, pipeline)
}

async fn record(store: &MemoryIdempotencyStore) -> JobRecord {
    let key = idempotency_key(JOB_TYPE, Some("r-1"), "");
    store
        .job(&key)
        .await
        .unwrap()
        .expect("a tracked job has a record")
}

#[tokio::test]
async fn the_record_tells_the_truth_after_a_retry_and_a_duplicate() {
    let (store, pipeline) = setup(Report {
        failures: 1,
        ..Report::new()
    });
    let first = run(&pipeline, message("m-1", 1)).await;
    assert!(
        matches!(first.outcome, Outcome::Retry { .. }),
        "{:?}",
        first.outcome
    );
    let retrying = record(&store).await;
    assert_eq!(retrying.status, JobStatus::Retrying);
    assert_eq!(retrying.attempts, 1);
    assert_eq!(retrying.last_error.as_deref(), Some("warehouse 503 on run 1"));

    let second = run(&pipeline, message("m-1", 2)).await;
    assert_eq!(second.outcome, Outcome::Ack(AckReason::Completed));
    let succeeded = record(&store).await;
    assert_eq!(succeeded.status, JobStatus::Succeeded);
    assert_eq!(succeeded.attempts, 2);
    assert_eq!(succeeded.output.as_deref(), Some(r#"{"rows":12}"#));
    assert_eq!(succeeded.last_error.as_deref(), Some("warehouse 503 on run 1"));
    let statuses: Vec<JobStatus> = succeeded.history.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses,
        [JobStatus::Running, JobStatus::Retrying, JobStatus::Succeeded]
    );

    // A duplicate (another message, same key) is acknowledged without touching the record.
    let before = store.requests();
    let duplicate = run(&pipeline, message("m-2", 1)).await;
    assert_eq!(duplicate.outcome, Outcome::Ack(AckReason::Duplicate));
    assert_eq!(record(&store).await, succeeded);
    assert_eq!(store.requests().complete, before.complete);
    assert_eq!(store.requests().release, before.release);
}

#[tokio::test]
async fn a_dead_lettered_job_says_so_with_its_reason() {
    let (store, pipeline) = setup(Report {
        failures: 1,
        permanent: true,
        ..Report::new()
    });
    let processed = run(&pipeline, message("m-1", 1)).await;
    assert!(
        matches!(processed.outcome, Outcome::Reject(_)),
        "{:?}",
        processed.outcome
    );
    let dead = record(&store).await;
    assert_eq!(dead.status, JobStatus::DeadLettered);
    assert_eq!(dead.last_error.as_deref(), Some("report 404: no such account"));

    // Retries exhausted: the last allowed attempt's failure is dead-lettered too.
    let (store, pipeline) = setup(Report {
        failures: 3,
        ..Report::new()
    });
    for attempt in 1..=3 {
        run(&pipeline, message("m-1", attempt)).await;
    }
    let exhausted = record(&store).await;
    assert_eq!(exhausted.status, JobStatus::DeadLettered);
    assert_eq!(exhausted.attempts, 3);
    assert!(
        exhausted
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("run 3")),
        "{:?}",
        exhausted.last_error
    );
}

#[tokio::test]
async fn tracking_adds_no_request_to_a_short_jobs_success() {
    let (tracked_store, tracked) = setup(Report::new());
    run(&tracked, message("m-1", 1)).await;
    let (untracked_store, untracked) = setup(Report {
        tracked: false,
        ..Report::new()
    });
    run(&untracked, message("m-1", 1)).await;
    assert_eq!(tracked_store.requests(), untracked_store.requests());
    assert_eq!(tracked_store.requests().total(), 2, "one claim, one complete");
    assert_eq!(record(&tracked_store).await.status, JobStatus::Succeeded);
    let key = idempotency_key(JOB_TYPE, Some("r-1"), "");
    assert_eq!(untracked_store.job(&key).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn progress_writes_stay_within_the_throttle_and_the_last_report_lands() {
    // 1,000 reports over 20 s of (paused) time; the default interval is 3 s.
    let (store, pipeline) = setup(Report {
        reports: 1000,
        step: Duration::from_millis(20),
        ..Report::new()
    });
    let handler_time = Duration::from_secs(20);
    let interval = HandlerSettings::default().progress_interval;
    let processed = run(&pipeline, message("m-1", 1)).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let writes = store.requests().progress;
    let allowed = handler_time.as_secs() / interval.as_secs() + 1;
    println!("progress writes for 1000 reports over {handler_time:?}: {writes} (at most {allowed})");
    assert!(writes >= 2, "progress was written while the job ran: {writes}");
    assert!(writes <= allowed, "{writes} progress writes, more than {allowed}");
    let done = record(&store).await;
    let progress = done.progress.unwrap();
    assert_eq!(
        (progress.percent, progress.message.as_str()),
        (100, "query 1000 of 1000")
    );
}

#[tokio::test(start_paused = true)]
async fn progress_is_visible_while_the_job_runs() {
    let (store, pipeline) = setup(Report {
        reports: 10,
        step: Duration::from_secs(2),
        ..Report::new()
    });
    let running = tokio::spawn({
        let pipeline = pipeline.clone();
        async move { run(&pipeline, message("m-1", 1)).await }
    });
    let seen = conveyor_testing::wait_for(Duration::from_secs(30), Duration::from_millis(100), async || {
        let key = idempotency_key(JOB_TYPE, Some("r-1"), "");
        let job = store.job(&key).await.ok().flatten()?;
        (job.status == JobStatus::Running)
            .then_some(job.progress)
            .flatten()
            .filter(|progress| progress.percent >= 30)
    })
    .await
    .unwrap();
    assert!(seen.message.starts_with("query "), "{seen:?}");
    assert_eq!(running.await.unwrap().outcome, Outcome::Ack(AckReason::Completed));
}
