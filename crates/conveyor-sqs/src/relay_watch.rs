//! The producer's look for a timer relay: a job kept in the timer table is sent only by a relay, so a
//! producer that keeps one warns when no relay was seen for the queue recently (see `conveyor_core`'s
//! timer note, "nothing waits silently").
//!
//! Cost: at most one read of the relay mark ([`Timers::relay_mark`], one eventually consistent
//! `GetItem` on DynamoDB) per producer per [`CHECK_EVERY`], and only while it keeps timers. The warning
//! is logged once, and again only after a look that saw a relay.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use conveyor_core::Timers;
use conveyor_core::port::RelayMark;
use tokio::time::Instant;

/// How often a producer reads the relay mark at most.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(600);

/// What a look at the relay mark found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sighting {
    /// A relay ran recently.
    Seen,
    /// No mark, or one too old: no relay runs for the queue.
    NotSeen(Option<RelayMark>),
}

/// Judges a mark read at `now`.
pub(crate) fn sighting(mark: Option<RelayMark>, now: SystemTime) -> Sighting {
    match mark {
        Some(mark) if mark.is_fresh(now) => Sighting::Seen,
        other => Sighting::NotSeen(other),
    }
}

/// One producer's state of the look.
#[derive(Debug, Default)]
pub(crate) struct RelayWatch {
    /// When the mark was last read.
    checked: Mutex<Option<Instant>>,
    /// Whether the warning was logged since a relay was last seen.
    warned: AtomicBool,
}

impl RelayWatch {
    /// Whether a look is due now (and, if so, records it as taken).
    fn due(&self) -> bool {
        let mut checked = self
            .checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if checked.is_some_and(|at| now < at + CHECK_EVERY) {
            return false;
        }
        *checked = Some(now);
        true
    }

    /// After `timers` kept a job: reads the relay mark when a look is due and warns once when no relay
    /// was seen. Never fails the send: a mark that cannot be read is logged at debug level.
    pub(crate) async fn look(&self, timers: &Timers, queue: &str) {
        if !timers.keeps_relay_marks() || !self.due() {
            return;
        }
        let mark = match timers.relay_mark().await {
            Ok(mark) => mark,
            Err(error) => {
                tracing::debug!(queue, %error, "cannot read the timer relay's mark");
                return;
            }
        };
        match sighting(mark, timers.now()) {
            Sighting::Seen => self.warned.store(false, Ordering::Relaxed),
            Sighting::NotSeen(mark) => {
                if self.warned.swap(true, Ordering::Relaxed) {
                    return;
                }
                let last_seen = mark.map_or_else(
                    || "never".to_owned(),
                    |mark| conveyor_core::runtime::format_time(mark.seen),
                );
                tracing::warn!(
                    queue,
                    last_seen = %last_seen,
                    "no timer relay has been seen for this queue recently: the jobs kept in the timer \
                     table are sent only by a relay, so they wait past their due time. Turn timers on in \
                     the consumers (conveyor::Pipeline::with_timers, which runs a conveyor::TimerRelay \
                     beside a worker; on Lambda, timer_relay = true in infra/modules/lambda-consumer), or \
                     send the due ones with `conveyor delays relay`"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_counts_while_its_lookahead_and_a_period_cover_now() {
        let seen = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mark = RelayMark {
            seen,
            lookahead: Duration::from_secs(60),
        };
        assert_eq!(
            sighting(Some(mark), seen + Duration::from_secs(150)),
            Sighting::Seen
        );
        assert_eq!(
            sighting(Some(mark), seen + Duration::from_secs(600)),
            Sighting::NotSeen(Some(mark))
        );
        assert_eq!(sighting(None, seen), Sighting::NotSeen(None));
    }
}
