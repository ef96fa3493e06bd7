//! The simulated job handler: each run follows its job's script and applies its effect through the
//! fenced sink.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::{
    Batch, BatchHandler, BatchJob, BatchResult, BatchSettings, Context, Handler, HandlerError,
    HandlerSettings,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::io::Instance;
use crate::scenario::{Behavior, JobSpec, Late, LateKind, Step};
use crate::sink::{RunEnd, Sink};

/// The body of a simulated job.
#[derive(Debug, Deserialize)]
pub struct SimJob {
    /// The job's number.
    pub job: u32,
}

/// Runs scripted jobs on one instance.
#[derive(Debug)]
pub struct SimHandler {
    /// The instance it runs on (a dead instance's handlers never act again).
    pub instance: Arc<Instance>,
    /// Where effects go.
    pub sink: Arc<Sink>,
    /// The jobs, by number.
    pub jobs: Arc<Vec<JobSpec>>,
    /// The handler's timeout.
    pub timeout: Duration,
    /// How long a completed record suppresses duplicates (`None`: the default, a day).
    pub record_ttl: Option<Duration>,
    /// Works on through a cancellation (until the pipeline drops it after its grace); checks the
    /// token only before applying its effect.
    pub ignores_cancellation: bool,
    /// The job type is tracked (its status kept on its record).
    pub tracked: bool,
    /// The jobs whose handler returns after its deadline, and how ([`LateKind`]).
    pub late: Option<Late>,
}

impl Handler for SimHandler {
    type Job = SimJob;
    type Output = u32;
    const JOB_TYPE: &'static str = "sim";

    async fn handle(&self, job: SimJob, ctx: Context) -> Result<u32, HandlerError> {
        self.instance.alive().await;
        let (run, step) = self.begin(&job, &ctx)?;
        match self.late_kind(job.job) {
            Some((LateKind::Effect, by)) => {
                self.wait_past(ctx.cancelled(), by).await;
                self.act_regardless(job.job, &ctx, run, step).await
            }
            Some((LateKind::Return, by)) => {
                let result = self.work(job, &ctx, run, step).await;
                if result.is_ok() {
                    self.sink.returns_late(run);
                    self.wait_past(ctx.cancelled(), by).await;
                    self.sink.returned(run);
                }
                result
            }
            None => self.work(job, &ctx, run, step).await,
        }
    }

    fn settings(&self) -> HandlerSettings {
        let settings = HandlerSettings::default()
            .with_timeout(self.timeout)
            .with_tracked(self.tracked);
        match self.record_ttl {
            Some(ttl) => settings.with_record_ttl(ttl),
            None => settings,
        }
    }
}

impl SimHandler {
    /// How job `job`'s handler misbehaves after its deadline, and how late it returns.
    fn late_kind(&self, job: u32) -> Option<(LateKind, Duration)> {
        let late = self.late.as_ref()?;
        let (_, kind) = late.jobs.iter().find(|(late_job, _)| *late_job == job)?;
        Some((*kind, late.by))
    }

    /// Waits until `stop` fires (its deadline, or a cancellation), then `by` more, looking at no
    /// token: a call on the wire when the handler was told to stop answers that late.
    async fn wait_past(&self, stop: impl std::future::Future<Output = ()>, by: Duration) {
        stop.await;
        tokio::time::sleep(by).await;
        self.instance.alive().await;
    }

    /// Does what the step says without looking at the run's token (a handler that ignores its
    /// context): only the fenced sink can refuse its effect. A hang hangs for good.
    async fn act_regardless(
        &self,
        job: u32,
        ctx: &Context,
        run: usize,
        step: Step,
    ) -> Result<u32, HandlerError> {
        match step.behavior {
            Behavior::Hang => std::future::pending().await,
            Behavior::Panic => {
                self.sink.end_run(run, RunEnd::Failed);
                std::panic::panic_any(PANIC_MESSAGE.to_owned())
            }
            Behavior::Succeed | Behavior::Retry | Behavior::Permanent => {
                self.act(job, ctx, run, step.behavior, ctx.is_cancelled())
            }
        }
    }

