//! The [`Worker`]: configuration, protections, and the run with its shutdown sequence.
//!
//! # Shutdown sequence
//!
//! Everything below fits in the platform's stop timeout (`stop_timeout`, `CONVEYOR_STOP_TIMEOUT_SECS`,
//! 30 s by default as on ECS): the drain deadline plus [`SHUTDOWN_RESERVE`] (cancel grace, releases,
//! delete flush), which the config's validation enforces.
//!
//! 1. Stop receiving: no new long poll starts. A long poll in flight may return while jobs drain, and
//!    for at least [`POLL_GRACE`] (1 s; SQS may be answering it right now): what it brings is made
//!    visible again at once. Then it is abandoned: an idle worker stops within about a second, and a
//!    message SQS hands the abandoned request comes back after its visibility timeout (see the design
//!    note in `crate::receiver`). With no job in flight the drain lasts only that grace. Messages
//!    received but not started (waiting for a FIFO predecessor, a job-type slot or a rate token) are
//!    made visible again at once.
//! 2. Drain: in-flight jobs may finish within the drain deadline; heartbeats keep extending them, and
//!    their outcomes are applied as usual.
//! 3. Past the deadline (or at once on a second signal): every remaining lease's token is cancelled;
//!    the pipeline gives handlers a short grace, releases their claims, and their messages are made
//!    visible again (`Retry` with no delay).
//! 4. Pending deletes are flushed.
//! 5. The heartbeat stops, background tasks get [`BACKGROUND_TIMEOUT`] to return, and the run
//!    returns its report.
//!
//! The shutdown line logs `at_most`, the sum of these bounds ([`shutdown_bound`]): the run returns
//! within it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::WorkerConfig;
use conveyor_core::runtime::CANCEL_GRACE;
use conveyor_core::runtime::{MIN_VISIBILITY_TIMEOUT, SHUTDOWN_RESERVE};
use conveyor_core::{
    port::Queue,
    {BackgroundTask, Pipeline},
};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::capacity::Capacity;
use crate::error::WorkerError;
use crate::heartbeat::{HeartbeatQueue, HeartbeatSettings, Heartbeats};
use crate::prometheus::install_recorder;
use crate::protect::{BreakerSettings, Guards, Protections};
use crate::receiver::{POLL_GRACE, plan_loops, receive_loop};
use crate::report::{WorkerReport, WorkerStatus};
use crate::runtime::Runtime;
use crate::telemetry::{QueueMetrics, in_flight_gauge};
use crate::{deleter, ops, signals, stats};
use conveyor_core::runtime::{TenantGuards, TenantLimits, TenantMetrics};

/// How long cancelled jobs get to apply their outcome after the pipeline's grace period.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the final delete flush may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long background tasks (told to stop when the drain began) may take to return after the flush;
/// past it they are dropped.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);
const _: () = assert!(
    CANCEL_GRACE.as_secs()
        + RELEASE_TIMEOUT.as_secs()
        + FLUSH_TIMEOUT.as_secs()
        + BACKGROUND_TIMEOUT.as_secs()
        <= SHUTDOWN_RESERVE.as_secs(),
    "the shutdown steps after the drain must fit in SHUTDOWN_RESERVE"
);

/// A long-poll worker: receives from one or more queues and runs each message through the pipeline.
///
/// ```no_run
/// # async fn example(pipeline: conveyor_core::Pipeline, queue: std::sync::Arc<dyn conveyor_core::port::Queue>)
/// # -> Result<(), conveyor_worker::WorkerError> {
/// let config = conveyor_worker::load_config(None)?;
/// let report = conveyor_worker::Worker::new(config, pipeline, vec![queue])?
///     .limit_job_type("report", 2)
///     .run_until_signal()
///     .await?;
/// println!("{} jobs succeeded", report.succeeded);
/// # Ok(()) }
/// ```
pub struct Worker {
    config: WorkerConfig,
    pipeline: Pipeline,
    queues: Vec<Arc<dyn Queue>>,
    /// What each queue's receives send as `VisibilityTimeout`.
    visibility: Vec<Duration>,
    dead_letter_queues: Vec<Arc<dyn Queue>>,
    protections: Protections,
    tenant_limits: TenantLimits,
    status: WorkerStatus,
    background: Vec<Box<dyn BackgroundTask>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.queues.iter().map(|queue| queue.name()).collect();
        f.debug_struct("Worker")
            .field("queues", &names)
            .field("config", &self.config)
            .field("protections", &self.protections)
            .finish()
    }
}

