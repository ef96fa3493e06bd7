//! The adapter's errors.

use conveyor_core::config::ConfigError;

/// Why [`run`](crate::run) could not start or stopped.
#[non_exhaustive]
#[derive(thiserror::Error)]
pub enum LambdaError {
    /// The configuration is invalid; the message lists every problem and what to change.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An environment variable holds a value that does not parse.
    #[error("environment variable {name}={value:?} is invalid: {problem}")]
    Environment {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong and what is expected.
        problem: String,
    },
    /// `CONVEYOR_IDEMPOTENCY_TABLE` is set but cannot be used (no `dynamodb` feature, or the pipeline
    /// has a store on another table): the message says what to do.
    #[error(transparent)]
    IdempotencyTable(#[from] conveyor_core::runtime::StoreEnvError),
    /// The Lambda runtime client failed (the Runtime API is unreachable, say).
    #[error("the Lambda runtime stopped: {0}")]
    Runtime(String),
    /// The idempotency store refused the cold start's probe as a configuration error (a table that
    /// does not exist, access denied): the function fails its init and takes no record.
    #[error(
        "the idempotency store cannot be used: {0}; the function took no record (fix the table or the \
         function's role, then redeploy)"
    )]
    Store(conveyor_core::port::StoreError),
}

/// An invocation whose payload is not an SQS event: the function reports it as an invocation error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this function consumes SQS events (an object with a \"Records\" array of SQS messages, as an SQS event \
     source mapping sends them), but it received {received}: {detail}"
)]
pub struct EventError {
    /// What was received, by shape (never its content).
    pub received: String,
    /// What exactly did not fit.
    pub detail: String,
}

/// Why an invocation failed instead of answering with a batch response.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvocationError {
    /// The payload is not an SQS event.
    #[error(transparent)]
    NotAnSqsEvent(#[from] EventError),
    /// The batch must be returned whole (see [`crate::BatchReport::invocation_error`]).
    #[error(transparent)]
    BatchFailed(#[from] crate::batch::BatchFailed),
    /// A flow sweep invocation ([`crate::FLOW_SWEEP_EVENT`]) could not sweep: what and what to do.
    #[error("{0}")]
    FlowSweep(String),
    /// A timer relay invocation ([`crate::TIMER_RELAY_EVENT`]) could not relay: what and what to do.
    #[error("{0}")]
    TimerRelay(String),
}

impl From<InvocationError> for lambda_runtime::Diagnostic {
    fn from(error: InvocationError) -> Self {
        match error {
            InvocationError::NotAnSqsEvent(error) => error.into(),
            InvocationError::BatchFailed(error) => lambda_runtime::Diagnostic {
                error_type: "Conveyor.BatchFailed".to_owned(),
                error_message: error.0,
            },
            InvocationError::FlowSweep(message) => lambda_runtime::Diagnostic {
                error_type: "Conveyor.FlowSweep".to_owned(),
                error_message: message,
            },
            InvocationError::TimerRelay(message) => lambda_runtime::Diagnostic {
                error_type: "Conveyor.TimerRelay".to_owned(),
                error_message: message,
            },
        }
    }
}

impl From<EventError> for lambda_runtime::Diagnostic {
    fn from(error: EventError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: "Conveyor.NotAnSqsEvent".to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// The readable text and its causes, not the variant's fields: what `fn main() -> Result<(), LambdaError>`
/// prints when it returns this error.
impl std::fmt::Debug for LambdaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        conveyor_core::runtime::write_error_chain(self, f)
    }
}
