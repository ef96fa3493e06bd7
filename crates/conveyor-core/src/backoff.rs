//! Exponential backoff with full jitter over the receive count.

use std::time::Duration;

use crate::limits::MAX_VISIBILITY_TIMEOUT;

/// Exponential backoff with full jitter: the n-th failure waits a random time in
/// `[0, min(cap, base * 2^(n-1))]` ("full jitter", as in AWS's architecture blog), so a provider that
/// was down is not hit by every retry at once when it comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first retry's delay.
    pub base: Duration,
    /// No delay exceeds this (and none exceeds SQS's 12-hour visibility limit).
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(15 * 60),
        }
    }
}

impl Backoff {
    /// The largest delay the `receive_count`-th delivery's failure may wait.
    pub fn ceiling(&self, receive_count: u32) -> Duration {
        let exponent = receive_count.saturating_sub(1).min(40);
        let ceiling = self.base.saturating_mul(1u32 << exponent.min(31)).min(self.cap);
        ceiling.min(MAX_VISIBILITY_TIMEOUT)
    }

    /// A delay for the failure of the `receive_count`-th delivery (1 = first), drawn with full jitter.
    pub fn delay(&self, receive_count: u32) -> Duration {
        self.delay_with(receive_count, fastrand::f64())
    }

    /// The delay for a given random draw in `[0, 1)`; [`Backoff::delay`] draws it.
    pub fn delay_with(&self, receive_count: u32, draw: f64) -> Duration {
        self.ceiling(receive_count).mul_f64(draw.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_then_caps() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(10),
        };
        let ceilings: Vec<u64> = (1..=6).map(|n| backoff.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn never_past_twelve_hours_even_for_huge_counts() {
        let backoff = Backoff {
            base: Duration::from_secs(3600),
            cap: Duration::from_secs(100 * 3600),
        };
        assert_eq!(backoff.ceiling(u32::MAX), MAX_VISIBILITY_TIMEOUT);
        assert!(backoff.delay(1000) <= MAX_VISIBILITY_TIMEOUT);
    }

    #[test]
    fn full_jitter_spans_zero_to_ceiling() {
        let backoff = Backoff {
            base: Duration::from_secs(4),
            cap: Duration::from_secs(60),
        };
        assert_eq!(backoff.delay_with(3, 0.0), Duration::ZERO);
        assert_eq!(backoff.delay_with(3, 0.5), Duration::from_secs(8));
        let draws: Vec<Duration> = (0..200).map(|_| backoff.delay(3)).collect();
        assert!(draws.iter().all(|delay| *delay <= Duration::from_secs(16)));
        assert!(
            draws.iter().any(|delay| *delay < Duration::from_secs(8)),
            "jitter never went low"
        );
        assert!(
            draws.iter().any(|delay| *delay > Duration::from_secs(8)),
            "jitter never went high"
        );
    }
}
