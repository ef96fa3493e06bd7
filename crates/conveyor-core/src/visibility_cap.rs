//! SQS's 12 hours of visibility, counted from a message's first receive: the one rule both runtimes
//! use to keep a visibility change within them.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::defaults::CLOCK_SKEW_ALLOWANCE;
use crate::limits::MAX_VISIBILITY_TIMEOUT;
use crate::message::Message;

/// When SQS's 12 hours of visibility end for `message`, received at `at` (`now` on the wall clock).
/// SQS counts them from the message's first receive (`ApproximateFirstReceiveTimestamp`), not from
/// this receipt: a message received again after a retry has less than 12 hours left, and SQS refuses
/// a visibility change past them ("Total VisibilityTimeout for the message is beyond the limit"). The
/// first receive is SQS's wall-clock time, so the clock skew allowance is taken off (earlier is safe).
/// A first receive 12 hours back or more leaves no room at all.
pub fn visibility_cap(message: &Message, at: Instant, now: SystemTime) -> Instant {
    let since_first = message.first_received_at.map_or(Duration::ZERO, |first| {
        now.duration_since(first).unwrap_or_default() + CLOCK_SKEW_ALLOWANCE
    });
    at + MAX_VISIBILITY_TIMEOUT.saturating_sub(since_first)
}

/// The longest visibility timeout a change that reaches SQS by `latest_call` may set for `message`
/// (see [`visibility_cap`]), measured now.
pub fn visibility_room(message: &Message, latest_call: Instant) -> Duration {
    let now = Instant::now();
    visibility_cap(message, now, crate::wall_clock::now()).saturating_duration_since(latest_call.max(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(ago: Duration) -> Message {
        let mut message = Message::new("m", "{}");
        message.first_received_at = SystemTime::now().checked_sub(ago);
        message
    }

    #[tokio::test(start_paused = true)]
    async fn the_visibility_cap_counts_from_the_first_receive_not_this_one() {
        let at = Instant::now();
        let now = SystemTime::now();
        let mut message = Message::new("m-1", "{}");
        assert_eq!(visibility_cap(&message, at, now), at + MAX_VISIBILITY_TIMEOUT);
        message.first_received_at = Some(now - Duration::from_secs(3 * 3600));
        let left = Duration::from_secs(9 * 3600) - CLOCK_SKEW_ALLOWANCE;
        assert_eq!(visibility_cap(&message, at, now), at + left);
        message.first_received_at = Some(now - Duration::from_secs(13 * 3600));
        assert_eq!(
            visibility_cap(&message, at, now),
            at,
            "past the limit: nothing left to extend"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_room_counts_from_the_first_receive_less_the_skew_and_the_latest_call() {
        let now = Instant::now();
        let message = received(Duration::from_secs(11 * 3600));
        let room = visibility_room(&message, now + Duration::from_secs(10));
        let expected = Duration::from_secs(3600) - CLOCK_SKEW_ALLOWANCE - Duration::from_secs(10);
        assert!(
            room <= expected && room + Duration::from_secs(1) >= expected,
            "{room:?}, expected about {expected:?}"
        );
        assert_eq!(
            visibility_room(&received(Duration::from_secs(13 * 3600)), now),
            Duration::ZERO,
            "past the 12 hours, none"
        );
        let unknown = Message::new("m", "{}");
        assert_eq!(visibility_room(&unknown, now), MAX_VISIBILITY_TIMEOUT);
    }
}