    /// Records the run's start; its step, or the failure when its job has no script.
    fn begin(&self, job: &SimJob, ctx: &Context) -> Result<(usize, Step), HandlerError> {
        let (run, index) = self.sink.start_run(
            job.job,
            self.instance.name(),
            ctx.message_id(),
            ctx.receive_count(),
            ctx.idempotency_key(),
            ctx.fencing_token(),
        );
        let Some(step) = self.jobs.get(job.job as usize).and_then(|spec| spec.step(index)) else {
            self.sink.end_run(run, RunEnd::Permanent);
            return Err(HandlerError::permanent(format!("sim: no job {}", job.job)));
        };
        Ok((run, step))
    }

    /// Works the step's duration, then does what it says.
    async fn work(&self, job: SimJob, ctx: &Context, run: usize, step: Step) -> Result<u32, HandlerError> {
        let worked = work_for(step.duration, ctx.cancellation(), self.ignores_cancellation).await;
        self.instance.alive().await;
        if !worked || ctx.is_cancelled() {
            self.sink.end_run(run, cancelled(ctx, None));
            return Err(HandlerError::retryable("sim: cancelled while working"));
        }
        match step.behavior {
            Behavior::Succeed | Behavior::Retry | Behavior::Permanent => {
                self.act(job.job, ctx, run, step.behavior, false)
            }
            Behavior::Panic => {
                self.sink.end_run(run, RunEnd::Failed);
                std::panic::panic_any(PANIC_MESSAGE.to_owned())
            }
            Behavior::Hang => {
                if self.ignores_cancellation {
                    // Never returns: the pipeline drops it at the end of its grace.
                    std::future::pending::<()>().await;
                } else {
                    ctx.cancelled().await;
                }
                self.instance.alive().await;
                self.sink.end_run(run, cancelled(ctx, None));
                Err(HandlerError::retryable("sim: hung until cancelled"))
            }
        }
    }

    /// Applies the effect (through the fenced sink), or fails as the step says.
    /// `told_to_stop`: the run's context (or its batch's) was cancelled; a handler that checks its
    /// token never acts then, one that ignores it may.
    fn act(
        &self,
        job: u32,
        ctx: &Context,
        run: usize,
        behavior: Behavior,
        told_to_stop: bool,
    ) -> Result<u32, HandlerError> {
        match behavior {
            Behavior::Succeed => {
                match self
                    .sink
                    .apply(job, run, ctx.idempotency_key(), ctx.fencing_token(), told_to_stop)
                {
                    Ok(()) => {
                        self.sink.end_run(run, RunEnd::Succeeded);
                        Ok(job)
                    }
                    Err(reason) => {
                        self.sink.end_run(run, RunEnd::Stopped);
                        Err(HandlerError::retryable(format!(
                            "sim: downstream refused: {reason}"
                        )))
                    }
                }
            }
            Behavior::Permanent => {
                // An error returned after the run was told to stop is the stop's (a timeout retries,
                // see `run` in conveyor-core's pipeline): the run ends stopped, not rejected.
                let end = if told_to_stop {
                    RunEnd::Stopped
                } else {
                    RunEnd::Permanent
                };
                self.sink.end_run(run, end);
                Err(HandlerError::permanent("sim: permanent failure"))
            }
            Behavior::Retry | Behavior::Panic | Behavior::Hang => {
                self.sink.end_run(run, RunEnd::Failed);
                Err(HandlerError::retryable("sim: transient failure"))
            }
        }
    }
}

