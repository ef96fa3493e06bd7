//! Batch handlers on the worker, against `MemoryQueue` and `MemoryIdempotencyStore` under a paused
//! clock: per-job outcomes in one call, duplicates inside one receive, a panic, lost leases, FIFO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    Backoff, Batch, BatchHandler, BatchResult, BatchSettings, HandlerError, HandlerSettings, Pipeline,
    Router,
    port::{IdempotencyStore, Queue},
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, ScriptedQueue};
use conveyor_worker::Worker;

/// What the batch handler saw and did.
#[derive(Debug, Default)]
struct Seen {
    /// Each call's job ids, in order.
    calls: Vec<Vec<u64>>,
    /// Each job's applied effects.
    effects: HashMap<u64, u32>,
    /// Effects in the order they were applied.
    order: Vec<u64>,
    /// How many calls each job was in (its script counts these: a FIFO head is retried in place,
    /// without a new receive).
    runs: HashMap<u64, u32>,
}

/// A batch handler whose jobs follow their `TestJob` script: one call, one result per job; a job
/// scripted to panic panics the whole call (before any effect); work watches the batch's token.
#[derive(Clone)]
struct Rows {
    seen: Arc<Mutex<Seen>>,
    max_jobs: usize,
}

impl Rows {
    fn new(max_jobs: usize) -> Self {
        Self {
            seen: Arc::default(),
            max_jobs,
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }

    fn effects_once(&self, ids: impl IntoIterator<Item = u64>) {
        let seen = self.seen();
        for id in ids {
            assert_eq!(
                seen.effects.get(&id),
                Some(&1),
                "job {id}'s effect once: {seen:?}"
            );
        }
    }
}

impl BatchHandler for Rows {
    type Job = TestJob;
    type Output = u64;
    const JOB_TYPE: &'static str = "rows";

    async fn handle_batch(&self, batch: Batch<TestJob>) -> BatchResult<u64> {
        let runs: Vec<u32> = {
            let mut seen = self.seen();
            seen.calls
                .push(batch.jobs().iter().map(|job| job.job.id).collect());
            batch
                .jobs()
                .iter()
                .map(|job| {
                    let runs = seen.runs.entry(job.job.id).or_default();
                    *runs += 1;
                    *runs
                })
                .collect()
        };
        let work = batch.jobs().iter().map(|job| job.job.ms).max().unwrap_or(0);
        if work > 0 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(work)) => {}
                () = batch.cancellation().cancelled() => return Err(HandlerError::retryable("batch cancelled")),
            }
        }
        let panics = batch
            .jobs()
            .iter()
            .zip(&runs)
            .any(|(job, runs)| job.job.fail == Fail::Panic && *runs <= job.job.fail_until);
        if panics {
            panic!("batch handler panicked on purpose");
        }
        let mut seen = self.seen();
        let results = batch
            .jobs()
            .iter()
            .zip(&runs)
            .map(|(job, runs)| {
                let failing = *runs <= job.job.fail_until;
                match job.job.fail {
                    Fail::Retry if failing => {
                        return Err(HandlerError::retryable("throttled: unprocessed item"));
                    }
                    Fail::Permanent => {
                        return Err(HandlerError::permanent("poison: this row can never be written"));
                    }
                    _ => {}
                }
                if job.ctx.is_cancelled() {
                    return Err(HandlerError::retryable("cancelled"));
                }
                *seen.effects.entry(job.job.id).or_default() += 1;
                seen.order.push(job.job.id);
                Ok(job.job.id)
            })
            .collect();
        Ok(results)
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_backoff(Backoff::with_budget(Duration::from_secs(3)))
    }

    fn batch_settings(&self) -> BatchSettings {
        BatchSettings::default().with_max_jobs(self.max_jobs)
    }
}

