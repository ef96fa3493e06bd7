//! The gatherer through the real pipeline (no store): what a call gets, what each job's outcome is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use serde::Deserialize;
use tokio::time::Instant;

use super::{Batch, BatchHandler, BatchResult, BatchSettings};
use crate::lease::Lease;
use crate::message::{AttributeValue, JOB_TYPE_ATTRIBUTE, Message};
use crate::outcome::{AckReason, Outcome};
use crate::pipeline::{Budget, Processed};
use crate::{HandlerError, HandlerSettings, Pipeline, Router};

#[derive(Debug, Deserialize)]
struct Job {
    n: u32,
    #[serde(default)]
    fail: Option<String>,
}

/// What the test handler does with a whole call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Each job as its `fail` says; a cancelled job is skipped (a retryable error).
    PerJob,
    /// As `PerJob`, without looking at the jobs' tokens.
    Blind,
    /// Returns one result fewer than jobs.
    Short,
    Panic,
    /// Returns `Err` for the batch.
    Whole,
    /// Never returns until cancelled.
    Hang,
    /// Returns one result more than jobs.
    Long,
    /// Ignores every token: works 6 s (past its 5 s timeout, within the grace), then as `Blind`.
    Late,
    /// Works 6 s ignoring every token, then returns `Err` for the batch.
    LateWhole,
}

struct Recorder {
    calls: Arc<Mutex<Vec<Vec<u32>>>>,
    mode: Mode,
    max_jobs: usize,
}

impl BatchHandler for Recorder {
    type Job = Job;
    type Output = u32;
    const JOB_TYPE: &'static str = "row";

    async fn handle_batch(&self, batch: Batch<Job>) -> BatchResult<u32> {
        let numbers: Vec<u32> = batch.jobs().iter().map(|job| job.job.n).collect();
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(numbers);
        match self.mode {
            Mode::Panic => panic!("boom in a batch"),
            Mode::Whole => return Err(HandlerError::permanent("the whole batch is bad")),
            Mode::Hang => {
                batch.cancellation().cancelled().await;
                return Err(HandlerError::retryable("stopped"));
            }
            Mode::Late => tokio::time::sleep(Duration::from_secs(6)).await,
            Mode::LateWhole => {
                tokio::time::sleep(Duration::from_secs(6)).await;
                return Err(HandlerError::permanent("the whole batch is bad"));
            }
            Mode::PerJob | Mode::Blind | Mode::Short | Mode::Long => {}
        }
        // Works a little, watching each job's token, as a real bulk write would.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut results: Vec<Result<u32, HandlerError>> = batch
            .jobs()
            .iter()
            .map(|job| match job.job.fail.as_deref() {
                _ if self.mode == Mode::PerJob && job.ctx.is_cancelled() => {
                    Err(HandlerError::retryable("cancelled: skipped"))
                }
                Some("retry") => Err(HandlerError::retryable("throttled")),
                Some("permanent") => Err(HandlerError::permanent("no such row")),
                _ => Ok(job.job.n * 10),
            })
            .collect();
        if self.mode == Mode::Short {
            results.pop();
        }
        if self.mode == Mode::Long {
            results.push(Ok(0));
        }
        Ok(results)
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_timeout(Duration::from_secs(5))
    }

    fn batch_settings(&self) -> BatchSettings {
        BatchSettings::default()
            .with_max_jobs(self.max_jobs)
            .with_linger(Duration::from_millis(20))
    }
}

