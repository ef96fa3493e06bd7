//! Outcomes, and the one place where handler results become outcomes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::error::{ErrorKind, HandlerError};
use crate::limits::MAX_VISIBILITY_TIMEOUT;

/// What happens to a message once the pipeline is done with it. The runtime loops see only this.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Delete the message: the job is done (now, or earlier by another delivery).
    Ack(AckReason),
    /// Make the message visible again after `delay`.
    Retry {
        /// How long the message stays invisible.
        delay: Duration,
        /// Why, for logs.
        reason: String,
    },
    /// Send the message to the DLQ with the failure recorded, then delete it.
    Reject(Failure),
    /// Put the message back without running it, after `delay`, without spending one of its receives
    /// (see [`deferred_copy`](crate::runtime::deferred_copy)): the job did not run here (a key in progress elsewhere, the store
    /// unreachable, a circuit open).
    Defer {
        /// How long until the job may run.
        delay: Duration,
        /// Why, for logs.
        reason: String,
        /// Why, for the runtimes' decisions: what keeps the job from running.
        cause: DeferCause,
    },
}

/// What keeps a deferred job from running (the typed half of [`Outcome::Defer`]; the `reason` says it
/// in words). The runtimes decide on this, never on the reason's wording.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferCause {
    /// A delayed job that is not due yet (its next hop).
    NotDue,
    /// The idempotency store could not be reached (a claim, or a cancel marker's read, failed).
    StoreUnreachable,
    /// The idempotency store answered that it is misconfigured (a table deleted, writes denied).
    StoreMisconfigured,
    /// Its key is in progress elsewhere.
    KeyInProgress,
    /// Its large payload could not be fetched.
    PayloadUnavailable,
    /// A downstream's circuit is open.
    CircuitOpen,
    /// Its tenant is at its limit.
    TenantLimit,
    /// Its flow's bookkeeping failed (a parent's children unreadable, a child's end not counted).
    FlowBookkeeping,
    /// Its run was cancelled at the last receive the redrive policy allows.
    Cancelled,
}

impl DeferCause {
    /// The cause recorded when such a deferral reaches the last allowed receive unrun.
    pub fn not_run(self) -> NotRun {
        match self {
            DeferCause::StoreUnreachable => NotRun::StoreUnreachable,
            DeferCause::StoreMisconfigured => NotRun::StoreMisconfigured,
            DeferCause::KeyInProgress => NotRun::KeyInProgress,
            _ => NotRun::Deferred,
        }
    }

    /// Its name in a deferred copy's record (`conveyor.deferral`'s `waiting_for`).
    pub fn name(self) -> &'static str {
        match self {
            DeferCause::NotDue => "not_due",
            DeferCause::StoreUnreachable => "store_unreachable",
            DeferCause::StoreMisconfigured => "store_misconfigured",
            DeferCause::KeyInProgress => "key_in_progress",
            DeferCause::PayloadUnavailable => "payload_unavailable",
            DeferCause::CircuitOpen => "circuit_open",
            DeferCause::TenantLimit => "tenant_limit",
            DeferCause::FlowBookkeeping => "flow_bookkeeping",
            DeferCause::Cancelled => "cancelled",
        }
    }

    /// How long a job may go on being deferred for this cause without a run before it goes to the DLQ
    /// with the cause ([`past_its_bound`](crate::runtime::past_its_bound)): an hour for a
    /// configuration mistake, a day for an outage. `None`: unbounded by design (a delay not due yet
    /// waits for its time, a tenant's turn for the tenants before it, a cancelled run's deferral is
    /// made once).
    pub fn bound(self) -> Option<Duration> {
        const HOUR: Duration = Duration::from_secs(3600);
        match self {
            DeferCause::StoreMisconfigured => Some(HOUR),
            DeferCause::StoreUnreachable
            | DeferCause::KeyInProgress
            | DeferCause::PayloadUnavailable
            | DeferCause::CircuitOpen
            | DeferCause::FlowBookkeeping => Some(24 * HOUR),
            DeferCause::NotDue | DeferCause::TenantLimit | DeferCause::Cancelled => None,
        }
    }

    /// What an operator does about a job dead-lettered past this cause's bound.
    pub(crate) fn advice(self) -> &'static str {
        match self {
            DeferCause::StoreMisconfigured => {
                "fix the idempotency store's table or its permissions (the runtime's logs and readiness name \
                 the error), then redrive it"
            }
            DeferCause::KeyInProgress => {
                "another run has held its key that long: look for a stuck worker, then redrive it"
            }
            DeferCause::PayloadUnavailable => "redrive it once its payload bucket can be read",
            DeferCause::CircuitOpen => "redrive it once its downstream answers",
            _ => "redrive it once the store answers",
        }
    }

    /// True when the idempotency store kept the job from running (down or misconfigured).
    pub fn is_the_store(self) -> bool {
        matches!(
            self,
            DeferCause::StoreUnreachable | DeferCause::StoreMisconfigured
        )
    }
}

