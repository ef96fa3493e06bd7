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

/// A rejection whose DLQ send failed: the message comes back (receive 2 of 3). The job is not run
/// again and stays `dead_lettered`; the outcome is the rejection again, so the runtime re-sends it.
#[tokio::test]
async fn a_failed_dlq_send_is_rejected_again_not_run() {
    let (store, pipeline) = setup(Report {
        failures: 1,
        permanent: true,
        ..Report::new()
    });
    let first = run(&pipeline, message("m-1", 1)).await;
    assert!(matches!(first.outcome, Outcome::Reject(_)), "{:?}", first.outcome);
    // The runtime's DLQ send failed: the same message comes back.
    let again = run(&pipeline, message("m-1", 2)).await;
    assert!(matches!(again.outcome, Outcome::Reject(_)), "{:?}", again.outcome);
    assert!(
        !again.ran(),
        "a job decided for the DLQ never runs again from its queue"
    );
    let dead = record(&store).await;
    assert_eq!(dead.status, JobStatus::DeadLettered, "{dead:?}");
    assert_eq!(dead.attempts, 2, "the comeback's claim counts, but nothing ran");
    // Back from the DLQ (a redrive: the failure attribute, first receive): runs, truthfully.
    let mut redriven = (*message("m-1", 1)).clone();
    redriven.attributes.insert(
        conveyor_core::message::FAILURE_ATTRIBUTE.to_owned(),
        AttributeValue::string("{}"),
    );
    let back = run(&pipeline, Arc::new(redriven)).await;
    assert_eq!(
        back.outcome,
        Outcome::Ack(AckReason::Completed),
        "{:?}",
        back.outcome
    );
    assert_eq!(record(&store).await.status, JobStatus::Succeeded);
}

/// A claim on the last receive the redrive policy allows marks the record; a run that never settles
/// (the worker killed) reads as dead-lettered by SQS's redrive once its lease is over.
#[tokio::test]
async fn a_last_receive_that_never_settles_reads_dead_lettered() {
    let (store, pipeline) = setup(Report::new());
    let key = idempotency_key(JOB_TYPE, Some("r-1"), "");
    let lease = Lease::new(Instant::now() + Duration::from_millis(50));
    let budget = Budget::default().with_max_attempts(Some(3));
    let processed = pipeline
        .process(message("m-1", 3), Arc::from("jobs"), &lease, budget)
        .await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    let settled = store.get(&key).await.unwrap().unwrap();
    assert!(settled.last_attempt, "the claim on the last receive is marked");
    assert!(
        !settled.dead_lettered_by_redrive(std::time::SystemTime::now() + Duration::from_secs(60)),
        "a completed run is no longer one redrive takes"
    );

    // The kill: a last-receive claim that never completes nor releases.
    let request = conveyor_core::port::ClaimRequest {
        key: format!("{key}-killed"),
        lease_until: std::time::SystemTime::now() - Duration::from_secs(1),
        expires_at: std::time::SystemTime::now() + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: true,
    };
    let running = conveyor_core::port::JobChange::now(JOB_TYPE, JobStatus::Running, 3);
    store.claim_tracked(&request, &running).await.unwrap();
    let shown = store.job(&request.key).await.unwrap().unwrap();
    assert_eq!(shown.status, JobStatus::DeadLettered, "{shown:?}");
    assert_eq!(
        shown.last_error.as_deref(),
        Some(conveyor_core::port::REDRIVE_REASON)
    );
}

/// A job whose first run failed (status retrying), and its store and pipeline.
async fn a_retrying_job() -> (Arc<MemoryIdempotencyStore>, Pipeline) {
    let handler = Report {
        failures: 1,
        ..Report::new()
    };
    let (store, pipeline) = setup(handler);
    assert!(matches!(
        run(&pipeline, message("m-1", 1)).await.outcome,
        Outcome::Retry { .. }
    ));
    (store, pipeline)
}

/// Why a FIFO follower leaves unrun at its last receive (3 of 3).
fn behind_its_group_at_the_last_receive() -> conveyor_core::runtime::Failure {
    conveyor_core::runtime::not_run_at_the_last_receive(
        conveyor_core::runtime::NotRun::BehindItsGroup,
        "a message ahead of it in its FIFO group had not finished",
        3,
        3,
        "jobs.fifo",
        JOB_TYPE,
    )
}

