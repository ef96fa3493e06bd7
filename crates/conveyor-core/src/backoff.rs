//! Retry delays: a retry budget spread over the attempts the redrive policy allows, exponential, with
//! full jitter.
//!
//! # The arithmetic
//!
//! A queue whose redrive policy allows `N` receives (`maxReceiveCount`) gives a failing job `N` runs and
//! `N - 1` waits between them. The ceilings of those waits double: `c_k = b * 2^(k-1)` for the k-th
//! failure, with `b` chosen so that they add up to twice the budget:
//!
//! ```text
//! b = 2 * budget / (2^(N-1) - 1)
//! ```
//!
//! Each wait is drawn uniformly in `[0, c_k]` ("full jitter", as in AWS's architecture blog), so a
//! provider that was down is not hit by every retry at once when it comes back, and the waits add up
//! to the budget on average (at most twice it). With the default budget of 15 minutes and SQS's usual
//! `maxReceiveCount` of 5: ceilings of 2, 4, 8 and 16 minutes, about 15 minutes of retrying in all.
//! A queue without a redrive policy retries forever; the spread then assumes
//! [`crate::defaults::MAX_RECEIVE_COUNT`] attempts and later failures wait up to the
//! last ceiling. No wait exceeds SQS's 12-hour visibility limit (the worker also keeps it within 12 hours
//! of the receive).
//!
//! # Jitter for the runtimes' own pauses
//!
//! The runtimes' pauses between tries of an AWS call, their deferrals after an outage and their waits
//! for a breaker are drawn with the functions below (`conveyor_core::runtime`), so each kind of jitter is
//! written once: [`full_jitter`] (uniform in `[0, ceiling]`), [`equal_jitter`] (half fixed, half random:
//! no pause near zero) and [`added_jitter`] (a delay plus up to some extra); [`doubling`] gives the
//! ceiling after the n-th failure in a row. Every draw comes from fastrand's thread-local generator, which the
//! simulator seeds (`conveyor-sim`), so a seed replays the same waits.

use std::time::Duration;

use crate::defaults::MAX_RECEIVE_COUNT;
use crate::limits::MAX_VISIBILITY_TIMEOUT;

/// How long a failing job keeps being retried, spread over the attempts the redrive policy allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The time the retries of one job take on average (full jitter: at most twice this).
    pub budget: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            budget: crate::defaults::RETRY_BUDGET,
        }
    }
}

/// The largest number of waits the doubling is spread over (2^30 already exceeds any budget's use).
const MAX_SPREAD: u32 = 30;

impl Backoff {
    /// A backoff with this retry budget.
    pub fn with_budget(budget: Duration) -> Self {
        Self { budget }
    }

    /// The largest wait after the failure of run `attempt` (1 = first) when the queue allows
    /// `max_attempts` runs (its `maxReceiveCount`; `None`: no redrive policy).
    pub fn ceiling(&self, attempt: u32, max_attempts: Option<u32>) -> Duration {
        let waits = max_attempts
            .unwrap_or(MAX_RECEIVE_COUNT)
            .saturating_sub(1)
            .clamp(1, MAX_SPREAD);
        let first = self
            .budget
            .saturating_mul(2)
            .div_f64(f64::from((1u32 << waits) - 1));
        let k = attempt.clamp(1, waits);
        first.saturating_mul(1u32 << (k - 1)).min(MAX_VISIBILITY_TIMEOUT)
    }

    /// A wait for the failure of run `attempt`, drawn with full jitter.
    pub fn delay(&self, attempt: u32, max_attempts: Option<u32>) -> Duration {
        full_jitter(self.ceiling(attempt, max_attempts))
    }

    /// The wait for a given random draw in `[0, 1)`; [`Backoff::delay`] draws it.
    pub fn delay_with(&self, attempt: u32, max_attempts: Option<u32>, draw: f64) -> Duration {
        self.ceiling(attempt, max_attempts).mul_f64(draw.clamp(0.0, 1.0))
    }
}

/// A wait drawn uniformly in `[0, ceiling]` ("full jitter"): the widest spread, for retries that may
/// wait as little as nothing.
pub(crate) fn full_jitter(ceiling: Duration) -> Duration {
    ceiling.mul_f64(fastrand::f64())
}

/// A wait of half `ceiling` plus up to the other half, drawn uniformly ("equal jitter"): a fleet, or
/// the messages put back together after an outage, do not come back in step, and no pause is near zero.
pub fn equal_jitter(ceiling: Duration) -> Duration {
    ceiling / 2 + (ceiling / 2).mul_f64(fastrand::f64())
}

/// `delay` plus up to `extra`, drawn uniformly: a wait that must last at least `delay` (a breaker's
/// open time), spread so the messages it holds back do not all come back in the same second.
pub fn added_jitter(delay: Duration, extra: Duration) -> Duration {
    delay.saturating_add(extra.mul_f64(fastrand::f64()))
}

