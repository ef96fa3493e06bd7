//! Classification of SDK errors into the port's [`QueueError`] and [`EntryError`].
//!
//! Classification is its own step (as in tower-http's `classify`): the queue code calls
//! [`classify`] and never inspects raw SDK errors itself.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::BatchResultErrorEntry;
use aws_smithy_runtime_api::http::Response;
use conveyor_core::port::{EntryError, QueueError};

/// The prefix SQS puts on some of its error codes (`AWS.SimpleQueueService.NonExistentQueue`).
const SQS_CODE_PREFIX: &str = "AWS.SimpleQueueService.";

/// How a call failed, before looking at the service's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure<'a> {
    /// The request could not be built: a bug or a bad parameter on our side.
    Construction,
    /// No response in time.
    Timeout,
    /// The request never reached the service (connection refused, DNS, TLS, IO).
    Dispatch,
    /// A response arrived but could not be read.
    Response,
    /// The service answered with an error.
    Service {
        /// The error code (`x-amzn-query-error` code when present).
        code: Option<&'a str>,
        /// The HTTP status.
        status: u16,
    },
}

/// Classifies an SDK error; `queue` (URL or name) is named in `QueueMissing` and `AccessDenied`.
pub(crate) fn classify<E>(error: &SdkError<E, Response>, queue: &str) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let failure = match error {
        SdkError::ConstructionFailure(_) => Failure::Construction,
        SdkError::TimeoutError(_) => Failure::Timeout,
        SdkError::DispatchFailure(_) => Failure::Dispatch,
        SdkError::ResponseError(_) => Failure::Response,
        SdkError::ServiceError(service) => Failure::Service {
            code: service.err().code(),
            status: service.raw().status().as_u16(),
        },
        _ => Failure::Response,
    };
    let message = match (error.message(), failure) {
        (Some(message), _) => message.to_owned(),
        (None, Failure::Dispatch) => format!("{}{}", crate::endpoint::NOT_REACHED, source_chain(error)),
        (None, Failure::Timeout) => format!("no answer from SQS in time: {}", source_chain(error)),
        (None, _) => display_chain(error),
    };
    classify_failure(failure, message, queue)
}

/// An error and its sources as one line (see [`conveyor_core::runtime::display_chain`]).
pub use conveyor_core::runtime::display_chain;

