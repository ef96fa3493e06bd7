//! Log output that cannot change what happens to a job.
//!
//! `worker 2>&1 | head -1` closes the log pipe after one line. Rust ignores `SIGPIPE`, so every later
//! write to stderr fails with `EPIPE`; `eprintln!` (and `tracing-subscriber`'s own report of a failed
//! write) panics on that, and a panic inside a job's task abandons the job between its effect and its
//! settlement: the effect repeats on the next delivery. [`LossyWriter`] writes what it can and drops
//! what it cannot: a failed write is counted ([`write_errors`]), never returned, never a panic.
//!
//! Every `init_tracing` in the workspace uses it (with `tracing-subscriber`, a `fn() -> W` where
//! `W: io::Write` is a `MakeWriter`):
//!
//! ```ignore
//! tracing_subscriber::fmt()
//!     .with_writer(conveyor_core::runtime::stderr)
//!     .log_internal_errors(false)
//!     .init();
//! ```
//!
//! [`LogFormat`] is the `CONVEYOR_LOG_FORMAT` setting (`text` or `json`) shared by the binaries.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes that failed and were dropped, in this process.
static WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// How many log writes failed and were dropped in this process (a closed pipe, a full disk).
pub fn write_errors() -> u64 {
    WRITE_ERRORS.load(Ordering::Relaxed)
}

/// A writer that never fails: a write error is counted in [`write_errors`] and the bytes are dropped.
#[derive(Debug)]
pub struct LossyWriter<W> {
    inner: W,
}

impl<W: Write> LossyWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self { inner }
    }
}

/// Standard error that never fails (a `MakeWriter` for `tracing-subscriber`).
pub fn stderr() -> LossyWriter<io::Stderr> {
    LossyWriter::new(io::stderr())
}

/// Standard output that never fails.
pub fn stdout() -> LossyWriter<io::Stdout> {
    LossyWriter::new(io::stdout())
}

impl<W: Write> Write for LossyWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.inner.write_all(buf).is_err() {
            WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.inner.flush().is_err() {
            WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// `CONVEYOR_LOG_FORMAT`: how the binaries write their logs.
pub const ENV_LOG_FORMAT: &str = "CONVEYOR_LOG_FORMAT";

/// The log format: human-readable lines or one JSON object per line (ECS, CloudWatch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A `CONVEYOR_LOG_FORMAT` value that is not a log format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ENV_LOG_FORMAT}={value:?} is not a log format: use one of text, json (or leave it unset for text)")]
pub struct UnknownLogFormat {
    /// The value given.
    pub value: String,
}

impl LogFormat {
    /// Parses `text` or `json` (any case); an empty value is the default.
    pub fn parse(value: &str) -> Result<Self, UnknownLogFormat> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(UnknownLogFormat {
                value: value.to_owned(),
            }),
        }
    }

    /// Reads `CONVEYOR_LOG_FORMAT` (unset: text).
    pub fn from_env() -> Result<Self, UnknownLogFormat> {
        match std::env::var(ENV_LOG_FORMAT) {
            Ok(value) => Self::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(LogFormat::Text),
            Err(std::env::VarError::NotUnicode(value)) => Err(UnknownLogFormat {
                value: value.to_string_lossy().into_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn a_broken_pipe_is_dropped_and_counted() {
        let before = write_errors();
        let mut writer = LossyWriter::new(Broken);
        assert!(writeln!(writer, "a log line").is_ok());
        assert!(writer.flush().is_ok());
        assert!(write_errors() >= before + 2);
    }

    #[test]
    fn log_formats_and_the_valid_values_in_the_error() {
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(" JSON "), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(""), Ok(LogFormat::Text));
        let error = LogFormat::parse("yaml").unwrap_err().to_string();
        assert!(
            error.contains("CONVEYOR_LOG_FORMAT")
                && error.contains("\"yaml\"")
                && error.contains("text, json"),
            "{error}"
        );
    }
}
