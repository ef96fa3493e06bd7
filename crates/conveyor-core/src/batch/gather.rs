//! The gatherer: per-job runs in, one batch call out, a result back to each job (see the design
//! note in `mod.rs`).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{Batch, BatchHandler, BatchJob, BatchSettings};
use crate::context::Context;
use crate::error::{ErrorKind, HandlerError};
use crate::handler::{ErasedHandler, HandlerSettings, PreparedJob, decode, encode_output};
use crate::message::Message;
use crate::pipeline::{CANCEL_GRACE, panic_message};

/// One job's result, as a single handler's run returns it (the output as JSON).
type Reply = Result<Option<String>, HandlerError>;

/// A [`BatchHandler`] as the router stores it: each job's run goes through the gatherer.
pub(crate) struct Gathered<B: BatchHandler> {
    gatherer: Arc<Gatherer<B>>,
    /// The settings each job's pipeline uses: the handler's, with the timeout widened by the
    /// linger and the grace, so the call's own timeout (the handler's) is what a job reports.
    settings: HandlerSettings,
}

impl<B: BatchHandler> Gathered<B> {
    pub(crate) fn new(handler: B) -> Self {
        let settings = handler.settings();
        let batch = handler.batch_settings();
        let batch = BatchSettings {
            max_jobs: batch.max_jobs.max(1),
            ..batch
        };
        let per_job = settings
            .clone()
            .with_timeout(settings.timeout + batch.linger + CANCEL_GRACE + Duration::from_secs(1));
        Self {
            gatherer: Arc::new(Gatherer {
                handler: Arc::new(handler),
                batch,
                timeout: settings.timeout,
                open: Mutex::new(Open::default()),
            }),
            settings: per_job,
        }
    }
}

impl<B: BatchHandler> ErasedHandler for Gathered<B> {
    fn job_type(&self) -> &'static str {
        B::JOB_TYPE
    }

    fn settings(&self) -> &HandlerSettings {
        &self.settings
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.gatherer.batch.max_jobs)
    }

    fn prepare(&self, message: &Message) -> Result<PreparedJob, HandlerError> {
        let handler = &self.gatherer.handler;
        let job = decode(B::JOB_TYPE, B::VERSION, message, |version, payload| {
            handler.upgrade(version, payload)
        })?;
        let gatherer = Arc::clone(&self.gatherer);
        // Called by the pipeline's run step, after the claim: only claimed jobs reach the gatherer.
        Ok(Box::new(move |ctx| {
            Box::pin(async move {
                let reply = gatherer.submit(job, ctx);
                // A job cancelled while its batch ran (lease lost, shutdown) is judged as a single
                // handler is: its result stands if the call answers within the pipeline's grace (an
                // `Ok` completes the claim, fenced if another holder took it over, so the work done
                // is not run again), and it is cancelled if the call does not.
                reply.await.unwrap_or_else(|_| {
                    Err(HandlerError::retryable("its batch ended without a result for it"))
                })
            })
        }))
    }
}

/// One route's gatherer.
struct Gatherer<B: BatchHandler> {
    handler: Arc<B>,
    batch: BatchSettings,
    /// The longest one call may take.
    timeout: Duration,
    /// The batch being filled.
    open: Mutex<Open<B::Job>>,
}

/// The batch being filled, and its number (a linger timer flushes only the batch it was set for).
struct Open<J> {
    entries: Vec<Entry<J>>,
    number: u64,
}

impl<J> Default for Open<J> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            number: 0,
        }
    }
}

impl<J> Open<J> {
    /// The entries, leaving an empty batch with the next number.
    fn take(&mut self) -> Vec<Entry<J>> {
        self.number += 1;
        std::mem::take(&mut self.entries)
    }
}

/// A job waiting in a batch.
struct Entry<J> {
    job: J,
    ctx: Context,
    reply: oneshot::Sender<Reply>,
    /// The job's message span (current when it was submitted): the call's span links to it.
    span: tracing::Span,
}

