//! Protecting downstreams: per-job-type concurrency and rate limits, and circuit breakers.
//!
//! All three are keyed by job type (the handler's `JOB_TYPE`), configured on the [`Worker`](crate::Worker):
//!
//! - [`Worker::limit_job_type`](crate::Worker::limit_job_type): at most N jobs of that type run at once.
//! - [`Worker::rate_limit_job_type`](crate::Worker::rate_limit_job_type): at most R jobs per second start
//!   (a token bucket with a burst).
//! - [`Worker::circuit_breaker`](crate::Worker::circuit_breaker): one breaker per *downstream* (an email
//!   provider, a partner API), shared by the job types that call it. Handlers need no new API: a handler
//!   run that ends in a retry (a retryable error, a panic, a timeout) counts as a failure of its
//!   downstream; a success or a permanent error (the downstream answered) counts as a success.
//!
//! A message waiting for a concurrency slot or a rate token stays in flight (the heartbeat keeps it)
//! and holds its in-flight slot: waiting never costs a receive, so it never pushes a message towards
//! `maxReceiveCount`. Put a tightly limited job type on its own queue if it must not hold slots that
//! other job types could use. An open circuit cannot be waited out cheaply, so its messages go back
//! to the queue without running, visible again when the circuit will let a probe through; each such
//! deferral counts a receive, so size `maxReceiveCount` for the outages you want to ride out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub(crate) use conveyor_core::runtime::TokenBucket;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A circuit breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct BreakerSettings {
    /// Consecutive failures that open the circuit.
    pub failure_threshold: u32,
    /// How long the circuit stays open before one probe may run; doubles after each failed probe.
    pub open_for: Duration,
    /// The longest the circuit stays open between probes.
    pub max_open_for: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(5 * 60),
        }
    }
}

/// The protections configured for a worker.
#[derive(Debug, Default, Clone)]
pub(crate) struct Protections {
    pub(crate) concurrency: HashMap<String, usize>,
    pub(crate) rates: HashMap<String, (f64, u32)>,
    pub(crate) breakers: Vec<(String, Vec<String>, BreakerSettings)>,
}

/// The live protection state, shared by the message tasks.
#[derive(Debug, Default)]
pub(crate) struct Guards {
    concurrency: HashMap<String, Arc<Semaphore>>,
    rates: HashMap<String, Arc<TokenBucket>>,
    breakers: HashMap<String, Arc<Breaker>>,
}

impl Guards {
    pub(crate) fn new(protections: &Protections) -> Self {
        let concurrency = protections
            .concurrency
            .iter()
            .map(|(job_type, max)| (job_type.clone(), Arc::new(Semaphore::new((*max).max(1)))))
            .collect();
        let rates = protections
            .rates
            .iter()
            .map(|(job_type, (per_second, burst))| {
                (job_type.clone(), Arc::new(TokenBucket::new(*per_second, *burst)))
            })
            .collect();
        let mut breakers = HashMap::new();
        for (downstream, job_types, settings) in &protections.breakers {
            let breaker = Arc::new(Breaker::new(downstream, *settings));
            for job_type in job_types {
                breakers.insert(job_type.clone(), Arc::clone(&breaker));
            }
        }
        Self {
            concurrency,
            rates,
            breakers,
        }
    }

    /// True when nothing is configured (the hot path skips the lookups).
    pub(crate) fn is_empty(&self) -> bool {
        self.concurrency.is_empty() && self.rates.is_empty() && self.breakers.is_empty()
    }

    /// The job type's concurrency limit.
    pub(crate) fn concurrency(&self, job_type: &str) -> Option<Arc<Semaphore>> {
        self.concurrency.get(job_type).cloned()
    }

    /// The job type's rate limit.
    pub(crate) fn rate(&self, job_type: &str) -> Option<Arc<TokenBucket>> {
        self.rates.get(job_type).cloned()
    }

    /// The breaker of the job type's downstream.
    pub(crate) fn breaker(&self, job_type: &str) -> Option<Arc<Breaker>> {
        self.breakers.get(job_type).cloned()
    }
}

/// Waits for a job-type slot.
pub(crate) async fn acquire_slot(semaphore: Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    semaphore.acquire_owned().await.ok()
}

/// Whether a job may call its downstream now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed circuit: run.
    Run,
    /// Half-open: run as the one probe; report its result with `probe = true`.
    Probe,
    /// Open: do not run; try again after this long.
    Defer(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, open_for: Duration },
    HalfOpen { probing: bool, open_for: Duration },
}

