//! The dead-letter pages' peeks, kept so that looking again does not touch SQS.
//!
//! SQS shows a message only by receiving it, and every receive adds one to its receive count. So the
//! console peeks only when asked (a `POST` with the CSRF value, never a `GET`) and keeps what it saw,
//! one peek per DLQ: the page, its filters and "show body" read the kept peek, and a reload costs no
//! receive. Starting a redrive or a delete of a DLQ drops its peek (what it showed is out of date), and
//! the next peek replaces it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use conveyor_sqs::admin::Received;

/// One peek of a DLQ.
#[derive(Debug)]
pub(crate) struct Peek {
    /// When it was taken.
    pub(crate) at: SystemTime,
    /// How many messages it asked for.
    pub(crate) max: usize,
    /// What it received (and made visible again).
    pub(crate) messages: Vec<Received>,
}

/// The last peek of each DLQ, by its URL.
#[derive(Debug, Default)]
pub(crate) struct Peeks {
    by_dlq: Mutex<HashMap<String, Arc<Peek>>>,
}

impl Peeks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Peek>>> {
        self.by_dlq.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last peek of `dlq`, if one is kept.
    pub(crate) fn get(&self, dlq: &str) -> Option<Arc<Peek>> {
        self.lock().get(dlq).cloned()
    }

    /// Keeps `peek` as `dlq`'s, replacing the one before.
    pub(crate) fn put(&self, dlq: &str, peek: Peek) {
        self.lock().insert(dlq.to_owned(), Arc::new(peek));
    }

    /// Drops `dlq`'s peek (a redrive or delete of it started).
    pub(crate) fn forget(&self, dlq: &str) {
        self.lock().remove(dlq);
    }
}
