//! Progress reports from a running handler, written to its job record at most once per interval.
//!
//! # Design note: ordering
//!
//! The handler's [`Context::progress`](crate::Context::progress) only stores the latest report and wakes
//! the writer; it never waits for the store. The writer (one task per tracked run) writes the latest
//! report, then sleeps the interval, so whatever the handler calls, a run makes at most one progress
//! write per interval (plus none at the end). When the handler returns, the pipeline stops the writer
//! and waits for a write in flight to finish *before* it settles the claim; the report not yet written
//! (if any) is then taken out of the reporter and written by the complete or release itself. So the
//! last report always lands, after every earlier one, and costs no request of its own. Progress writes
//! are fenced on the claim's token and on the record being in progress: a stale holder's report is
//! refused, and a report can never land after the job's end.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::idempotency::{Claim, IdempotencyStore, StoreError};
use crate::tracking::Progress;

/// The latest progress a handler reported and not yet written.
#[derive(Debug, Default)]
pub struct ProgressReporter {
    latest: Mutex<Option<Progress>>,
    reported: Notify,
}

impl ProgressReporter {
    /// Stores a report (replacing an unwritten one) and wakes the writer.
    pub fn report(&self, percent: u8, message: String) {
        let progress = Progress {
            percent: percent.min(100),
            message,
            at: crate::wall_clock::now(),
        };
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(progress);
        self.reported.notify_one();
    }

    /// Takes the report not yet written, if any.
    pub fn take(&self) -> Option<Progress> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A running progress writer; [`ProgressWriter::stop`] ends it.
#[derive(Debug)]
pub(crate) struct ProgressWriter {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl ProgressWriter {
    /// Starts writing `reporter`'s reports to `claim`'s record, at most one per `interval`.
    pub(crate) fn start(
        store: Arc<dyn IdempotencyStore>,
        claim: Claim,
        reporter: Arc<ProgressReporter>,
        interval: Duration,
    ) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(write_reports(store, claim, reporter, interval, stop.clone()));
        Self { stop, task }
    }

    /// Stops the writer and waits for a write in flight to end.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "progress writer ended abnormally");
        }
    }
}

async fn write_reports(
    store: Arc<dyn IdempotencyStore>,
    claim: Claim,
    reporter: Arc<ProgressReporter>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            biased;
            () = reporter.reported.notified() => {}
            () = stop.cancelled() => return,
        }
        let Some(progress) = reporter.take() else {
            continue;
        };
        match store.record_progress(&claim, &progress).await {
            Ok(()) => {}
            Err(StoreError::Fenced { .. }) => {
                tracing::warn!(key = %claim.key, "progress refused: the claim was taken over; no more progress writes");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, key = %claim.key, "could not write progress; the next report will try again");
            }
        }
        tokio::select! {
            biased;
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
