//! The seam through which the worker runs work beside its jobs (a scheduler, an outbox relay) without
//! depending on the crates that do that work.

use tokio_util::sync::CancellationToken;

use crate::handler::BoxFuture;

/// Work the worker runs beside its receive loops: `conveyor_schedule::Scheduler` and
/// `conveyor_outbox::Poller` implement it, and so can an application's own periodic task.
///
/// The worker starts [`run`](BackgroundTask::run) when it starts and cancels `drain` when its drain
/// begins (a signal, or the worker's shutdown token), so nothing new is started by a worker that is
/// stopping. The task then finishes or hands back what it holds (a relay checkpoints its last page and
/// gives its lease up) and returns; the worker waits for it before it reports.
pub trait BackgroundTask: Send + 'static {
    /// A short name for the worker's logs, such as `scheduler` or `outbox relay`.
    fn name(&self) -> &'static str;

    /// Runs until `drain` is cancelled, then returns once what it started is settled.
    fn run(self: Box<Self>, drain: CancellationToken) -> BoxFuture<()>;
}
