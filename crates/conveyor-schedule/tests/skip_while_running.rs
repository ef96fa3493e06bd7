//! `skip_while_running`, on the in-memory stores and tokio's paused clock: a tick is skipped while the
//! previous tick's job is not completed in the consumers' idempotency store, and no longer than the
//! schedule's bound when that job never completes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::port::{ClaimOutcome, ClaimRequest, IdempotencyStore, idempotency_key};
use conveyor_schedule::{MemoryScheduleStore, MissedTicks, Schedule, Scheduler, SchedulerClock, TickSender};
use conveyor_sqs::NewJob;
use conveyor_testing::MemoryIdempotencyStore;
use tokio_util::sync::CancellationToken;

/// A queue and its consumer in one: each job is claimed at once and completed after `runs_for`
/// (never, when `None`).
struct Consumer {
    jobs: Arc<MemoryIdempotencyStore>,
    runs_for: Option<Duration>,
    sent: Mutex<Vec<tokio::time::Instant>>,
}

#[async_trait]
impl TickSender for Consumer {
    async fn send_tick(&self, job: &NewJob<serde_json::Value>) -> Result<String, String> {
        self.sent.lock().unwrap().push(tokio::time::Instant::now());
        let key = idempotency_key(job.job_type(), job.producer_key(), "");
        let far = SystemTime::now() + Duration::from_secs(86_400);
        let request = ClaimRequest {
            key,
            lease_until: far,
            expires_at: far,
            validation: None,
            restart_runs: false,
            last_attempt: false,
        };
        let ClaimOutcome::Acquired(claim) = self.jobs.claim(&request).await.unwrap() else {
            return Err("claimed twice".into());
        };
        if let Some(runs_for) = self.runs_for {
            let jobs = Arc::clone(&self.jobs);
            tokio::spawn(async move {
                tokio::time::sleep(runs_for).await;
                jobs.complete(&claim, None, far).await.unwrap();
            });
        }
        Ok("m".into())
    }
}

async fn run(runs_for: Option<Duration>) -> (Vec<Duration>, conveyor_schedule::ScheduleState) {
    let jobs = Arc::new(MemoryIdempotencyStore::new());
    let consumer = Arc::new(Consumer {
        jobs: Arc::clone(&jobs),
        runs_for,
        sent: Mutex::default(),
    });
    let store = Arc::new(MemoryScheduleStore::new());
    let schedule = Schedule::every("report", Duration::from_secs(10))
        .unwrap()
        .job_of("report", 1, &serde_json::json!({}))
        .unwrap()
        .missed_ticks(MissedTicks::All)
        .missed_after(Duration::from_secs(1))
        .skip_while_running(Duration::from_secs(60));
    let start = tokio::time::Instant::now();
    let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800);
    let scheduler = Scheduler::with_shared_store(vec![schedule], store.clone(), consumer.clone())
        .unwrap()
        .with_clock(SchedulerClock::simulated(origin, start, 0))
        .with_job_records(jobs);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(scheduler.run(shutdown.child_token()));
    tokio::time::sleep(Duration::from_secs(300)).await;
    shutdown.cancel();
    task.await.unwrap();
    let sent = consumer
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|at| *at - start)
        .collect();
    (sent, store.peek_state("report"))
}

#[tokio::test(start_paused = true)]
async fn a_tick_is_skipped_while_the_previous_job_runs() {
    // Every 10 s; each job runs 25 s: a send every 30 s, the two ticks between skipped.
    let (sent, state) = run(Some(Duration::from_secs(25))).await;
    assert!(sent.len() >= 9, "{sent:?}");
    for pair in sent.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_secs(25),
            "sent while the previous job ran: {sent:?}"
        );
        assert!(
            gap <= Duration::from_secs(31),
            "skipped after the previous job completed: {sent:?}"
        );
    }
    assert!(
        state
            .history
            .iter()
            .any(|entry| entry.detail.contains("previous run still going")),
        "{:?}",
        state.history
    );
    assert_eq!(state.runs, sent.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn a_job_that_never_completes_holds_the_schedule_no_longer_than_its_bound() {
    let (sent, _) = run(None).await;
    assert!(sent.len() >= 4, "{sent:?}");
    for pair in sent.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap > Duration::from_secs(60) && gap <= Duration::from_secs(71),
            "{sent:?}"
        );
    }
}
