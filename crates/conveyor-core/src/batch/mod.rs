//! Batch handlers: one call for up to N jobs of one type, every guarantee kept per job.
//!
//! # Design note: a batch is gathered from per-message pipelines
//!
//! There is no second pipeline. [`Router::batch_route`](crate::Router::batch_route) wraps a
//! [`BatchHandler`] as an ordinary erased handler whose per-job run hands the decoded job and its
//! [`Context`] to the route's gatherer (`gather.rs`) and waits for that job's own result. Each message
//! still goes through the whole pipeline on its own (route, decode, delay, cancel, payload, claim,
//! run, settle), so:
//!
//! 1. **Claims first.** A job reaches the gatherer only from the pipeline's run step, which comes
//!    after its claim was acquired: the handler sees only claimed jobs. A duplicate inside one receive
//!    finds its key in progress (deferred) or completed (acknowledged) and never reaches the gatherer.
//! 2. **Per-job outcomes.** The handler returns one result per job (by position); each job's
//!    pipeline classifies its own (ack, retry with its backoff, permanent to the DLQ with the reason)
//!    and completes or releases its own claim. A whole-batch `Err`, a panic or the timeout is every
//!    job's retryable (or, for an `Err`, its kind of) failure. A result list of another length than
//!    the batch cannot be matched to its jobs (which job lacks its result is unknown), so it fails
//!    every job of the call with a retryable error naming the handler: no job is acknowledged for
//!    another's result.
//! 3. **Leases.** The runtimes' heartbeats and deadlines cover each message as before. A job whose
//!    own token fires while the batch runs (its lease lost, shutdown's drain deadline) is treated as
//!    a cancelled single handler is: if the call answers within the pipeline's cancel grace, the
//!    job's result stands (an `Ok` completes its claim, fenced if another holder took it over, so
//!    work already done is not run again); if not, the job is cancelled (claim released, run again
//!    later). The batch goes on for the others. The batch's
//!    own token ([`Batch::cancellation`]) fires at the batch's timeout and when every job's token fired.
//! 4. **The call never outlives its jobs.** The call runs in a task of its own, and that task drops
//!    the handler's future as soon as no job waits for a result any more (each job's pipeline dropped
//!    it at the end of its run: its deadline and grace, or the process stopping). So a job's claim is
//!    never released while the handler still works on it, except for the moment between the last
//!    job's return and that drop, where the task is polled before anything else (`biased`).
//! 5. **When a batch is called.** When it holds [`BatchSettings::max_jobs`] jobs, or
//!    [`BatchSettings::linger`] after its first job arrived. Several batches of one route may run at
//!    once; a job waits at most the linger before its batch starts.
//! 6. **FIFO.** Both runtimes run one message of a group at a time, so a batch holds at most one job
//!    per group: it gathers across groups, and order within a group is kept by the runtime as before.
//! 7. **Timeouts.** [`HandlerSettings::timeout`] bounds the call, counted from its start. Each job's
//!    pipeline allows the linger and the cancel grace on top, so the batch's own timeout is what a job
//!    reports; a runtime's deadline (a Lambda invocation's) bounds the call too, through the jobs'
//!    contexts. At the timeout the batch's token fires and the call gets the cancel grace: results it
//!    returns within it stand, as a single handler's late result does (an `Ok` completes its job; an
//!    error, the job's or the batch's, is the timeout's retryable failure). Only a call still running
//!    when the grace ends fails every job with the timeout.

mod gather;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::HandlerError;
use crate::handler::HandlerSettings;

pub(crate) use gather::Gathered;

/// What a batch handler returns: exactly one result per job, in the order of [`Batch::jobs`], or one
/// error for the whole batch (every job fails with it). A list of another length fails every job of
/// the call (retryably, the error naming the handler): results are matched to jobs by position.
pub type BatchResult<Output> = Result<Vec<Result<Output, HandlerError>>, HandlerError>;

