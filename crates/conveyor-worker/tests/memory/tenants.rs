//! Per-tenant limits in the worker on `MemoryQueue` under a paused clock: a noisy tenant is held to
//! its limit by deferring its jobs unrun (no receive spent, nothing lost or doubled), and quiet
//! tenants' jobs run meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_core::runtime::{TenantLimit, TenantLimits};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_testing::MemoryQueue;
use conveyor_worker::Worker;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::common::{config, eventually, start};

#[derive(Debug, Serialize, Deserialize)]
struct Work {
    id: u64,
    ms: u64,
}

/// What the handler saw: runs per job id, the most jobs of each tenant at once, finish times.
#[derive(Debug, Default)]
struct Seen {
    runs: HashMap<u64, u32>,
    running: HashMap<String, usize>,
    most: HashMap<String, usize>,
    attempts: Vec<u32>,
    finished: HashMap<String, Vec<Instant>>,
}

struct Tenanted(Arc<Mutex<Seen>>);

impl Handler for Tenanted {
    type Job = Work;
    type Output = ();
    const JOB_TYPE: &'static str = "work";

    async fn handle(&self, job: Work, ctx: Context) -> Result<(), HandlerError> {
        let tenant = ctx.tenant().unwrap_or("none").to_owned();
        {
            let mut seen = self.0.lock().unwrap();
            *seen.runs.entry(job.id).or_insert(0) += 1;
            seen.attempts.push(ctx.receive_count());
            let now = seen.running.entry(tenant.clone()).or_insert(0);
            *now += 1;
            let now = *now;
            let most = seen.most.entry(tenant.clone()).or_insert(0);
            *most = (*most).max(now);
        }
        tokio::time::sleep(Duration::from_millis(job.ms)).await;
        let mut seen = self.0.lock().unwrap();
        *seen.running.get_mut(&tenant).unwrap() -= 1;
        seen.finished.entry(tenant).or_default().push(Instant::now());
        Ok(())
    }
}

fn tenant_job(id: u64, tenant: &str, ms: u64) -> OutgoingMessage {
    OutgoingMessage {
        group_id: Some(tenant.to_owned()),
        ..OutgoingMessage::job("work", serde_json::to_string(&Work { id, ms }).unwrap())
    }
}

/// 40 jobs of a noisy tenant queued ahead of 2 jobs each of 4 quiet tenants, 8 slots, 1 s jobs.
async fn run(limits: Option<TenantLimits>) -> (Seen, conveyor_worker::WorkerReport, Arc<MemoryQueue>) {
    let queue = Arc::new(
        MemoryQueue::standard("tenants")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(Arc::new(MemoryQueue::standard("tenants-dlq")), 2),
    );
    for id in 0..40 {
        queue.push_message(tenant_job(id, "noisy", 1_000)).unwrap();
    }
    for (index, tenant) in ["q-a", "q-b", "q-c", "q-d"].iter().enumerate() {
        for n in 0..2 {
            queue
                .push_message(tenant_job(100 + index as u64 * 10 + n, tenant, 1_000))
                .unwrap();
        }
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let pipeline = Pipeline::new(Router::new().route(Tenanted(Arc::clone(&seen))));
    let config = config(&[("tenants", 1)]).with_max_in_flight(8);
    let mut worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap();
    if let Some(limits) = limits {
        worker = worker.limit_tenants(limits).unwrap();
    }
    let running = start(worker);
    let done = Arc::clone(&seen);
    eventually(600, "all 48 jobs", move || done.lock().unwrap().runs.len() == 48).await;
    eventually(60, "the queue to empty", || queue.is_empty()).await;
    let report = running.stop().await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (seen, report, queue)
}

fn last_quiet_finish(seen: &Seen, start: Instant) -> Duration {
    seen.finished
        .iter()
        .filter(|(tenant, _)| tenant.starts_with("q-"))
        .flat_map(|(_, times)| times.iter())
        .max()
        .unwrap()
        .duration_since(start)
}

#[tokio::test(start_paused = true)]
async fn a_noisy_tenant_is_held_to_its_limit_and_quiet_tenants_run_meanwhile() {
    let start = Instant::now();
    let limits = TenantLimits::new(TenantLimit::concurrent(2)).with_defer_for(Duration::from_millis(500));
    let (seen, report, queue) = run(Some(limits)).await;
    assert_eq!(
        seen.most["noisy"], 2,
        "the noisy tenant never ran more than its limit"
    );
    assert!(
        seen.runs.values().all(|runs| *runs == 1),
        "every job ran exactly once"
    );
    assert!(
        seen.attempts.iter().all(|attempt| *attempt == 1),
        "deferrals spent no receive (maxReceiveCount is 2 here)"
    );
    assert!(report.deferred > 0, "the noisy tenant was deferred");
    assert!(queue.messages_in_dlq().is_empty());
    let quiet = last_quiet_finish(&seen, start);
    assert!(
        quiet < Duration::from_secs(5),
        "the quiet tenants' 8 jobs finished after {quiet:?}, beside the noisy tenant's 40"
    );
}

#[tokio::test(start_paused = true)]
async fn without_limits_the_noisy_tenant_takes_every_slot_first() {
    let start = Instant::now();
    let (seen, report, _queue) = run(None).await;
    assert_eq!(seen.most["noisy"], 8, "all 8 slots");
    assert_eq!(report.deferred, 0);
    let quiet = last_quiet_finish(&seen, start);
    assert!(
        quiet >= Duration::from_secs(5),
        "the quiet tenants' jobs waited behind the noisy tenant's: {quiet:?}"
    );
}

#[tokio::test]
async fn a_zero_limit_is_refused_at_start_with_the_reason() {
    let queue = Arc::new(MemoryQueue::standard("tenants-zero"));
    let pipeline = Pipeline::new(Router::new().route(Tenanted(Arc::default())));
    let worker = Worker::new(
        config(&[("tenants-zero", 1)]),
        pipeline,
        vec![queue as Arc<dyn Queue>],
    )
    .unwrap();
    let error = worker
        .limit_tenants(TenantLimits::new(TenantLimit::concurrent(0)))
        .unwrap_err();
    assert!(error.to_string().contains("concurrency limit of 0"), "{error}");
}
