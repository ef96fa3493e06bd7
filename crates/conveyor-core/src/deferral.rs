//! Putting a message back without running it, without spending one of its receives.
//!
//! # Design note: why a delayed copy, not a visibility change
//!
//! SQS counts every receive toward the redrive policy's `maxReceiveCount`, including receives whose
//! message the consumer only put back (circuit open, a key in progress on another worker, the store
//! unreachable). With a visibility change, a 7-minute outage of a downstream dead-letters jobs that
//! never ran. So a deferral sends a *delayed copy* of the message (`DelaySeconds` up to 15 minutes) and
//! then deletes the original: the copy starts again at receive count 1.
//!
//! The copy keeps what identifies the job and its history, in one attribute, `conveyor.deferral`
//! (JSON, see [`DeferralRecord`](crate::message::DeferralRecord)): the original message id (so the idempotency key of a job without a
//! producer key stays the same), the first-sent time, the runs so far and the deferrals so far. Body,
//! attributes, the trace header and the `MessageGroupId` (on a standard queue the tenant) are copied as
//! they are.
//!
//! Costs: one `SendMessage` per deferral (the delete rides in the batched deletes), and a new message
//! id on each copy. When the copy cannot be built (11 attributes, over 1 MiB, a FIFO queue, whose
//! order a copy would break) the runtime falls back to a visibility change, or keeps the message in
//! flight until it may run, and says so.
//!
//! Order matters: the copy is sent first and the original deleted only after the send succeeded. A
//! crash between the two leaves both: the original comes back and is deferred or run again, and its
//! idempotency record makes the second run a duplicate.

use std::time::{Duration, SystemTime};

use crate::limits::{MAX_DELAY, MAX_MESSAGE_ATTRIBUTES, MAX_MESSAGE_BYTES};
use crate::message::{AttributeValue, DEFERRAL_ATTRIBUTE, DeferralRecord, Message, attributes_size};
use crate::outcome::{DeferCause, Failure, Origin, Outcome, epoch_millis};
use crate::queue::OutgoingMessage;

/// Why a deferred copy cannot be built; the runtime falls back and logs this.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeferralError {
    /// FIFO queues: a copy would go behind the rest of its group.
    #[error("a copy on a FIFO queue would break the group's order")]
    Fifo,
    /// The message already has 10 attributes and is not a deferred copy.
    #[error("the message has {0} attributes; the deferral record would be one too many")]
    TooManyAttributes(usize),
    /// The copy with its record would be over 1 MiB.
    #[error("the copy with its deferral record would be {0} bytes, over SQS's 1 MiB")]
    TooLarge(usize),
}

/// The delayed copy that defers `message` by `delay` (at most SQS's 15 minutes: a longer deferral
/// comes back and is deferred again) without counting this receive as a run.
pub fn deferred_copy(
    message: &Message,
    delay: Duration,
    fifo: bool,
) -> Result<OutgoingMessage, DeferralError> {
    copy_with_history(message, delay, fifo, None, None)
}

/// [`deferred_copy`] for a deferral the pipeline or the runtime decided for `cause` at `now` (the
/// pipeline's clock, [`Pipeline::now`](crate::Pipeline::now)): the copy's record says since when the job
/// has been waiting for it, so that [`past_its_bound`] can end the wait.
pub fn deferred_copy_for(
    message: &Message,
    delay: Duration,
    fifo: bool,
    cause: DeferCause,
    now: SystemTime,
) -> Result<OutgoingMessage, DeferralError> {
    copy_with_history(message, delay, fifo, None, Some((cause, now)))
}

/// A deferral of a job for a cause it has been waiting on, without a run, longer than the cause's
/// bound ([`DeferCause::bound`]) becomes a dead-lettering with the cause, its age and what to do (issue
/// 51, rule 4: every deferral of a job that did not run is bounded per cause). Any other outcome is
/// returned as it is. The wait is counted from the first deferred copy for that cause
/// ([`DeferralRecord::waiting_since_ms`]), so a delay's hops before it and a run in between never count.
pub fn past_its_bound(message: &Message, outcome: Outcome, origin: Origin<'_>, now: SystemTime) -> Outcome {
    let Outcome::Defer { reason, cause, .. } = &outcome else {
        return outcome;
    };
    let Some(bound) = cause.bound() else {
        return outcome;
    };
    let Some(record) = DeferralRecord::of(message) else {
        return outcome;
    };
    let (Some(waiting_for), Some(since_ms)) = (&record.waiting_for, record.waiting_since_ms) else {
        return outcome;
    };
    let waited = Duration::from_millis(epoch_millis(now).saturating_sub(since_ms));
    if waiting_for != cause.name() || waited < bound {
        return outcome;
    }
    let error = format!(
        "not run: {reason}, at every try for {} (a deferral for this cause may last {}); {}",
        humantime_minutes(waited),
        humantime_minutes(bound),
        cause.advice()
    );
    tracing::error!(
        cause = cause.name(),
        waited_secs = waited.as_secs(),
        "a deferral past its bound: dead-lettering the job with its cause"
    );
    let mut failure = Failure::now(error, origin.attempt, origin.queue, origin.handler);
    failure.not_run = Some(cause.not_run());
    Outcome::Reject(failure)
}

