//! A token bucket: the rate limiter of the worker's per-job-type and per-tenant limits.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket: `per_second` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket that starts full.
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            per_second: per_second.max(f64::MIN_POSITIVE),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Reserves a token; returns how long to wait before using it (zero when one was saved up).
    pub fn reserve(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let (tokens, last) = *state;
        let refilled = (tokens + (now - last).as_secs_f64() * self.per_second).min(self.burst);
        let left = refilled - 1.0;
        *state = (left, now);
        if left >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-left / self.per_second)
    }

    /// Gives back a reserved token that was not used.
    pub fn give_back(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = (state.0 + 1.0).min(self.burst);
    }

    /// True when the bucket has refilled to its burst: forgetting it loses nothing.
    pub fn is_full(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (tokens, last) = *state;
        tokens + last.elapsed().as_secs_f64() * self.per_second >= self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn token_bucket_spends_the_burst_then_paces() {
        let bucket = TokenBucket::new(2.0, 2);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::from_millis(500));
        assert_eq!(bucket.reserve(), Duration::from_millis(1000));
        bucket.give_back();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert!(
            bucket.reserve() > Duration::ZERO,
            "the burst caps what is saved up"
        );
    }
}
