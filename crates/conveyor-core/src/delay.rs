//! Delays longer than SQS's 15 minutes, and cancelling a delayed job by its key.
//!
//! # Design note: hops
//!
//! SQS delays a message by at most 15 minutes (`DelaySeconds`). A job due later carries its due time in
//! one attribute, [`DUE_ATTRIBUTE`] (epoch milliseconds), and is sent with the longest delay SQS allows.
//! When it is received before it is due, the pipeline answers [`Outcome::Defer`](crate::Outcome) with
//! the remaining delay (at most 15 minutes: one *hop*) *before routing, claiming or running anything*,
//! and the runtime re-sends it the way it puts back every job that did not run (a delayed copy, then a
//! delete: see [`crate::deferral`]). So a hop
//!
//! - never runs the handler and never counts toward `maxReceiveCount` (the copy starts again at
//!   receive count 1, and [`Message::attempt`] leaves deferrals out);
//! - keeps the body, every attribute (the producer's key, the job type and version, the due time), the
//!   original message id (the key's fallback) and the first-sent time;
//! - is decided the same way by the worker and the Lambda adapter, because both call one pipeline.
//!
//! Cost: one `SendMessage` and one (batched) delete per hop, plus the receive: about
//! `24 × 4 = 96` hops per day of delay, so ~300 requests per job per day (~US$0.00012 at
//! US$0.40 per million requests). A job due in a week costs ~2,000 requests.
//!
//! A message whose due time cannot be read is not delayed (it runs when received): a bad due time must
//! not hold a job forever.
//!
//! # Design note: cancelling
//!
//! [`cancel`] writes the job's idempotency record as completed, with [`CANCELLED_OUTPUT`] as its output,
//! through the store's own conditional claim (free key → claim → complete). When the job comes due its
//! claim finds the completed record and the pipeline acknowledges it without running, as
//! [`AckReason::Cancelled`](crate::AckReason) (a log line and the runtimes' cancelled metric). A job can
//! be cancelled only while its key is free: a job already done, or running, says so. Cancelling needs
//! the handler to be idempotent (the default) and the pipeline to have the store; the record lives
//! [`CANCEL_RECORD_TTL`] (longer than any message stays in SQS).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus, StoreError, idempotency_key,
};
use crate::limits::MAX_DELAY;
use crate::message::Message;
use crate::outcome::epoch_millis;

/// Message attribute of a job due later than SQS's 15-minute delay: the due time, epoch milliseconds.
pub const DUE_ATTRIBUTE: &str = "conveyor.due";
/// The output stored on a cancelled job's record.
pub(crate) const CANCELLED_OUTPUT: &str = r#"{"conveyor.cancelled":true}"#;
/// How long a cancellation record lasts: past SQS's longest retention (14 days).
pub(crate) const CANCEL_RECORD_TTL: Duration = Duration::from_secs(15 * 24 * 3600);
/// How early a job may run before its due time: a hop shorter than this is not worth a request.
pub(crate) const DUE_TOLERANCE: Duration = Duration::from_millis(500);
/// SQS's longest message retention: no delay may be longer.
pub const MAX_TOTAL_DELAY: Duration = Duration::from_secs(14 * 24 * 3600);

/// The wall clock the pipeline judges due times by: `SystemTime::now` unless a test shifts it.
pub type Clock = std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system clock.
pub(crate) fn system_clock() -> Clock {
    std::sync::Arc::new(SystemTime::now)
}

