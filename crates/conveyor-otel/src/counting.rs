//! Counting what becomes of the spans: a span processor that counts the spans handed to it (and
//! tidies them, [`crate::tidy`]), an
//! exporter that counts what each export did with them, and a flush bounded by a time the caller
//! gives (the rest of a Lambda invocation, the rest of a worker's stop timeout), never the exporter's.
//!
//! The SDK's flush waits for the exporter up to five seconds, and its exporter up to ten; a collector
//! that holds each export would make every invocation that long. Here the flush runs on a blocking
//! thread and the caller waits for it only as long as it has: when the time is up, the spans not yet
//! exported are counted as unflushed (they leave with a later export, or with the process) and the
//! caller goes on. At most one flush runs at a time: a flush still waiting for a slow collector is
//! waited on again, not joined by another.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::Notify;

/// The spans of this process: handed to the exporter's queue, exported, lost to a failed export.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Ended (and sampled): handed to the batch processor.
    ended: AtomicU64,
    /// Accepted by the collector.
    exported: AtomicU64,
    /// In an export that failed (refused, timed out, an error status): lost.
    failed: AtomicU64,
    /// What the last [`Counts::report`] saw, so each report says what happened since.
    reported_exported: AtomicU64,
    reported_failed: AtomicU64,
}

impl Counts {
    /// What happened since the last report, and what waits now.
    pub(crate) fn report(&self) -> FlushReport {
        let ended = self.ended.load(Ordering::Acquire);
        let exported = self.exported.load(Ordering::Acquire);
        let failed = self.failed.load(Ordering::Acquire);
        let exported_before = self.reported_exported.swap(exported, Ordering::AcqRel);
        let failed_before = self.reported_failed.swap(failed, Ordering::AcqRel);
        FlushReport {
            exported: exported.saturating_sub(exported_before),
            dropped: failed.saturating_sub(failed_before),
            unflushed: ended.saturating_sub(exported).saturating_sub(failed),
        }
    }
}

/// What a bounded flush ([`crate::flush_within`]) saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlushReport {
    /// Spans the collector accepted since the previous report.
    pub exported: u64,
    /// Spans lost since the previous report: their export failed (the collector refused the
    /// connection, answered with an error, or did not answer within the exporter's timeout).
    pub dropped: u64,
    /// Spans ended (by this invocation or earlier ones) but not yet exported when the flush's time was
    /// up: they wait for a later export (the next invocation's flush, the exporter's timer), and are
    /// lost if the process ends first. A count of what waits, not of what happened since the last
    /// report.
    pub unflushed: u64,
}

impl FlushReport {
    /// Whether every span ended so far was exported and none was lost.
    pub fn is_clean(&self) -> bool {
        self.dropped == 0 && self.unflushed == 0
    }
}

/// The process's counts.
pub(crate) fn counts() -> &'static Counts {
    static COUNTS: OnceLock<Counts> = OnceLock::new();
    COUNTS.get_or_init(Counts::default)
}

/// A span processor that counts each ended span, then hands it to `inner` (the batch processor).
#[derive(Debug)]
pub(crate) struct Counting<P> {
    pub(crate) inner: P,
    pub(crate) counts: &'static Counts,
}

impl<P: SpanProcessor> SpanProcessor for Counting<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        self.counts.ended.fetch_add(1, Ordering::AcqRel);
        crate::tidy::drop_field_copies(&mut span);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts what each export of `inner` (OTLP/HTTP) did with its spans.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    pub(crate) inner: E,
    pub(crate) counts: &'static Counts,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        let count = match &result {
            Ok(()) => &self.counts.exported,
            Err(_) => &self.counts.failed,
        };
        count.fetch_add(spans, Ordering::AcqRel);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Whether a flush's blocking thread is still waiting for the exporter.
static FLUSHING: AtomicBool = AtomicBool::new(false);

fn flushed() -> &'static Notify {
    static FLUSHED: OnceLock<Notify> = OnceLock::new();
    FLUSHED.get_or_init(Notify::new)
}

