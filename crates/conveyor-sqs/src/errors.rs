//! Classification of SQS errors into the port's error types: the only place that reads SQS error codes.
//!
//! Whole-call errors become [`QueueError`]; failed entries of a batch call become [`EntryError`].
//! See the crate README for the table, including the codes LocalStack 4.8.1 was seen to return.

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::BatchResultErrorEntry;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use conveyor_core::{EntryError, QueueError};

/// Codes SQS uses when it throttles a caller (or when too many messages are in flight).
const THROTTLING_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "RequestThrottled",
    "AWS.SimpleQueueService.RequestThrottled",
    "OverLimit",
    "AWS.SimpleQueueService.OverLimit",
    "KmsThrottled",
    "KMS.ThrottlingException",
];

/// Codes for a server-side failure that may pass.
const UNAVAILABLE_CODES: &[&str] = &[
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "AWS.SimpleQueueService.ServiceUnavailable",
    "AWS.SimpleQueueService.InternalError",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Codes that name a queue that does not exist (the query-protocol code and the JSON-protocol shape name).
const QUEUE_MISSING_CODES: &[&str] = &[
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "NonExistentQueue",
];

/// Credential failures that are not `AccessDenied*` but mean the same to an operator: fix the identity.
const CREDENTIAL_CODES: &[&str] = &[
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidSecurity",
    "AWS.SimpleQueueService.InvalidSecurity",
    "MissingAuthenticationToken",
];

/// Per-entry codes meaning "this receipt is no longer yours".
const LEASE_LOST_CODES: &[&str] = &[
    "ReceiptHandleIsInvalid",
    "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
];

/// Per-entry codes that mean a lost lease when their message is about the receipt handle.
const INVALID_PARAMETER_CODES: &[&str] = &["InvalidParameterValue", "InvalidParameterValueException"];

/// Turns a failed SDK call on `queue` (its URL or name) into a [`QueueError`].
pub fn classify<E>(error: &SdkError<E, HttpResponse>, queue: &str) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let message = DisplayErrorContext(error).to_string();
    match error {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            return QueueError::Unavailable { message };
        }
        SdkError::ConstructionFailure(_) => return QueueError::Invalid { message },
        SdkError::ServiceError(_) => {}
        // `SdkError` is non-exhaustive: anything new is treated as passing trouble.
        _ => return QueueError::Unavailable { message },
    }
    let status = error.raw_response().map(|response| response.status().as_u16());
    classify_code(error.code(), error.message(), status, queue, message)
}

/// The decision behind [`classify`], on plain values so it can be tested without building SDK errors.
pub fn classify_code(
    code: Option<&str>,
    service_message: Option<&str>,
    status: Option<u16>,
    queue: &str,
    full_message: String,
) -> QueueError {
    let code = code.unwrap_or_default();
    if QUEUE_MISSING_CODES.contains(&code) {
        return QueueError::QueueMissing {
            queue: queue.to_owned(),
        };
    }
    if THROTTLING_CODES.contains(&code) || UNAVAILABLE_CODES.contains(&code) {
        return QueueError::Unavailable {
            message: full_message,
        };
    }
    if code.starts_with("AccessDenied")
        || code.starts_with("AWS.SimpleQueueService.AccessDenied")
        || CREDENTIAL_CODES.contains(&code)
    {
        let detail = service_message.unwrap_or("no message");
        return QueueError::AccessDenied {
            queue: queue.to_owned(),
            message: format!("{code}: {detail}"),
        };
    }
    if status.is_some_and(|status| status >= 500) || status == Some(429) {
        return QueueError::Unavailable {
            message: full_message,
        };
    }
    QueueError::Invalid {
        message: full_message,
    }
}

/// Turns one failed entry of a batch call into an [`EntryError`].
pub fn entry_error(entry: &BatchResultErrorEntry) -> EntryError {
    entry_error_from(entry.code(), entry.message().unwrap_or_default(), entry.sender_fault())
}

