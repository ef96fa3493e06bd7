//! The simulated job handler: each run follows its job's script and applies its effect through the
//! fenced sink.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::{Context, Handler, HandlerError, HandlerSettings};
use serde::Deserialize;

use crate::io::Instance;
use crate::scenario::{Behavior, JobSpec};
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
}

impl Handler for SimHandler {
    type Job = SimJob;
    type Output = u32;
    const JOB_TYPE: &'static str = "sim";

    async fn handle(&self, job: SimJob, ctx: Context) -> Result<u32, HandlerError> {
        self.instance.alive().await;
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
        let worked = if self.ignores_cancellation {
            tokio::time::sleep(step.duration).await;
            true
        } else {
            tokio::select! {
                () = tokio::time::sleep(step.duration) => true,
                () = ctx.cancelled() => false,
            }
        };
        self.instance.alive().await;
        if !worked || ctx.is_cancelled() {
            self.sink.end_run(run, cancelled(&ctx));
            return Err(HandlerError::retryable("sim: cancelled while working"));
        }
        match step.behavior {
            Behavior::Succeed => {
                match self
                    .sink
                    .apply(job.job, run, ctx.idempotency_key(), ctx.fencing_token())
                {
                    Ok(()) => {
                        self.sink.end_run(run, RunEnd::Succeeded);
                        Ok(job.job)
                    }
                    Err(reason) => {
                        self.sink.end_run(run, RunEnd::Stopped);
                        Err(HandlerError::retryable(format!(
                            "sim: downstream refused: {reason}"
                        )))
                    }
                }
            }
            Behavior::Retry => {
                self.sink.end_run(run, RunEnd::Failed);
                Err(HandlerError::retryable("sim: transient failure"))
            }
            Behavior::Permanent => {
                self.sink.end_run(run, RunEnd::Permanent);
                Err(HandlerError::permanent("sim: permanent failure"))
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
                self.sink.end_run(run, cancelled(&ctx));
                Err(HandlerError::retryable("sim: hung until cancelled"))
            }
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

/// What a scripted panic says (the panic hook keeps these quiet).
pub const PANIC_MESSAGE: &str = "sim: scripted handler panic";

/// How a cancelled run ended: at its deadline (the pipeline stops a handler there), or before it.
fn cancelled(ctx: &Context) -> RunEnd {
    if tokio::time::Instant::now() < ctx.deadline() {
        RunEnd::Cancelled
    } else {
        RunEnd::Stopped
    }
}
