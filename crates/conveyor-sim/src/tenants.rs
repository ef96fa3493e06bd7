//! Tenants and per-tenant limits under load: the real [`Worker`]s and Lambda [`BatchProcessor`]s over
//! the in-memory queue (SQS's receive counts and redrive, `MessageGroupId` on a standard queue) and
//! idempotency store, on tokio's paused clock.
//!
//! A seed draws 2–6 tenants, the first of them noisy (10–80 jobs sent in a burst, the others 1–6 each,
//! spread over a minute), jobs that work 0–3 s and some that fail once (retryable), some sent twice
//! with one producer key, per-tenant limits (a concurrency limit of 1–3, in half the seeds a rate, in
//! a third an override for one tenant) and consumers: 1–3 workers and 0–2 Lambda functions (at least
//! one consumer), and in a third of the seeds a worker shut down gracefully mid-run and replaced.
//!
//! Invariants after every run:
//! - **once**: every job (one key) had its effect exactly once: a tenant deferral neither loses nor
//!   doubles a job;
//! - **no receive spent**: nothing reaches the DLQ (`maxReceiveCount` is 3, a job fails at most once:
//!   a deferral that spent a receive would take jobs there);
//! - **the tenant travels**: every run's `Context::tenant` is the tenant its job was sent with (deferred
//!   copies, retries and duplicates included);
//! - **concurrency held**: no consumer ever ran more of a tenant's jobs at once than its limit;
//! - **rate held**: no consumer started more of a tenant's jobs in any window of `w` seconds than the
//!   bucket allows (`burst + rate × w`, one of slack for the jitter of the clock);
//! - **settles**: the queue is empty at the end.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE};
use conveyor_core::port::{IdempotencyStore, OutgoingMessage, Queue};
use conveyor_core::runtime::{TenantLimit, TenantLimits, TenantOverride, TenantSettings};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_lambda::{BatchProcessor, FixedQueue};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::VirtualStore;
use crate::lambda::Function;
use crate::scenario::LambdaSpec;
use crate::sink::Sink;
use crate::trace::Trace;

/// The redrive policy's `maxReceiveCount`: a job fails at most once, so a third receive is a spent one.
const MAX_RECEIVES: u32 = 3;
/// The job type.
const JOB_TYPE: &str = "tenant_job";

/// One job of a seed.
#[derive(Debug, Clone)]
pub struct TenantJob {
    /// Its number (the body), shared by the sends of one key.
    pub id: u32,
    /// Its tenant.
    pub tenant: String,
    /// When it is sent (from the start).
    pub sent: Duration,
    /// How long it works.
    pub work: Duration,
    /// Its first run fails with a retryable error.
    pub fails_once: bool,
}

/// One seed's scenario.
#[derive(Debug, Clone)]
pub struct TenantScenario {
    /// The seed.
    pub seed: u64,
    /// The sends (a job sent twice appears twice).
    pub sends: Vec<TenantJob>,
    /// The limits every consumer runs with.
    pub settings: TenantSettings,
    /// Workers and their `max_in_flight`.
    pub workers: Vec<usize>,
    /// Lambda functions.
    pub functions: Vec<LambdaSpec>,
    /// A worker shut down gracefully at this time and replaced.
    pub restart_at: Option<Duration>,
}

