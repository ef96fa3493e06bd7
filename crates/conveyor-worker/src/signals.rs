//! SIGTERM and SIGINT: the first starts a graceful drain, the second skips it.

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
                if received == 1 {
                    tracing::info!(
                        signal = name,
                        "shutting down gracefully; send it again to stop at once"
                    );
                    graceful.cancel();
                } else {
                    tracing::warn!(signal = name, "second signal: cancelling the remaining jobs now");
                    immediate.cancel();
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
                    tracing::info!("Ctrl-C: shutting down gracefully; press it again to stop at once");
                    graceful.cancel();
                } else {
                    immediate.cancel();
                }
            }
        }))
    }
}
