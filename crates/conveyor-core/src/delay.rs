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
//! Cost: see [`crate::delay_cost`]: each hop is a `SendMessage`, a receive and a (batched) delete,
//! each billed per 64 KB chunk of the message, plus one cancel read ([`CANCEL_KEY_PREFIX`]) and, on
//! Lambda, a share of an invocation. `hops = delay / 15 min` (96 per day).
//!
//! A message whose due time cannot be read is not delayed (it runs when received): a bad due time must
//! not hold a job forever.
//!
//! # Design note: cancelling applies to the jobs sent before it, not to the key forever
//!
//! [`cancel`] does not touch the job's idempotency record. It writes a *cancel marker*, a record of its
//! own (`conveyor:cancel#<the job's record id>`, so every key style is honoured: the record id is built
//! by the handler's [`KeyStyle`](crate::KeyStyle)) holding the cancel time. A delayed message (one
//! that carries [`DUE_ATTRIBUTE`]) whose job was first sent *before* that time is dropped as
//! [`AckReason::Cancelled`](crate::AckReason) (a log line and the runtimes' cancelled metric); one sent
//! after it runs. So "cancel, then send again with the same key" runs the new job, and a later job
//! reusing the key is not swallowed.
//!
//! Order matters: the pipeline reads the marker **before** the due check, so a cancelled job stops at
//! its next hop instead of hopping until it is due, and before the claim, so it never runs. The first
//! send time comes from the deferral record (a hop's copy keeps it) or SQS's `SentTimestamp`; the cancel
//! time from the canceller's clock, so a re-send within the clock skew of a cancel may go either way.
//!
//! The marker is written through the store's own conditional claim with a lease that has already
//! ended, so the next cancel of the same key can claim it again and move the time forward (never
//! back); the time travels in the record's `validation` field, which no job record of this id uses. It
//! lives [`CANCEL_MARKER_TTL`]: longer than any message sent before it can live (a delay of at most 14
//! days, then a DLQ copy's 14 days).
//!
//! Reading the marker costs one `GetItem` per hop of a delayed job, and one when it comes due. If the
//! store cannot be read, a hop goes on (nothing runs) and a due job is deferred (fail closed).
//!
//! A job tracked by its producer (`sent`) gets the `cancelled` status on its record through the tracking
//! port, written so the record stays free for the next job with the key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus, StoreError, idempotency_key,
};
use crate::limits::MAX_DELAY;
use crate::message::{DeferralRecord, Message};
use crate::outcome::epoch_millis;
use crate::record_key::{KeySource, KeyStyle};
use crate::tracking::{JobChange, JobStatus};

/// Message attribute of a job due later than SQS's 15-minute delay: the due time, epoch milliseconds.
pub const DUE_ATTRIBUTE: &str = "conveyor.due";
/// The prefix of a cancel marker's record id: `conveyor:cancel#<the job's record id>`.
pub const CANCEL_KEY_PREFIX: &str = "conveyor:cancel#";
/// How long a cancel marker lasts: a delay (at most 14 days) plus a DLQ copy's retention (14 days),
/// and a day of margin.
pub(crate) const CANCEL_MARKER_TTL: Duration = Duration::from_secs(29 * 24 * 3600);
/// The marker's `validation` field: this prefix, then the cancel time in epoch milliseconds.
const MARKER_PREFIX: &str = "cancelled-before:";
/// How early a job may run before its due time: a hop shorter than this is not worth a request.
pub(crate) const DUE_TOLERANCE: Duration = Duration::from_millis(500);
/// SQS's longest message retention: no delay may be longer.
pub const MAX_TOTAL_DELAY: Duration = Duration::from_secs(14 * 24 * 3600);