impl TenantScenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x7e4a_4175);
        let tenants: Vec<String> = (0..rng.usize(2..=6))
            .map(|index| match index {
                0 => "noisy".to_owned(),
                _ => format!("quiet-{index}"),
            })
            .collect();
        let mut sends = Vec::new();
        let mut id = 0;
        for tenant in &tenants {
            let (count, spread) = if tenant == "noisy" {
                (rng.u32(10..=80), 10)
            } else {
                (rng.u32(1..=6), 60)
            };
            for _ in 0..count {
                let job = TenantJob {
                    id,
                    tenant: tenant.clone(),
                    sent: Duration::from_millis(rng.u64(0..spread * 1000)),
                    work: Duration::from_millis(rng.u64(0..3000)),
                    fails_once: rng.f64() < 0.2,
                };
                if rng.f64() < 0.1 {
                    let mut again = job.clone();
                    again.sent += Duration::from_millis(rng.u64(0..5000));
                    sends.push(again);
                }
                sends.push(job);
                id += 1;
            }
        }
        let mut settings = TenantSettings::default();
        settings.max_concurrent = Some(rng.usize(1..=3));
        if rng.bool() {
            settings.per_second = Some(0.5 + rng.f64() * 4.5);
            settings.burst = rng.u32(1..=3);
        }
        settings.defer = Duration::from_millis(rng.u64(100..2000));
        if rng.u32(0..3) == 0 && tenants.len() > 1 {
            let mut own = TenantOverride::default();
            own.max_concurrent = Some(rng.usize(1..=5));
            settings.overrides.insert(tenants[1].clone(), own);
        }
        let mut workers: Vec<usize> = (0..rng.usize(0..=3)).map(|_| rng.usize(2..=10)).collect();
        let functions: Vec<LambdaSpec> = (0..rng.usize(0..=2))
            .map(|_| LambdaSpec {
                function_timeout: Duration::from_secs(rng.u64(20..=60)),
                batch_size: rng.usize(1..=10),
                batch_concurrency: rng.usize(1..=4),
                invocations: 1,
                process_concurrency: None,
                invoke_delay: Duration::ZERO,
            })
            .collect();
        if workers.is_empty() && functions.is_empty() {
            workers.push(rng.usize(2..=10));
        }
        let restart_at =
            (!workers.is_empty() && rng.u32(0..3) == 0).then(|| Duration::from_millis(rng.u64(1000..30_000)));
        Self {
            seed,
            sends,
            settings,
            workers,
            functions,
            restart_at,
        }
    }

    fn limits(&self) -> TenantLimits {
        self.settings.limits()
    }

    fn limit(&self, tenant: &str) -> TenantLimit {
        let limits = self.limits();
        limits.overrides.get(tenant).copied().unwrap_or(limits.default)
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default)]
pub struct TenantReport {
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Jobs (keys) in the scenario.
    pub jobs: usize,
    /// Handler runs.
    pub runs: usize,
    /// Runs that would have gone over a tenant's limit and were deferred instead (messages sent
    /// beyond the producer's: deferred copies and delay hops).
    pub copies: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Serialize, Deserialize)]
struct Body {
    job: u32,
    tenant: String,
    work_ms: u64,
    fails_once: bool,
}

/// One run a consumer's handler started.
#[derive(Debug, Clone)]
struct Run {
    job: u32,
    consumer: String,
    tenant: Option<String>,
    sent_tenant: String,
    started: Duration,
}

/// What the run saw.
#[derive(Debug, Default)]
struct Log {
    runs: Vec<Run>,
    /// Effects applied, by job.
    effects: BTreeMap<u32, u32>,
    /// Runs of each job that failed on purpose.
    failed: HashMap<u32, u32>,
    /// Running now, by (consumer, tenant), and the most seen.
    running: HashMap<(String, String), usize>,
    most: HashMap<(String, String), usize>,
}

/// The handler of one consumer: records its runs and how many of each tenant run at once.
struct Recorder {
    consumer: String,
    log: Arc<Mutex<Log>>,
    start: Instant,
}

impl Handler for Recorder {
    type Job = Body;
    type Output = ();
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, job: Body, ctx: Context) -> Result<(), HandlerError> {
        let tenant = ctx.tenant().map(str::to_owned);
        let slot = (self.consumer.clone(), tenant.clone().unwrap_or_default());
        {
            let mut log = lock(&self.log);
            log.runs.push(Run {
                job: job.job,
                consumer: self.consumer.clone(),
                tenant: tenant.clone(),
                sent_tenant: job.tenant.clone(),
                started: self.start.elapsed(),
            });
            let now = log.running.entry(slot.clone()).or_insert(0);
            *now += 1;
            let now = *now;
            let most = log.most.entry(slot.clone()).or_insert(0);
            *most = (*most).max(now);
        }
        let worked = tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(job.work_ms)) => true,
            () = ctx.cancelled() => false,
        };
        let mut log = lock(&self.log);
        if let Some(now) = log.running.get_mut(&slot) {
            *now -= 1;
        }
        if !worked {
            return Err(HandlerError::retryable("stopped"));
        }
        let failed = log.failed.entry(job.job).or_insert(0);
        if job.fails_once && *failed == 0 {
            *failed += 1;
            return Err(HandlerError::retryable("fails once"));
        }
        *log.effects.entry(job.job).or_insert(0) += 1;
        Ok(())
    }
}

/// Runs `seed`'s scenario and checks its invariants.
pub fn simulate_tenants(seed: u64) -> TenantReport {
    let scenario = TenantScenario::generate(seed);
    let runtime = match crate::seeded_paused_runtime(seed) {
        Ok(runtime) => runtime,
        Err(error) => {
            return TenantReport {
                violations: vec![error],
                ..TenantReport::default()
            };
        }
    };
    runtime.block_on(run(&scenario))
}