/// The decision behind [`entry_error`], on plain values.
pub fn entry_error_from(code: &str, message: &str, sender_fault: bool) -> EntryError {
    if LEASE_LOST_CODES.contains(&code) {
        return EntryError::LeaseLost(format!("{code}: {message}"));
    }
    if INVALID_PARAMETER_CODES.contains(&code) && is_about_receipt_handle(message) {
        return EntryError::LeaseLost(format!("{code}: {message}"));
    }
    EntryError::Failed {
        code: code.to_owned(),
        message: message.to_owned(),
        sender_fault,
    }
}

/// True when an `InvalidParameterValue` message is about the receipt handle. SQS says "... is not a valid
/// receipt handle" or "Value ... for parameter ReceiptHandle is invalid. Reason: The receipt handle has
/// expired." (LocalStack 4.8.1 uses the second form, also with "Message does not exist or is not
/// available for visibility timeout change.").
fn is_about_receipt_handle(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("receipt handle") || lower.contains("receipthandle") || lower.contains("not available for visibility")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(code: &str, status: u16) -> QueueError {
        classify_code(Some(code), Some("text"), Some(status), "jobs", "full".to_owned())
    }

    #[test]
    fn throttling_and_server_errors_are_unavailable() {
        for code in ["ThrottlingException", "RequestThrottled", "OverLimit", "KmsThrottled"] {
            assert!(decide(code, 400).is_retryable(), "{code}");
        }
        assert!(decide("SomethingNew", 503).is_retryable());
        assert!(decide("SomethingNew", 429).is_retryable());
        assert!(decide("InternalError", 500).is_retryable());
    }

    #[test]
    fn a_missing_queue_names_the_queue() {
        for code in ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"] {
            assert_eq!(
                decide(code, 400),
                QueueError::QueueMissing {
                    queue: "jobs".to_owned()
                }
            );
        }
    }

    #[test]
    fn access_denied_keeps_the_code_and_message() {
        let error = decide("AccessDeniedException", 400);
        assert_eq!(
            error,
            QueueError::AccessDenied {
                queue: "jobs".to_owned(),
                message: "AccessDeniedException: text".to_owned()
            }
        );
        assert!(matches!(decide("InvalidClientTokenId", 403), QueueError::AccessDenied { .. }));
    }

    #[test]
    fn other_client_errors_are_invalid() {
        assert!(matches!(decide("InvalidParameterValue", 400), QueueError::Invalid { .. }));
        assert!(matches!(
            classify_code(None, None, None, "jobs", "x".to_owned()),
            QueueError::Invalid { .. }
        ));
    }

    #[test]
    fn receipt_handle_entry_errors_are_lost_leases() {
        let cases = [
            ("ReceiptHandleIsInvalid", "The input receipt handle \"x\" is not a valid receipt handle."),
            ("MessageNotInflight", "Message not inflight"),
            ("AWS.SimpleQueueService.MessageNotInflight", ""),
            (
                "InvalidParameterValueException",
                "Value abc for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.",
            ),
            (
                "InvalidParameterValueException",
                "Value abc for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not \
                 available for visibility timeout change.",
            ),
            ("InvalidParameterValue", "Value x for parameter ReceiptHandle is invalid."),
        ];
        for (code, message) in cases {
            assert!(
                matches!(entry_error_from(code, message, false), EntryError::LeaseLost(_)),
                "{code}: {message}"
            );
        }
    }

    #[test]
    fn other_entry_errors_keep_code_and_fault() {
        let error = entry_error_from("InvalidParameterValue", "VisibilityTimeout is too large", true);
        assert_eq!(
            error,
            EntryError::Failed {
                code: "InvalidParameterValue".to_owned(),
                message: "VisibilityTimeout is too large".to_owned(),
                sender_fault: true
            }
        );
    }
}
