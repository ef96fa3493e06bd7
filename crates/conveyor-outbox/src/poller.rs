//! [`Poller`]: the long-running relay (the worker's background task, `conveyor outbox relay`). It holds
//! the store's lease, relays the pending aggregates oldest first, and publishes the backlog's age.
//! Standby pollers wait to take the lease over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use conveyor_core::runtime::epoch_millis;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::Lease;
use crate::relay::{Fence, Relay, RelayReport};
use crate::store::{Backlog, StoreError};

/// The lease's name in the store.
pub(crate) const LEASE_NAME: &str = "relay";
/// Gauge: seconds since the oldest unsent, unparked job was committed (0 when none).
pub const OLDEST_UNSENT_METRIC: &str = "conveyor_outbox_oldest_unsent_seconds";
/// Gauge: parked jobs (counted up to the backlog limit).
pub const PARKED_METRIC: &str = "conveyor_outbox_parked_jobs";
/// Counter: jobs the relay sent.
pub const SENT_METRIC: &str = "conveyor_outbox_sent_total";

/// Settings of a [`Poller`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PollerOptions {
    /// How long the lease lasts without renewal (renewed every third). Default 30 s; at least
    /// [`crate::store::MIN_LEASE`].
    pub lease: Duration,
    /// The pause after a pass that found nothing to send. Default 1 s.
    pub idle_poll: Duration,
    /// Aggregates relayed per pass. Default 100.
    pub aggregates_per_pass: usize,
    /// How often the backlog gauges are read. Default 30 s.
    pub backlog_every: Duration,
    /// Stop (and release the lease) after the first pass that, holding the lease, found nothing to send:
    /// `conveyor outbox relay --exit-when-idle` draining a backlog.
    pub exit_when_idle: bool,
}

/// What a [`Poller`] has done so far, readable while it runs.
#[derive(Debug, Clone, Default)]
pub struct PollerProgress {
    inner: Arc<ProgressCounters>,
}

#[derive(Debug, Default)]
struct ProgressCounters {
    sent: AtomicU64,
    raced: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    leader: AtomicBool,
}

/// A reading of [`PollerProgress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Jobs sent and removed.
    pub sent: u64,
    /// Jobs another relay had removed first (duplicates settled by the consumer).
    pub raced: u64,
    /// Failed sends.
    pub failed: u64,
    /// Jobs parked.
    pub parked: u64,
    /// True while this poller holds the lease.
    pub leader: bool,
}

impl PollerProgress {
    /// The counts now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            sent: self.inner.sent.load(Ordering::Relaxed),
            raced: self.inner.raced.load(Ordering::Relaxed),
            failed: self.inner.failed.load(Ordering::Relaxed),
            parked: self.inner.parked.load(Ordering::Relaxed),
            leader: self.inner.leader.load(Ordering::Relaxed),
        }
    }

    fn add(&self, report: &RelayReport) {
        let count = |value: usize| value as u64;
        self.inner.sent.fetch_add(count(report.sent), Ordering::Relaxed);
        self.inner.raced.fetch_add(count(report.raced), Ordering::Relaxed);
        self.inner
            .failed
            .fetch_add(count(report.failed), Ordering::Relaxed);
        self.inner
            .parked
            .fetch_add(count(report.parked), Ordering::Relaxed);
    }
}

impl Default for PollerOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            idle_poll: Duration::from_secs(1),
            aggregates_per_pass: 100,
            backlog_every: Duration::from_secs(30),
            exit_when_idle: false,
        }
    }
}

/// The polling relay.
#[derive(Debug)]
pub struct Poller {
    relay: Relay,
    lease: Lease,
    options: PollerOptions,
    progress: PollerProgress,
}

impl Poller {
    /// A poller of `relay`'s store, calling itself `owner` (unique per process) in the lease.
    pub fn new(relay: Relay, owner: &str, options: PollerOptions) -> Self {
        let lease = Lease::new(Arc::clone(relay.store()), LEASE_NAME, owner, options.lease);
        Self {
            relay,
            lease,
            options,
            progress: PollerProgress::default(),
        }
    }