/// A handler that does up to [`BatchSettings::max_jobs`] jobs of one type in one call: a bulk insert
/// (DynamoDB's `BatchWriteItem`), a batched API call, one SQL transaction for many rows.
///
/// Register it with [`Router::batch_route`](crate::Router::batch_route). Every job keeps every
/// guarantee of a single job: it is claimed before the handler sees it (so a duplicate never reaches
/// it), and its result decides its own outcome (acknowledged, retried with its backoff, or sent to the
/// DLQ with its reason). See `docs/batch-handlers.md`.
///
/// ```
/// use conveyor_core::{Batch, BatchHandler, BatchResult, HandlerError};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Row { id: u64, name: String }
///
/// struct InsertRows;
///
/// impl BatchHandler for InsertRows {
///     type Job = Row;
///     type Output = ();
///     const JOB_TYPE: &'static str = "insert_row";
///
///     async fn handle_batch(&self, batch: Batch<Row>) -> BatchResult<()> {
///         // One write for every row; here each row with an empty name is refused alone.
///         Ok(batch
///             .jobs()
///             .iter()
///             .map(|job| {
///                 if job.job.name.is_empty() {
///                     return Err(HandlerError::permanent(format!("row {} has no name", job.job.id)));
///                 }
///                 Ok(())
///             })
///             .collect())
///     }
/// }
/// ```
pub trait BatchHandler: Send + Sync + 'static {
    /// One job, decoded from its message body as JSON.
    type Job: DeserializeOwned + Send + 'static;
    /// One job's result, stored as JSON in its idempotency record.
    type Output: Serialize + Send + 'static;
    /// The job type producers put in the `conveyor.type` attribute.
    const JOB_TYPE: &'static str;
    /// The schema version this handler decodes.
    const VERSION: u32 = 1;

    /// Does the jobs. Return exactly one result per job, in the order of [`Batch::jobs`]: results
    /// are matched to jobs by position, so a list of another length cannot be matched and fails
    /// every job of the call with a retryable error naming this handler (none is acknowledged for
    /// another's result). `Err` fails every job of the batch with that error.
    fn handle_batch(&self, batch: Batch<Self::Job>)
    -> impl Future<Output = BatchResult<Self::Output>> + Send;

    /// Decodes a job written with an older schema version, as [`Handler::upgrade`](crate::Handler::upgrade).
    fn upgrade(&self, version: u32, _payload: serde_json::Value) -> Result<Self::Job, HandlerError> {
        Err(crate::handler::no_upgrade(
            Self::JOB_TYPE,
            version,
            Self::VERSION,
            "BatchHandler::upgrade",
        ))
    }

    /// Timeout (of one call), backoff and idempotency settings, as for a [`Handler`](crate::Handler).
    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default()
    }

    /// How many jobs one call takes, and how long a batch waits to fill.
    fn batch_settings(&self) -> BatchSettings {
        BatchSettings::default()
    }
}

/// How batches are gathered: `BatchSettings::default()` and a `with_*` setter per field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct BatchSettings {
    /// The most jobs one call takes (default 10; at least 1). A runtime must let this many messages
    /// of the type run at once for a batch to fill: the worker's `max_in_flight`, the Lambda
    /// adapter's `batch_concurrency` and the event source mapping's batch size. Both runtimes warn at
    /// start-up when they cannot.
    pub max_jobs: usize,
    /// How long a batch waits for more jobs after its first one arrived (default 5 ms).
    pub linger: Duration,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_jobs: 10,
            linger: Duration::from_millis(5),
        }
    }
}

/// The jobs of one call, each with its own [`Context`].
#[derive(Debug)]
pub struct Batch<J> {
    jobs: Vec<BatchJob<J>>,
    cancel: CancellationToken,
}

/// One job of a [`Batch`] and its context: its message, idempotency key, fencing token, attempt
/// (`ctx.receive_count()`), deadline and its own cancellation token.
#[derive(Debug)]
#[non_exhaustive]
pub struct BatchJob<J> {
    /// The decoded job.
    pub job: J,
    /// The job's context. `ctx.is_cancelled()` says this job was cancelled (its lease lost,
    /// shutdown): skip its effect when you can and return an error for it, so it runs again later;
    /// a result returned within the cancel grace still stands.
    pub ctx: Context,
}

impl<J> Batch<J> {
    pub(crate) fn new(jobs: Vec<BatchJob<J>>, cancel: CancellationToken) -> Self {
        Self { jobs, cancel }
    }

    /// The jobs, in the order the results must follow.
    pub fn jobs(&self) -> &[BatchJob<J>] {
        &self.jobs
    }

    /// The jobs, owned (the results follow this order).
    pub fn into_jobs(self) -> Vec<BatchJob<J>> {
        self.jobs
    }

    /// How many jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// True when there are none (never, for a batch a runtime calls).
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Fires when the batch must stop: its timeout passed, or every job was cancelled. Return soon
    /// after: the call is dropped at the end of a grace.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// True once [`Batch::cancellation`] fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

#[cfg(test)]
mod tests;