/// Why a message is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckReason {
    /// The handler ran and succeeded.
    Completed,
    /// An earlier delivery (or a duplicate send with the same key) already completed the job.
    Duplicate,
    /// The producer cancelled the job before it ran ([`crate::delay::cancel`]): dropped without running.
    Cancelled,
    /// A notice that carries no job (S3's test event, sent when a bucket's notification is
    /// configured, [`crate::events`]): acknowledged without running anything.
    Ignored,
}

/// A permanent failure, as recorded on the dead-lettered message (`conveyor.failure` attribute, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What went wrong.
    pub error: String,
    /// The run that failed (1 = first): the receive count, plus the runs of earlier copies when the
    /// message had been deferred.
    pub receive_count: u32,
    /// The queue the message came from.
    pub source_queue: String,
    /// The job type whose handler failed (empty when no handler was found).
    pub handler: String,
    /// When it failed, in epoch milliseconds.
    pub failed_at_ms: u64,
    /// True when the job was retryable but used its last allowed attempt (`maxReceiveCount`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retries_exhausted: bool,
    /// True when the job had runs left but its message used the last receive its redrive policy
    /// allows (a FIFO message whose receives counted while its group waited).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub receives_exhausted: bool,
    /// Set when the job never ran: why its last allowed receive passed without a run (the `error`
    /// says it in words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<NotRun>,
}

/// Why a message reached its last allowed receive without running (a FIFO message cannot be deferred
/// with a copy, so receives it could not run in count): [`Failure::not_run`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotRun {
    /// The idempotency store could not be reached to claim it.
    StoreUnreachable,
    /// The idempotency store answered that it is misconfigured (a table deleted, writes denied).
    StoreMisconfigured,
    /// Its key was in progress elsewhere.
    KeyInProgress,
    /// Deferred for another reason at each try (a large payload that could not be fetched, an open
    /// circuit, a flow's children that could not be read).
    Deferred,
    /// A message ahead of it in its FIFO group had not finished.
    BehindItsGroup,
    /// The Lambda invocation's time ran out before it started.
    OutOfTime,
    /// The worker shut down before it started.
    ShutDown,
}

impl Failure {
    /// A failure happening now.
    pub fn now(error: impl Into<String>, receive_count: u32, source_queue: &str, handler: &str) -> Self {
        Self {
            error: error.into(),
            receive_count,
            source_queue: source_queue.to_owned(),
            handler: handler.to_owned(),
            failed_at_ms: epoch_millis(crate::wall_clock::now()),
            retries_exhausted: false,
            receives_exhausted: false,
            not_run: None,
        }
    }

    /// The JSON stored in the `conveyor.failure` attribute.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"error\":{:?}}}", self.error))
    }
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// How a handler run ended, before classification.
#[non_exhaustive]
#[derive(Debug)]
pub enum RunResult {
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error.
    Failed(HandlerError),
    /// The handler panicked; the message is the panic payload when it was a string.
    Panicked(String),
    /// The handler ran past its timeout.
    TimedOut(Duration),
    /// The run was cancelled (lease lost, or shutdown past the drain deadline).
    Cancelled,
}

