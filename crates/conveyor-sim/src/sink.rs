//! The fenced sink the simulated handlers apply their effects to, and the log of everything the
//! invariants are checked against: sends, receives, runs, effects and refused effects.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use conveyor_core::message::DEFERRAL_ATTRIBUTE;
use conveyor_core::{message::Message, port::RecordStatus};

use crate::clock::VirtualStore;
use crate::scenario::job_of_body;
use crate::trace::Trace;

/// A message handed out by a receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Who received it.
    pub instance: String,
    /// The message id.
    pub message_id: String,
    /// The job its body names.
    pub job: Option<u32>,
    /// Its receive count.
    pub receive_count: u32,
    /// True for a deferred copy (it carries `conveyor.deferral`).
    pub deferred_copy: bool,
    /// When (virtual ms).
    pub at_ms: u128,
    /// When the message was first received (virtual ms, from its `ApproximateFirstReceiveTimestamp`).
    pub first_received_ms: Option<u128>,
}

/// A visibility change SQS refused as invalid (`InvalidParameterValue`): one that would keep the
/// message in flight past 12 hours from its first receive, or a timeout over 12 hours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibilityRefused {
    /// Who asked.
    pub instance: String,
    /// The message, when the receipt was one this instance received.
    pub message_id: Option<String>,
    /// When (virtual ms).
    pub at_ms: u128,
    /// SQS's answer.
    pub error: String,
}

/// How a run ended, as far as the handler knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Still running when the run ended (killed, dropped at a deadline, or cut by a timeout).
    Unfinished,
    /// Applied its effect.
    Succeeded,
    /// Returned or panicked with the failure its script asked for.
    Failed,
    /// Permanent failure.
    Permanent,
    /// Stopped at its deadline, or refused by the sink.
    Stopped,
    /// Cancelled before its deadline: its lease was lost, or its worker shut down.
    Cancelled,
}

/// One handler run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The job.
    pub job: u32,
    /// Which run of the job it is (0-based, across copies).
    pub index: usize,
    /// The instance it ran on.
    pub instance: String,
    /// The message it ran for.
    pub message_id: String,
    /// The receive it ran in (the message's receive count then).
    pub receive_count: u32,
    /// The idempotency key it was claimed under.
    pub key: Option<String>,
    /// The fencing token it held (unique per key, not across keys).
    pub token: Option<u64>,
    /// Virtual milliseconds at start and end.
    pub started_ms: u128,
    /// Virtual milliseconds at the end, when it ended.
    pub ended_ms: Option<u128>,
    /// How it ended.
    pub end: RunEnd,
    /// Virtual milliseconds when its handler returned, when that was after its end (a late handler
    /// that applied its effect, then returned only after it was told to stop): the runtime settles
    /// (completes the claim) from here, not from the effect.
    pub returned_ms: Option<u128>,
    /// Its handler held its result past its effect, to return it late ([`Sink::returns_late`]): until
    /// `returned_ms`, no runtime could complete the run.
    pub returns_late: bool,
}

impl Run {
    /// When the runtime began settling the run: its handler's return, else its end (the effect).
    pub fn settled_from_ms(&self) -> Option<u128> {
        self.returned_ms.or(self.ended_ms)
    }
}

/// An effect attempt the sink refused: its claim was no longer the record's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The run (an index into [`Log::runs`]).
    pub run: usize,
    /// Why.
    pub reason: String,
    /// The run had been told to stop (its context or its batch cancelled) and acted anyway: a
    /// handler that ignores its context, which only the fence can stop.
    pub told_to_stop: bool,
}

/// A batch call whose handler returned fewer results than it had jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortCall {
    /// The runs of the call (indices into [`Log::runs`]).
    pub runs: Vec<usize>,
    /// How many results it returned.
    pub results: usize,
}

