//! Trying a store write again through an outage: one schedule for every caller.
//!
//! The waits start at `first`, double up to `longest` ([`crate::backoff::doubling`], the schedule the
//! worker's queue calls use too) and are jittered ([`crate::backoff::equal_jitter`]). The tries end at
//! `give_up` (a wait that would pass it is not taken) or, for a worker, when its process stops. Only an outage ([`StoreError::Unavailable`]) is worth waiting out; a
//! refusal is a configuration error or a lost claim, and waiting changes neither.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::idempotency::StoreError;

/// The schedule of one write's tries (see the module's note).
#[derive(Debug)]
pub(crate) struct StoreRetry<'a> {
    first: Duration,
    longest: Duration,
    failures: u32,
    give_up: Instant,
    stop: Option<&'a CancellationToken>,
}

impl<'a> StoreRetry<'a> {
    /// Waits of `first`, doubled up to `longest`, until `give_up`.
    pub(crate) fn new(first: Duration, longest: Duration, give_up: Instant) -> Self {
        Self {
            first,
            longest,
            failures: 0,
            give_up,
            stop: None,
        }
    }

    /// Also ends the tries when `stop` is cancelled (the worker's hard stop).
    pub(crate) fn until_stopped(mut self, stop: &'a CancellationToken) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Waits before the next try after `error`: false, without waiting, when `error` is not an outage,
    /// when the wait would pass the give-up instant, or when the process stops meanwhile.
    pub(crate) async fn after(&mut self, error: &StoreError) -> bool {
        if !matches!(error, StoreError::Unavailable { .. }) {
            return false;
        }
        self.failures = self.failures.saturating_add(1);
        let pause =
            crate::backoff::equal_jitter(crate::backoff::doubling(self.first, self.failures, self.longest));
        if Instant::now() + pause > self.give_up {
            return false;
        }
        let Some(stop) = self.stop else {
            tokio::time::sleep(pause).await;
            return true;
        };
        tokio::select! {
            biased;
            () = tokio::time::sleep(pause) => true,
            () = stop.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage() -> StoreError {
        StoreError::Unavailable {
            message: "down".to_owned(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waits_double_up_to_the_longest_and_end_at_the_give_up_instant() {
        let start = Instant::now();
        let mut retry = StoreRetry::new(
            Duration::from_millis(100),
            Duration::from_millis(400),
            start + Duration::from_secs(2),
        );
        let mut tries = 0;
        while retry.after(&outage()).await {
            tries += 1;
        }
        // Waits of half to all of 100, 200, 400, 400, ... ms within 2 s: 6 tries (the longest waits)
        // to 11 (the shortest); without the cap 4 at most, without the doubling 20 at least.
        assert!((6..=11).contains(&tries), "{tries} tries");
        assert!(Instant::now() <= start + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_or_a_stop_ends_the_tries_at_once() {
        let give_up = Instant::now() + Duration::from_secs(60);
        let mut retry = StoreRetry::new(Duration::from_millis(100), Duration::from_secs(1), give_up);
        let refusal = StoreError::Misconfigured {
            message: "no such table".to_owned(),
        };
        assert!(!retry.after(&refusal).await);
        let stop = CancellationToken::new();
        stop.cancel();
        let mut retry =
            StoreRetry::new(Duration::from_secs(1), Duration::from_secs(1), give_up).until_stopped(&stop);
        let before = Instant::now();
        assert!(!retry.after(&outage()).await);
        assert_eq!(Instant::now(), before, "a stopped process does not wait");
    }
}
