//! What the idempotency store's last claim said about its configuration, for readiness.

use std::sync::{Arc, Mutex, PoisonError};

/// Whether the idempotency store answered its last claim as misconfigured (a table deleted, a policy
/// changed after the start-up check). Set by the pipeline on such an answer, cleared by the next claim
/// the store answers; an outage leaves it as it was (an outage is not a configuration error). A
/// runtime reports it (the worker's `/readyz` turns not ready with the store's message). Cheap to
/// clone: every clone sees the same state.
#[derive(Debug, Clone, Default)]
pub struct StoreHealth {
    misconfigured: Arc<Mutex<Option<String>>>,
}

impl StoreHealth {
    /// The store's message when its last answered claim said it is misconfigured, else `None`.
    pub fn misconfigured(&self) -> Option<String> {
        self.lock().clone()
    }

    pub(crate) fn set_misconfigured(&self, message: String) {
        *self.lock() = Some(message);
    }

    pub(crate) fn set_answered(&self) {
        let mut state = self.lock();
        if state.is_some() {
            *state = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.misconfigured.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
