//! What a worker did: counters shared by its tasks, read as a [`WorkerReport`] or a live [`WorkerStatus`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use conveyor_core::runtime::StoreHealth;

/// Counts for a worker's run, returned by [`Worker::run`](crate::Worker::run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Messages received.
    pub received: u64,
    /// Messages whose handler succeeded (and whose delete was requested).
    pub succeeded: u64,
    /// Messages put back for a retry (handler errors, panics, timeouts, busy claims, open circuits,
    /// lost leases, and permanent failures that could not reach a DLQ).
    pub retried: u64,
    /// Messages sent to the DLQ with their reason (or left to redrive in `leave_to_redrive` mode).
    pub dead_lettered: u64,
    /// Duplicates acknowledged without running (the idempotency record said completed).
    pub duplicates: u64,
    /// Messages made visible again at shutdown: not started yet, or cancelled past the drain deadline.
    pub released_at_shutdown: u64,
    /// FIFO messages put back unrun, in order, because an earlier message of their group failed.
    pub fifo_requeued: u64,
    /// Messages deferred unrun because their downstream's circuit was open (also counted in `retried`).
    pub circuit_deferred: u64,
    /// Messages put back without running and without spending a receive (a delayed copy was sent).
    pub deferred: u64,
    /// Visibility extensions made by the heartbeat.
    pub heartbeat_extensions: u64,
    /// Leases lost while a job ran (extension refused, or the claim was taken over).
    pub leases_lost: u64,
    /// Deletes that failed for good (the message comes back and is acked as a duplicate).
    pub deletes_failed: u64,
    /// Log lines dropped in this process because the log output failed (a closed pipe, a full disk);
    /// they change nothing else.
    pub log_write_errors: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) released_at_shutdown: AtomicU64,
    pub(crate) fifo_requeued: AtomicU64,
    pub(crate) circuit_deferred: AtomicU64,
    pub(crate) deferred: AtomicU64,
    pub(crate) heartbeat_extensions: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) deletes_failed: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    fn report(&self) -> WorkerReport {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WorkerReport {
            received: get(&self.received),
            succeeded: get(&self.succeeded),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            duplicates: get(&self.duplicates),
            released_at_shutdown: get(&self.released_at_shutdown),
            fifo_requeued: get(&self.fifo_requeued),
            circuit_deferred: get(&self.circuit_deferred),
            deferred: get(&self.deferred),
            heartbeat_extensions: get(&self.heartbeat_extensions),
            leases_lost: get(&self.leases_lost),
            deletes_failed: get(&self.deletes_failed),
            log_write_errors: conveyor_core::runtime::write_errors(),
        }
    }
}

/// [`StatusInner::phase`]: not running yet (or no longer), running, draining.
const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const DRAINING: u8 = 2;

/// State shared by the worker's tasks and its [`WorkerStatus`] handles.
#[derive(Debug)]
pub(crate) struct StatusInner {
    pub(crate) counters: Counters,
    /// Per queue: false when the last receive failed (true until one does: the queues the worker was
    /// given are connected).
    pub(crate) receiving: Vec<AtomicBool>,
    /// [`IDLE`], [`RUNNING`] or [`DRAINING`].
    phase: AtomicU8,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) operations_addr: Mutex<Option<SocketAddr>>,
    /// The pipeline's view of its idempotency store (misconfigured at run time: not ready).
    store: StoreHealth,
}

/// A live view of a running worker: readiness, in-flight count and counts so far. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerStatus {
    pub(crate) inner: Arc<StatusInner>,
}

impl WorkerStatus {
    pub(crate) fn new(queues: usize, store: StoreHealth) -> Self {
        Self {
            inner: Arc::new(StatusInner {
                counters: Counters::default(),
                receiving: (0..queues).map(|_| AtomicBool::new(true)).collect(),
                phase: AtomicU8::new(IDLE),
                in_flight: AtomicUsize::new(0),
                operations_addr: Mutex::new(None),
                store,
            }),
        }
    }

    /// What `/readyz` answers: true while the worker runs (its queues are connected: it was given
    /// them connected), is not draining, no queue's last receive failed, and the idempotency store did
    /// not answer its last claim as misconfigured (a table deleted or a permission revoked after the
    /// start: jobs wait, deferred, until it is fixed). It does not wait for a
    /// first receive to return (an empty queue's long poll takes 20 s); it turns false as soon as a
    /// shutdown starts, so a load balancer or ECS stops sending traffic to a draining worker.
    pub fn is_ready(&self) -> bool {
        self.not_ready_because().is_none()
    }

    /// True from the start of a shutdown (a signal, or the `run` token cancelled) until the run returns.
    pub fn is_draining(&self) -> bool {
        self.inner.phase.load(Ordering::Relaxed) == DRAINING
    }

    /// Why the worker is not ready, or `None` when it is (the body of a 503 from `/readyz`).
    pub(crate) fn not_ready_because(&self) -> Option<String> {
        let reason = match self.inner.phase.load(Ordering::Relaxed) {
            IDLE => "not ready: the worker is not running",
            DRAINING => "not ready: draining in-flight jobs before shutting down",
            _ if !self.inner.receiving.iter().all(|ok| ok.load(Ordering::Relaxed)) => {
                "not ready: the last receive from a queue failed; see the worker's logs"
            }
            _ => {
                let message = self.inner.store.misconfigured()?;
                return Some(format!(
                    "not ready: the idempotency store is misconfigured ({message}); jobs are deferred, not run, \
                     until its table and permissions are fixed"
                ));
            }
        };
        Some(reason.to_owned())
    }

    /// The run has started: its queues are connected and its receive loops are running.
    pub(crate) fn set_running(&self) {
        self.inner.phase.store(RUNNING, Ordering::Relaxed);
    }

    /// The shutdown has started: receiving stops, in-flight jobs drain.
    pub(crate) fn set_draining(&self) {
        self.inner.phase.store(DRAINING, Ordering::Relaxed);
    }

    /// Messages this worker holds in flight now (received and not yet settled).
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Relaxed)
    }

    /// The counts so far.
    pub fn report(&self) -> WorkerReport {
        self.inner.counters.report()
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served, once listening (useful with port 0).
    pub fn operations_addr(&self) -> Option<SocketAddr> {
        *self
            .inner
            .operations_addr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_receiving(&self, queue: usize, ok: bool) {
        if let Some(flag) = self.inner.receiving.get(queue) {
            flag.store(ok, Ordering::Relaxed);
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }
}