/// The sources of `error` (not its own `dispatch failure` / `timeout` text), as [`display_chain`].
fn source_chain(error: &(dyn std::error::Error + 'static)) -> String {
    match error.source() {
        Some(source) => display_chain(source),
        None => error.to_string(),
    }
}

/// The classification table, as a pure function (unit-tested below).
///
/// | what happened | `QueueError` |
/// |---|---|
/// | timeout, dispatch/IO failure, unreadable response | `Unavailable` |
/// | `ThrottlingException`, `RequestThrottled`, `OverLimit`, `KmsThrottled`, HTTP 429, any 5xx | `Unavailable` |
/// | `AWS.SimpleQueueService.NonExistentQueue`, `QueueDoesNotExist` | `QueueMissing { queue }` |
/// | `AccessDenied*` | `AccessDenied { queue, message }` |
/// | anything else (bad parameters, too large, request construction) | `Invalid` |
pub(crate) fn classify_failure(failure: Failure<'_>, message: String, queue: &str) -> QueueError {
    let (code, status) = match failure {
        Failure::Construction => return QueueError::Invalid { message },
        Failure::Timeout | Failure::Dispatch | Failure::Response => {
            return QueueError::Unavailable { message };
        }
        Failure::Service { code, status } => (code.map(strip_prefix).unwrap_or_default(), status),
    };
    let with_code = |message: String| {
        if code.is_empty() || message.contains(code) {
            message
        } else {
            format!("{code}: {message}")
        }
    };
    if matches!(code, "NonExistentQueue" | "QueueDoesNotExist") {
        return QueueError::QueueMissing {
            queue: queue.to_owned(),
        };
    }
    if code.starts_with("AccessDenied") {
        return QueueError::AccessDenied {
            queue: queue.to_owned(),
            message: with_code(message),
        };
    }
    let throttled = matches!(
        code,
        "ThrottlingException" | "Throttling" | "RequestThrottled" | "OverLimit" | "KmsThrottled"
    );
    if throttled || status == 429 || status >= 500 {
        return QueueError::Unavailable {
            message: with_code(message),
        };
    }
    QueueError::Invalid {
        message: with_code(message),
    }
}

/// Classifies one failed entry of a batch call (see [`classify_entry`]).
pub(crate) fn entry_error(entry: &BatchResultErrorEntry) -> EntryError {
    classify_entry(entry.code(), entry.message(), entry.sender_fault())
}

/// Classifies one failed entry of a batch call by its code, message and `SenderFault`.
///
/// | code | meaning | `EntryError` |
/// |---|---|---|
/// | `ReceiptHandleIsInvalid` | a handle SQS never issued (malformed, or another queue's) | `NotIssued` |
/// | `InvalidParameterValue` about the `ReceiptHandle` | a handle SQS issued whose message is no longer in flight under it | `LeaseLost` |
/// | `MessageNotInflight` | the message is not in flight | `LeaseLost` |
/// | anything else | | `Failed` |
///
/// What says which, per backend (pinned by `conveyor-testing`'s queue conformance suite,
/// `receipt_handles_sqs_never_issued`):
/// - SQS (AWS's documentation, the knowledge-center article "sqs-receipt-handle-error"): an incorrect
///   handle is `ReceiptHandleIsInvalid` "The input receipt handle '…' is not a valid receipt handle.";
///   an expired one `InvalidParameterValue` "… Reason: The receipt handle has expired."; a deleted
///   message's `InvalidParameterValue` "… Reason: Message does not exist or is not available for
///   visibility timeout change." (aws/aws-sdk-net#1927). `MessageNotInflight` is documented but not
///   seen in practice (getmoto/moto#4655, localstack/localstack#9632).
/// - LocalStack 4.8.1: the same split; the code is spelled `InvalidParameterValueException` and
///   `SenderFault` is false on both.
/// - moto 5.2.6: `ReceiptHandleIsInvalid` for a malformed handle *and* for a deleted message's
///   (`SenderFault` true): on moto a message no longer in flight looks like a handle never issued.
pub(crate) fn classify_entry(code: &str, message: Option<&str>, sender_fault: bool) -> EntryError {
    let message = message.unwrap_or_default();
    let short = strip_prefix(code);
    match short {
        "ReceiptHandleIsInvalid" | "InvalidReceiptHandle" => {
            return EntryError::NotIssued(format!("{code}: {message}"));
        }
        "MessageNotInflight" => return EntryError::LeaseLost(format!("{code}: {message}")),
        "InvalidParameterValue" | "InvalidParameterValueException" if mentions_receipt_handle(message) => {
            return EntryError::LeaseLost(format!("{code}: {message}"));
        }
        _ => {}
    }
    EntryError::Failed {
        code: code.to_owned(),
        message: message.to_owned(),
        sender_fault,
    }
}

fn mentions_receipt_handle(message: &str) -> bool {
    let squashed: String = message
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    squashed.contains("receipthandle")
}

fn strip_prefix(code: &str) -> &str {
    code.strip_prefix(SQS_CODE_PREFIX).unwrap_or(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(code: &str, status: u16) -> Failure<'_> {
        Failure::Service {
            code: Some(code),
            status,
        }
    }

    #[test]
    fn throttling_timeouts_io_and_5xx_are_unavailable() {
        for failure in [
            service("ThrottlingException", 400),
            service("RequestThrottled", 403),
            service("AWS.SimpleQueueService.RequestThrottled", 403),
            service("OverLimit", 403),
            service("InternalError", 500),
            service("ServiceUnavailable", 503),
            service("Whatever", 429),
            Failure::Timeout,
            Failure::Dispatch,
            Failure::Response,
        ] {
            let error = classify_failure(failure, "m".into(), "q");
            assert!(
                matches!(error, QueueError::Unavailable { .. }),
                "{failure:?} -> {error:?}"
            );
            assert!(error.is_retryable());
        }
    }

    #[test]
    fn missing_queue_names_the_queue() {
        for code in ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"] {
            let error = classify_failure(service(code, 400), "m".into(), "http://sqs/000/jobs");
            assert_eq!(
                error,
                QueueError::QueueMissing {
                    queue: "http://sqs/000/jobs".into()
                }
            );
            assert!(error.to_string().contains("http://sqs/000/jobs"));
        }
    }

    #[test]
    fn access_denied_and_the_rest() {
        let denied = classify_failure(service("AccessDeniedException", 400), "no".into(), "jobs");
        assert!(matches!(denied, QueueError::AccessDenied { ref queue, .. } if queue == "jobs"));
        let invalid = classify_failure(service("InvalidParameterValue", 400), "bad".into(), "jobs");
        assert_eq!(
            invalid,
            QueueError::Invalid {
                message: "InvalidParameterValue: bad".into()
            }
        );
        assert!(matches!(
            classify_failure(Failure::Construction, "x".into(), "jobs"),
            QueueError::Invalid { .. }
        ));
    }

    #[test]
    fn stale_receipts_are_lease_lost() {
        for (code, message) in [
            (
                "AWS.SimpleQueueService.MessageNotInflight",
                "Message not inflight.",
            ),
            (
                "InvalidParameterValue",
                "Value abc for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.",
            ),
            (
                "InvalidParameterValueException",
                "Value abc for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not \
                 available for visibility timeout change.",
            ),
        ] {
            assert!(
                matches!(
                    classify_entry(code, Some(message), false),
                    EntryError::LeaseLost(_)
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn handles_sqs_never_issued_are_not_issued() {
        for (code, message, sender_fault) in [
            (
                "ReceiptHandleIsInvalid",
                "The input receipt handle \"MessageReceiptHandle\" is not a valid receipt handle.",
                false,
            ),
            // moto 5.2.6's spelling, with SenderFault true.
            (
                "ReceiptHandleIsInvalid",
                "The input receipt handle is invalid.",
                true,
            ),
            (
                "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
                "The specified receipt handle isn't valid.",
                false,
            ),
        ] {
            let error = classify_entry(code, Some(message), sender_fault);
            assert!(
                matches!(&error, EntryError::NotIssued(text) if text.contains(message)),
                "{code}: {error:?}"
            );
        }
    }

    #[test]
    fn other_entry_failures_keep_code_and_fault() {
        let error = classify_entry(
            "InvalidParameterValue",
            Some(
                "Value 43201 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout \
                  for the message is beyond the limit [43200 seconds].",
            ),
            true,
        );
        assert!(matches!(
            error,
            EntryError::Failed { ref code, sender_fault: true, .. } if code == "InvalidParameterValue"
        ));
        assert!(matches!(
            classify_entry("InternalError", None, false),
            EntryError::Failed {
                sender_fault: false,
                ..
            }
        ));
    }
}