impl Worker {
    /// A worker for `queues`, which line up with `config.queues` (same count and order: `queues[i]`
    /// has the weight `config.queues[i].weight`). Validates the config against the queues: each
    /// receive sends the queue's own visibility timeout (or `config.visibility_timeout`), which must
    /// leave the heartbeat room to work, and every handler's idempotency record must outlive the
    /// longest processing time.
    pub fn new(
        config: WorkerConfig,
        pipeline: Pipeline,
        queues: Vec<Arc<dyn Queue>>,
    ) -> Result<Worker, WorkerError> {
        config.validate()?;
        if queues.len() != config.queues.len() {
            return Err(WorkerError::QueueMismatch {
                given: queues.len(),
                configured: config.queues.len(),
            });
        }
        let visibility = check_queues(&config, &queues)?;
        let tenant_limits = config.tenants.limits();
        check_record_lifetimes(&config, &pipeline)?;
        warn_unfillable_batches(&config, &pipeline);
        let status = WorkerStatus::new(queues.len(), pipeline.store_health());
        Ok(Worker {
            config,
            pipeline,
            queues,
            visibility,
            dead_letter_queues: Vec::new(),
            protections: Protections::default(),
            tenant_limits,
            status,
            background: Vec::new(),
        })
    }

    /// Runs at most `max_concurrency` jobs of `job_type` at once (at least 1). Messages beyond that
    /// wait in flight, holding their in-flight slot, until a job of that type finishes.
    pub fn limit_job_type(mut self, job_type: &str, max_concurrency: usize) -> Self {
        self.protections
            .concurrency
            .insert(job_type.to_owned(), max_concurrency.max(1));
        self
    }

    /// Starts at most `per_second` jobs of `job_type` a second, with bursts of up to `burst`.
    pub fn rate_limit_job_type(mut self, job_type: &str, per_second: f64, burst: u32) -> Self {
        self.protections
            .rates
            .insert(job_type.to_owned(), (per_second, burst.max(1)));
        self
    }

    /// Limits every tenant's jobs (`NewJob::tenant`) in this worker, in place of the configured
    /// `tenant_*` settings: a job whose tenant is at its limit goes back unrun as a deferred copy,
    /// without spending a receive, so one noisy tenant cannot take every slot (see
    /// `conveyor_core`'s `src/tenant_limits.rs`). Checked here: a mistake is an error at start.
    pub fn limit_tenants(mut self, limits: TenantLimits) -> Result<Self, WorkerError> {
        limits.validate().map_err(|error| WorkerError::Setting {
            setting: "tenant limits".to_owned(),
            problem: error.to_string(),
        })?;
        self.tenant_limits = limits;
        Ok(self)
    }

    /// A circuit breaker for the downstream `downstream`, called by the handlers of `job_types`. After
    /// `settings.failure_threshold` consecutive failed runs (a retryable error, a panic or a timeout)
    /// the circuit opens: those jobs go back to the queue unrun, visible again when one probe may run.
    pub fn circuit_breaker(
        mut self,
        downstream: &str,
        job_types: &[&str],
        settings: BreakerSettings,
    ) -> Self {
        let job_types = job_types.iter().map(|job_type| (*job_type).to_owned()).collect();
        self.protections
            .breakers
            .push((downstream.to_owned(), job_types, settings));
        self
    }

    /// Also reports this dead-letter queue's depth: `conveyor_dlq_messages{queue="<its name>"}` (and the
    /// queue depth gauges under its name).
    pub fn watch_dead_letter_queue(mut self, queue: Arc<dyn Queue>) -> Self {
        self.dead_letter_queues.push(queue);
        self
    }

    /// Also runs `task` beside the receive loops until the drain begins (see [`BackgroundTask`]): a
    /// `conveyor_schedule::Scheduler` (each tick sent by exactly one of any number of workers), a
    /// `conveyor_outbox::Poller` (it relays the outbox while this worker holds the relay's lease, and
    /// gives the lease up when the drain begins so another worker takes over at once),
    /// or an application's own task.
    pub fn with_background_task(mut self, task: impl BackgroundTask) -> Self {
        self.background.push(Box::new(task));
        self
    }

