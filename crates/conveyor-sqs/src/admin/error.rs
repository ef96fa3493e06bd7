//! Why an administration operation failed.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use conveyor_core::port::QueueError;

use crate::errors::{classify, display_chain};

/// Error codes an endpoint answers with when it does not implement an operation (AWS's
/// `UnsupportedOperation`, and what emulators such as moto return for an action they lack).
const UNSUPPORTED_CODES: &[&str] = &[
    "UnsupportedOperation",
    "AWS.SimpleQueueService.UnsupportedOperation",
    "InvalidAction",
    "UnknownOperation",
    "UnknownOperationException",
    "NotImplemented",
    "NotImplementedException",
];

/// An administration operation that failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// An SQS call failed (a missing queue, denied access, throttling, a refused request).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// A `--queue-url` that is neither a queue URL nor a queue name.
    #[error(transparent)]
    BadQueueRef(#[from] super::queue_ref::BadQueueRef),
    /// The queue has no redrive policy and no queue names it as its DLQ.
    #[error(
        "queue {queue} has no dead-letter queue: it has no RedrivePolicy and no queue names it as its \
         dead-letter queue; pass the URL of a queue with a redrive policy (infra/modules/queue sets one), or \
         of its DLQ"
    )]
    NoDeadLetterQueue {
        /// The queue's URL.
        queue: String,
    },
    /// The endpoint does not implement an operation (an emulator without `StartMessageMoveTask`).
    #[error("the endpoint does not support {operation}: {message}")]
    Unsupported {
        /// The SQS operation.
        operation: &'static str,
        /// What the endpoint said.
        message: String,
    },
    /// A message move task ended in `FAILED`.
    #[error("the message move task from {source_queue} failed after moving {moved} messages: {reason}")]
    MoveTaskFailed {
        /// The DLQ's ARN.
        source_queue: String,
        /// Messages moved before it failed.
        moved: u64,
        /// SQS's `FailureReason`.
        reason: String,
    },
    /// A started move task never showed up in `ListMessageMoveTasks`.
    #[error(
        "the message move task from {source_queue} (handle {handle}) does not show up in ListMessageMoveTasks; \
         check it with `conveyor dlq tasks`"
    )]
    MoveTaskNotListed {
        /// The DLQ's ARN.
        source_queue: String,
        /// The task's handle.
        handle: String,
    },
    /// `CancelMessageMoveTask` found no running task with that handle (it finished, was cancelled, or
    /// the handle is wrong).
    #[error(
        "no running message move task has handle {handle}: it may have finished or been cancelled already; \
         list the tasks and their handles with `conveyor dlq tasks --queue-url <queue>` ({message})"
    )]
    MoveTaskNotRunning {
        /// The handle given.
        handle: String,
        /// What SQS said.
        message: String,
    },
    /// Another purge of the queue is still running: SQS allows one per 60 seconds.
    #[error(
        "a purge of {queue} is already in progress: SQS allows one purge per queue every 60 seconds; try again in a minute"
    )]
    PurgeInProgress {
        /// The queue's URL.
        queue: String,
    },
}

/// Classifies a failed call on `queue`, recognising an operation the endpoint does not implement.
pub(crate) fn admin_error<E>(
    error: &SdkError<E, HttpResponse>,
    queue: &str,
    operation: &'static str,
) -> AdminError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if is_unsupported(
        error.code(),
        error.raw_response().map(|raw| raw.status().as_u16()),
    ) {
        return AdminError::Unsupported {
            operation,
            message: display_chain(error),
        };
    }
    AdminError::Queue(classify(error, queue))
}

/// True when an error code (or an HTTP 501) says the operation is not implemented by the endpoint.
pub(crate) fn is_unsupported(code: Option<&str>, status: Option<u16>) -> bool {
    code.is_some_and(|code| UNSUPPORTED_CODES.contains(&code)) || status == Some(501)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_codes_and_501_are_recognised() {
        assert!(is_unsupported(Some("UnsupportedOperation"), Some(400)));
        assert!(is_unsupported(Some("InvalidAction"), Some(400)));
        assert!(is_unsupported(None, Some(501)));
        assert!(!is_unsupported(Some("InvalidParameterValue"), Some(400)));
        assert!(!is_unsupported(None, None));
    }
}