/// A message that leaves unrun at its last allowed receive (behind its FIFO group, at shutdown) reaches
/// the DLQ without a claim: the runtime asks the store first. The status says dead_lettered with the
/// reason, the unrun claim costs the job no run (another send with the same key still runs it, as run
/// 2), and once the job completed, an unrun message is a duplicate to delete.
#[tokio::test]
async fn a_job_leaving_unrun_at_its_last_receive_reads_dead_lettered_and_keeps_its_runs() {
    let (store, pipeline) = a_retrying_job().await;
    assert_eq!(record(&store).await.status, JobStatus::Retrying);

    let failure = behind_its_group_at_the_last_receive();
    let asked = pipeline
        .unrun_at_the_last_receive(&message("m-1", 3), &failure, None)
        .await;
    assert_eq!(asked, conveyor_core::runtime::UnrunJob::DeadLetter);
    let dead = record(&store).await;
    assert_eq!(dead.status, JobStatus::DeadLettered, "{dead:?}");
    assert_eq!(dead.last_error.as_deref(), Some(failure.error.as_str()));

    let again = run(&pipeline, message("m-2", 1)).await;
    assert_eq!(
        again.outcome,
        Outcome::Ack(AckReason::Completed),
        "{:?}",
        again.outcome
    );
    assert_eq!(again.run, Some(2), "the unrun claim gave its run back");
    assert_eq!(record(&store).await.status, JobStatus::Succeeded);

    let late = pipeline
        .unrun_at_the_last_receive(&message("m-3", 3), &failure, None)
        .await;
    assert_eq!(late, conveyor_core::runtime::UnrunJob::Completed);
    assert_eq!(
        record(&store).await.status,
        JobStatus::Succeeded,
        "a done job stays done"
    );
}

/// A store outage at that moment: asked once (no deadline) the status cannot be written and stays
/// retrying; with a deadline (a worker holding the message, a Lambda invocation) the store is asked
/// again until it answers, so the status reads dead_lettered once the outage ends.
#[tokio::test(start_paused = true)]
async fn a_store_outage_at_the_last_receive_is_waited_out_until_the_deadline() {
    let (store, pipeline) = a_retrying_job().await;
    let failure = behind_its_group_at_the_last_receive();

    store.set_unavailable(true);
    let once = pipeline
        .unrun_at_the_last_receive(&message("m-1", 3), &failure, None)
        .await;
    assert_eq!(once, conveyor_core::runtime::UnrunJob::DeadLetter);
    store.set_unavailable(false);
    assert_eq!(
        record(&store).await.status,
        JobStatus::Retrying,
        "asked once, in the outage"
    );

    store.set_unavailable(true);
    let outage_ends = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            store.set_unavailable(false);
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let waited = pipeline
        .unrun_at_the_last_receive(&message("m-1", 3), &failure, Some(deadline))
        .await;
    outage_ends.await.expect("the outage's end ran");
    assert_eq!(waited, conveyor_core::runtime::UnrunJob::DeadLetter);
    let dead = record(&store).await;
    assert_eq!(dead.status, JobStatus::DeadLettered, "{dead:?}");
    assert!(
        Instant::now() < deadline,
        "answered when the store came back, not at the deadline"
    );
}

/// Final statuses outlive `record_ttl`: kept for the status retention (14 days by default).
#[tokio::test]
async fn final_statuses_are_kept_for_the_status_retention() {
    let (store, pipeline) = setup(Report::new());
    run(&pipeline, message("m-1", 1)).await;
    let key = idempotency_key(JOB_TYPE, Some("r-1"), "");
    let record = store.get(&key).await.unwrap().unwrap();
    let left = record
        .expires_at
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(left > Duration::from_secs(13 * 24 * 3600), "{left:?}");
}

/// A tracked handler with the Powertools key style is refused at start-up, with the reason.
#[tokio::test]
async fn tracking_with_the_powertools_key_style_is_refused_at_start() {
    struct Powertools;
    impl Handler for Powertools {
        type Job = serde_json::Value;
        type Output = ();
        const JOB_TYPE: &'static str = "pt";
        async fn handle(&self, _job: serde_json::Value, _ctx: Context) -> Result<(), HandlerError> {
            Ok(())
        }
        fn settings(&self) -> HandlerSettings {
            let style = conveyor_core::KeyStyle::Powertools(conveyor_core::PowertoolsKey {
                flavor: conveyor_core::PowertoolsFlavor::Python,
                prefix: "fn.app.handler".to_owned(),
                source: conveyor_core::KeySource::MessageId,
            });
            HandlerSettings::default()
                .with_tracked(true)
                .with_key_style(style)
        }
    }
    let pipeline =
        Pipeline::new(Router::new().route(Powertools)).with_store(Arc::new(MemoryIdempotencyStore::new()));
    let error = pipeline.check_store().await.unwrap_err();
    assert!(error.to_string().contains("Powertools key style"), "{error}");
}
