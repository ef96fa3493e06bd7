//! As a batch starts: the visibility of the records whose receive may be older than the invocation.
//!
//! # Design note: why, and how it is ordered
//!
//! A Lambda function has no heartbeat. It trusts that each record stays invisible until the invocation
//! is over: SQS counts the queue's visibility timeout from the receive that took the record, and the
//! function's time is shorter (the advice in `batch.rs`: at least six times longer). But the receive
//! and the invocation are not one moment: the event source mapping holds records for its batching
//! window (up to 300 s), an invocation waits for a concurrency slot or a cold start, a receive's answer
//! is slow to arrive. A record whose visibility ends while it runs is handed out again: the second
//! consumer finds its key in progress and defers it, and at its last allowed receive on a FIFO queue
//! (no copy can defer it there) it goes to the DLQ unrun while the first run still goes (simulator
//! seed 2450: a receive's answer held 55 s, a record started with 5 s of its 60 s left).
//!
//! So as the lanes start, every record that cannot be shown fresh gets its visibility set again:
//! to the queue's visibility timeout, and never less than the invocation's time left and the clock
//! skew allowance, so that it behaves as if received now. A record is shown fresh when this is its
//! first receive (`ApproximateReceiveCount` 1, so `ApproximateFirstReceiveTimestamp` is this receive's
//! time) and the visibility left, less the clock skew allowance, outlasts the invocation by the
//! allowance. A first receive at most the clock skew allowance old is taken as fresh without looking
//! at the queue ([`prompt`]): a queue whose visibility timeout does not outlast the function's time by
//! more is a configuration error the adapter reports. So with a prompt mapping no call is made, not
//! even to resolve the queue; a record received again (a retry, a redelivery) or held before the
//! invocation costs a share of one `ChangeMessageVisibilityBatch` (ten records per call, per queue).
//!
//! Ordering: the call goes out as the lanes start, so a slow SQS does not hold prompt records back;
//! a record that is not prompt waits for the call before it starts (until the invocation's cutoff:
//! one refused as no longer ours must not run, below), and a later visibility change of the same
//! source's records (a retry's backoff, a FIFO group's wait) waits until the cover is over, so the
//! cover never overwrites it. A change SQS refuses for another reason (throttled, a limit), an error,
//! or no answer by the cutoff leaves the record as it was, and it runs on what it has left.
//!
//! # Design note: a record refused as no longer ours never runs
//!
//! A change refused as [`EntryError::LeaseLost`] (the receipt is not the message's latest, or the
//! message is no longer in flight) proves the visibility already ended: the message was received again
//! elsewhere, deleted, or moved to the DLQ by the redrive policy, and on a FIFO queue the rest of its
//! group may have been received and run by then. Running it anyway would run it *after* its successors
//! (simulator seed 2601: a batch answered late and held 12 s before the invocation; its head was moved
//! to the DLQ at its fourth receive, a worker ran the next message of the group, then the invocation
//! ran the head). So such a record is not run and not touched again (no backoff, no DLQ copy: it is
//! not ours), and is listed, so the mapping does not delete it with a stale receipt; on a FIFO queue
//! the records behind it in its group are not run either (listed as behind a failed message). This is
//! the worker's rule too: its heartbeat cancels a run whose lease is lost.
//!
//! # Design note: a record whose handle SQS never issued runs
//!
//! A change refused as [`EntryError::NotIssued`] (SQS's `ReceiptHandleIsInvalid`: the handle is
//! malformed, or not one of the queue's) says something else: the record never came from a receive of
//! this queue. Lambda's own events never carry such a handle; a hand-written one does, the way
//! `cargo lambda invoke` is used with an event in the shape of `aws_lambda_events`' fixture
//! `example-sqs-event.json` (receipt handle `MessageReceiptHandle`, a first receive years ago). So the
//! invocation is not Lambda's own, and it answers as Lambda would for the same records: they run, and
//! no visibility call is made for them again (no backoff for a retry, no delete before the rest of a
//! FIFO group: SQS would refuse each), while a retry is still listed in `batchItemFailures` as usual.
//! One warning per invocation says so ([`warn_not_issued`]). A handle SQS did issue whose message is
//! no longer in flight is `LeaseLost`, above: not run. Which answer says which, on SQS and on the
//! emulators, is in `conveyor-sqs`'s `classify_entry` and pinned by `conveyor-testing`'s queue
//! conformance case `receipt_handles_sqs_never_issued`; moto answers `ReceiptHandleIsInvalid` for a
//! deleted message too, so on moto such a record runs (its idempotency claim still decides).

