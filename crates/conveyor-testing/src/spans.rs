//! Capturing what the runtimes record on their spans in a test: the `outcome` each message's span ends
//! with (`acked`, `retried`, `dead_lettered`, ...), on the test's own thread.
//!
//! `tracing` caches each callsite's interest for the whole process, computed by the first thread that
//! reaches it: a test thread with no subscriber caches "never", and a capture on another thread then
//! sees nothing. [`keep_callsites_open`] installs a global registry once, which wants every callsite;
//! a capture installs its own subscriber for its thread and rebuilds the cache.

use std::sync::{Arc, Mutex, Once};

use tracing_subscriber::layer::SubscriberExt as _;

/// Keeps every callsite's interest open for thread-local captures (see the module docs). Call it
/// before `tracing::subscriber::set_default`, then `tracing::callsite::rebuild_interest_cache()`.
pub fn keep_callsites_open() {
    static KEEP_INTEREST: Once = Once::new();
    KEEP_INTEREST.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
}

/// The `outcome` values recorded on spans while captured, in order. A test on tokio's current-thread
/// runtime (the default, and any paused-clock test) sees the runtime's tasks too.
#[derive(Debug, Clone, Default)]
pub struct SpanOutcomes(Arc<Mutex<Vec<String>>>);

impl SpanOutcomes {
    /// Captures on this thread until the guard drops.
    pub fn capture(&self) -> tracing::subscriber::DefaultGuard {
        keep_callsites_open();
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()));
        tracing::callsite::rebuild_interest_cache();
        guard
    }

    /// The outcomes recorded so far, in order.
    pub fn values(&self) -> Vec<String> {
        self.0.lock().map(|values| values.clone()).unwrap_or_default()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanOutcomes {
    fn on_record(
        &self,
        _span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        values.record(&mut OutcomeField(&self.0));
    }
}

struct OutcomeField<'a>(&'a Mutex<Vec<String>>);

impl tracing::field::Visit for OutcomeField<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.push(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.push(field, format!("{value:?}"));
    }
}

impl OutcomeField<'_> {
    fn push(&self, field: &tracing::field::Field, value: String) {
        if field.name() != "outcome" {
            return;
        }
        if let Ok(mut values) = self.0.lock() {
            values.push(value);
        }
    }
}
