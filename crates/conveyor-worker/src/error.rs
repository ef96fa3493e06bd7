//! The worker's errors: each says what went wrong and what to change.

use std::path::PathBuf;

use conveyor_core::config::ConfigError;

/// Why a worker could not start or run.
#[non_exhaustive]
#[derive(thiserror::Error)]
pub enum WorkerError {
    /// A setting (a config-file field or an environment variable) has a value that cannot be used.
    #[error("{setting}: {problem}")]
    Setting {
        /// The environment variable or config-file field.
        setting: String,
        /// What is wrong and what to change.
        problem: String,
    },
    /// The config file could not be read.
    #[error("cannot read the config file {path}: {source}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for a worker config.
    #[error("config file {path} is invalid: {message}")]
    ConfigSyntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the field and line).
        message: String,
    },
    /// The configuration failed validation.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The queues passed to [`Worker::new`](crate::Worker::new) do not line up with `config.queues`.
    #[error(
        "{given} queue(s) passed to Worker::new but config.queues lists {configured}: pass one Queue per \
         configured queue, in the same order"
    )]
    QueueMismatch {
        /// How many `Queue`s were passed.
        given: usize,
        /// How many queues the config lists.
        configured: usize,
    },
    /// The operations endpoint could not listen.
    #[error(
        "cannot listen on {addr} for /healthz, /readyz and /metrics: {source}; change listen_addr \
             (CONVEYOR_LISTEN_ADDR) or set it to \"off\""
    )]
    Listen {
        /// The configured address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("cannot install the SIGTERM/SIGINT handlers: {0}")]
    Signals(std::io::Error),
    /// A queue could not be connected at start-up because of the configuration (no region, no
    /// credentials, a missing queue, denied access): nothing changes until someone fixes it.
    #[error("cannot connect to queue {queue}: {problem}")]
    Connect {
        /// The queue's URL or name.
        queue: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// SQS stayed unreachable at start-up for longer than the connect patience: an outage, not a
    /// configuration error.
    #[error(
        "cannot connect to queue {queue}: SQS stayed unavailable for {elapsed:.0?} ({attempts} attempts, \
         last: {last_error}); this is an outage, not a configuration error; giving up"
    )]
    Outage {
        /// The queue's URL or name.
        queue: String,
        /// Connection attempts made.
        attempts: u32,
        /// How long they took.
        elapsed: std::time::Duration,
        /// The last attempt's error.
        last_error: String,
    },
    /// The idempotency store refused the start-up probe as a configuration error (a table that does
    /// not exist, access denied): no message was received.
    #[error(
        "the idempotency store cannot be used: {0}; no message was received (fix the table or the role, then start again)"
    )]
    Store(conveyor_core::port::StoreError),
    /// `CONVEYOR_IDEMPOTENCY_TABLE` is set but cannot be used (no `dynamodb` feature, or the pipeline
    /// has a store on another table): the message says what to do.
    #[error(transparent)]
    IdempotencyTable(#[from] conveyor_core::runtime::StoreEnvError),
    /// A health check failed.
    #[error("health check of {addr} failed: {problem}")]
    Unhealthy {
        /// The address checked.
        addr: String,
        /// What happened.
        problem: String,
    },
}

/// The readable text and its causes, not the variant's fields: what `fn main() -> Result<(), WorkerError>`
/// prints when it returns this error.
impl std::fmt::Debug for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        conveyor_core::runtime::write_error_chain(self, f)
    }
}

#[cfg(test)]
mod tests {
    use conveyor_core::config::ConfigProblem;

    use super::*;

    #[test]
    fn main_returning_the_error_prints_its_text_not_its_fields() {
        let error = WorkerError::Invalid(ConfigError {
            problems: vec![ConfigProblem {
                field: "queues[0].url".into(),
                problem: "\"greetings\" is not a queue URL".into(),
            }],
        });
        let printed = format!("{error:?}");
        assert_eq!(
            printed,
            "invalid configuration:\n  - queues[0].url: \"greetings\" is not a queue URL"
        );
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let printed = format!(
            "{:?}",
            WorkerError::ConfigFile {
                path: "worker.toml".into(),
                source: io
            }
        );
        assert_eq!(printed, "cannot read the config file worker.toml: no such file");
    }
}