/// How a call ended.
enum Ended<O> {
    Returned(std::thread::Result<super::BatchResult<O>>),
    TimedOut,
    /// No job waits any more: the call was dropped.
    Abandoned,
}

impl<B: BatchHandler> Gatherer<B> {
    /// Adds a job to the open batch; calls the handler when it is full, or sets the linger timer
    /// when it is the batch's first job.
    fn submit(self: &Arc<Self>, job: B::Job, ctx: Context) -> oneshot::Receiver<Reply> {
        let (reply, result) = oneshot::channel();
        let (full, linger_for) = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.entries.push(Entry {
                job,
                ctx,
                reply,
                span: tracing::Span::current(),
            });
            if open.entries.len() >= self.batch.max_jobs {
                (Some(open.take()), None)
            } else if open.entries.len() == 1 {
                (None, Some(open.number))
            } else {
                (None, None)
            }
        };
        if let Some(entries) = full {
            tokio::spawn(Arc::clone(self).call(entries));
        }
        if let Some(number) = linger_for {
            let gatherer = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(gatherer.batch.linger).await;
                let entries = {
                    let mut open = gatherer.open.lock().unwrap_or_else(PoisonError::into_inner);
                    // A batch filled meanwhile took a new number; this timer is not its own.
                    (open.number == number && !open.entries.is_empty()).then(|| open.take())
                };
                if let Some(entries) = entries {
                    gatherer.call(entries).await;
                }
            });
        }
        result
    }

    /// Calls the handler with `entries` and answers each job.
    async fn call(self: Arc<Self>, entries: Vec<Entry<B::Job>>) {
        let started = Instant::now();
        let mut deadline = started + self.timeout;
        let mut jobs = Vec::with_capacity(entries.len());
        let mut replies = Vec::with_capacity(entries.len());
        let mut tokens = Vec::with_capacity(entries.len());
        let mut job_spans = Vec::with_capacity(entries.len());
        for Entry {
            job,
            ctx,
            reply,
            span,
        } in entries
        {
            // A runtime's deadline (a Lambda invocation's) reaches the call through the jobs'.
            deadline = deadline.min(ctx.deadline());
            tokens.push(ctx.cancellation().clone());
            jobs.push(BatchJob { job, ctx });
            replies.push(reply);
            job_spans.push(span);
        }
        let count = jobs.len();
        let cancel = CancellationToken::new();
        let handler = Arc::clone(&self.handler);
        let batch = Batch::new(jobs, cancel.clone());
        let call_span = crate::trace::batch_call_span(B::JOB_TYPE, &job_spans);
        drop(job_spans);
        let mut handling = Box::pin(
            AssertUnwindSafe(async move { handler.handle_batch(batch).await }.instrument(call_span))
                .catch_unwind(),
        );
        let ended = {
            let all_gone = all_closed(&mut replies);
            let all_cancelled = {
                let cancel = cancel.clone();
                async move {
                    for token in &tokens {
                        token.cancelled().await;
                    }
                    cancel.cancel();
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = all_gone => Ended::Abandoned,
                result = &mut handling => Ended::Returned(result),
                () = tokio::time::sleep_until(deadline) => Ended::TimedOut,
                () = all_cancelled => Ended::Abandoned,
            }
        };
        // As a single handler's timeout: tell it, let it wind down within the grace, then drop it,
        // before any job hears of it (and its claim is released). What it returns within the grace
        // stands, as a single handler's late result does (see `run` in `pipeline.rs`).
        let (ended, late) = match ended {
            Ended::TimedOut => {
                cancel.cancel();
                let all_gone = all_closed(&mut replies);
                tokio::select! {
                    biased;
                    () = all_gone => (Ended::TimedOut, false),
                    result = tokio::time::timeout(CANCEL_GRACE, &mut handling) => match result {
                        Ok(returned) => (Ended::Returned(returned), true),
                        Err(_) => (Ended::TimedOut, false),
                    },
                }
            }
            other => (other, false),
        };
        drop(handling);
        let timed_out = format!(
            "batch handler {} timed out after {:?}",
            B::JOB_TYPE,
            deadline.saturating_duration_since(started)
        );
        let results: Vec<Reply> = match ended {
            Ended::Abandoned => {
                tracing::debug!(
                    job_type = B::JOB_TYPE,
                    jobs = count,
                    "no job waits for the batch any more; dropped it"
                );
                return;
            }
            Ended::TimedOut => {
                tracing::warn!(job_type = B::JOB_TYPE, jobs = count, timeout = ?self.timeout, "batch handler timed out");
                let reason = format!("{timed_out} (every job of the batch fails with it)");
                every_job(count, &HandlerError::retryable(reason))
            }
            Ended::Returned(Err(panic)) => {
                let reason = format!("batch handler panicked: {}", panic_message(panic.as_ref()));
                // The panic hook printed the panic; this names the batch.
                tracing::error!(job_type = B::JOB_TYPE, jobs = count, "batch handler panicked");
                every_job(count, &HandlerError::retryable(reason))
            }
            Ended::Returned(Ok(Err(error))) if late => every_job(
                count,
                &HandlerError::retryable(format!("{timed_out}, then returned: {error}")),
            ),
            Ended::Returned(Ok(Err(error))) => every_job(count, &error),
            Ended::Returned(Ok(Ok(results))) => match per_job(B::JOB_TYPE, results, count) {
                Ok(replies) if late => {
                    tracing::info!(
                        job_type = B::JOB_TYPE,
                        jobs = count,
                        "batch handler returned after its timeout, within its grace: its results stand"
                    );
                    replies
                        .into_iter()
                        .map(|reply| {
                            reply.map_err(|error| {
                                HandlerError::retryable(format!("{timed_out}, then returned: {error}"))
                            })
                        })
                        .collect()
                }
                Ok(replies) => replies,
                Err(mismatch) => every_job(count, &mismatch),
            },
        };
        for (reply, result) in replies.into_iter().zip(results) {
            // A job that stopped waiting (cancelled, its grace over) has already ended.
            let _ = reply.send(result);
        }
    }
}