/// A running worker.
struct RunningWorker {
    graceful: CancellationToken,
    handle: JoinHandle<Result<conveyor_worker::WorkerReport, conveyor_worker::WorkerError>>,
}

async fn run(scenario: &TenantScenario) -> TenantReport {
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Log::default()));
    let dlq = Arc::new(MemoryQueue::standard("tenants-dlq"));
    let visibility = scenario
        .functions
        .iter()
        .map(|spec| spec.function_timeout * 6)
        .max()
        .unwrap_or(Duration::from_secs(30));
    let queue = Arc::new(
        MemoryQueue::standard("tenants")
            .with_visibility_timeout(visibility)
            .with_dead_letter_queue(Arc::clone(&dlq), MAX_RECEIVES),
    );
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotencyStore::new());
    let pipeline = |consumer: String| {
        let handler = Recorder {
            consumer,
            log: Arc::clone(&log),
            start,
        };
        Pipeline::new(Router::new().route(handler)).with_store(Arc::clone(&store))
    };
    let mut violations = Vec::new();
    let start_worker = |index: usize, max_in_flight: usize| -> Result<RunningWorker, String> {
        let mut config = WorkerConfig::default()
            .with_queues(vec![QueueConfig::new("http://sim.invalid/tenants")])
            .with_max_in_flight(max_in_flight)
            .with_listen_addr(None);
        config.tenants = scenario.settings.clone();
        let worker = Worker::new(
            config,
            pipeline(format!("worker-{index}")),
            vec![Arc::clone(&queue) as Arc<dyn Queue>],
        )
        .map_err(|error| format!("could not build worker {index}: {error}"))?;
        let graceful = CancellationToken::new();
        let handle = tokio::spawn(worker.run_with(graceful.clone(), CancellationToken::new()));
        Ok(RunningWorker { graceful, handle })
    };
    let mut workers = Vec::new();
    for (index, max_in_flight) in scenario.workers.iter().enumerate() {
        match start_worker(index, *max_in_flight) {
            Ok(worker) => workers.push(worker),
            Err(error) => violations.push(error),
        }
    }
    let sink = Arc::new(Sink::new(
        Arc::new(VirtualStore::new(Arc::new(MemoryIdempotencyStore::new()))),
        Trace::new(std::env::var_os("TENANT_TRACE").is_some()),
    ));
    let stop_functions = CancellationToken::new();
    let functions: Vec<JoinHandle<()>> = scenario
        .functions
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let mut config = crate::lambda::config(spec);
            config.tenants = scenario.settings.clone();
            let processor = BatchProcessor::new(
                pipeline(format!("function-{index}")),
                config,
                Arc::new(FixedQueue(Arc::clone(&queue) as Arc<dyn Queue>)),
            )
            .without_metrics();
            let function = Function {
                name: format!("function-{index}"),
                spec: *spec,
                queue: Arc::clone(&queue) as Arc<dyn Queue>,
                processor: Arc::new(processor),
                sink: Arc::clone(&sink),
            };
            tokio::spawn(function.run(stop_functions.clone()))
        })
        .collect();

    let mut sends: Vec<&TenantJob> = scenario.sends.iter().collect();
    sends.sort_by_key(|job| job.sent);
    let mut restart = scenario.restart_at;
    for job in sends {
        if let Some(at) = restart.filter(|at| *at <= job.sent) {
            tokio::time::sleep_until(start + at).await;
            restart = None;
            violations.extend(restart_first(&mut workers, &start_worker).await);
        }
        tokio::time::sleep_until(start + job.sent).await;
        if let Err(error) = queue.send(message(job)).await {
            violations.push(format!("job {}: the producer's send failed: {error}", job.id));
        }
    }
    // Every job settles well within an hour: the slowest works 3 s, the noisiest tenant has 80.
    let settled =
        conveyor_testing::wait_until(Duration::from_secs(3600), Duration::from_secs(1), async || {
            queue.is_empty()
        })
        .await;
    if settled.is_err() {
        violations.push(format!(
            "the queue did not empty within an hour: {} messages left",
            queue.snapshot().len()
        ));
    }
    for worker in workers {
        worker.graceful.cancel();
        match worker.handle.await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => violations.push(format!("a worker failed: {error}")),
            Err(error) => violations.push(format!("a worker panicked: {error}")),
        }
    }
    stop_functions.cancel();
    for function in functions {
        if let Err(error) = function.await {
            violations.push(format!("a function panicked: {error}"));
        }
    }
    let log = lock(&log);
    violations.extend(check(scenario, &log, dlq.snapshot().len()));
    let copies = queue_sends(&queue, scenario);
    TenantReport {
        violations,
        jobs: scenario
            .sends
            .iter()
            .map(|job| job.id)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        runs: log.runs.len(),
        copies,
    }
}

