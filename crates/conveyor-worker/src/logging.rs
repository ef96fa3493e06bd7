//! The worker's logs when the application set up none: [`run`](crate::run) and
//! [`Runner::run`](crate::Runner::run) call [`init_logging`] first, so a worker written from the README
//! says that it started, what it skips and why, and what shutdown waits for.
//!
//! Text lines on stderr (colour only on a terminal), or JSON lines with `CONVEYOR_LOG_FORMAT=json`;
//! `RUST_LOG` filters (default `info`). An application that installed its own `tracing` subscriber
//! keeps it: nothing is replaced. Lines go through [`conveyor_core::runtime::stderr`]: a closed or full
//! log pipe drops lines (counted) and never panics a job's task.

use std::io::IsTerminal as _;

use conveyor_core::runtime::{self as log_output, LogFormat};

use crate::error::WorkerError;

/// Installs the worker's logging (see the module docs) unless a global `tracing` subscriber is set
/// already. Returns whether it installed one. An unknown `CONVEYOR_LOG_FORMAT` is a
/// [`WorkerError::Setting`] that lists the formats; an invalid `RUST_LOG` logs at `info` with a warning.
pub fn init_logging() -> Result<bool, WorkerError> {
    if tracing::dispatcher::has_been_set() {
        return Ok(false);
    }
    let format = LogFormat::from_env().map_err(|error| WorkerError::Setting {
        setting: log_output::ENV_LOG_FORMAT.to_owned(),
        problem: error.to_string(),
    })?;
    // A mistyped filter must not stop a worker: it logs at `info` and says so once logging is up.
    let mut bad_filter = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|error| {
                bad_filter = Some(format!("RUST_LOG={directives:?} is not a log filter ({error})"));
                tracing_subscriber::EnvFilter::new("info")
            })
        }
        _ => tracing_subscriber::EnvFilter::new("info"),
    };
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    let lines = tracing_subscriber::fmt::layer()
        .with_writer(log_output::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false);
    // `RUST_LOG` filters the log lines only: a quiet log (`warn`) still exports every message's span.
    let registry = tracing_subscriber::registry();
    let installed = match format {
        LogFormat::Json => install(registry.with(lines.json().with_filter(filter)))?,
        LogFormat::Text => install(registry.with(lines.with_filter(filter)))?,
    };
    if let Some(problem) = bad_filter {
        tracing::warn!(
            "{problem}; logging at info. Write for example RUST_LOG=info or RUST_LOG=info,conveyor_worker=debug"
        );
    }
    // Another thread may have set one between the check and here: theirs stays.
    Ok(installed)
}

/// Sets `subscriber` as the global one, with OpenTelemetry export when the `otel` feature is on and
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see `conveyor-otel`); whether it was set.
fn install<S>(subscriber: S) -> Result<bool, WorkerError>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span> + Send + Sync,
{
    use tracing_subscriber::util::SubscriberInitExt as _;

    #[cfg(feature = "otel")]
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;

        let layer = conveyor_otel::layer::<S>().map_err(|error| WorkerError::Setting {
            setting: "OTEL_*".to_owned(),
            problem: error.to_string(),
        })?;
        // Conveyor's spans are at `info`; the AWS SDK's own (debug, trace) stay out of the traces.
        let layer = layer.map(|layer| layer.with_filter(tracing::level_filters::LevelFilter::INFO));
        Ok(subscriber.with(layer).try_init().is_ok())
    }
    #[cfg(not(feature = "otel"))]
    {
        Ok(subscriber.try_init().is_ok())
    }
}