/// One downstream's circuit breaker.
#[derive(Debug)]
pub(crate) struct Breaker {
    downstream: Arc<str>,
    settings: BreakerSettings,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(downstream: &str, settings: BreakerSettings) -> Self {
        Self {
            downstream: Arc::from(downstream),
            settings,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The downstream's name.
    pub(crate) fn downstream(&self) -> &Arc<str> {
        &self.downstream
    }

    /// Asks to call the downstream now.
    pub(crate) fn admit(&self) -> Admission {
        let now = Instant::now();
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Admission::Run,
            State::Open { until, open_for } if now >= until => {
                *state = State::HalfOpen {
                    probing: true,
                    open_for,
                };
                tracing::info!(downstream = %self.downstream, "circuit half-open: letting one probe through");
                Admission::Probe
            }
            State::Open { until, .. } => Admission::Defer(until - now),
            State::HalfOpen {
                probing: false,
                open_for,
            } => {
                *state = State::HalfOpen {
                    probing: true,
                    open_for,
                };
                Admission::Probe
            }
            // A probe is out; the others wait a little more than a typical probe takes.
            State::HalfOpen { probing: true, .. } => Admission::Defer(self.settings.open_for / 2),
        }
    }

    /// Records a handler run against the downstream.
    pub(crate) fn record(&self, probe: bool, success: bool) {
        let now = Instant::now();
        let mut state = self.lock();
        match (*state, success) {
            (_, true) => {
                if !matches!(*state, State::Closed { .. }) {
                    tracing::info!(downstream = %self.downstream, "circuit closed: the probe succeeded");
                }
                *state = State::Closed { failures: 0 };
            }
            (State::Closed { failures }, false) => {
                let failures = failures + 1;
                if failures < self.settings.failure_threshold {
                    *state = State::Closed { failures };
                    return;
                }
                tracing::warn!(
                    downstream = %self.downstream,
                    failures,
                    open_for = ?self.settings.open_for,
                    "circuit open: jobs for this downstream go back to the queue unrun until a probe succeeds"
                );
                *state = State::Open {
                    until: now + self.settings.open_for,
                    open_for: self.settings.open_for,
                };
            }
            (State::HalfOpen { open_for, .. }, false) if probe => {
                let open_for = (open_for * 2).min(self.settings.max_open_for);
                tracing::warn!(downstream = %self.downstream, ?open_for, "circuit probe failed; open again");
                *state = State::Open {
                    until: now + open_for,
                    open_for,
                };
            }
            // A run admitted before the circuit opened finished late: already counted as open.
            (_, false) => {}
        }
    }

    /// A probe ended without a verdict (a duplicate, a busy claim, a cancellation): let another probe.
    pub(crate) fn abandon_probe(&self) {
        let mut state = self.lock();
        if let State::HalfOpen { open_for, .. } = *state {
            *state = State::HalfOpen {
                probing: false,
                open_for,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            failure_threshold: 3,
            open_for: Duration::from_secs(10),
            max_open_for: Duration::from_secs(25),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_probes_once() {
        let breaker = Breaker::new("email", settings());
        breaker.record(false, false);
        breaker.record(false, false);
        breaker.record(false, true);
        assert_eq!(breaker.admit(), Admission::Run, "a success resets the count");
        for _ in 0..3 {
            breaker.record(false, false);
        }
        assert_eq!(breaker.admit(), Admission::Defer(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(breaker.admit(), Admission::Probe);
        assert!(
            matches!(breaker.admit(), Admission::Defer(_)),
            "only one probe at a time"
        );
        breaker.record(true, false);
        assert_eq!(
            breaker.admit(),
            Admission::Defer(Duration::from_secs(20)),
            "open time doubles"
        );
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(breaker.admit(), Admission::Probe);
        breaker.record(true, false);
        assert_eq!(
            breaker.admit(),
            Admission::Defer(Duration::from_secs(25)),
            "capped"
        );
        tokio::time::advance(Duration::from_secs(25)).await;
        assert_eq!(breaker.admit(), Admission::Probe);
        breaker.abandon_probe();
        assert_eq!(
            breaker.admit(),
            Admission::Probe,
            "an abandoned probe frees the slot"
        );
        breaker.record(true, true);
        assert_eq!(breaker.admit(), Admission::Run);
    }
}
