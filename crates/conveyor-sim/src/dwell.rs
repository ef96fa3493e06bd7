//! Tenant dwell times on the simulator: one noisy tenant's burst and many quiet tenants' trickle
//! through the real [`Worker`] over the in-memory queue, on tokio's paused clock, with SQS's fair
//! queues and Conveyor's per-tenant limits each on or off.
//!
//! A figure, not an invariant: [`run`] reports the quiet and noisy tenants' dwell (send to handler
//! start) percentiles, the virtual time the run took and the SQS requests per job. The in-memory queue
//! models fair queues after AWS's description ([`conveyor_testing::memory_queue::fair`]); LocalStack
//! 4.8 has none, so the simulator is where their effect, and how per-tenant limits interact with it,
//! can be measured here. `cargo run --release -p conveyor-sim --example tenant_bench` prints these
//! beside the same load on LocalStack.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_core::runtime::{TenantLimit, TenantLimits};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_testing::MemoryQueue;
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// How long every job works.
pub const WORK: Duration = Duration::from_millis(50);
/// The worker's `max_in_flight`.
pub const MAX_IN_FLIGHT: usize = 40;
/// The per-tenant concurrency limit when limits are on.
pub const TENANT_LIMIT: usize = 20;
/// How many quiet tenants send.
pub const QUIET_TENANTS: usize = 20;
/// The job type.
pub const JOB_TYPE: &str = "timed";

/// The job: when its producer sent it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    /// Milliseconds on the run's [`Clock`].
    pub sent_ms: u64,
}

/// The run's clock: the wall clock against an emulator, tokio's (paused) clock in memory.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    /// `SystemTime`, for runs in real time.
    Wall,
    /// Milliseconds since this instant of tokio's clock.
    Virtual(tokio::time::Instant),
}

impl Clock {
    /// Milliseconds now.
    pub fn now_ms(self) -> u64 {
        match self {
            Clock::Wall => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64),
            Clock::Virtual(start) => start.elapsed().as_millis() as u64,
        }
    }
}

/// Each run's dwell, by tenant.
pub type Dwell = Arc<Mutex<HashMap<String, Vec<u64>>>>;

/// Works [`WORK`]; records each run's dwell under its tenant.
#[derive(Debug)]
pub struct Timed {
    /// The clock the producer stamped `sent_ms` with.
    pub clock: Clock,
    /// Where the dwell goes.
    pub dwell: Dwell,
}

impl Handler for Timed {
    type Job = Job;
    type Output = ();
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, job: Job, ctx: Context) -> Result<(), HandlerError> {
        let dwell = self.clock.now_ms().saturating_sub(job.sent_ms);
        let tenant = ctx.tenant().unwrap_or("none").to_owned();
        self.dwell
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tenant)
            .or_default()
            .push(dwell);
        tokio::time::sleep(WORK).await;
        Ok(())
    }
}

/// The load: a noisy burst and the quiet tenants' trickle.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Jobs the noisy tenant sends at once, first.
    pub noisy: usize,
    /// Jobs each quiet tenant sends.
    pub quiet: usize,
    /// Over how many seconds the quiet jobs are spread (round-robin over the tenants).
    pub quiet_secs: u64,
}

impl Load {
    /// All jobs.
    pub fn total(self) -> usize {
        self.noisy + self.quiet * QUIET_TENANTS
    }
}

/// What is on for a run.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The queue orders receives as SQS fair queues do.
    pub fair_queues: bool,
    /// The worker limits each tenant to [`TENANT_LIMIT`] running jobs.
    pub tenant_limits: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// The quiet tenants' dwell, p50 and p99, in ms.
    pub quiet: (u64, u64),
    /// The noisy tenant's dwell, p50 and p99, in ms.
    pub noisy: (u64, u64),
    /// From the worker's start to the last job done.
    pub total: Duration,
    /// SQS requests per job.
    pub requests_per_job: f64,
}

fn percentile(values: &mut [u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index]
}

/// The figures from the recorded dwell.
pub fn figures(dwell: &Dwell, total: Duration, requests: u64, jobs: usize) -> Figures {
    let dwell = dwell.lock().unwrap_or_else(PoisonError::into_inner);
    let mut quiet: Vec<u64> = dwell
        .iter()
        .filter(|(tenant, _)| tenant.starts_with("quiet"))
        .flat_map(|(_, values)| values.iter().copied())
        .collect();
    let mut noisy = dwell.get("noisy").cloned().unwrap_or_default();
    Figures {
        quiet: (percentile(&mut quiet, 0.5), percentile(&mut quiet, 0.99)),
        noisy: (percentile(&mut noisy, 0.5), percentile(&mut noisy, 0.99)),
        total,
        requests_per_job: requests as f64 / jobs.max(1) as f64,
    }
}

