//! SIGTERM and SIGINT: the first starts a graceful drain, the second skips it. Each signal is acted on
//! before it is logged, so a broken log output cannot delay or lose a shutdown.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::WorkerError;

/// Installs the handlers now (so an error is returned before the worker starts) and watches them.
pub(crate) fn listen(
    graceful: CancellationToken,
    immediate: CancellationToken,
) -> Result<JoinHandle<()>, WorkerError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).map_err(WorkerError::Signals)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(WorkerError::Signals)?;
        Ok(tokio::spawn(async move {
            let mut received = 0;
            while received < 2 {
                let name = tokio::select! {
                    _ = terminate.recv() => "SIGTERM",
                    _ = interrupt.recv() => "SIGINT",
                };
                received += 1;
                // Act first, log after: the shutdown must not depend on the log output.
                if received == 1 {
                    graceful.cancel();
                    tracing::info!(
                        signal = name,
                        "shutting down gracefully; send it again to stop at once"
                    );
                } else {
                    immediate.cancel();
                    tracing::warn!(signal = name, "second signal: cancelling the remaining jobs now");
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(tokio::spawn(async move {
            for round in 0..2 {
                if tokio::signal::ctrl_c().await.is_err() {
                    return;
                }
                if round == 0 {
                    graceful.cancel();
                    tracing::info!("Ctrl-C: shutting down gracefully; press it again to stop at once");
                } else {
                    immediate.cancel();
                }
            }
        }))
    }
}
