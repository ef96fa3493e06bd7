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
}

/// Why a message is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckReason {
    /// The handler ran and succeeded.
    Completed,
    /// An earlier delivery (or a duplicate send with the same key) already completed the job.
    Duplicate,
}

/// A permanent failure, as recorded on the dead-lettered message (`conveyor.failure` attribute, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What went wrong.
    pub error: String,
    /// The delivery that failed.
    pub receive_count: u32,
    /// The queue the message came from.
    pub source_queue: String,
    /// The job type whose handler failed (empty when no handler was found).
    pub handler: String,
    /// When it failed, in epoch milliseconds.
    pub failed_at_ms: u64,
}

impl Failure {
    /// A failure happening now.
    pub fn now(error: impl Into<String>, receive_count: u32, source_queue: &str, handler: &str) -> Self {
        Self {
            error: error.into(),
            receive_count,
            source_queue: source_queue.to_owned(),
            handler: handler.to_owned(),
            failed_at_ms: epoch_millis(SystemTime::now()),
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

/// Where the outcome came from, for the failure record.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The queue the message came from.
    pub queue: &'a str,
    /// The job type.
    pub handler: &'a str,
    /// The delivery's receive count.
    pub receive_count: u32,
}

/// Turns a handler run into an [`Outcome`]: the only place that does.
///
/// Success acks; a permanent error rejects; retryable errors, panics and timeouts retry after the
/// handler's explicit delay or the backoff; a cancelled run goes back at once (another worker or the
/// next receive picks it up without waiting for a backoff it did not earn).
pub fn classify(result: RunResult, origin: Origin<'_>, backoff: &Backoff) -> Outcome {
    let retry = |reason: String| Outcome::Retry {
        delay: backoff.delay(origin.receive_count),
        reason,
    };
    match result {
        RunResult::Succeeded => Outcome::Ack(AckReason::Completed),
        RunResult::Failed(error) => match error.kind() {
            ErrorKind::Permanent => Outcome::Reject(Failure::now(
                error.message(),
                origin.receive_count,
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
            reason: "cancelled".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: Origin<'static> = Origin {
        queue: "jobs",
        handler: "email",
        receive_count: 3,
    };

    fn backoff() -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
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
            delay <= Duration::from_secs(4),
            "third delivery's ceiling is 4 s, got {delay:?}"
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
}
