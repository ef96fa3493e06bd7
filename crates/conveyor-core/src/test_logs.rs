//! Log lines captured in unit tests, as the `fmt` subscriber writes them.

use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;

/// What was logged, shared with the subscriber's writer.
#[derive(Clone, Default)]
pub(crate) struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

/// Captures what this thread logs (without colours) while the guard lives.
pub(crate) fn capture() -> (Lines, DefaultGuard) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    keep_callsites_open();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    (lines, guard)
}

/// `tracing` caches each callsite's interest for the whole process, computed by the first thread
/// that reaches it: a test thread without a subscriber caches "never", and a capture on another
/// thread then sees nothing (a flaky CI failure of the Lambda batch tests). A global registry wants
/// every callsite, so interests stay open; events still reach only each thread's own subscriber.
pub(crate) fn keep_callsites_open() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
}
