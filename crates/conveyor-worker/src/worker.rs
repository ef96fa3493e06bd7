//! The [`Worker`]: configuration, protections, and the run with its shutdown sequence.
//!
//! # Shutdown sequence
//!
//! 1. Stop receiving: the long polls are dropped mid-wait; messages received but not started (waiting
//!    for a FIFO predecessor, a job-type slot or a rate token) are made visible again at once.
//! 2. Drain: in-flight jobs may finish within `drain_deadline`; heartbeats keep extending them, and
//!    their outcomes are applied as usual.
//! 3. Past the deadline (or at once on a second signal): every remaining lease's token is cancelled;
//!    the pipeline gives handlers a short grace, releases their claims, and their messages are made
//!    visible again (`Retry` with no delay).
//! 4. Pending deletes are flushed.
//! 5. The heartbeat stops, last, and the run returns its report.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::config::WorkerConfig;
use conveyor_core::pipeline::CANCEL_GRACE;
use conveyor_core::{Pipeline, Queue};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::capacity::Capacity;
use crate::error::WorkerError;
use crate::heartbeat::{HeartbeatSettings, Heartbeats};
use crate::protect::{BreakerSettings, Guards, Protections};
use crate::receiver::{plan_loops, receive_loop};
use crate::report::{WorkerReport, WorkerStatus};
use crate::runtime::Runtime;
use crate::telemetry::{QueueMetrics, in_flight_gauge, install_recorder};
use crate::{deleter, ops, signals, stats};

/// How long cancelled jobs get to apply their outcome after the pipeline's grace period.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the final delete flush may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A long-poll worker: receives from one or more queues and runs each message through the pipeline.
///
/// ```no_run
/// # async fn example(pipeline: conveyor_core::Pipeline, queue: std::sync::Arc<dyn conveyor_core::Queue>)
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
    dead_letter_queues: Vec<Arc<dyn Queue>>,
    protections: Protections,
    status: WorkerStatus,
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
    /// has the weight `config.queues[i].weight`). Validates the config.
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
        let status = WorkerStatus::new(queues.len());
        Ok(Worker {
            config,
            pipeline,
            queues,
            dead_letter_queues: Vec::new(),
            protections: Protections::default(),
            status,
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

    /// Also reports this dead-letter queue's depth in the queue metrics (label `queue` = its name).
    pub fn watch_dead_letter_queue(mut self, queue: Arc<dyn Queue>) -> Self {
        self.dead_letter_queues.push(queue);
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
        let heartbeats = Heartbeats::new(
            HeartbeatSettings {
                visibility_timeout: config.visibility_timeout,
                max_processing_time: config.max_processing_time,
            },
            self.queues.clone(),
            self.pipeline.store().cloned(),
            status.clone(),
            metrics.clone(),
        );
        let heartbeat_task = tokio::spawn(heartbeats.clone().run(background.clone()));
        let deleter_stop = CancellationToken::new();
        let (deleter, deleter_task) = deleter::spawn(
            self.queues.clone(),
            config.delete_flush_interval,
            status.clone(),
            deleter_stop.clone(),
        );
        let mut background_tasks = JoinSet::new();
        if let Some(listener) = listener {
            background_tasks.spawn(ops::serve(listener, status.clone(), recorder, background.clone()));
        }
        let mut watched: Vec<(Arc<str>, Arc<dyn Queue>)> =
            names.iter().cloned().zip(self.queues.iter().cloned()).collect();
        watched.extend(
            self.dead_letter_queues
                .iter()
                .map(|queue| (Arc::from(queue.name()), Arc::clone(queue))),
        );
        background_tasks.spawn(stats::run(watched, config.stats_interval, background.clone()));

        let plan = plan_loops(&config);
        let runtime = Arc::new(Runtime {
            capacity: Capacity::new(config.max_in_flight, &weights, config.priority),
            guards: Guards::new(&self.protections),
            pipeline: self.pipeline,
            queues: self.queues,
            names,
            metrics,
            heartbeats,
            deleter,
            status: status.clone(),
            in_flight_gauge: in_flight_gauge(),
            stop_receiving: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            config,
        });
        let mut loops = JoinSet::new();
        for (queue, batch) in &plan {
            loops.spawn(receive_loop(Arc::clone(&runtime), *queue, *batch));
        }
        tracing::info!(
            queues = ?runtime.names,
            receive_loops = plan.len(),
            max_in_flight = runtime.config.max_in_flight,
            priority = ?runtime.config.priority,
            "worker started"
        );

        tokio::select! {
            () = graceful.cancelled() => {}
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
        while background_tasks.join_next().await.is_some() {}
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

/// Steps 1–3 of the shutdown sequence.
async fn drain(runtime: &Arc<Runtime>, immediate: &CancellationToken, loops: &mut JoinSet<()>) {
    let drain_deadline = runtime.config.drain_deadline;
    tracing::info!(
        in_flight = runtime.status.in_flight(),
        ?drain_deadline,
        "shutting down: receiving stopped, draining in-flight jobs"
    );
    runtime.stop_receiving.cancel();
    while loops.join_next().await.is_some() {}
    runtime.tracker.close();
    let drained = !immediate.is_cancelled()
        && tokio::select! {
            () = runtime.tracker.wait() => true,
            () = tokio::time::sleep(drain_deadline) => false,
            () = immediate.cancelled() => false,
        };
    if drained {
        tracing::info!("all in-flight jobs finished");
        return;
    }
    tracing::warn!(
        in_flight = runtime.status.in_flight(),
        "cancelling the remaining jobs; their claims are released and their messages visible again"
    );
    runtime.hard_stop.cancel();
    if tokio::time::timeout(CANCEL_GRACE + RELEASE_TIMEOUT, runtime.tracker.wait())
        .await
        .is_err()
    {
        tracing::error!(
            in_flight = runtime.status.in_flight(),
            "some jobs did not stop in time; their messages come back when their visibility timeout ends"
        );
    }
}