/// The worker both places run: one queue, `max_in_flight` [`MAX_IN_FLIGHT`], and with limits on, each
/// tenant at most [`TENANT_LIMIT`] running (over it: deferred 1 s).
pub fn worker(
    url: &str,
    queue: Arc<dyn Queue>,
    pipeline: Pipeline,
    tenant_limits: bool,
) -> anyhow::Result<Worker> {
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(url)])
        .with_max_in_flight(MAX_IN_FLIGHT)
        .with_listen_addr(None);
    let worker = Worker::new(config, pipeline, vec![queue])?;
    if !tenant_limits {
        return Ok(worker);
    }
    let limits =
        TenantLimits::new(TenantLimit::concurrent(TENANT_LIMIT)).with_defer_for(Duration::from_secs(1));
    Ok(worker.limit_tenants(limits)?)
}

/// The quiet tenants' tenant names and send gaps: `quiet-00`..`quiet-19` round-robin, spread evenly
/// over `load.quiet_secs`.
pub fn quiet_sends(load: Load) -> (Vec<String>, Duration) {
    let count = load.quiet * QUIET_TENANTS;
    let gap = Duration::from_secs(load.quiet_secs) / count.max(1) as u32;
    let tenants = (0..count)
        .map(|n| format!("quiet-{:02}", n % QUIET_TENANTS))
        .collect();
    (tenants, gap)
}

/// Runs `load` on the simulator with `setting`: a fresh paused-clock runtime, the real worker over
/// a [`MemoryQueue`] (fair queues as `setting` says), the noisy burst sent before the worker starts.
pub fn run(load: Load, setting: Setting) -> anyhow::Result<Figures> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    runtime.block_on(run_paused(load, setting))
}

async fn run_paused(load: Load, setting: Setting) -> anyhow::Result<Figures> {
    let clock = Clock::Virtual(tokio::time::Instant::now());
    let mut queue = MemoryQueue::standard("tenant-bench");
    if !setting.fair_queues {
        queue = queue.without_fair_queues();
    }
    let queue = Arc::new(queue);
    let message = |tenant: &str, sent_ms: u64| -> anyhow::Result<OutgoingMessage> {
        Ok(OutgoingMessage {
            group_id: Some(tenant.to_owned()),
            ..OutgoingMessage::job(JOB_TYPE, serde_json::to_string(&Job { sent_ms })?)
        })
    };
    for _ in 0..load.noisy {
        queue.push_message(message("noisy", 0)?)?;
    }
    let dwell = Dwell::default();
    let pipeline = Pipeline::new(Router::single(Timed {
        clock,
        dwell: Arc::clone(&dwell),
    }));
    let url = "http://memory.invalid/000000000000/tenant-bench";
    let worker = worker(
        url,
        queue.clone() as Arc<dyn Queue>,
        pipeline,
        setting.tenant_limits,
    )?;
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = tokio::time::Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let (tenants, gap) = quiet_sends(load);
    for tenant in tenants {
        queue.send(message(&tenant, clock.now_ms())?).await?;
        tokio::time::sleep(gap).await;
    }
    let total = load.total() as u64;
    let finished = conveyor_testing::wait_until(
        Duration::from_secs(36_000),
        Duration::from_millis(20),
        async || status.report().succeeded >= total,
    )
    .await;
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await??;
    anyhow::ensure!(
        finished.is_ok(),
        "the simulated run did not finish in 10 virtual hours"
    );
    Ok(figures(&dwell, elapsed, queue.requests().total(), load.total()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOAD: Load = Load {
        noisy: 2_000,
        quiet: 5,
        quiet_secs: 5,
    };

    /// On the paused clock the figures are exact, so this compares them: fair queues bring the quiet
    /// tenants' p99 dwell under a second while the noisy backlog (2,000 jobs, 2.5 s of work at 40 in
    /// flight) still drains; without them the quiet jobs wait behind the whole backlog.
    #[test]
    fn fair_queues_keep_quiet_tenants_quick() {
        let off = run(
            LOAD,
            Setting {
                fair_queues: false,
                tenant_limits: false,
            },
        )
        .unwrap();
        let on = run(
            LOAD,
            Setting {
                fair_queues: true,
                tenant_limits: false,
            },
        )
        .unwrap();
        assert!(
            off.quiet.1 > 1_000,
            "without fair queues quiet jobs wait: {off:?}"
        );
        assert!(on.quiet.1 < 1_000, "with fair queues they do not: {on:?}");
        assert!(
            on.noisy.1 >= off.noisy.1 / 2,
            "the noisy tenant still runs: {on:?} vs {off:?}"
        );
    }
}