    /// A live view of the worker (readiness, in-flight count, counts so far), usable while it runs.
    pub fn status(&self) -> WorkerStatus {
        self.status.clone()
    }

    /// Runs until `shutdown` is cancelled, then drains gracefully (see the module docs) and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport, WorkerError> {
        self.run_with(shutdown, CancellationToken::new()).await
    }

    /// Runs until SIGTERM or SIGINT, then drains gracefully; a second signal skips the drain: remaining
    /// jobs are cancelled and released, pending deletes flushed, and the run returns.
    pub async fn run_until_signal(self) -> Result<WorkerReport, WorkerError> {
        let graceful = CancellationToken::new();
        let immediate = CancellationToken::new();
        let listener = signals::listen(graceful.clone(), immediate.clone())?;
        let result = self.run_with(graceful, immediate).await;
        listener.abort();
        result
    }

    /// Runs until `graceful` (drain, then return) or `immediate` (skip the drain) is cancelled.
    pub async fn run_with(
        self,
        graceful: CancellationToken,
        immediate: CancellationToken,
    ) -> Result<WorkerReport, WorkerError> {
        self.warn_about_unknown_job_types();
        // A store that cannot be used is a configuration error: stop before receiving anything,
        // rather than defer every job forever while /readyz says ready.
        self.pipeline.check_store().await.map_err(WorkerError::Store)?;
        let config = self.config;
        let status = self.status;
        let listener = match &config.listen_addr {
            Some(addr) => Some(ops::bind(addr).await?),
            None => None,
        };
        let recorder = listener.as_ref().and_then(|_| install_recorder());
        if let Some(listener) = &listener {
            *status
                .inner
                .operations_addr
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = listener.local_addr().ok();
        }

        let names: Vec<Arc<str>> = self.queues.iter().map(|queue| Arc::from(queue.name())).collect();
        let metrics: Vec<Arc<QueueMetrics>> = names
            .iter()
            .map(|name| Arc::new(QueueMetrics::new(Arc::clone(name))))
            .collect();
        let weights: Vec<u32> = config.queues.iter().map(|queue| queue.weight).collect();

        let background = CancellationToken::new();
        let heartbeat_queues = self
            .queues
            .iter()
            .zip(&self.visibility)
            .map(|(queue, visibility)| HeartbeatQueue {
                queue: Arc::clone(queue),
                visibility_timeout: *visibility,
            })
            .collect();
        let heartbeats = Heartbeats::new(
            HeartbeatSettings {
                max_processing_time: config.max_processing_time,
            },
            heartbeat_queues,
            self.pipeline.store().cloned(),
            status.clone(),
            metrics.clone(),
        );
        let heartbeat_task = tokio::spawn(heartbeats.clone().run(background.clone()));
        let deleter_stop = CancellationToken::new();
        let (deleter, deleter_task) = deleter::spawn(
            config.max_in_flight,
            self.queues.clone(),
            config.delete_flush_interval,
            status.clone(),
            deleter_stop.clone(),
        );
        let mut background_tasks = JoinSet::new();
        if let Some(listener) = listener {
            background_tasks.spawn(ops::serve(listener, status.clone(), recorder, background.clone()));
        }
        let watched: Vec<(Arc<str>, Arc<dyn Queue>)> =
            names.iter().cloned().zip(self.queues.iter().cloned()).collect();
        let dlqs = self.dead_letter_queues.clone();
        background_tasks.spawn(stats::run(
            watched,
            dlqs,
            config.stats_interval,
            background.clone(),
        ));

        // One drain token for every background task: cancelled when the drain begins (or, at the
        // latest, with the other background tasks); the worker waits for the tasks before it reports.
        let task_drain = background.child_token();
        let mut tasks = self.background;
        let task_names: Vec<&'static str> = tasks.iter().map(|task| task.name()).collect();
        let on = crate::start_line::WhatIsOn::of(&self.pipeline, &config, &task_names);
        if let Some(timers) = self.pipeline.timers() {
            tasks.push(Box::new(conveyor_core::TimerRelay::new(timers.clone())));
        }
        for task in tasks {
            let drain = task_drain.clone();
            let name = task.name();
            background_tasks.spawn(async move {
                task.run(drain).await;
                tracing::debug!(task = name, "background task stopped");
            });
        }

        let plan = plan_loops(&config);
        let gathering = names.iter().map(|_| tokio::sync::Mutex::new(())).collect();
        let runtime = Arc::new(Runtime {
            gathering,
            abandon_polls: CancellationToken::new(),
            late_settle_by: std::sync::OnceLock::new(),
            capacity: Capacity::new(config.max_in_flight, &weights, config.priority),
            guards: Guards::new(&self.protections),
            tenants: TenantGuards::new(self.tenant_limits),
            tenant_metrics: TenantMetrics::new(config.tenants.metrics_top),
            pipeline: self.pipeline,
            queues: self.queues,
            names,
            visibility: self.visibility,
            metrics,
            heartbeats,
            deleter,
            status: status.clone(),
            in_flight_gauge: in_flight_gauge(),
            stop_receiving: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            fifo_gates: conveyor_core::runtime::GroupGates::default(),
            typical_job_micros: std::sync::atomic::AtomicU64::new(0),
            config,
        });
        let mut loops = JoinSet::new();
        for (queue, batch) in &plan {
            loops.spawn(receive_loop(Arc::clone(&runtime), *queue, *batch));
        }
        status.set_running();
        tracing::info!(
            queues = ?runtime.names,
            visibility_timeouts = ?runtime.visibility,
            drain_deadline = ?runtime.config.drain_deadline(),
            stop_timeout = ?runtime.config.stop_timeout,
            receive_loops = plan.len(),
            max_in_flight = runtime.config.max_in_flight,
            priority = ?runtime.config.priority,
            idempotency = %on.idempotency,
            tracking = %on.tracking,
            timers_relay = %on.timers_relay,
            schedules = %on.schedules,
            outbox_relay = %on.outbox_relay,
            flows_sweep = %on.flows_sweep,
            tenants = %on.tenants,
            tracing = %on.tracing,
            "worker started"
        );

        tokio::select! {
            biased;
            () = graceful.cancelled() => task_drain.cancel(),
            () = immediate.cancelled() => {}
        }
        drain(&runtime, &immediate, &mut loops).await;

        deleter_stop.cancel();
        if tokio::time::timeout(FLUSH_TIMEOUT, deleter_task).await.is_err() {
            tracing::error!(
                "final delete flush did not finish; those messages come back and are acked as duplicates"
            );
        }
        background.cancel();
        let _ = heartbeat_task.await;
        let stopped = tokio::time::timeout(BACKGROUND_TIMEOUT, async {
            while background_tasks.join_next().await.is_some() {}
        })
        .await;
        if stopped.is_err() {
            tracing::warn!(
                tasks = ?task_names,
                "a background task did not stop within its time after the drain; it is dropped"
            );
            background_tasks.abort_all();
        }
        let report = status.report();
        tracing::info!(
            received = report.received,
            succeeded = report.succeeded,
            retried = report.retried,
            dead_lettered = report.dead_lettered,
            duplicates = report.duplicates,
            released_at_shutdown = report.released_at_shutdown,
            "worker stopped"
        );
        Ok(report)
    }

    fn warn_about_unknown_job_types(&self) {
        let known = self.pipeline.router().job_types();
        let configured = self
            .protections
            .concurrency
            .keys()
            .chain(self.protections.rates.keys())
            .chain(
                self.protections
                    .breakers
                    .iter()
                    .flat_map(|(_, types, _)| types.iter()),
            );
        for job_type in configured {
            if !known.contains(&job_type.as_str()) {
                tracing::warn!(
                    job_type = %job_type,
                    routed = ?known,
                    "a protection names a job type no route handles (a typo?); it applies only if a default \
                     route has that type"
                );
            }
        }
    }
}