/// Everything observed.
#[derive(Debug, Default, Clone)]
pub struct Log {
    /// Message ids the producer sent, by job.
    pub sent: Vec<(u32, String)>,
    /// Every receive.
    pub received: Vec<Received>,
    /// Every handler run.
    pub runs: Vec<Run>,
    /// Applied effects: (job, run).
    pub effects: Vec<(u32, usize)>,
    /// Refused effect attempts.
    pub refused: Vec<Refused>,
    /// Windows (virtual ms) when the store was down.
    pub store_outages: Vec<(u128, u128)>,
    /// Windows (virtual ms) when the queue failed or hung visibility changes.
    pub queue_faults: Vec<(u128, u128)>,
    /// Windows (virtual ms) when receives answered late.
    pub late_receives: Vec<(u128, u128)>,
    /// Windows (virtual ms) when deletes failed.
    pub delete_faults: Vec<(u128, u128)>,
    /// When each instance was asked to shut down (virtual ms).
    pub shutdowns: Vec<(String, u128)>,
    /// When each instance's shutdown skipped the rest of its drain (virtual ms).
    pub hard_stops: Vec<(String, u128)>,
    /// Visibility changes refused as invalid.
    pub visibility_refused: Vec<VisibilityRefused>,
    /// The window (virtual ms) when the store answered "misconfigured".
    pub store_misconfigured: Option<(u128, u128)>,
    /// Consumers that refused to start, or Lambda cold starts that failed, on a misconfigured store:
    /// (instance, virtual ms).
    pub refused_starts: Vec<(String, u128)>,
    /// Lambda invocations that ran past their deadline and were stopped there: (instance, virtual ms).
    pub overran: Vec<(String, u128)>,
    /// The batches the event source mappings handed to their functions, in order.
    pub invocations: Vec<Invocation>,
    /// Batch calls that returned too few results.
    pub short_calls: Vec<ShortCall>,
}

/// A batch an event source mapping handed to its function, after holding it
/// ([`LambdaSpec::invoke_delay`](crate::scenario::LambdaSpec::invoke_delay)): from then until it was
/// done with them, and only then, the function tries the store for its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The function.
    pub instance: String,
    /// Its records: (message id, receive count).
    pub records: Vec<(String, u32)>,
    /// When the mapping handed it the batch (virtual ms).
    pub at_ms: u128,
    /// When the function was done with the batch (virtual ms): it answered, it was cut at its deadline,
    /// or its cold start failed. `None` when the run ended first.
    pub ended_ms: Option<u128>,
    /// Its deadline (virtual ms).
    pub deadline_ms: u128,
    /// False when its cold start failed: nothing processed the records.
    pub processed: bool,
}

impl Invocation {
    /// When the function may have tried the store for its records (virtual ms, both ends included).
    pub fn window(&self) -> (u128, u128) {
        (self.at_ms, self.ended_ms.unwrap_or(self.deadline_ms))
    }
}

/// The fenced sink.
#[derive(Debug)]
pub struct Sink {
    store: Arc<VirtualStore>,
    trace: Trace,
    log: Mutex<Log>,
}