/// The wall clock the pipeline judges due times by: `SystemTime::now` unless a test shifts it.
pub type Clock = std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system clock.
pub(crate) fn system_clock() -> Clock {
    std::sync::Arc::new(crate::wall_clock::now)
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

/// When the job `message` carries was first sent: its deferral record's time (a hop or a deferred
/// copy keeps it), else SQS's `SentTimestamp`.
pub fn first_sent(message: &Message) -> Option<SystemTime> {
    DeferralRecord::of(message)
        .and_then(|record| record.first_sent_ms)
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .or(message.sent_at)
}

/// The cancel marker's record id for a job whose record id is `record_key`.
pub fn cancel_marker_key(record_key: &str) -> String {
    format!("{CANCEL_KEY_PREFIX}{record_key}")
}

/// The time before which jobs of `record_key` are cancelled, if a live marker says so.
pub async fn cancelled_before(
    store: &dyn IdempotencyStore,
    record_key: &str,
    now: SystemTime,
) -> Result<Option<SystemTime>, StoreError> {
    let Some(record) = store.get(&cancel_marker_key(record_key)).await? else {
        return Ok(None);
    };
    if record.expires_at < now {
        return Ok(None);
    }
    Ok(record
        .validation
        .as_deref()
        .and_then(|text| text.strip_prefix(MARKER_PREFIX))
        .and_then(|ms| ms.parse::<u64>().ok())
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms))))
}

/// What the cancel check found for a delayed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelCheck {
    /// Not delayed, or no marker covers it.
    Live,
    /// Sent before a cancel: drop it.
    Cancelled,
    /// The marker could not be read.
    Unknown(StoreError),
}

/// Whether the delayed `message` (record id `record_key`) was cancelled (see the design note).
pub(crate) async fn check_cancelled(
    store: &dyn IdempotencyStore,
    record_key: &str,
    message: &Message,
    now: SystemTime,
) -> CancelCheck {
    if due_at(message).is_none() {
        return CancelCheck::Live;
    }
    let cutoff = match cancelled_before(store, record_key, now).await {
        Ok(Some(cutoff)) => cutoff,
        Ok(None) => return CancelCheck::Live,
        Err(error) => return CancelCheck::Unknown(error),
    };
    match first_sent(message) {
        Some(sent) if sent < cutoff => CancelCheck::Cancelled,
        Some(_) => CancelCheck::Live,
        None => {
            tracing::warn!(key = %record_key, "a cancel marker exists but the message has no send time; running it");
            CancelCheck::Live
        }
    }
}

/// What [`cancel`] found. In every case, the delayed jobs of the key sent before the cancel are
/// dropped when they next hop or come due; jobs sent after it run.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Nothing of the key runs now: its pending delayed jobs are dropped.
    Cancelled,
    /// A job of the key completed before (its record says so): the pending ones are dropped.
    AlreadyCompleted,
    /// A job of the key runs now under a live claim: that run is not stopped (its retries are dropped).
    Running,
}

/// Why [`cancel`] failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CancelError {
    /// The store failed; nothing is cancelled (try again).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The handler's key style builds the record id from a body field, which a key string cannot
    /// stand for.
    #[error(
        "cannot cancel by key: the handler's Powertools key style hashes the body field `{0}`; cancel with a \
         key style whose source is the producer key or the message id"
    )]
    BodyFieldKey(String),
}

/// The record id of the job of `job_type` with `key` (a producer key; the message id when the style's
/// source is the message id) in `style`.
pub fn record_key_for(style: &KeyStyle, job_type: &str, key: &str) -> Result<String, CancelError> {
    match style {
        KeyStyle::Powertools(powertools) => match &powertools.source {
            KeySource::BodyField(field) => Err(CancelError::BodyFieldKey(field.clone())),
            KeySource::MessageId | KeySource::ProducerKey => Ok(format!(
                "{}#{}",
                powertools.prefix,
                powertools.flavor.hash(&Value::String(key.to_owned()))
            )),
        },
        _ => Ok(idempotency_key(job_type, Some(key), "")),
    }
}

/// Cancels the delayed jobs of `job_type` with `key` sent before now (see the module's design note).
pub async fn cancel(
    store: &dyn IdempotencyStore,
    style: &KeyStyle,
    job_type: &str,
    key: &str,
) -> Result<Cancelled, CancelError> {
    cancel_at(store, style, job_type, key, crate::wall_clock::now()).await
}