/// The visibility timeout each queue's receives send; refuses ones too short for the heartbeat, and
/// warns about queues without a redrive policy.
fn check_queues(config: &WorkerConfig, queues: &[Arc<dyn Queue>]) -> Result<Vec<Duration>, WorkerError> {
    let mut visibility = Vec::with_capacity(queues.len());
    for queue in queues {
        let chosen = config
            .visibility_timeout
            .unwrap_or_else(|| queue.visibility_timeout());
        if chosen < MIN_VISIBILITY_TIMEOUT {
            return Err(WorkerError::Setting {
                setting: format!("visibility timeout of queue {}", queue.name()),
                problem: format!(
                    "{chosen:?} is too short for the heartbeat (it extends when half is left, and needs that \
                     time to reach SQS even when SQS is slow); give the queue a VisibilityTimeout of at least \
                     {}s (aws sqs set-queue-attributes, or visibility_timeout_seconds in infra/modules/queue), \
                     or set CONVEYOR_VISIBILITY_TIMEOUT_SECS, which every receive then sends",
                    MIN_VISIBILITY_TIMEOUT.as_secs()
                ),
            });
        }
        if queue.max_receive_count().is_none() {
            tracing::warn!(
                queue = %queue.name(),
                "the queue has no redrive policy: permanent failures and jobs out of retries stay in the queue, \
                 coming back after their backoff, instead of going to a DLQ; add one (infra/modules/queue, or \
                 `conveyor local init`)"
            );
        }
        visibility.push(chosen);
    }
    Ok(visibility)
}