/// When the job is due, if it carries a due time.
pub fn due_at(message: &Message) -> Option<SystemTime> {
    let ms: u64 = message.string_attribute(DUE_ATTRIBUTE)?.trim().parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// The due attribute's value for `due`.
pub fn due_value(due: SystemTime) -> String {
    epoch_millis(due).to_string()
}

/// The delay of the next hop when `message` is not due at `now` (at most `max_hop`, itself at most
/// SQS's 15 minutes); `None` when it is due (or carries no due time).
pub(crate) fn next_hop(message: &Message, now: SystemTime, max_hop: Duration) -> Option<Duration> {
    let remaining = due_at(message)?.duration_since(now).ok()?;
    if remaining <= DUE_TOLERANCE {
        return None;
    }
    Some(remaining.min(max_hop).min(MAX_DELAY))
}

/// True when a record's output marks its job cancelled.
pub(crate) fn is_cancelled_output(output: Option<&str>) -> bool {
    output == Some(CANCELLED_OUTPUT)
}

/// What [`cancel`] found.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The job is cancelled: when it comes due it is dropped without running.
    Cancelled,
    /// It was cancelled before.
    AlreadyCancelled,
    /// Too late: the job (or another with the same key) already completed.
    AlreadyCompleted,
    /// Too late: the job is running now.
    Running,
}

/// Cancels the job of `job_type` whose producer key is `key` (see the module's design note).
pub async fn cancel(
    store: &dyn IdempotencyStore,
    job_type: &str,
    key: &str,
) -> Result<Cancelled, StoreError> {
    let now = SystemTime::now();
    let request = ClaimRequest {
        key: idempotency_key(job_type, Some(key), ""),
        lease_until: now + Duration::from_secs(30),
        expires_at: now + CANCEL_RECORD_TTL,
        validation: None,
        restart_runs: false,
        last_attempt: false,
    };
    let claim = match store.claim(&request).await? {
        ClaimOutcome::Acquired(claim) => claim,
        ClaimOutcome::Exists(record) => {
            return Ok(match record.status {
                RecordStatus::Completed if is_cancelled_output(record.output.as_deref()) => {
                    Cancelled::AlreadyCancelled
                }
                RecordStatus::Completed => Cancelled::AlreadyCompleted,
                RecordStatus::InProgress | RecordStatus::Expired => Cancelled::Running,
            });
        }
    };
    store
        .complete(&claim, Some(CANCELLED_OUTPUT), request.expires_at)
        .await?;
    tracing::info!(job_type, key, "delayed job cancelled");
    Ok(Cancelled::Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::AttributeValue;

    fn due_in(now: SystemTime, delay: Duration) -> Message {
        let mut message = Message::new("m-1", "{}");
        message.attributes.insert(
            DUE_ATTRIBUTE.into(),
            AttributeValue::number(due_value(now + delay)),
        );
        message
    }

    #[test]
    fn hops_are_at_most_fifteen_minutes_and_stop_when_due() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let message = due_in(now, Duration::from_secs(7200));
        assert_eq!(next_hop(&message, now, MAX_DELAY), Some(MAX_DELAY));
        assert_eq!(
            next_hop(&message, now + Duration::from_secs(7000), MAX_DELAY),
            Some(Duration::from_secs(200))
        );
        assert_eq!(
            next_hop(&message, now, Duration::from_secs(2)),
            Some(Duration::from_secs(2)),
            "a shorter hop setting"
        );
        assert_eq!(
            next_hop(&message, now + Duration::from_secs(7200), MAX_DELAY),
            None
        );
        assert_eq!(
            next_hop(&message, now + Duration::from_secs(9000), MAX_DELAY),
            None
        );
        assert_eq!(
            next_hop(&message, now + Duration::from_millis(7_199_600), MAX_DELAY),
            None,
            "within the tolerance"
        );
    }

    #[test]
    fn no_or_unreadable_due_time_runs_at_once() {
        let now = SystemTime::now();
        assert_eq!(next_hop(&Message::new("m", "{}"), now, MAX_DELAY), None);
        let mut bad = Message::new("m", "{}");
        bad.attributes
            .insert(DUE_ATTRIBUTE.into(), AttributeValue::string("tomorrow"));
        assert_eq!(next_hop(&bad, now, MAX_DELAY), None);
    }
}