/// Ends once no job waits for its reply any more (each one's run ended).
async fn all_closed(replies: &mut [oneshot::Sender<Reply>]) {
    for reply in replies {
        reply.closed().await;
    }
}

/// The handler's results, one per job (outputs as JSON), matched by position: the order of
/// [`Batch::jobs`](super::Batch::jobs). A list of another length cannot be matched (which job lacks
/// its result, or which one is extra, is unknown), so it is no job's: `Err` with the retryable error
/// every job of the call fails with, naming the handler. No job is acknowledged for another's result.
fn per_job<O: serde::Serialize>(
    job_type: &'static str,
    results: Vec<Result<O, HandlerError>>,
    count: usize,
) -> Result<Vec<Reply>, HandlerError> {
    let returned = results.len();
    if returned != count {
        tracing::error!(
            job_type,
            returned,
            jobs = count,
            "batch handler returned a result list that does not match its batch; every job of the call fails"
        );
        return Err(HandlerError::retryable(format!(
            "batch handler {job_type} returned {returned} results for {count} jobs: results are matched to \
             jobs by position (the order of Batch::jobs), so none is taken and every job of the call is \
             retried; return exactly one result per job"
        )));
    }
    Ok(results
        .into_iter()
        .map(|result| result.map(|output| encode_output(&output)))
        .collect())
}

/// `error` for each of `count` jobs.
fn every_job(count: usize, error: &HandlerError) -> Vec<Reply> {
    (0..count).map(|_| Err(copy_error(error))).collect()
}

/// The same error again (a whole-batch error is every job's).
fn copy_error(error: &HandlerError) -> HandlerError {
    match error.kind() {
        ErrorKind::Permanent => HandlerError::permanent(error.message()),
        ErrorKind::Retryable { delay: Some(delay) } => HandlerError::retry_after(error.message(), delay),
        ErrorKind::Retryable { delay: None } => HandlerError::retryable(error.message()),
    }
}