/// Every idempotent handler's record must outlive the longest time a job may run, or a long job's
/// record could expire (and be claimed again) while it still runs.
fn check_record_lifetimes(config: &WorkerConfig, pipeline: &Pipeline) -> Result<(), WorkerError> {
    if pipeline.store().is_none() {
        return Ok(());
    }
    for (job_type, settings) in pipeline.router().settings() {
        if settings.idempotent && settings.record_ttl <= config.max_processing_time {
            return Err(WorkerError::Setting {
                setting: format!("record_ttl of job type {job_type}"),
                problem: format!(
                    "its idempotency record lives {:?}, not longer than max_processing_time ({:?}): a job still \
                     running when its record expires could be run again; raise HandlerSettings::record_ttl or \
                     lower max_processing_time (CONVEYOR_MAX_PROCESSING_SECS)",
                    settings.record_ttl, config.max_processing_time
                ),
            });
        }
    }
    Ok(())
}

/// A batch handler's call fills only when that many of its messages run at once: warns when
/// `max_in_flight` is below its batch size (the batch then always waits its linger, half full).
fn warn_unfillable_batches(config: &WorkerConfig, pipeline: &Pipeline) {
    for (job_type, max_jobs) in pipeline.router().batch_sizes() {
        if max_jobs > config.max_in_flight {
            tracing::warn!(
                job_type,
                max_jobs,
                max_in_flight = config.max_in_flight,
                "a batch handler takes more jobs per call than max_in_flight lets run at once: its batches never \
                 fill; raise max_in_flight (CONVEYOR_MAX_IN_FLIGHT) or lower BatchSettings::max_jobs"
            );
        }
    }
}

/// Steps 1–3 of the shutdown sequence: within the jobs' deadline (the drain deadline, or
/// [`POLL_GRACE`] when no job was in flight), then [`CANCEL_GRACE`] and [`RELEASE_TIMEOUT`].
async fn drain(runtime: &Arc<Runtime>, immediate: &CancellationToken, loops: &mut JoinSet<()>) {
    let began = Instant::now();
    runtime.status.set_draining();
    runtime.stop_receiving.cancel();
    runtime.tracker.close();
    // Read after receiving stopped: a message received in this instant is held to the idle bound
    // (cancelled and released after the grace), so the estimate below holds either way.
    let in_flight = runtime.status.in_flight();
    let jobs_deadline = jobs_deadline(in_flight, runtime.config.drain_deadline());
    tracing::info!(
        in_flight,
        drain_deadline = ?jobs_deadline,
        at_most = %format_args!("{:.1}s", shutdown_bound(jobs_deadline).as_secs_f64()),
        "shutting down: receiving stopped, draining in-flight jobs"
    );
    let deadline = began + jobs_deadline;
    let _ = runtime
        .late_settle_by
        .set(deadline + CANCEL_GRACE + RELEASE_TIMEOUT);
    let drained = !immediate.is_cancelled()
        && tokio::select! {
            biased;
            () = runtime.tracker.wait() => true,
            () = tokio::time::sleep_until(deadline) => false,
            () = immediate.cancelled() => false,
        };
    // The long polls in flight had the drain to answer; they get at least the grace, then are dropped.
    let grace_end = began + POLL_GRACE.min(jobs_deadline);
    if !immediate.is_cancelled() {
        tokio::select! {
            biased;
            () = async { while loops.join_next().await.is_some() {} } => {}
            () = tokio::time::sleep_until(grace_end) => {}
            () = immediate.cancelled() => {}
        }
    }
    runtime.abandon_polls.cancel();
    if drained {
        tracing::info!("all in-flight jobs finished");
    } else {
        tracing::warn!(
            in_flight = runtime.status.in_flight(),
            "cancelling the remaining jobs; their claims are released and their messages visible again"
        );
        runtime.hard_stop.cancel();
    }
    // Late receives release what they brought (within `LATE_RELEASE_TIMEOUT`), cancelled jobs theirs.
    let settled = tokio::time::timeout(CANCEL_GRACE + RELEASE_TIMEOUT, async {
        while loops.join_next().await.is_some() {}
        runtime.tracker.wait().await;
    })
    .await;
    loops.abort_all();
    if settled.is_err() {
        tracing::error!(
            in_flight = runtime.status.in_flight(),
            "some jobs did not stop in time; their messages come back when their visibility timeout ends"
        );
    }
}