/// The simulated handler as a batch handler: one call for up to `max_jobs` jobs, a bulk operation as
/// long as its longest job's step, after which each job does what its step says (its effect, a
/// retryable or a permanent failure). A job scripted to panic panics the whole call and one scripted
/// to hang hangs it, before any effect (every run of the call ends failed or stopped). A call with a
/// late job ([`LateKind`]) is late as a whole: its bulk call answers after the call's deadline and
/// its effects land then, regardless of tokens (`Effect`), or it returns after its deadline once its
/// effects landed (`Return`). With `short_results` it leaves out the results of the jobs it did not
/// write when a job after them has one (see [`Scenario::short_results`](crate::Scenario)).
#[derive(Debug)]
pub struct SimBatchHandler {
    /// The per-job logic.
    pub handler: SimHandler,
    /// The most jobs per call.
    pub max_jobs: usize,
    /// Returns too few results (see above).
    pub short_results: bool,
}

impl BatchHandler for SimBatchHandler {
    type Job = SimJob;
    type Output = u32;
    const JOB_TYPE: &'static str = "sim";

    async fn handle_batch(&self, batch: Batch<SimJob>) -> BatchResult<u32> {
        let handler = &self.handler;
        handler.instance.alive().await;
        let cancel = batch.cancellation().clone();
        let begun: Vec<_> = batch
            .into_jobs()
            .into_iter()
            .map(|job| {
                let started = handler.begin(&job.job, &job.ctx);
                (job, started)
            })
            .collect();
        // Told to stop: the batch's token (its timeout, or every job cancelled), or any job's own.
        let tokens: Vec<CancellationToken> = std::iter::once(cancel.clone())
            .chain(begun.iter().map(|(job, _)| job.ctx.cancellation().clone()))
            .collect();
        let stop = async move {
            let stops = tokens.iter().map(|token| Box::pin(token.cancelled()));
            futures_util::future::select_all(stops).await;
        };
        let late = begun
            .iter()
            .filter(|(_, started)| started.is_ok())
            .find_map(|(job, _)| handler.late_kind(job.job.job));
        let runs: Vec<usize> = begun
            .iter()
            .filter_map(|(_, started)| started.as_ref().ok().map(|(run, _)| *run))
            .collect();
        let results = match late {
            Some((LateKind::Effect, by)) => {
                handler.wait_past(stop, by).await;
                self.act_regardless(begun, &cancel).await
            }
            Some((LateKind::Return, by)) => {
                let results = self.work(begun, &cancel).await;
                if results.iter().any(Result::is_ok) {
                    for run in &runs {
                        handler.sink.returns_late(*run);
                    }
                    handler.wait_past(stop, by).await;
                    for run in &runs {
                        handler.sink.returned(*run);
                    }
                }
                results
            }
            None => self.work(begun, &cancel).await,
        };
        if !self.short_results {
            return Ok(results);
        }
        Ok(self.leave_out_unwritten(results, &runs))
    }

    fn settings(&self) -> HandlerSettings {
        Handler::settings(&self.handler)
    }

    fn batch_settings(&self) -> BatchSettings {
        BatchSettings::default().with_max_jobs(self.max_jobs)
    }
}

/// A job of a call and its start (its run and step, or why it has none).
type Begun = (BatchJob<SimJob>, Result<(usize, Step), HandlerError>);

impl SimBatchHandler {
    /// The bulk call, watching the batch's token: as long as its longest job, then each job's step.
    async fn work(&self, begun: Vec<Begun>, cancel: &CancellationToken) -> Vec<Result<u32, HandlerError>> {
        let handler = &self.handler;
        let steps: Vec<Step> = begun
            .iter()
            .filter_map(|(_, started)| started.as_ref().ok().map(|(_, step)| *step))
            .collect();
        let has = |behavior| steps.iter().any(|step| step.behavior == behavior);
        // One bulk call: it works as long as its longest job, and every effect lands at its end.
        let longest = steps.iter().map(|step| step.duration).max().unwrap_or_default();
        let mut worked = work_for(longest, cancel, handler.ignores_cancellation).await;
        handler.instance.alive().await;
        if worked && has(Behavior::Hang) {
            // A hung job hangs the call: until its timeout (the batch's token), or forever when it
            // ignores cancellation (the gatherer drops it after its grace).
            if handler.ignores_cancellation {
                std::future::pending::<()>().await;
            }
            cancel.cancelled().await;
            handler.instance.alive().await;
            worked = false;
        }
        if worked && !cancel.is_cancelled() && has(Behavior::Panic) {
            self.panic(&begun);
        }
        begun
            .into_iter()
            .map(|(job, started)| {
                let (run, step) = started?;
                if !worked || cancel.is_cancelled() || job.ctx.is_cancelled() {
                    handler.sink.end_run(run, cancelled(&job.ctx, Some(cancel)));
                    return Err(HandlerError::retryable("sim: cancelled while working"));
                }
                handler.act(job.job.job, &job.ctx, run, step.behavior, false)
            })
            .collect()
    }

