//! What a worker did: counters shared by its tasks, read as a [`WorkerReport`] or a live [`WorkerStatus`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    /// Visibility extensions made by the heartbeat.
    pub heartbeat_extensions: u64,
    /// Leases lost while a job ran (extension refused, or the claim was taken over).
    pub leases_lost: u64,
    /// Deletes that failed for good (the message comes back and is acked as a duplicate).
    pub deletes_failed: u64,
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
            heartbeat_extensions: get(&self.heartbeat_extensions),
            leases_lost: get(&self.leases_lost),
            deletes_failed: get(&self.deletes_failed),
        }
    }
}

/// State shared by the worker's tasks and its [`WorkerStatus`] handles.
#[derive(Debug)]
pub(crate) struct StatusInner {
    pub(crate) counters: Counters,
    /// Per queue: did the last receive succeed?
    pub(crate) receiving: Vec<AtomicBool>,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) operations_addr: Mutex<Option<SocketAddr>>,
}

/// A live view of a running worker: readiness, in-flight count and counts so far. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerStatus {
    pub(crate) inner: Arc<StatusInner>,
}

impl WorkerStatus {
    pub(crate) fn new(queues: usize) -> Self {
        Self {
            inner: Arc::new(StatusInner {
                counters: Counters::default(),
                receiving: (0..queues).map(|_| AtomicBool::new(false)).collect(),
                in_flight: AtomicUsize::new(0),
                operations_addr: Mutex::new(None),
            }),
        }
    }

    /// True when the last receive from every queue succeeded (what `/readyz` answers).
    pub fn is_ready(&self) -> bool {
        self.inner.receiving.iter().all(|ok| ok.load(Ordering::Relaxed))
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
