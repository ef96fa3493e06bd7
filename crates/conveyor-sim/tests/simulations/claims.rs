//! A run holds its claim as it holds its message (issue 51, rule 2), shown with the real worker on the
//! virtual store, where leases lapse as tokio's paused clock moves (a plain `MemoryIdempotencyStore`
//! compares with the real wall clock, so under a paused clock no claim would ever lapse).
//!
//! The store goes down while a long job runs and stays down past the claim's lease; a second message
//! of the same job (a duplicate send) waits. When the store comes back, that duplicate may take the
//! lapsed claim: the first run must have been stopped before then, so two runs never overlap and the
//! work is done once. With the claim's renewal failing silently (the defect), both run to the end.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_sim::clock::{Skew, SkewedStore, VirtualStore};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A two-minute report that watches its context; records when each run worked and finished.
#[derive(Default)]
struct Report {
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    finished: AtomicUsize,
    runs: Mutex<Vec<(Instant, &'static str)>>,
}

struct ReportHandler(Arc<Report>);

impl Handler for ReportHandler {
    type Job = serde_json::Value;
    type Output = ();
    const JOB_TYPE: &'static str = "report";

    async fn handle(&self, _job: serde_json::Value, ctx: Context) -> Result<(), HandlerError> {
        let report = &self.0;
        let now_running = report.running.fetch_add(1, Ordering::SeqCst) + 1;
        report.most_at_once.fetch_max(now_running, Ordering::SeqCst);
        report.runs.lock().unwrap().push((Instant::now(), "started"));
        let outcome = tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(120)) => {
                report.finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            () = ctx.cancelled() => Err(HandlerError::retryable("stopped")),
        };
        report.running.fetch_sub(1, Ordering::SeqCst);
        report.runs.lock().unwrap().push((
            Instant::now(),
            if outcome.is_ok() { "finished" } else { "stopped" },
        ));
        outcome
    }
}

fn keyed(key: &str) -> OutgoingMessage {
    let mut message = OutgoingMessage {
        body: "{}".into(),
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("report"));
    message
        .attributes
        .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    message
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_longer_than_the_claim_never_lets_two_runs_of_a_job_overlap() {
    let queue = Arc::new(MemoryQueue::standard("claims").with_visibility_timeout(Duration::from_secs(30)));
    let inner = Arc::new(MemoryIdempotencyStore::new());
    let store = Arc::new(SkewedStore::new(
        Arc::new(VirtualStore::new(Arc::clone(&inner))),
        Skew::default(),
    ));
    let report = Arc::new(Report::default());
    let pipeline = Pipeline::new(Router::new().route(ReportHandler(Arc::clone(&report))))
        .with_store(store as Arc<dyn IdempotencyStore>);
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(
            "http://memory.invalid/000000000000/claims",
        )])
        .with_max_in_flight(10);
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    queue.push_message(keyed("report:7")).unwrap();
    let started =
        conveyor_testing::wait_until(Duration::from_secs(60), Duration::from_millis(10), async || {
            report.runs.lock().unwrap().len() == 1
        })
        .await;
    assert!(started.is_ok(), "the first run started");
    inner.set_unavailable(true);
    queue.push_message(keyed("report:7")).unwrap();
    tokio::time::sleep(Duration::from_secs(90)).await;
    inner.set_unavailable(false);
    let settled =
        conveyor_testing::wait_until(Duration::from_secs(1800), Duration::from_secs(1), async || {
            report.finished.load(Ordering::SeqCst) >= 1
                && queue.is_empty()
                && report.running.load(Ordering::SeqCst) == 0
        })
        .await;
    stop.cancel();
    let _ = running.await;
    let runs = report.runs.lock().unwrap().clone();
    assert!(
        settled.is_ok(),
        "the job was done and both messages settled: {runs:?}"
    );
    assert_eq!(
        report.most_at_once.load(Ordering::SeqCst),
        1,
        "two runs of one job overlapped: {runs:?}"
    );
    assert_eq!(
        report.finished.load(Ordering::SeqCst),
        1,
        "the work was done once: {runs:?}"
    );
}