fn message(n: u32, fail: Option<&str>) -> Arc<Message> {
    let body = match fail {
        Some(fail) => format!(r#"{{"n": {n}, "fail": "{fail}"}}"#),
        None => format!(r#"{{"n": {n}}}"#),
    };
    let mut message = Message::new(format!("m-{n}"), body);
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("row"));
    Arc::new(message)
}

struct Run {
    calls: Arc<Mutex<Vec<Vec<u32>>>>,
    pipeline: Pipeline,
}

fn pipeline(mode: Mode, max_jobs: usize) -> Run {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let handler = Recorder {
        calls: Arc::clone(&calls),
        mode,
        max_jobs,
    };
    Run {
        calls,
        pipeline: Pipeline::new(Router::new().batch_route(handler)),
    }
}

impl Run {
    /// Each message through its own pipeline run, all at once, each with its own lease.
    async fn process(&self, messages: Vec<Arc<Message>>, leases: &[Lease]) -> Vec<Processed> {
        let runs = messages.into_iter().zip(leases).map(|(message, lease)| {
            self.pipeline
                .process(message, Arc::from("jobs"), lease, Budget::default())
        });
        join_all(runs).await
    }

    fn calls(&self) -> Vec<Vec<u32>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn leases(count: usize) -> Vec<Lease> {
    (0..count)
        .map(|_| Lease::new(Instant::now() + Duration::from_secs(60)))
        .collect()
}

fn retry_reason(processed: &Processed) -> &str {
    match &processed.outcome {
        Outcome::Retry { reason, .. } => reason,
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn each_job_of_one_call_gets_its_own_outcome() {
    let run = pipeline(Mode::PerJob, 3);
    let messages = vec![
        message(1, None),
        message(2, Some("retry")),
        message(3, Some("permanent")),
    ];
    let processed = run.process(messages, &leases(3)).await;
    assert_eq!(run.calls(), vec![vec![1, 2, 3]], "one call with every job");
    assert_eq!(processed[0].outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed[0].output.as_deref(), Some("10"));
    assert_eq!(retry_reason(&processed[1]), "throttled");
    match &processed[2].outcome {
        Outcome::Reject(failure) => assert_eq!(failure.error, "no such row"),
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_not_full_is_called_after_the_linger_and_a_full_one_at_once() {
    let run = pipeline(Mode::PerJob, 2);
    let started = Instant::now();
    let processed = run
        .process(
            vec![message(1, None), message(2, None), message(3, None)],
            &leases(3),
        )
        .await;
    let mut calls = run.calls();
    calls.sort();
    assert_eq!(calls, vec![vec![1, 2], vec![3]]);
    assert!(
        processed
            .iter()
            .all(|p| p.outcome == Outcome::Ack(AckReason::Completed))
    );
    // The full batch ran at once, the last job after its linger: 20 ms + 50 ms of work.
    println!(
        "figure: three jobs, max two per call, done in {:?} of virtual time",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn too_few_results_fail_every_job_of_the_call_naming_the_handler() {
    // Results are matched by position: with one missing, which job lacks its result is unknown, so no
    // job is acknowledged for another's result (the first would otherwise complete on the second's).
    let run = pipeline(Mode::Short, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        let reason = retry_reason(processed);
        assert!(
            reason.contains("batch handler row returned 1 results for 2 jobs"),
            "{reason}"
        );
        assert_eq!(processed.output, None);
    }
}

#[tokio::test(start_paused = true)]
async fn too_many_results_fail_every_job_of_the_call_naming_the_handler() {
    let run = pipeline(Mode::Long, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        let reason = retry_reason(processed);
        assert!(
            reason.contains("batch handler row returned 3 results for 2 jobs"),
            "{reason}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn results_returned_within_the_grace_after_the_timeout_stand() {
    // As a single handler's late `Ok`: the bulk write happened, so each job's result is its own (an
    // `Ok` completes, a job's own failure retries as the timeout's).
    let run = pipeline(Mode::Late, 2);
    let processed = run
        .process(vec![message(1, None), message(2, Some("permanent"))], &leases(2))
        .await;
    assert_eq!(processed[0].outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed[0].output.as_deref(), Some("10"));
    let reason = retry_reason(&processed[1]);
    assert!(
        reason.contains("timed out after 5s") && reason.contains("no such row"),
        "{reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_whole_batch_error_returned_within_the_grace_after_the_timeout_is_the_timeouts() {
    let run = pipeline(Mode::LateWhole, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        let reason = retry_reason(processed);
        assert!(reason.contains("timed out after 5s"), "{reason}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_fails_every_job_of_the_call_retryably() {
    let run = pipeline(Mode::Panic, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        assert!(
            retry_reason(processed).contains("boom in a batch"),
            "{processed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_whole_batch_error_is_every_jobs_error() {
    let run = pipeline(Mode::Whole, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        assert!(matches!(&processed.outcome, Outcome::Reject(f) if f.error == "the whole batch is bad"));
    }
}

#[tokio::test(start_paused = true)]
async fn the_timeout_applies_to_the_call_and_fails_every_job() {
    let run = pipeline(Mode::Hang, 2);
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases(2))
        .await;
    for processed in &processed {
        assert!(
            retry_reason(processed).contains("batch handler row timed out after 5s"),
            "{processed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_whose_lease_is_lost_while_its_batch_runs_is_cancelled_and_the_rest_completes() {
    let run = pipeline(Mode::PerJob, 2);
    let leases = leases(2);
    let lost = leases[1].cancellation().clone();
    let losing = async {
        // The batch is called at once (full) and works 50 ms; the lease goes at 10 ms.
        tokio::time::sleep(Duration::from_millis(10)).await;
        lost.cancel();
    };
    let (processed, ()) = tokio::join!(
        run.process(vec![message(1, None), message(2, None)], &leases),
        losing
    );
    assert_eq!(processed[0].outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(retry_reason(&processed[1]), crate::outcome::CANCELLED);
    assert_eq!(processed[1].output, None, "the lost job's result is dropped");
}

#[tokio::test(start_paused = true)]
async fn a_job_whose_lease_is_lost_keeps_the_result_its_batch_returns_within_the_grace() {
    // As a cancelled single handler that still returns `Ok` in its grace: the work is done, so the
    // claim completes and the job does not run again.
    let run = pipeline(Mode::Blind, 2);
    let leases = leases(2);
    let lost = leases[1].cancellation().clone();
    let losing = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        lost.cancel();
    };
    let (processed, ()) = tokio::join!(
        run.process(vec![message(1, None), message(2, None)], &leases),
        losing
    );
    assert_eq!(processed[0].outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed[1].outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed[1].output.as_deref(), Some("20"));
}

#[tokio::test(start_paused = true)]
async fn a_batch_whose_every_job_is_cancelled_stops() {
    let run = pipeline(Mode::Hang, 2);
    let leases = leases(2);
    for lease in &leases {
        lease.cancellation().cancel();
    }
    let processed = run
        .process(vec![message(1, None), message(2, None)], &leases)
        .await;
    for processed in &processed {
        assert_eq!(retry_reason(processed), crate::outcome::CANCELLED);
    }
}