fn worker<Q: Queue + 'static>(
    rows: &Rows,
    queue: &Arc<Q>,
    name: &str,
    store: &Arc<MemoryIdempotencyStore>,
) -> Worker {
    let pipeline = Pipeline::new(Router::new().batch_route(rows.clone()))
        .with_store(Arc::clone(store) as Arc<dyn IdempotencyStore>);
    Worker::new(
        config(&[(name, 1)]),
        pipeline,
        vec![Arc::clone(queue) as Arc<dyn Queue>],
    )
    .unwrap()
}

fn queue_with_dlq(name: &str) -> Arc<MemoryQueue> {
    let dlq = Arc::new(MemoryQueue::standard(&format!("{name}-dlq")));
    Arc::new(
        MemoryQueue::standard(name)
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq, 5),
    )
}

#[tokio::test(start_paused = true)]
async fn one_call_with_a_retryable_a_permanent_and_eight_good_jobs_settles_each_job_on_its_own() {
    let rows = Rows::new(10);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let queue = queue_with_dlq("rows");
    for id in 0..10 {
        let fail = match id {
            3 => Fail::Retry,
            5 => Fail::Permanent,
            _ => Fail::Never,
        };
        let script = TestJob {
            id,
            fail,
            fail_until: 1,
            ..TestJob::default()
        };
        queue.push_message(message("rows", &script)).unwrap();
    }
    let running = start(worker(&rows, &queue, "rows", &store));
    eventually(60, "nine effects and an empty queue", || {
        rows.seen().effects.len() == 9 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    let seen = rows.seen();
    assert_eq!(
        seen.calls[0].len(),
        10,
        "the first call had every job: {:?}",
        seen.calls
    );
    assert_eq!(seen.calls[1..], [vec![3]], "only the retried job ran again");
    drop(seen);
    rows.effects_once((0..10).filter(|id| *id != 5));
    let dlq = queue.messages_in_dlq();
    assert_eq!(dlq.len(), 1, "one DLQ copy: {dlq:?}");
    assert_eq!(
        dlq[0].body,
        serde_json::to_string(&TestJob {
            id: 5,
            fail: Fail::Permanent,
            fail_until: 1,
            ..TestJob::default()
        })
        .unwrap()
    );
    let failure = dlq[0].attributes[FAILURE_ATTRIBUTE].string_value.clone().unwrap();
    assert!(
        failure.contains("poison: this row can never be written"),
        "{failure}"
    );
    let requests = queue.requests();
    assert_eq!(requests.dead_letter, 1, "{requests:?}");
    assert_eq!(
        requests.change_visibility, 1,
        "one visibility change, the retry's: {requests:?}"
    );
    assert_eq!(
        (report.succeeded, report.retried, report.dead_lettered),
        (9, 1, 1),
        "{report:?}"
    );
    let claims = store.requests();
    assert_eq!(claims.claim, 11, "a claim per run: {claims:?}");
    assert_eq!((claims.complete, claims.release), (9, 2), "{claims:?}");
}

#[tokio::test(start_paused = true)]
async fn duplicates_inside_one_receive_run_once() {
    let rows = Rows::new(10);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let queue = queue_with_dlq("dups");
    for copy in 0..3 {
        for id in 0..3 {
            let script = TestJob {
                id,
                ms: 200,
                ..TestJob::default()
            };
            queue
                .push_message(keyed_message("rows", &script, &format!("row-{id}")))
                .unwrap();
        }
        let _ = copy;
    }
    let running = start(worker(&rows, &queue, "dups", &store));
    eventually(120, "three effects and an empty queue", || {
        rows.seen().effects.len() == 3 && queue.is_empty()
    })
    .await;
    running.stop().await;
    rows.effects_once(0..3);
    let seen = rows.seen();
    for call in &seen.calls {
        let distinct: HashSet<&u64> = call.iter().collect();
        assert_eq!(
            distinct.len(),
            call.len(),
            "a call never holds one key twice: {:?}",
            seen.calls
        );
    }
    assert_eq!(
        seen.calls.iter().map(Vec::len).sum::<usize>(),
        3,
        "only the claimed copies reached the handler: {:?}",
        seen.calls
    );
    assert!(
        queue.messages_in_dlq().is_empty(),
        "a duplicate never reaches the DLQ"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_fails_the_whole_call_and_every_job_runs_again_once() {
    let rows = Rows::new(4);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let queue = queue_with_dlq("panics");
    for id in 0..4 {
        let fail = if id == 2 { Fail::Panic } else { Fail::Never };
        let script = TestJob {
            id,
            fail,
            fail_until: 1,
            ..TestJob::default()
        };
        queue.push_message(message("rows", &script)).unwrap();
    }
    let running = start(worker(&rows, &queue, "panics", &store));
    eventually(60, "four effects and an empty queue", || {
        rows.seen().effects.len() == 4 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    rows.effects_once(0..4);
    assert_eq!(rows.seen().calls[0].len(), 4);
    assert_eq!((report.retried, report.succeeded), (4, 4), "{report:?}");
    assert!(queue.messages_in_dlq().is_empty());
}

#[tokio::test(start_paused = true)]
async fn lost_leases_cancel_the_batch_release_the_claims_and_the_jobs_run_once_later() {
    let rows = Rows::new(3);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let queue = ScriptedQueue::new(queue_with_dlq("leases"));
    for id in 0..3 {
        let script = TestJob {
            id,
            ms: 90_000,
            fail: Fail::Never,
            ..TestJob::default()
        };
        queue.inner().push_message(message("rows", &script)).unwrap();
    }
    // No extension answers: every lease of the first call is lost before its work ends.
    queue.hang_visibility(true);
    let running = start(worker(&rows, &queue, "leases", &store));
    eventually(120, "the first call", || !rows.seen().calls.is_empty()).await;
    eventually(120, "the leases lost", || {
        running.status.report().leases_lost >= 3
    })
    .await;
    queue.hang_visibility(false);
    eventually(600, "three effects and an empty queue", || {
        rows.seen().effects.len() == 3 && queue.inner().is_empty()
    })
    .await;
    let report = running.stop().await;
    rows.effects_once(0..3);
    assert!(rows.seen().calls.len() >= 2, "{:?}", rows.seen().calls);
    assert!(report.leases_lost >= 3, "{report:?}");
    assert!(queue.inner().messages_in_dlq().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fifo_queue_gathers_across_groups_and_keeps_each_groups_order() {
    let rows = Rows::new(10);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let queue = Arc::new(MemoryQueue::fifo("rows").with_visibility_timeout(Duration::from_secs(30)));
    let groups = ["a", "b", "c"];
    for id in 0..12u64 {
        let group = groups[(id % 3) as usize];
        // The second job of group a fails once: its group waits for it.
        let fail = if id == 3 { Fail::Retry } else { Fail::Never };
        let script = TestJob {
            id,
            fail,
            fail_until: 1,
            ..TestJob::default()
        };
        queue.push_message(fifo_message("rows", &script, group)).unwrap();
    }
    let running = start(worker(&rows, &queue, "rows.fifo", &store));
    let settled =
        conveyor_testing::wait_until(Duration::from_secs(300), Duration::from_millis(10), async || {
            rows.seen().effects.len() == 12 && queue.is_empty()
        })
        .await;
    assert!(settled.is_ok(), "{:?} {:?}", rows.seen(), queue.snapshot());
    running.stop().await;
    rows.effects_once(0..12);
    let seen = rows.seen();
    for (index, group) in groups.iter().enumerate() {
        let order: Vec<u64> = seen
            .order
            .iter()
            .copied()
            .filter(|id| *id % 3 == index as u64)
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "group {group} in order: {:?}", seen.order);
    }
    assert!(
        seen.calls.iter().any(|call| call.len() > 1),
        "calls gather across groups: {:?}",
        seen.calls
    );
    for call in &seen.calls {
        let groups: HashSet<u64> = call.iter().map(|id| id % 3).collect();
        assert_eq!(
            groups.len(),
            call.len(),
            "one job per group in a call: {:?}",
            seen.calls
        );
    }
}