/// The ceiling of the pause after the `failures`-th failure in a row (1 = first): `first`, doubled for
/// each failure after the first, at most `cap`.
pub fn doubling(first: Duration, failures: u32, cap: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(MAX_DOUBLINGS);
    first.saturating_mul(1 << exponent).min(cap)
}

/// The most doublings [`doubling`] applies (2^16 times any first pause is past every cap in use).
const MAX_DOUBLINGS: u32 = 16;

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_default_budget_spreads_over_five_receives() {
        let backoff = Backoff::default();
        let ceilings: Vec<Duration> = (1..=4).map(|n| backoff.ceiling(n, Some(5))).collect();
        assert_eq!(ceilings, vec![2 * MINUTE, 4 * MINUTE, 8 * MINUTE, 16 * MINUTE]);
        let total: Duration = ceilings.iter().sum();
        assert_eq!(
            total / 2,
            backoff.budget,
            "the waits add up to the budget on average"
        );
        assert_eq!(
            backoff.ceiling(9, Some(5)),
            16 * MINUTE,
            "past the policy: the last ceiling"
        );
    }

    #[test]
    fn the_budget_follows_the_redrive_policy() {
        let backoff = Backoff::with_budget(Duration::from_secs(3600));
        for attempts in [2u32, 3, 10, 50] {
            let total: Duration = (1..attempts).map(|n| backoff.ceiling(n, Some(attempts))).sum();
            let expected = Duration::from_secs(7200);
            let off = total.abs_diff(expected);
            assert!(
                off < Duration::from_secs(2) || attempts > MAX_SPREAD,
                "{attempts}: {total:?}"
            );
        }
        assert_eq!(
            backoff.ceiling(1, None),
            backoff.ceiling(1, Some(MAX_RECEIVE_COUNT))
        );
        assert_eq!(
            backoff.ceiling(1, Some(1)),
            Duration::from_secs(7200),
            "one wait gets it all"
        );
    }

    #[test]
    fn never_past_twelve_hours() {
        let backoff = Backoff::with_budget(Duration::from_secs(100 * 3600));
        assert_eq!(backoff.ceiling(u32::MAX, Some(3)), MAX_VISIBILITY_TIMEOUT);
        assert!(backoff.delay(1000, None) <= MAX_VISIBILITY_TIMEOUT);
    }

    #[test]
    fn equal_jitter_keeps_half_and_draws_the_rest() {
        let ceiling = Duration::from_secs(2);
        let draws: Vec<Duration> = (0..200).map(|_| equal_jitter(ceiling)).collect();
        assert!(draws.iter().all(|pause| (ceiling / 2..=ceiling).contains(pause)));
        assert!(
            draws.iter().any(|pause| *pause < ceiling * 3 / 4),
            "never went low"
        );
        assert!(
            draws.iter().any(|pause| *pause > ceiling * 3 / 4),
            "never went high"
        );
    }

    #[test]
    fn added_jitter_never_shortens() {
        let delay = Duration::from_secs(30);
        let extra = Duration::from_secs(6);
        let draws: Vec<Duration> = (0..200).map(|_| added_jitter(delay, extra)).collect();
        assert!(draws.iter().all(|wait| (delay..=delay + extra).contains(wait)));
        assert!(draws.iter().any(|wait| *wait > delay + extra / 2));
    }

    #[test]
    fn doubling_starts_at_the_first_and_stops_at_the_cap() {
        let first = Duration::from_millis(200);
        let cap = Duration::from_secs(20);
        assert_eq!(doubling(first, 0, cap), first);
        assert_eq!(doubling(first, 1, cap), first);
        assert_eq!(doubling(first, 3, cap), first * 4);
        assert_eq!(doubling(first, 8, cap), cap);
        assert_eq!(doubling(first, u32::MAX, cap), cap);
    }

    #[test]
    fn full_jitter_spans_zero_to_ceiling() {
        let backoff = Backoff::default();
        let ceiling = backoff.ceiling(3, Some(5));
        assert_eq!(backoff.delay_with(3, Some(5), 0.0), Duration::ZERO);
        assert_eq!(backoff.delay_with(3, Some(5), 0.5), ceiling / 2);
        let draws: Vec<Duration> = (0..200).map(|_| backoff.delay(3, Some(5))).collect();
        assert!(draws.iter().all(|delay| *delay <= ceiling));
        assert!(
            draws.iter().any(|delay| *delay < ceiling / 2),
            "jitter never went low"
        );
        assert!(
            draws.iter().any(|delay| *delay > ceiling / 2),
            "jitter never went high"
        );
    }
}