/// How long in-flight jobs may drain: the drain deadline, or only the long polls' grace when none is
/// in flight.
fn jobs_deadline(in_flight: usize, drain_deadline: Duration) -> Duration {
    if in_flight == 0 {
        POLL_GRACE.min(drain_deadline)
    } else {
        drain_deadline
    }
}

/// The longest a shutdown whose jobs drain for at most `jobs_deadline` takes, from its start to the
/// run's return: every step after the drain is bounded on its own.
pub(crate) fn shutdown_bound(jobs_deadline: Duration) -> Duration {
    jobs_deadline + CANCEL_GRACE + RELEASE_TIMEOUT + FLUSH_TIMEOUT + BACKGROUND_TIMEOUT
}

#[cfg(test)]
mod tests {
    use conveyor_core::Router;
    use conveyor_testing::{MemoryQueue, ScriptedQueue};

    use super::*;
    use crate::config::QueueConfig;

    fn idle_worker(drain_deadline: Duration) -> (Worker, Arc<ScriptedQueue>) {
        let inner = Arc::new(MemoryQueue::standard("idle").with_visibility_timeout(Duration::from_secs(30)));
        let queue = ScriptedQueue::new(inner);
        let config = WorkerConfig {
            queues: vec![QueueConfig::new("http://memory.invalid/000000000000/idle")],
            max_in_flight: 100,
            listen_addr: None,
            ..WorkerConfig::default()
        }
        .with_drain_deadline(Some(drain_deadline));
        let pipeline = Pipeline::new(Router::new());
        let worker = Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>]).unwrap();
        (worker, queue)
    }

    /// Issue 55: an idle worker's shutdown waited for its 20 s long polls (19.9 s on LocalStack), past
    /// the `at_most` it logged. Now it stops after the polls' grace, within the bound it logs.
    #[tokio::test(start_paused = true)]
    async fn an_idle_worker_stops_within_the_grace_and_its_logged_bound() {
        let (worker, queue) = idle_worker(Duration::from_secs(23));
        assert_eq!(worker.config.receive_wait, Duration::from_secs(20));
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(worker.run(shutdown.clone()));
        queue.receive_started().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let began = Instant::now();
        shutdown.cancel();
        run.await.unwrap().unwrap();
        let took = began.elapsed();
        assert!(took <= POLL_GRACE + Duration::from_millis(100), "took {took:?}");
        let logged = shutdown_bound(jobs_deadline(0, Duration::from_secs(23)));
        assert!(took <= logged, "took {took:?}, logged at most {logged:?}");
    }

    #[test]
    fn the_bound_with_jobs_in_flight_is_the_stop_timeout() {
        let drain = WorkerConfig::default().drain_deadline();
        assert_eq!(jobs_deadline(3, drain), drain);
        assert!(shutdown_bound(drain) <= WorkerConfig::default().stop_timeout);
        assert_eq!(jobs_deadline(0, drain), POLL_GRACE);
        assert_eq!(
            jobs_deadline(0, Duration::from_millis(300)),
            Duration::from_millis(300)
        );
    }
}