    /// The late bulk call's end, looking at no token: a hang hangs for good, a panic panics the call,
    /// else each job does what its step says (only the fenced sink can refuse an effect).
    async fn act_regardless(
        &self,
        begun: Vec<Begun>,
        cancel: &CancellationToken,
    ) -> Vec<Result<u32, HandlerError>> {
        let has = |behavior| {
            begun
                .iter()
                .any(|(_, started)| matches!(started, Ok((_, step)) if step.behavior == behavior))
        };
        if has(Behavior::Hang) {
            // Never returns: the gatherer drops it at the end of its grace.
            std::future::pending::<()>().await;
        }
        if has(Behavior::Panic) {
            self.panic(&begun);
        }
        begun
            .into_iter()
            .map(|(job, started)| {
                let (run, step) = started?;
                let told_to_stop = cancel.is_cancelled() || job.ctx.is_cancelled();
                self.handler
                    .act(job.job.job, &job.ctx, run, step.behavior, told_to_stop)
            })
            .collect()
    }

    /// Ends every run of the call failed and panics it.
    fn panic(&self, begun: &[Begun]) -> ! {
        for (_, started) in begun {
            if let Ok((run, _)) = started {
                self.handler.sink.end_run(*run, RunEnd::Failed);
            }
        }
        std::panic::panic_any(PANIC_MESSAGE.to_owned())
    }

    /// The results without those of the jobs it did not write (an error) that have a result after
    /// them: a handler that collects only its writes' results. Recorded with the call's runs when it
    /// left one out.
    fn leave_out_unwritten(
        &self,
        results: Vec<Result<u32, HandlerError>>,
        runs: &[usize],
    ) -> Vec<Result<u32, HandlerError>> {
        let jobs = results.len();
        let last_ok = results.iter().rposition(Result::is_ok);
        let kept: Vec<Result<u32, HandlerError>> = results
            .into_iter()
            .enumerate()
            .filter(|(position, result)| result.is_ok() || last_ok.is_none_or(|last| *position > last))
            .map(|(_, result)| result)
            .collect();
        if kept.len() < jobs {
            self.handler.sink.short_call(runs, kept.len());
        }
        kept
    }
}

/// Works `duration`; false when `stop` fired first (never, for a handler ignoring cancellation).
async fn work_for(duration: Duration, stop: &CancellationToken, ignores_cancellation: bool) -> bool {
    if ignores_cancellation {
        tokio::time::sleep(duration).await;
        return true;
    }
    tokio::select! {
        biased;
        () = tokio::time::sleep(duration) => true,
        () = stop.cancelled() => false,
    }
}

/// What a scripted panic says (the panic hook keeps these quiet).
pub const PANIC_MESSAGE: &str = "sim: scripted handler panic";

/// How a cancelled run ended: at its deadline (the pipeline stops a handler there; a batch call's
/// token fires at the call's timeout), or before it.
fn cancelled(ctx: &Context, batch: Option<&CancellationToken>) -> RunEnd {
    let batch_stopped = batch.is_some_and(CancellationToken::is_cancelled) && !ctx.is_cancelled();
    if !batch_stopped && tokio::time::Instant::now() < ctx.deadline() {
        RunEnd::Cancelled
    } else {
        RunEnd::Stopped
    }
}