/// How a [`bounded`] flush ended for its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// The caller's own flush ended in time: every span ended before the call was handed to the exporter.
    Own,
    /// A flush another caller had started ended in time. Spans this caller ended after that flush
    /// began were not part of it (concurrent invocations under Lambda Managed Instances).
    Joined,
    /// The time was up first.
    Late,
}

/// Runs `flush` (blocking) on a blocking thread unless one still runs, and waits for it at most
/// `budget`.
pub(crate) async fn bounded(budget: Duration, flush: impl FnOnce() + Send + 'static) -> Flushed {
    let notified = flushed().notified();
    tokio::pin!(notified);
    // Registered before the flag is read: a flush that ends in between still wakes this one.
    notified.as_mut().enable();
    let own = !FLUSHING.swap(true, Ordering::AcqRel);
    if own {
        tokio::task::spawn_blocking(move || {
            let _done = Done;
            flush();
        });
    }
    match (tokio::time::timeout(budget, notified).await, own) {
        (Err(_), _) => Flushed::Late,
        (Ok(()), true) => Flushed::Own,
        (Ok(()), false) => Flushed::Joined,
    }
}

/// Clears [`FLUSHING`] and wakes the waiters when the flush ends, even by a panic.
struct Done;

impl Drop for Done {
    fn drop(&mut self) {
        FLUSHING.store(false, Ordering::Release);
        flushed().notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor};

    use super::*;

    /// An exporter whose collector refuses every export, or takes every one.
    #[derive(Debug)]
    struct Collector {
        refuses: bool,
    }

    impl SpanExporter for Collector {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            if self.refuses {
                Err(OTelSdkError::InternalFailure("connection refused".to_owned()))
            } else {
                Ok(())
            }
        }
    }

    fn spans_through(refuses: bool, spans: usize) -> FlushReport {
        let counts: &'static Counts = Box::leak(Box::default());
        let exporter = CountingExporter {
            inner: Collector { refuses },
            counts,
        };
        let processor = Counting {
            inner: SimpleSpanProcessor::new(exporter),
            counts,
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("counting");
        for _ in 0..spans {
            tracer.in_span("job", |_| ());
        }
        counts.report()
    }

    /// Two invocations of one process flush at once (Managed Instances): the second joins the first's
    /// flush, which did not carry the spans it ended later, and is told so; its own flush is its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_that_joins_another_is_told_so() {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn(bounded(Duration::from_secs(30), move || {
            let _ = released.recv();
        }));
        // The first flush holds the flag until released.
        while !FLUSHING.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let second = bounded(Duration::from_secs(30), || unreachable!("a flush already runs"));
        tokio::pin!(second);
        // Polled once, it finds the first flush running and waits for it.
        let waiting =
            std::future::poll_fn(|cx| std::task::Poll::Ready(second.as_mut().poll(cx).is_pending())).await;
        assert!(waiting);
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Flushed::Own);
        assert_eq!(second.await, Flushed::Joined);
        assert_eq!(bounded(Duration::from_secs(30), || ()).await, Flushed::Own);
        // A flush that outlasts the time given: the caller goes on.
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let late = bounded(Duration::from_millis(10), move || {
            let _ = held.recv();
        });
        assert_eq!(late.await, Flushed::Late);
        drop(hold);
    }

    #[test]
    fn a_refused_export_counts_its_spans_as_dropped_and_none_as_waiting() {
        let report = spans_through(true, 3);
        assert_eq!((report.exported, report.dropped, report.unflushed), (0, 3, 0));
        assert!(!report.is_clean());
    }

    #[test]
    fn an_accepted_export_counts_its_spans_as_exported() {
        let report = spans_through(false, 3);
        assert_eq!((report.exported, report.dropped, report.unflushed), (3, 0, 0));
        assert!(report.is_clean());
    }

    #[test]
    fn each_report_says_what_happened_since_the_last() {
        let counts = Counts::default();
        counts.ended.store(5, Ordering::Release);
        counts.exported.store(2, Ordering::Release);
        counts.failed.store(1, Ordering::Release);
        let first = counts.report();
        assert_eq!((first.exported, first.dropped, first.unflushed), (2, 1, 2));
        counts.exported.store(4, Ordering::Release);
        let second = counts.report();
        assert_eq!((second.exported, second.dropped, second.unflushed), (2, 0, 0));
    }
}
