//! The state a running worker's tasks share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::WorkerConfig;
use conveyor_core::runtime::{TenantGuards, TenantMetrics};
use conveyor_core::{Pipeline, port::Queue};
use metrics::Gauge;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::time::Duration;

use crate::capacity::{Capacity, Permit};
use crate::deleter::Deleter;
use crate::heartbeat::{Heartbeats, Registration};
use crate::protect::Guards;
use crate::report::WorkerStatus;
use crate::telemetry::QueueMetrics;

/// Everything a receive loop or a message task needs.
pub(crate) struct Runtime {
    pub(crate) config: WorkerConfig,
    pub(crate) pipeline: Pipeline,
    pub(crate) queues: Vec<Arc<dyn Queue>>,
    /// The queues' names, shared with the pipeline.
    pub(crate) names: Vec<Arc<str>>,
    /// What each queue's receives send as `VisibilityTimeout` (and its extensions extend by).
    pub(crate) visibility: Vec<Duration>,
    pub(crate) metrics: Vec<Arc<QueueMetrics>>,
    pub(crate) capacity: Arc<Capacity>,
    pub(crate) heartbeats: Heartbeats,
    pub(crate) deleter: Deleter,
    pub(crate) guards: Guards,
    /// The per-tenant limits (`Worker::limit_tenants`).
    pub(crate) tenants: Arc<TenantGuards>,
    /// Metrics by tenant, the top tenants named.
    pub(crate) tenant_metrics: TenantMetrics,
    pub(crate) status: WorkerStatus,
    pub(crate) in_flight_gauge: Gauge,
    /// Cancelled at shutdown: no new receive, no new job start.
    pub(crate) stop_receiving: CancellationToken,
    /// Cancelled past the drain deadline (or on a second signal): the parent of every lease's token.
    pub(crate) hard_stop: CancellationToken,
    /// Every message task, for the drain.
    pub(crate) tracker: TaskTracker,
    /// One batch of a FIFO group at a time (see [`conveyor_core::runtime::GroupGates`]).
    pub(crate) fifo_gates: conveyor_core::runtime::GroupGates,
    /// A moving average of how long a message holds its slot (claim, handler, complete, settling), in
    /// microseconds (for the receive linger).
    pub(crate) typical_job_micros: AtomicU64,
    /// Per queue: whose turn it is to gather slots for a receive (see [`crate::receiver`]: one loop at
    /// a time, so freed slots fill one batch instead of being split among loops).
    pub(crate) gathering: Vec<tokio::sync::Mutex<()>>,
    /// Cancelled once shutdown stops waiting for the long polls in flight: their requests are
    /// dropped (see `crate::receiver::POLL_GRACE`).
    pub(crate) abandon_polls: CancellationToken,
    /// Set when shutdown begins: until when it waits for the receive loops, so a late receive's
    /// messages may be settled until then (see `crate::receiver::release_late`).
    pub(crate) late_settle_by: std::sync::OnceLock<tokio::time::Instant>,
}

impl Runtime {
    /// Records how long one message held its slot, from its dispatch to its outcome applied. Not the
    /// handler's time alone: with idempotency on, the claim and the complete (a few milliseconds each)
    /// hold the slot too, and a linger sized from a no-op handler's microseconds would end before any
    /// slot came back (issue 28: 2.2 messages per receive).
    pub(crate) fn observe_slot(&self, duration: Duration) {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let old = self.typical_job_micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            micros
        } else {
            old - old / 8 + micros / 8
        };
        self.typical_job_micros.store(new, Ordering::Relaxed);
    }

    /// How long a receive loop holding `held` slots waits for `wanted` while the queue has a backlog:
    /// twice the time the missing slots take to free up on average when every slot frees once per
    /// typical slot time (`2 × missing × typical / max_in_flight`: slots free unevenly, and waiting
    /// only the average fills half the batches), between 1 ms and [`crate::receiver::RECEIVE_LINGER`].
    /// The slots a waiting loop holds are idle for at most that long, and a batch that fills sooner
    /// ends the wait at once.
    pub(crate) fn linger(&self, held: usize, wanted: usize) -> Duration {
        let typical = Duration::from_micros(self.typical_job_micros.load(Ordering::Relaxed));
        let missing = u32::try_from(wanted.saturating_sub(held)).unwrap_or(u32::MAX);
        let slots = u32::try_from(self.config.max_in_flight.max(1)).unwrap_or(u32::MAX);
        (typical * missing.saturating_mul(2) / slots)
            .clamp(Duration::from_millis(1), crate::receiver::RECEIVE_LINGER)
    }
}

/// What keeps one received message in flight: its heartbeat, its capacity slot, its count. Dropped
/// once the message's outcome was applied to the queue (the visibility change answered, or the delete
/// was queued: a pending delete keeps only the heartbeat registration and a pending-delete slot).
#[derive(Debug)]
#[expect(dead_code, reason = "held for their Drop")]
pub(crate) struct Held {
    /// Ends the message's heartbeat when dropped.
    pub(crate) registration: Registration,
    /// The in-flight slot; pending deletes keep theirs, so they count against `max_in_flight`.
    pub(crate) permit: Permit,
    /// The in-flight count.
    pub(crate) in_flight: InFlight,
}

/// Counts one message as in flight in this worker until dropped.
pub(crate) struct InFlight {
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

impl InFlight {
    pub(crate) fn new(runtime: &Arc<Runtime>) -> Self {
        let now = runtime.status.inner.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        runtime.in_flight_gauge.set(now as f64);
        Self {
            runtime: Arc::clone(runtime),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self
            .runtime
            .status
            .inner
            .in_flight
            .fetch_sub(1, Ordering::Relaxed)
            - 1;
        self.runtime.in_flight_gauge.set(now as f64);
    }
}