/// Messages sent to the queue beyond the producer's (deferred copies).
fn queue_sends(queue: &MemoryQueue, scenario: &TenantScenario) -> usize {
    queue.requests().send.saturating_sub(scenario.sends.len() as u64) as usize
}

/// Shuts the first worker down gracefully and starts its replacement.
async fn restart_first(
    workers: &mut [RunningWorker],
    start_worker: &impl Fn(usize, usize) -> Result<RunningWorker, String>,
) -> Vec<String> {
    let Some(first) = workers.first_mut() else {
        return Vec::new();
    };
    first.graceful.cancel();
    let mut problems = Vec::new();
    match (&mut first.handle).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => problems.push(format!("worker 0 failed at its shutdown: {error}")),
        Err(error) => problems.push(format!("worker 0 panicked at its shutdown: {error}")),
    }
    match start_worker(100, 5) {
        Ok(worker) => *first = worker,
        Err(error) => problems.push(error),
    }
    problems
}

/// The message the producer sends for `job`: the tenant as the standard queue's `MessageGroupId`.
fn message(job: &TenantJob) -> OutgoingMessage {
    let body = Body {
        job: job.id,
        tenant: job.tenant.clone(),
        work_ms: job.work.as_millis() as u64,
        fails_once: job.fails_once,
    };
    let mut message = OutgoingMessage::job(JOB_TYPE, serde_json::to_string(&body).unwrap_or_default());
    message.group_id = Some(job.tenant.clone());
    message.attributes.insert(
        IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
        AttributeValue::string(format!("tenant-job:{}", job.id)),
    );
    message
}

/// The invariants of one run.
fn check(scenario: &TenantScenario, log: &Log, dead_lettered: usize) -> Vec<String> {
    let mut violations = Vec::new();
    if dead_lettered > 0 {
        violations.push(format!(
            "{dead_lettered} messages reached the DLQ: a tenant deferral spent receives"
        ));
    }
    let mut jobs: Vec<u32> = scenario.sends.iter().map(|job| job.id).collect();
    jobs.sort_unstable();
    jobs.dedup();
    for job in jobs {
        let effects = log.effects.get(&job).copied().unwrap_or(0);
        if effects != 1 {
            violations.push(format!("job {job} had its effect {effects} times"));
        }
    }
    for run in &log.runs {
        if run.tenant.as_deref() != Some(run.sent_tenant.as_str()) {
            violations.push(format!(
                "job {} ran on {} with tenant {:?}, sent as {:?}",
                run.job, run.consumer, run.tenant, run.sent_tenant
            ));
        }
    }
    for ((consumer, tenant), most) in &log.most {
        if let Some(max) = scenario.limit(tenant).max_concurrent
            && *most > max
        {
            violations.push(format!(
                "{consumer} ran {most} jobs of tenant {tenant} at once, over its limit of {max}"
            ));
        }
    }
    violations.extend(check_rates(scenario, log));
    violations
}

/// No consumer started more of a tenant's jobs in a window than its bucket allows.
fn check_rates(scenario: &TenantScenario, log: &Log) -> Vec<String> {
    let mut starts: HashMap<(&str, &str), Vec<Duration>> = HashMap::new();
    for run in &log.runs {
        let tenant = run.tenant.as_deref().unwrap_or_default();
        starts
            .entry((&run.consumer, tenant))
            .or_default()
            .push(run.started);
    }
    let mut violations = Vec::new();
    for ((consumer, tenant), mut times) in starts {
        let Some((rate, burst)) = scenario.limit(tenant).per_second else {
            continue;
        };
        times.sort_unstable();
        for (first, at) in times.iter().enumerate() {
            for (last, until) in times.iter().enumerate().skip(first) {
                let started = (last - first + 1) as f64;
                let allowed = f64::from(burst) + rate * (*until - *at).as_secs_f64() + 1.0;
                if started > allowed {
                    violations.push(format!(
                        "{consumer} started {started} jobs of tenant {tenant} between {at:?} and {until:?}, \
                         over its rate ({rate:.2}/s, burst {burst})"
                    ));
                    return violations;
                }
            }
        }
    }
    violations
}
