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

/// Sets the visibility of `messages` (all of `queue`) to the queue's visibility timeout, at least
/// `needed`, in one batch call (ten per request), waiting at most until `wait_until`.
///
/// Returns the indexes (in `messages`) of the records SQS refused as [`EntryError::LeaseLost`]: no
/// longer in flight under this receipt, so the invocation must not run them (see the design note on
/// records refused as no longer ours). Any other outcome (another refusal, an error, no answer in time)
/// lists none: those records run on what they have left.
pub(crate) async fn cover(
    queue: &dyn Queue,
    messages: &[&Message],
    needed: Duration,
    wait_until: Instant,
) -> Vec<usize> {
    if messages.is_empty() {
        return Vec::new();
    }
    let timeout = queue.visibility_timeout().max(needed);
    let changes: Vec<VisibilityChange> = messages
        .iter()
        .map(|message| VisibilityChange {
            receipt_handle: message.receipt_handle.clone(),
            timeout,
        })
        .collect();
    let refused = match tokio::time::timeout_at(wait_until, queue.change_visibility_batch(&changes)).await {
        Ok(Ok(refused)) => refused,
        Ok(Err(error)) => {
            tracing::warn!(
                queue = %queue.name(),
                %error,
                records = messages.len(),
                "could not renew the visibility of records received earlier; they run on what they have left"
            );
            return Vec::new();
        }
        Err(_) => {
            tracing::warn!(
                queue = %queue.name(),
                records = messages.len(),
                "renewing the visibility of records received earlier did not answer in time; starting them anyway"
            );
            return Vec::new();
        }
    };
    let mut lost = Vec::new();
    for failure in refused {
        let message_id = messages
            .get(failure.index)
            .map_or("?", |message| message.id.as_str());
        if matches!(failure.error, EntryError::LeaseLost(_)) && failure.index < messages.len() {
            tracing::warn!(
                message_id,
                error = %failure.error,
                "a record's visibility ended before the invocation: it is no longer ours (received again \
                 elsewhere, deleted or moved to the DLQ); not running it"
            );
            lost.push(failure.index);
            continue;
        }
        tracing::warn!(
            message_id,
            error = %failure.error,
            "could not renew the visibility of a record received earlier; it runs on what it has left"
        );
    }
    tracing::debug!(
        queue = %queue.name(),
        records = messages.len(),
        lost = lost.len(),
        timeout_s = timeout.as_secs(),
        "renewed the visibility of records that may have been received long before the invocation"
    );
    lost
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