/// Where the outcome came from, for the failure record and the retry arithmetic.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The queue the message came from.
    pub queue: &'a str,
    /// The job type.
    pub handler: &'a str,
    /// Which run of the job this is (1 = first), the count the retry budget spends: the runs the
    /// idempotency store recorded for a claimed job ([`run_number`](crate::runtime::run_number)), else
    /// the receive count plus the runs of earlier copies ([`Message::attempt`](crate::message::Message::attempt)).
    pub attempt: u32,
    /// This message's receive count (SQS's `ApproximateReceiveCount`, what its redrive policy counts).
    /// Receives bound how long a message is held, never how often its job runs.
    pub receive: u32,
    /// The runs the queue's redrive policy allows (`maxReceiveCount`); `None` without a DLQ. The same
    /// number bounds the message's receives.
    pub max_attempts: Option<u32>,
}

impl Origin<'_> {
    /// True when this run is the last one the budget allows (`maxReceiveCount` runs).
    pub fn is_last_attempt(&self) -> bool {
        self.max_attempts.is_some_and(|max| self.attempt >= max)
    }

    /// True when this is the message's last receive its redrive policy allows: put back, its next
    /// receive would move it to the DLQ without a reason.
    pub fn is_last_receive(&self) -> bool {
        self.max_attempts.is_some_and(|max| self.receive >= max)
    }
}

/// How a retry leaves the queue, the one place the rule lives (both runtimes call it): receives bound
/// how long a message is held, runs spend the budget (`exhaust` already dead-lettered a job whose
/// runs are spent).
///
/// | the message | standard queue | FIFO queue |
/// |---|---|---|
/// | at its last allowed receive, runs left | [`RetryPath::Copy`]: a fresh copy after the delay, carrying the runs | [`RetryPath::DeadLetter`] with the reason (a copy would go behind its group; put back, SQS would dead-letter it with none) |
/// | SQS's 12 hours from the first receive leave less than the delay (`room`) | [`RetryPath::Copy`] | [`RetryPath::Visibility`] (within what is left) |
/// | otherwise | [`RetryPath::Visibility`] after the delay | the same |
///
/// A FIFO runtime retries in place (its group held) before it comes here, while it has time.
pub fn retry_path(
    origin: Origin<'_>,
    reason: &str,
    fifo: bool,
    delay: Duration,
    room: Duration,
) -> RetryPath {
    if let Some(max) = origin.max_attempts.filter(|_| origin.is_last_receive()) {
        if !fifo {
            return RetryPath::Copy;
        }
        let error = format!(
            "{reason} (run {} of the {max} the budget allows, but receive {} of the {max} the redrive \
             policy allows: a FIFO message's receives also count while its group waits, and a copy would \
             break the group's order); redrive it to run it again",
            origin.attempt, origin.receive
        );
        let mut failure = Failure::now(error, origin.attempt, origin.queue, origin.handler);
        failure.receives_exhausted = true;
        return RetryPath::DeadLetter(failure);
    }
    if delay > room && !fifo {
        return RetryPath::Copy;
    }
    RetryPath::Visibility
}

/// How a retry leaves the queue ([`retry_path`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RetryPath {
    /// The message is visible again after the delay.
    Visibility,
    /// A fresh copy goes out with the delay, carrying the runs so far, and this message is deleted.
    Copy,
    /// The message goes to the DLQ with this failure.
    DeadLetter(Failure),
}