impl Sink {
    /// A sink that checks claims in `store`.
    pub fn new(store: Arc<VirtualStore>, trace: Trace) -> Self {
        Self {
            store,
            trace,
            log: Mutex::new(Log::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the log.
    pub fn log(&self) -> Log {
        self.lock().clone()
    }

    /// Virtual milliseconds since the run began.
    pub fn now_ms(&self) -> u128 {
        self.trace.elapsed_ms()
    }

    /// Records a step in the trace.
    pub fn step(&self, text: impl AsRef<str>) {
        self.trace.step(text);
    }

    /// The producer sent `message_id` for `job`.
    pub fn sent(&self, job: u32, message_id: String) {
        self.trace
            .step(format!("producer sent job {job} as {message_id}"));
        self.lock().sent.push((job, message_id));
    }

    /// `instance` received `message`.
    pub fn received(&self, instance: &str, message: &Message) {
        let job = job_of_body(&message.body);
        let deferred_copy = message.attributes.contains_key(DEFERRAL_ATTRIBUTE);
        self.trace.step(format!(
            "{instance} received {} (job {job:?}, receive {}{})",
            message.id,
            message.receive_count,
            if deferred_copy { ", deferred copy" } else { "" }
        ));
        let at_ms = self.trace.elapsed_ms();
        // The queue dates the first receive on its (virtual) clock, counted back from the wall clock
        // now: its age is the virtual time since.
        let first_received_ms = message.first_received_at.map(|first| {
            let age = conveyor_core::wall_clock::now()
                .duration_since(first)
                .unwrap_or_default();
            at_ms.saturating_sub(age.as_millis())
        });
        self.lock().received.push(Received {
            instance: instance.to_owned(),
            message_id: message.id.clone(),
            job,
            receive_count: message.receive_count,
            deferred_copy,
            at_ms,
            first_received_ms,
        });
    }

    /// SQS refused a visibility change `instance` asked for `message_id` as invalid.
    pub fn visibility_refused(&self, instance: &str, message_id: Option<String>, error: String) {
        self.trace.step(format!(
            "{instance}: visibility change for {} refused: {error}",
            message_id.as_deref().unwrap_or("an unknown receipt")
        ));
        let at_ms = self.trace.elapsed_ms();
        self.lock().visibility_refused.push(VisibilityRefused {
            instance: instance.to_owned(),
            message_id,
            at_ms,
            error,
        });
    }

    /// A store outage window.
    pub fn store_outage(&self, from_ms: u128, to_ms: u128) {
        self.lock().store_outages.push((from_ms, to_ms));
    }

    /// A window when the queue failed or hung visibility changes.
    pub fn queue_fault(&self, from_ms: u128, to_ms: u128) {
        self.lock().queue_faults.push((from_ms, to_ms));
    }

    /// Records a window when deletes failed.
    pub fn delete_fault(&self, from_ms: u128, to_ms: u128) {
        self.lock().delete_faults.push((from_ms, to_ms));
    }

    /// A window when receives answered late.
    pub fn late_receives(&self, from_ms: u128, to_ms: u128) {
        self.lock().late_receives.push((from_ms, to_ms));
    }

    /// The window when the store answered "misconfigured".
    pub fn store_misconfigured(&self, from_ms: u128, to_ms: u128) {
        self.lock().store_misconfigured = Some((from_ms, to_ms));
    }

    /// `instance` refused to start (or its cold start failed) because the store is misconfigured.
    pub fn refused_start(&self, instance: &str, why: impl std::fmt::Display) {
        let at = self.trace.elapsed_ms();
        self.trace.step(format!("{instance} refused to start: {why}"));
        self.lock().refused_starts.push((instance.to_owned(), at));
    }

    /// A Lambda invocation of `instance` ran past its deadline and was stopped there.
    pub fn overran(&self, instance: &str) {
        let at = self.trace.elapsed_ms();
        self.trace.step(format!(
            "{instance}: invocation ran past its deadline and was stopped; nothing deleted"
        ));
        self.lock().overran.push((instance.to_owned(), at));
    }

    /// A Lambda invocation of `instance` processes `messages`, until `timeout` at the latest; returns
    /// its index in [`Log::invocations`] for [`Sink::invocation_over`].
    pub fn invoked(&self, instance: &str, messages: &[Message], timeout: Duration) -> usize {
        self.trace.step(format!(
            "{instance} invoked with {} records (jobs {:?})",
            messages.len(),
            messages
                .iter()
                .map(|message| job_of_body(&message.body))
                .collect::<Vec<_>>()
        ));
        self.push_invocation(instance, messages, timeout, true)
    }

    /// The cold start of `instance`'s invocation with `messages`, begun at `since_ms` (virtual ms),
    /// failed (`why`): nothing processes them.
    pub fn cold_start_failed(
        &self,
        instance: &str,
        messages: &[Message],
        since_ms: u128,
        why: impl std::fmt::Display,
    ) {
        self.refused_start(instance, why);
        let at_ms = self.trace.elapsed_ms();
        let index = self.push_invocation(instance, messages, Duration::ZERO, false);
        if let Some(invocation) = self.lock().invocations.get_mut(index) {
            invocation.at_ms = since_ms.min(at_ms);
            invocation.ended_ms = Some(at_ms);
        }
    }

    /// Invocation `index` (from [`Sink::invoked`]) is done with its records.
    pub fn invocation_over(&self, index: usize) {
        let at = self.trace.elapsed_ms();
        if let Some(invocation) = self.lock().invocations.get_mut(index) {
            invocation.ended_ms = Some(at);
        }
    }

    fn push_invocation(
        &self,
        instance: &str,
        messages: &[Message],
        timeout: Duration,
        processed: bool,
    ) -> usize {
        let at_ms = self.trace.elapsed_ms();
        let records = messages
            .iter()
            .map(|message| (message.id.clone(), message.receive_count))
            .collect();
        let mut log = self.lock();
        log.invocations.push(Invocation {
            instance: instance.to_owned(),
            records,
            at_ms,
            ended_ms: None,
            deadline_ms: at_ms + timeout.as_millis(),
            processed,
        });
        log.invocations.len() - 1
    }

    /// `instance` was asked to shut down now.
    pub fn shutdown(&self, instance: &str) {
        let at = self.trace.elapsed_ms();
        self.lock().shutdowns.push((instance.to_owned(), at));
    }

    /// `instance`'s shutdown skips the rest of its drain now (a hard stop).
    pub fn hard_stop(&self, instance: &str) {
        let at = self.trace.elapsed_ms();
        self.lock().hard_stops.push((instance.to_owned(), at));
    }

    /// A run of `job` starts; returns its run number and its index within the job.
    pub fn start_run(
        &self,
        job: u32,
        instance: &str,
        message_id: &str,
        receive_count: u32,
        key: Option<&str>,
        token: Option<u64>,
    ) -> (usize, usize) {
        let mut log = self.lock();
        let index = log.runs.iter().filter(|run| run.job == job).count();
        log.runs.push(Run {
            job,
            index,
            instance: instance.to_owned(),
            message_id: message_id.to_owned(),
            receive_count,
            key: key.map(str::to_owned),
            token,
            started_ms: self.trace.elapsed_ms(),
            ended_ms: None,
            end: RunEnd::Unfinished,
            returned_ms: None,
            returns_late: false,
        });
        let run = log.runs.len() - 1;
        drop(log);
        self.trace.step(format!(
            "{instance} runs job {job} (run {index}) for {message_id}, token {}",
            token.map_or_else(|| "none".to_owned(), |token| token.to_string())
        ));
        (run, index)
    }

    /// Run `run` ended with `end`.
    pub fn end_run(&self, run: usize, end: RunEnd) {
        let mut log = self.lock();
        let ended_ms = self.trace.elapsed_ms();
        if let Some(record) = log.runs.get_mut(run) {
            record.ended_ms = Some(ended_ms);
            record.end = end;
        }
        drop(log);
        self.trace.step(format!("run {run} ended: {end:?}"));
    }

    /// Run `run`'s handler holds its result past its effect, to return it late ([`Run::returns_late`]).
    pub fn returns_late(&self, run: usize) {
        if let Some(record) = self.lock().runs.get_mut(run) {
            record.returns_late = true;
        }
    }

    /// The handler of `run` returned (late: after it was told to stop, its effect applied before).
    pub fn returned(&self, run: usize) {
        let mut log = self.lock();
        let at = self.trace.elapsed_ms();
        if let Some(record) = log.runs.get_mut(run) {
            record.returned_ms = Some(at);
        }
        drop(log);
        self.trace.step(format!("run {run}'s handler returned, late"));
    }

    /// A batch call with `runs` returned `results` results, fewer than its jobs.
    pub fn short_call(&self, runs: &[usize], results: usize) {
        self.trace.step(format!(
            "a batch call with runs {runs:?} returned {results} results for {} jobs",
            runs.len()
        ));
        self.lock().short_calls.push(ShortCall {
            runs: runs.to_vec(),
            results,
        });
    }

    /// Applies run `run`'s effect for `job` if `token` is still the claim on `key`; refuses otherwise.
    /// `told_to_stop`: the run acts although its context was cancelled (recorded with a refusal).
    pub fn apply(
        &self,
        job: u32,
        run: usize,
        key: Option<&str>,
        token: Option<u64>,
        told_to_stop: bool,
    ) -> Result<(), String> {
        let refusal = match (key, token) {
            (Some(key), Some(token)) => match self.store.current(key) {
                Some(record) if record.token == Some(token) && record.status == RecordStatus::InProgress => {
                    None
                }
                Some(record) => Some(format!(
                    "claim on {key} is no longer this run's (record {:?}, token {:?})",
                    record.status, record.token
                )),
                None => Some(format!("no record for {key}")),
            },
            _ => Some("the run holds no claim".to_owned()),
        };
        let mut log = self.lock();
        match refusal {
            None => {
                log.effects.push((job, run));
                drop(log);
                self.trace
                    .step(format!("effect of job {job} applied by run {run}"));
                Ok(())
            }
            Some(reason) => {
                log.refused.push(Refused {
                    run,
                    reason: reason.clone(),
                    told_to_stop,
                });
                drop(log);
                self.trace
                    .step(format!("effect of job {job} by run {run} refused: {reason}"));
                Err(reason)
            }
        }
    }
}