/// [`cancel`] at `now` (the simulator's virtual clock).
#[doc(hidden)]
pub async fn cancel_at(
    store: &dyn IdempotencyStore,
    style: &KeyStyle,
    job_type: &str,
    key: &str,
    now: SystemTime,
) -> Result<Cancelled, CancelError> {
    let record_key = record_key_for(style, job_type, key)?;
    write_marker(store, &record_key, now).await?;
    let found = match store.get(&record_key).await? {
        Some(record) if record.is_free_at(now) => Cancelled::Cancelled,
        Some(record) if record.status == RecordStatus::Completed => Cancelled::AlreadyCompleted,
        Some(_) => Cancelled::Running,
        None => Cancelled::Cancelled,
    };
    if found == Cancelled::Cancelled {
        mark_tracked_cancelled(store, &record_key, job_type, now).await;
    }
    tracing::info!(job_type, key = %record_key, outcome = ?found, "delayed jobs sent before now cancelled");
    Ok(found)
}

/// Writes (or moves forward) the marker of `record_key` to `now`.
async fn write_marker(
    store: &dyn IdempotencyStore,
    record_key: &str,
    now: SystemTime,
) -> Result<(), StoreError> {
    let marker = cancel_marker_key(record_key);
    let previous = cancelled_before(store, record_key, now).await?;
    let cutoff = previous.map_or(now, |previous| previous.max(now));
    let request = ClaimRequest {
        key: marker.clone(),
        // Already ended: the next cancel claims the marker again.
        lease_until: UNIX_EPOCH + Duration::from_millis(1),
        expires_at: now + CANCEL_MARKER_TTL,
        validation: Some(format!("{MARKER_PREFIX}{}", epoch_millis(cutoff))),
        restart_runs: true,
        last_attempt: false,
    };
    match store.claim(&request).await? {
        ClaimOutcome::Acquired(_) => Ok(()),
        // Only another marker write holds it (never past its ended lease): try once more.
        ClaimOutcome::Exists(_) => match store.claim(&request).await? {
            ClaimOutcome::Acquired(_) => Ok(()),
            ClaimOutcome::Exists(_) => Err(StoreError::Unavailable {
                message: format!("the cancel marker {marker} is being written by another cancel; try again"),
            }),
        },
    }
}

/// A tracked job recorded as `sent` gets the `cancelled` status, written as a completion that has
/// already expired, so the next job with the key claims the record as free (its runs counted from 1).
async fn mark_tracked_cancelled(
    store: &dyn IdempotencyStore,
    record_key: &str,
    job_type: &str,
    now: SystemTime,
) {
    let Ok(Some(job)) = store.job(record_key).await else {
        return;
    };
    if job.status != JobStatus::Sent {
        return;
    }
    let request = ClaimRequest {
        key: record_key.to_owned(),
        lease_until: now + Duration::from_secs(30),
        expires_at: now + Duration::from_secs(60),
        validation: None,
        restart_runs: true,
        last_attempt: false,
    };
    let change = JobChange {
        at: now,
        ..JobChange::now(job_type, JobStatus::Cancelled, 0)
    };
    let Ok(ClaimOutcome::Acquired(claim)) = store.claim_tracked(&request, &change).await else {
        return;
    };
    let expired = now.checked_sub(Duration::from_secs(2)).unwrap_or(UNIX_EPOCH);
    if let Err(error) = store.complete_tracked(&claim, None, expired, &change).await {
        tracing::warn!(%error, key = %record_key, "could not record the cancelled status");
    }
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
    fn the_cancel_marker_follows_the_handlers_key_style() {
        use crate::record_key::{PowertoolsFlavor, PowertoolsKey};
        let mut message = Message::new("m-1", r#"{"order_id": 7}"#);
        message.attributes.insert(
            crate::message::IDEMPOTENCY_KEY_ATTRIBUTE.into(),
            AttributeValue::string("report:7"),
        );
        let powertools = |source| {
            KeyStyle::Powertools(PowertoolsKey {
                flavor: PowertoolsFlavor::Python,
                prefix: "fn.app.handle".into(),
                source,
            })
        };
        for style in [KeyStyle::Conveyor, powertools(KeySource::ProducerKey)] {
            assert_eq!(
                record_key_for(&style, "report", "report:7").unwrap(),
                style.key("report", &message).unwrap(),
                "{style:?}"
            );
        }
        let by_field = powertools(KeySource::BodyField("order_id".into()));
        let error = record_key_for(&by_field, "report", "7").unwrap_err();
        assert!(error.to_string().contains("order_id"), "{error}");
        assert_eq!(
            cancel_marker_key("conveyor:report#report:7"),
            "conveyor:cancel#conveyor:report#report:7"
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