use std::time::{Duration, SystemTime};

use conveyor_core::message::Message;
use conveyor_core::port::{EntryError, Queue, VisibilityChange};
use conveyor_core::runtime::CLOCK_SKEW_ALLOWANCE;
use tokio::time::Instant;

/// How recent a first receive must be to count as prompt without the queue's visibility timeout.
pub(crate) const PROMPT: Duration = CLOCK_SKEW_ALLOWANCE;

/// True when `message` was taken by its first receive at most [`PROMPT`] ago (by `now`, this host's
/// wall clock): no longer ago than the clock skew allowance, so its visibility left is the queue's
/// visibility timeout, which the queue's settings already hold longer than the invocation
/// ([`crate::visibility_advice`]). Nothing else, not even the queue, is needed to skip it.
pub(crate) fn prompt(message: &Message, now: SystemTime) -> bool {
    message.receive_count <= 1
        && message
            .first_received_at
            .is_some_and(|received| now.duration_since(received).unwrap_or(Duration::ZERO) <= PROMPT)
}

/// True when `message` is known to stay invisible for `needed` more: its first receive (so SQS's
/// first-receive time is this receive's), received at most `visibility` less `needed` and the clock
/// skew allowance ago. `now` is this host's wall clock.
pub(crate) fn known_fresh(
    message: &Message,
    visibility: Duration,
    needed: Duration,
    now: SystemTime,
) -> bool {
    if message.receive_count > 1 {
        return false;
    }
    let Some(received) = message.first_received_at else {
        return false;
    };
    let age = now.duration_since(received).unwrap_or(Duration::ZERO);
    age + CLOCK_SKEW_ALLOWANCE + needed <= visibility
}

/// What the invocation needs a record to stay invisible for: until its deadline, and the clock skew
/// allowance past it (the idempotency claim's lease ends at the deadline).
pub(crate) fn needed_until(deadline: Instant, now: Instant) -> Duration {
    deadline.saturating_duration_since(now) + CLOCK_SKEW_ALLOWANCE
}

/// The records SQS refused a renewal, by index in the `messages` given to [`cover`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Refused as [`EntryError::LeaseLost`]: no longer ours, so not run (see the design note on
    /// records refused as no longer ours).
    pub(crate) lost: Vec<usize>,
    /// Refused as [`EntryError::NotIssued`]: SQS never issued the handle, so the invocation is not
    /// Lambda's own; they run, with no visibility call again (see the design note on such records).
    pub(crate) not_issued: Vec<usize>,
}