/// `waited` in whole minutes, or hours past two hours, for a failure's text.
fn humantime_minutes(waited: Duration) -> String {
    let minutes = waited.as_secs() / 60;
    if minutes >= 120 {
        format!("{} h", minutes / 60)
    } else {
        format!("{minutes} min")
    }
}

/// The delayed copy that retries `message` after `delay` when the message itself can no longer be
/// held that long (SQS's 12 hours of visibility, counted from its first receive, are nearly spent, or
/// this was its last allowed receive, [`retry_path`](crate::outcome::retry_path)): like
/// [`deferred_copy`], but this receive ran the job, and the copy carries `runs`, the runs so far
/// ([`run_number`](crate::pipeline::run_number)), this one included.
pub fn retried_copy(
    message: &Message,
    delay: Duration,
    fifo: bool,
    runs: u32,
) -> Result<OutgoingMessage, DeferralError> {
    copy_with_history(message, delay, fifo, Some(runs), None)
}

/// What the copy waits for: nothing after a run; the same as before for a deferral of the same cause
/// or of no known cause (one the runtime made: out of time, at shutdown); else the new cause.
fn waiting_for(
    previous: Option<&DeferralRecord>,
    runs: Option<u32>,
    cause: Option<(DeferCause, SystemTime)>,
) -> Option<String> {
    if runs.is_some() {
        return None;
    }
    match cause {
        Some((cause, _)) => Some(cause.name().to_owned()),
        None => previous.and_then(|record| record.waiting_for.clone()),
    }
}

/// Since when the copy waits (see [`waiting_for`]): kept while the cause stays, `now` for a new one.
fn waiting_since(
    previous: Option<&DeferralRecord>,
    runs: Option<u32>,
    cause: Option<(DeferCause, SystemTime)>,
) -> Option<u64> {
    if runs.is_some() {
        return None;
    }
    let kept = previous.and_then(|record| record.waiting_since_ms);
    let Some((cause, now)) = cause else {
        return kept;
    };
    let same = previous.is_some_and(|record| record.waiting_for.as_deref() == Some(cause.name()));
    match (same, kept) {
        (true, Some(since)) => Some(since),
        _ => Some(epoch_millis(now)),
    }
}