/// Turns a handler run into an [`Outcome`]: the only place that does.
///
/// Success acks; a permanent error rejects; retryable errors, panics and timeouts retry after the
/// handler's explicit delay or the backoff, and reject with their reason on the last attempt the
/// redrive policy allows (`exhaust` in `src/outcome.rs`); a cancelled run goes back at once (another worker or the
/// next receive picks it up without waiting for a backoff it did not earn), as a deferral when it
/// was the last attempt, so a cancellation never spends a job's last receive.
pub fn classify(result: RunResult, origin: Origin<'_>, backoff: &Backoff) -> Outcome {
    let retry = |reason: String| Outcome::Retry {
        delay: backoff.delay(origin.attempt, origin.max_attempts),
        reason,
    };
    crate::trace::record_error_type(&result);
    let outcome = match result {
        RunResult::Succeeded => Outcome::Ack(AckReason::Completed),
        RunResult::Failed(error) => match error.kind() {
            ErrorKind::Permanent => Outcome::Reject(Failure::now(
                error.message(),
                origin.attempt,
                origin.queue,
                origin.handler,
            )),
            ErrorKind::Retryable { delay: Some(delay) } => Outcome::Retry {
                delay: delay.min(MAX_VISIBILITY_TIMEOUT),
                reason: error.message().to_owned(),
            },
            ErrorKind::Retryable { delay: None } => retry(error.message().to_owned()),
        },
        RunResult::Panicked(message) => retry(format!("handler panicked: {message}")),
        RunResult::TimedOut(after) => retry(format!("handler timed out after {after:?}")),
        RunResult::Cancelled => Outcome::Retry {
            delay: Duration::ZERO,
            reason: CANCELLED.to_owned(),
        },
    };
    at_last_attempt(outcome, origin)
}

/// The reason of a deferral whose key is held by a run elsewhere.
pub(crate) const IN_PROGRESS_ELSEWHERE: &str = "in progress elsewhere";

/// The reason of a cancelled run's retry.
pub const CANCELLED: &str = "cancelled";

/// The last-attempt rules, the one place they live: on the last attempt the redrive policy allows, a
/// cancelled run's retry becomes a deferral (a cancellation never spends the last receive) and any
/// other retry a reject (`exhaust` in `src/outcome.rs`). [`classify`] applies them; a runtime that learns the redrive
/// policy only when a message needs its queue (the Lambda adapter resolves it lazily) applies them
/// afterwards.
pub fn at_last_attempt(outcome: Outcome, origin: Origin<'_>) -> Outcome {
    match &outcome {
        Outcome::Retry { reason, .. } if reason == CANCELLED && origin.is_last_receive() => Outcome::Defer {
            delay: Duration::ZERO,
            reason: "cancelled on its last allowed receive".to_owned(),
            cause: DeferCause::Cancelled,
        },
        Outcome::Retry { reason, .. } if reason == CANCELLED => outcome,
        _ => exhaust(outcome, origin),
    }
}

/// The failure of a message dead-lettered at the last receive the redrive policy allows without
/// having run in it (`why`: what kept it from running, and what to do): SQS's redrive would move it
/// without a reason. Every such reason starts `not run at its last allowed receive (n of max)`.
pub fn not_run_at_the_last_receive(
    cause: NotRun,
    why: &str,
    attempt: u32,
    max: u32,
    queue: &str,
    handler: &str,
) -> Failure {
    let error = format!("not run at its last allowed receive ({attempt} of {max}): {why}");
    let mut failure = Failure::now(error, attempt, queue, handler);
    failure.not_run = Some(cause);
    failure
}