/// Sets the visibility of `messages` (all of `queue`) to the queue's visibility timeout, at least
/// `needed`, in one batch call (ten per request), waiting at most until `wait_until`.
///
/// Returns the records SQS refused as no longer in flight under this receipt, or as never issued
/// ([`Refused`]). Any other outcome (another refusal, an error, no answer in time) lists none: those
/// records run on what they have left.
pub(crate) async fn cover(
    queue: &dyn Queue,
    messages: &[&Message],
    needed: Duration,
    wait_until: Instant,
) -> Refused {
    let mut refused = Refused::default();
    if messages.is_empty() {
        return refused;
    }
    let timeout = queue.visibility_timeout().max(needed);
    // Within SQS's 12 hours from each message's first receive, which SQS would refuse to pass.
    let changes: Vec<VisibilityChange> = messages
        .iter()
        .map(|message| VisibilityChange {
            receipt_handle: message.receipt_handle.clone(),
            timeout: timeout.min(conveyor_core::runtime::visibility_room(message, wait_until)),
        })
        .collect();
    let failures = match tokio::time::timeout_at(wait_until, queue.change_visibility_batch(&changes)).await {
        Ok(Ok(failures)) => failures,
        Ok(Err(error)) => {
            tracing::warn!(
                queue = %queue.name(),
                %error,
                records = messages.len(),
                "could not renew the visibility of records received earlier; they run on what they have left"
            );
            return refused;
        }
        Err(_) => {
            tracing::warn!(
                queue = %queue.name(),
                records = messages.len(),
                "renewing the visibility of records received earlier did not answer in time; starting them anyway"
            );
            return refused;
        }
    };
    for failure in failures {
        let Some(message) = messages.get(failure.index) else {
            continue;
        };
        match &failure.error {
            EntryError::LeaseLost(_) => {
                tracing::warn!(
                    message_id = %message.id,
                    error = %failure.error,
                    "a record's visibility ended before the invocation: it is no longer ours (received again \
                     elsewhere, deleted or moved to the DLQ); not running it"
                );
                refused.lost.push(failure.index);
            }
            // Said once for the invocation ([`warn_not_issued`]).
            EntryError::NotIssued(_) => {
                tracing::debug!(message_id = %message.id, error = %failure.error, "a receipt handle SQS never issued");
                refused.not_issued.push(failure.index);
            }
            EntryError::Failed { .. } => tracing::warn!(
                message_id = %message.id,
                error = %failure.error,
                "could not renew the visibility of a record received earlier; it runs on what it has left"
            ),
        }
    }
    tracing::debug!(
        queue = %queue.name(),
        records = messages.len(),
        lost = refused.lost.len(),
        not_issued = refused.not_issued.len(),
        timeout_s = timeout.as_secs(),
        "renewed the visibility of records that may have been received long before the invocation"
    );
    refused
}

/// The one warning of an invocation with `records` records whose receipt handles SQS never issued
/// (`example`: one of their message ids).
pub(crate) fn warn_not_issued(records: usize, example: &str) {
    tracing::warn!(
        records,
        example_message_id = example,
        "SQS says it never issued the receipt handles of records in this event (ReceiptHandleIsInvalid): \
         the invocation is not Lambda's own (a hand-written test event, as with `cargo lambda invoke`); \
         running them, without visibility changes for them (no backoff for their retries, which are \
         still listed)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(receive_count: u32, ago: Option<Duration>, now: SystemTime) -> Message {
        let mut message = Message::new("m", "{}");
        message.receive_count = receive_count;
        message.first_received_at = ago.map(|ago| now - ago);
        message
    }

    #[test]
    fn only_a_first_receive_with_time_to_spare_is_fresh() {
        let now = SystemTime::now();
        let visibility = Duration::from_secs(60);
        let needed = Duration::from_secs(32);
        let fresh = |count, ago| known_fresh(&received(count, ago, now), visibility, needed, now);
        assert!(fresh(1, Some(Duration::from_secs(1))), "received a second ago");
        assert!(
            fresh(1, Some(Duration::from_secs(26))),
            "26 + 2 + 32 = 60: just covered"
        );
        assert!(
            !fresh(1, Some(Duration::from_secs(27))),
            "held 27 s: the visibility ends before the deadline"
        );
        assert!(
            !fresh(2, Some(Duration::from_secs(1))),
            "a second receive's own time is unknown"
        );
        assert!(!fresh(1, None), "no first-receive time");
        // A clock behind SQS's: a first receive "in the future" counts as just now.
        let ahead = received(1, None, now);
        let ahead = Message {
            first_received_at: Some(now + Duration::from_secs(5)),
            ..ahead
        };
        assert!(known_fresh(&ahead, visibility, needed, now));
        assert!(prompt(&ahead, now));
    }

    #[test]
    fn a_prompt_record_is_a_first_receive_within_the_skew_allowance() {
        let now = SystemTime::now();
        assert!(prompt(&received(1, Some(Duration::from_millis(1500)), now), now));
        assert!(!prompt(&received(1, Some(Duration::from_millis(2500)), now), now));
        assert!(!prompt(&received(2, Some(Duration::ZERO), now), now));
        assert!(!prompt(&received(1, None, now), now));
    }
}