/// `runs`: the runs so far when this receive ran the job; `None` for a deferral (this receive did not
/// run it, and the receives before it on this copy did). `cause`: what a deferral waits for, when known.
fn copy_with_history(
    message: &Message,
    delay: Duration,
    fifo: bool,
    runs: Option<u32>,
    cause: Option<(DeferCause, SystemTime)>,
) -> Result<OutgoingMessage, DeferralError> {
    if fifo {
        return Err(DeferralError::Fifo);
    }
    let previous = DeferralRecord::of(message);
    let record = DeferralRecord {
        original_id: previous
            .as_ref()
            .map_or_else(|| message.id.clone(), |record| record.original_id.clone()),
        first_sent_ms: previous
            .as_ref()
            .and_then(|record| record.first_sent_ms)
            .or_else(|| message.sent_at.map(epoch_millis)),
        // A retry knows its runs; a deferral counts the receives before this one on this copy as
        // runs (they ran the job, or failed it), and not this one.
        attempts: runs.unwrap_or_else(|| {
            previous.as_ref().map_or(0, |record| record.attempts) + message.receive_count.saturating_sub(1)
        }),
        deferrals: previous.as_ref().map_or(0, |record| record.deferrals) + 1,
        waiting_for: waiting_for(previous.as_ref(), runs, cause),
        waiting_since_ms: waiting_since(previous.as_ref(), runs, cause),
    };
    let mut attributes = message.attributes.clone();
    if !attributes.contains_key(DEFERRAL_ATTRIBUTE) {
        // The trace context gives way to the deferral record.
        crate::trace::make_room(&mut attributes, 1, MAX_MESSAGE_ATTRIBUTES);
    }
    let json = serde_json::to_string(&record).unwrap_or_default();
    attributes.insert(DEFERRAL_ATTRIBUTE.to_owned(), AttributeValue::string(json));
    if attributes.len() > MAX_MESSAGE_ATTRIBUTES {
        return Err(DeferralError::TooManyAttributes(message.attributes.len()));
    }
    let size = message.body.len() + attributes_size(&attributes);
    if size > MAX_MESSAGE_BYTES {
        return Err(DeferralError::TooLarge(size));
    }
    Ok(OutgoingMessage {
        body: message.body.clone(),
        attributes,
        delay: Some(delay.min(MAX_DELAY)),
        // A standard queue's MessageGroupId is the tenant (fair queues): the copy stays in its share.
        group_id: message.group_id.clone(),
        deduplication_id: None,
        trace_header: message.trace_header.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::message::IDEMPOTENCY_KEY_ATTRIBUTE;
    use crate::outcome::NotRun;

    /// When the job was first sent: the deferral record's time, else `SentTimestamp` (what the tests read
    /// back from a copy).
    fn first_sent(message: &Message) -> Option<SystemTime> {
        DeferralRecord::of(message)
            .and_then(|record| record.first_sent_ms)
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
            .or(message.sent_at)
    }

    fn received(id: &str, receive_count: u32) -> Message {
        let mut message = Message::new(id, "{\"to\":\"a@b\"}");
        message.receive_count = receive_count;
        message.sent_at = Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_000));
        message.trace_header = Some("Root=1-abc".into());
        message
    }

    fn as_received(copy: OutgoingMessage, id: &str, receive_count: u32) -> Message {
        let mut message = Message::new(id, copy.body);
        message.attributes = copy.attributes;
        message.receive_count = receive_count;
        message.sent_at = Some(SystemTime::UNIX_EPOCH + Duration::from_millis(99_000));
        message
    }

    #[test]
    fn a_copy_keeps_identity_history_and_trace() {
        let original = received("m-1", 3);
        let copy = deferred_copy(&original, Duration::from_secs(40 * 60), false).unwrap();
        assert_eq!(copy.delay, Some(MAX_DELAY), "capped at 15 minutes");
        assert_eq!(copy.trace_header.as_deref(), Some("Root=1-abc"));
        let first = as_received(copy, "m-2", 2);
        let record = DeferralRecord::of(&first).unwrap();
        assert_eq!(record.original_id, "m-1");
        assert_eq!(record.attempts, 2, "receives 1 and 2 ran; the third was deferred");
        assert_eq!(record.deferrals, 1);
        assert_eq!(first.original_id(), "m-1");
        assert_eq!(
            first.attempt(),
            4,
            "two runs before, this is the copy's second receive"
        );
        assert_eq!(first_sent(&first), original.sent_at);

        let again = deferred_copy(&first, Duration::from_secs(1), false).unwrap();
        let second = as_received(again, "m-3", 1);
        let record = DeferralRecord::of(&second).unwrap();
        assert_eq!(
            (record.original_id.as_str(), record.attempts, record.deferrals),
            ("m-1", 3, 2)
        );
        assert_eq!(
            first_sent(&second),
            original.sent_at,
            "the first copy's time survives"
        );
    }

    const ORIGIN: Origin<'static> = Origin {
        queue: "jobs",
        handler: "email",
        attempt: 1,
        receive: 1,
        max_attempts: Some(5),
    };

    fn deferral(cause: DeferCause) -> Outcome {
        Outcome::Defer {
            delay: Duration::from_secs(30),
            reason: "claim refused, the store is misconfigured: AccessDenied".to_owned(),
            cause,
        }
    }

    #[test]
    fn a_copy_says_since_when_it_waits_for_its_cause_and_a_run_ends_the_wait() {
        let original = received("m-1", 1);
        let first = deferred_copy_for(
            &original,
            Duration::ZERO,
            false,
            DeferCause::StoreUnreachable,
            SystemTime::now(),
        )
        .unwrap();
        let first = as_received(first, "m-2", 1);
        let record = DeferralRecord::of(&first).unwrap();
        assert_eq!(record.waiting_for.as_deref(), Some("store_unreachable"));
        let since = record.waiting_since_ms.unwrap();
        // The same cause keeps the start; a copy the runtime made without a cause keeps it too.
        let again = deferred_copy_for(
            &first,
            Duration::ZERO,
            false,
            DeferCause::StoreUnreachable,
            SystemTime::now(),
        )
        .unwrap();
        let again = as_received(again, "m-3", 1);
        assert_eq!(DeferralRecord::of(&again).unwrap().waiting_since_ms, Some(since));
        let unknown = as_received(deferred_copy(&again, Duration::ZERO, false).unwrap(), "m-4", 1);
        assert_eq!(
            DeferralRecord::of(&unknown).unwrap().waiting_since_ms,
            Some(since)
        );
        // Another cause starts its own wait; a run ends it.
        let other = deferred_copy_for(
            &unknown,
            Duration::ZERO,
            false,
            DeferCause::CircuitOpen,
            SystemTime::now(),
        )
        .unwrap();
        let other = as_received(other, "m-5", 1);
        assert_eq!(
            DeferralRecord::of(&other).unwrap().waiting_for.as_deref(),
            Some("circuit_open")
        );
        let retried = as_received(retried_copy(&other, Duration::ZERO, false, 1).unwrap(), "m-6", 1);
        let record = DeferralRecord::of(&retried).unwrap();
        assert_eq!((record.waiting_for, record.waiting_since_ms), (None, None));
    }

    #[test]
    fn a_deferral_past_its_causes_bound_is_dead_lettered_with_the_cause() {
        let original = received("m-1", 1);
        let copy = deferred_copy_for(
            &original,
            Duration::ZERO,
            false,
            DeferCause::StoreMisconfigured,
            SystemTime::now(),
        )
        .unwrap();
        let copy = as_received(copy, "m-2", 1);
        let now = SystemTime::now();
        let within = past_its_bound(&copy, deferral(DeferCause::StoreMisconfigured), ORIGIN, now);
        assert!(matches!(within, Outcome::Defer { .. }), "{within:?}");
        let later = now + Duration::from_secs(3601);
        let Outcome::Reject(failure) =
            past_its_bound(&copy, deferral(DeferCause::StoreMisconfigured), ORIGIN, later)
        else {
            panic!("an hour of a misconfigured store is past its bound")
        };
        assert_eq!(failure.not_run, Some(NotRun::StoreMisconfigured));
        assert!(
            failure.error.contains("AccessDenied") && failure.error.contains("permissions"),
            "names the cause and the fix: {}",
            failure.error
        );
        // An outage's bound is a day; another cause than the one waited for starts anew.
        let outage = past_its_bound(&copy, deferral(DeferCause::StoreUnreachable), ORIGIN, later);
        assert!(matches!(outage, Outcome::Defer { .. }));
        let not_due = past_its_bound(
            &copy,
            deferral(DeferCause::NotDue),
            ORIGIN,
            now + Duration::from_secs(400 * 86400),
        );
        assert!(
            matches!(not_due, Outcome::Defer { .. }),
            "a delay waits for its time"
        );
    }

    #[test]
    fn a_retried_copy_carries_the_runs_not_the_receives() {
        // Five receives, two of them runs (a message that waited unrun for three): the copy has three
        // runs left of five, not none.
        let original = received("m-1", 5);
        let copy = as_received(
            retried_copy(&original, Duration::from_secs(90), false, 2).unwrap(),
            "m-2",
            1,
        );
        assert_eq!(DeferralRecord::of(&copy).unwrap().attempts, 2);
        assert_eq!(copy.attempt(), 3, "the copy's first receive is the third run");
    }

    #[test]
    fn a_retried_copy_counts_the_receive_that_ran() {
        let original = received("m-1", 3);
        let copy = as_received(
            retried_copy(&original, Duration::from_secs(90), false, original.attempt()).unwrap(),
            "m-2",
            1,
        );
        assert_eq!(
            DeferralRecord::of(&copy).unwrap().attempts,
            3,
            "all three receives ran"
        );
        assert_eq!(copy.attempt(), 4, "the copy's first receive is the fourth run");
        assert_eq!(
            retried_copy(&original, Duration::ZERO, true, 1),
            Err(DeferralError::Fifo)
        );
    }

    #[test]
    fn a_producer_key_is_kept_as_it_is() {
        let mut original = received("m-1", 1);
        original.attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.into(),
            AttributeValue::string("user:42"),
        );
        let copy = deferred_copy(&original, Duration::from_secs(5), false).unwrap();
        let copy = as_received(copy, "m-2", 1);
        assert_eq!(copy.idempotency_key(), Some("user:42"));
    }

    #[test]
    fn fifo_full_and_large_messages_are_refused_with_the_reason() {
        let original = received("m-1", 1);
        assert_eq!(
            deferred_copy(&original, Duration::ZERO, true),
            Err(DeferralError::Fifo)
        );
        let mut full = received("m-1", 1);
        for i in 0..10 {
            full.attributes
                .insert(format!("a{i}"), AttributeValue::string("x"));
        }
        assert_eq!(
            deferred_copy(&full, Duration::ZERO, false),
            Err(DeferralError::TooManyAttributes(10))
        );
        let large = Message::new("m-1", "x".repeat(MAX_MESSAGE_BYTES - 10));
        assert!(matches!(
            deferred_copy(&large, Duration::ZERO, false),
            Err(DeferralError::TooLarge(_))
        ));
    }
}