/// A retry of the last attempt the redrive policy allows becomes a reject carrying the last error, so
/// the DLQ copy says why (SQS's own redrive moves it without a reason; it stays the backstop for
/// crashes).
pub(crate) fn exhaust(outcome: Outcome, origin: Origin<'_>) -> Outcome {
    let Outcome::Retry { reason, .. } = &outcome else {
        return outcome;
    };
    let Some(max) = origin.max_attempts.filter(|_| origin.is_last_attempt()) else {
        return outcome;
    };
    let error = format!(
        "{reason} (attempt {} of the {max} the redrive policy allows)",
        origin.attempt
    );
    let mut failure = Failure::now(error, origin.attempt, origin.queue, origin.handler);
    failure.retries_exhausted = true;
    Outcome::Reject(failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: Origin<'static> = Origin {
        queue: "jobs",
        handler: "email",
        attempt: 3,
        receive: 3,
        max_attempts: Some(5),
    };

    fn backoff() -> Backoff {
        Backoff::with_budget(Duration::from_secs(60))
    }

    #[test]
    fn a_never_run_failure_names_its_cause_in_the_dlq_json_and_old_records_still_read() {
        let failure =
            not_run_at_the_last_receive(NotRun::StoreUnreachable, "claim failed", 3, 3, "jobs", "email");
        let json = failure.to_json();
        assert!(json.contains(r#""not_run":"store_unreachable""#), "{json}");
        let read: Failure = serde_json::from_str(&json).expect("its own JSON reads back");
        assert_eq!(read.not_run, Some(NotRun::StoreUnreachable));
        let plain = Failure::now("boom", 1, "jobs", "email").to_json();
        assert!(
            !plain.contains("not_run"),
            "a failure that ran says nothing: {plain}"
        );
        let old =
            r#"{"error":"boom","receive_count":1,"source_queue":"jobs","handler":"email","failed_at_ms":1}"#;
        let read: Failure = serde_json::from_str(old).expect("a record from before the field reads");
        assert_eq!(read.not_run, None);
    }

    #[test]
    fn a_deferrals_cause_gives_what_a_dlq_copy_records() {
        assert_eq!(DeferCause::StoreUnreachable.not_run(), NotRun::StoreUnreachable);
        assert_eq!(
            DeferCause::StoreMisconfigured.not_run(),
            NotRun::StoreMisconfigured
        );
        assert_eq!(DeferCause::KeyInProgress.not_run(), NotRun::KeyInProgress);
        assert_eq!(DeferCause::PayloadUnavailable.not_run(), NotRun::Deferred);
        assert!(DeferCause::StoreMisconfigured.is_the_store());
        assert!(!DeferCause::KeyInProgress.is_the_store());
    }

    #[test]
    fn success_acks() {
        assert_eq!(
            classify(RunResult::Succeeded, ORIGIN, &backoff()),
            Outcome::Ack(AckReason::Completed)
        );
    }

    #[test]
    fn permanent_rejects_with_the_failure_recorded() {
        let outcome = classify(
            RunResult::Failed(HandlerError::permanent("no such user")),
            ORIGIN,
            &backoff(),
        );
        let Outcome::Reject(failure) = outcome else {
            panic!("expected a reject, got {outcome:?}")
        };
        assert_eq!(failure.error, "no such user");
        assert_eq!(failure.receive_count, 3);
        assert_eq!(failure.source_queue, "jobs");
        assert_eq!(failure.handler, "email");
        assert!(failure.failed_at_ms > 0);
        let json: serde_json::Value = serde_json::from_str(&failure.to_json()).unwrap();
        assert_eq!(json["error"], "no such user");
    }

    #[test]
    fn retryable_uses_backoff_or_explicit_delay() {
        let outcome = classify(
            RunResult::Failed(HandlerError::retryable("503")),
            ORIGIN,
            &backoff(),
        );
        let Outcome::Retry { delay, .. } = outcome else {
            panic!("expected retry")
        };
        assert!(
            delay <= backoff().ceiling(3, Some(5)),
            "third run's ceiling, got {delay:?}"
        );

        let explicit = HandlerError::retry_after("429", Duration::from_secs(30));
        let outcome = classify(RunResult::Failed(explicit), ORIGIN, &backoff());
        assert!(matches!(outcome, Outcome::Retry { delay, .. } if delay == Duration::from_secs(30)));
    }

    #[test]
    fn panics_and_timeouts_retry() {
        let panicked = classify(RunResult::Panicked("boom".into()), ORIGIN, &backoff());
        assert!(matches!(&panicked, Outcome::Retry { reason, .. } if reason.contains("boom")));
        let timed_out = classify(RunResult::TimedOut(Duration::from_secs(5)), ORIGIN, &backoff());
        assert!(matches!(&timed_out, Outcome::Retry { reason, .. } if reason.contains("timed out")));
    }

    #[test]
    fn cancelled_goes_back_at_once() {
        let outcome = classify(RunResult::Cancelled, ORIGIN, &backoff());
        assert!(matches!(outcome, Outcome::Retry { delay, .. } if delay.is_zero()));
    }

    const LAST: Origin<'static> = Origin {
        attempt: 5,
        receive: 5,
        ..ORIGIN
    };

    #[test]
    fn the_last_attempt_rejects_with_the_last_error() {
        let outcome = classify(
            RunResult::Failed(HandlerError::retryable("503 from provider")),
            LAST,
            &backoff(),
        );
        let Outcome::Reject(failure) = outcome else {
            panic!("expected a reject, got {outcome:?}")
        };
        assert!(failure.error.contains("503 from provider"), "{}", failure.error);
        assert!(failure.error.contains("attempt 5 of the 5"), "{}", failure.error);
        assert!(failure.retries_exhausted);
        assert_eq!(failure.receive_count, 5);
        let panicked = classify(RunResult::Panicked("boom".into()), LAST, &backoff());
        assert!(matches!(panicked, Outcome::Reject(_)));
    }

    #[test]
    fn without_a_redrive_policy_retries_never_run_out() {
        let origin = Origin {
            attempt: 50,
            max_attempts: None,
            ..ORIGIN
        };
        let outcome = classify(
            RunResult::Failed(HandlerError::retryable("503")),
            origin,
            &backoff(),
        );
        assert!(matches!(outcome, Outcome::Retry { .. }));
    }

    /// A FIFO message that waited unrun behind its group: its last allowed receive, its second run.
    const RUNS_LEFT: Origin<'static> = Origin {
        attempt: 2,
        receive: 5,
        ..ORIGIN
    };

    #[test]
    fn the_budget_counts_runs_not_receives() {
        let outcome = classify(
            RunResult::Failed(HandlerError::retryable("503")),
            RUNS_LEFT,
            &backoff(),
        );
        assert!(
            matches!(outcome, Outcome::Retry { .. }),
            "two runs of five: not exhausted, got {outcome:?}"
        );
        let cancelled = classify(RunResult::Cancelled, RUNS_LEFT, &backoff());
        assert!(
            matches!(
                cancelled,
                Outcome::Defer {
                    cause: DeferCause::Cancelled,
                    ..
                }
            ),
            "a cancellation never spends the last receive: {cancelled:?}"
        );
        let spent = Origin { receive: 1, ..LAST };
        let outcome = classify(
            RunResult::Failed(HandlerError::retryable("503")),
            spent,
            &backoff(),
        );
        assert!(
            matches!(&outcome, Outcome::Reject(failure) if failure.retries_exhausted),
            "five runs spent on a copy's first receive: {outcome:?}"
        );
    }

    #[test]
    fn a_retry_at_the_last_receive_goes_on_a_copy_or_to_the_dlq_with_its_reason() {
        let delay = Duration::from_secs(10);
        let room = Duration::from_secs(3600);
        assert_eq!(retry_path(RUNS_LEFT, "503", false, delay, room), RetryPath::Copy);
        let RetryPath::DeadLetter(failure) = retry_path(RUNS_LEFT, "503", true, delay, room) else {
            panic!("a FIFO message at its last receive cannot go on a copy")
        };
        assert!(failure.receives_exhausted && !failure.retries_exhausted);
        assert!(
            failure.error.contains("503") && failure.error.contains("run 2 of the 5"),
            "{}",
            failure.error
        );
        assert_eq!(failure.receive_count, 2, "the record counts runs");
        assert_eq!(
            retry_path(ORIGIN, "503", false, delay, room),
            RetryPath::Visibility
        );
        assert_eq!(
            retry_path(ORIGIN, "503", true, delay, room),
            RetryPath::Visibility
        );
        let short = Duration::from_secs(5);
        assert_eq!(retry_path(ORIGIN, "503", false, delay, short), RetryPath::Copy);
        assert_eq!(
            retry_path(ORIGIN, "503", true, delay, short),
            RetryPath::Visibility,
            "FIFO: within what is left"
        );
        let no_dlq = Origin {
            max_attempts: None,
            ..RUNS_LEFT
        };
        assert_eq!(
            retry_path(no_dlq, "503", true, delay, room),
            RetryPath::Visibility
        );
    }

    #[test]
    fn a_cancellation_never_spends_the_last_attempt() {
        let outcome = classify(RunResult::Cancelled, LAST, &backoff());
        assert!(matches!(outcome, Outcome::Defer { delay, .. } if delay.is_zero()));
    }
}