    /// What it has done so far (a handle that stays valid while it runs).
    pub fn progress(&self) -> PollerProgress {
        self.progress.clone()
    }

    /// Runs until `drain` is cancelled, then gives the lease up.
    pub async fn run(mut self, drain: CancellationToken) {
        let fence = self.lease.fence();
        let mut renew_at = Instant::now();
        let mut backlog_at = Instant::now();
        loop {
            if drain.is_cancelled() {
                break;
            }
            if Instant::now() >= renew_at {
                if let Err(error) = self.lease.acquire().await {
                    tracing::warn!(%error, "outbox relay lease could not be renewed; tried again");
                }
                renew_at = Instant::now() + self.lease.renew_every();
            }
            self.progress.inner.leader.store(fence.holds(), Ordering::Relaxed);
            if !fence.holds() {
                pause(&drain, renew_at.saturating_duration_since(Instant::now())).await;
                continue;
            }
            if Instant::now() >= backlog_at {
                self.publish_backlog().await;
                backlog_at = Instant::now() + self.options.backlog_every;
            }
            let report = self.pass(&fence).await;
            if report.sent == 0 && report.raced == 0 {
                if self.options.exit_when_idle && report.lease_held && report.store_errors == 0 {
                    break;
                }
                let until_renewal = renew_at.saturating_duration_since(Instant::now());
                pause(&drain, self.options.idle_poll.min(until_renewal)).await;
            }
        }
        self.progress.inner.leader.store(false, Ordering::Relaxed);
        if let Err(error) = self.lease.release().await {
            tracing::warn!(%error, "outbox relay lease not released; a standby relay takes over when it lapses");
        }
    }

    /// One pass: the oldest pending aggregates relayed.
    pub async fn pass(&self, fence: &dyn Fence) -> RelayReport {
        let report = self
            .relay
            .sweep(Duration::ZERO, self.options.aggregates_per_pass, fence)
            .await;
        metrics::counter!(SENT_METRIC).increment(report.sent as u64);
        self.progress.add(&report);
        if report.sent > 0 || report.failed > 0 {
            tracing::debug!(
                sent = report.sent,
                raced = report.raced,
                failed = report.failed,
                parked = report.parked,
                blocked = report.blocked,
                "outbox relay pass"
            );
        }
        report
    }

    async fn publish_backlog(&self) {
        match backlog(&self.relay, 100).await {
            Ok(backlog) => publish(&backlog),
            Err(error) => tracing::warn!(%error, "reading the outbox backlog failed"),
        }
    }
}

/// The store's backlog (for the gauges and `conveyor outbox backlog`).
pub async fn backlog(relay: &Relay, limit: usize) -> Result<Backlog, StoreError> {
    relay.store().backlog(limit).await
}

/// Sets the backlog gauges, and warns about parked jobs.
pub fn publish(backlog: &Backlog) {
    let now = epoch_millis(SystemTime::now());
    let age = backlog
        .oldest_pending_millis
        .map_or(0.0, |oldest| now.saturating_sub(oldest) as f64 / 1000.0);
    metrics::gauge!(OLDEST_UNSENT_METRIC).set(age);
    metrics::gauge!(PARKED_METRIC).set(backlog.parked.len() as f64);
    if !backlog.parked.is_empty() {
        tracing::error!(
            parked = backlog.parked.len(),
            "outbox jobs are parked (see `conveyor outbox backlog`); their aggregates wait"
        );
    }
}

async fn pause(drain: &CancellationToken, length: Duration) {
    tokio::select! {
        () = drain.cancelled() => {}
        () = tokio::time::sleep(length.max(Duration::from_millis(10))) => {}
    }
}

impl conveyor_core::BackgroundTask for Poller {
    fn name(&self) -> &'static str {
        "outbox relay"
    }

    /// When the drain begins, the pass under way finishes, then the lease is released, so a standby
    /// relay takes over at once.
    fn run(self: Box<Self>, drain: CancellationToken) -> conveyor_core::BoxFuture<()> {
        Box::pin(Poller::run(*self, drain))
    }
}
