//! What the idempotency store's last claim said about its configuration, for readiness.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Whether the idempotency store answered its last claim as misconfigured (a table deleted, a policy
/// changed after the start-up check). Set by the pipeline on such an answer, cleared by the next claim
/// the store answers; an outage leaves it as it was (an outage is not a configuration error). A
/// runtime reports it (the worker's `/readyz` turns not ready with the store's message). Cheap to
/// clone: every clone sees the same state.
#[derive(Debug, Clone, Default)]
pub struct StoreHealth {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// True while `message` holds a misconfiguration: every answered claim reads only this flag, so a
    /// healthy store costs one atomic load per claim, no lock.
    flagged: AtomicBool,
    message: Mutex<Option<String>>,
}

impl StoreHealth {
    /// The store's message when its last answered claim said it is misconfigured, else `None`.
    pub fn misconfigured(&self) -> Option<String> {
        if !self.inner.flagged.load(Ordering::Acquire) {
            return None;
        }
        self.lock().clone()
    }

    pub(crate) fn set_misconfigured(&self, message: String) {
        *self.lock() = Some(message);
        self.inner.flagged.store(true, Ordering::Release);
    }

    pub(crate) fn set_answered(&self) {
        if !self.inner.flagged.load(Ordering::Acquire) {
            return;
        }
        let mut message = self.lock();
        *message = None;
        self.inner.flagged.store(false, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.inner.message.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
