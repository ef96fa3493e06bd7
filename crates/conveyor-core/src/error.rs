//! What a handler returns when it fails.

use std::fmt;
use std::time::Duration;

/// Whether a failed job may succeed if tried again.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Try again later: after `delay` if given, else after the handler's backoff.
    Retryable {
        /// A delay the handler asks for (a provider's `Retry-After`, say).
        delay: Option<Duration>,
    },
    /// Will never succeed (bad input, a 4xx from a provider): skip the remaining retries, go to the DLQ.
    Permanent,
}

/// A handler's failure: retryable (optionally with a delay) or permanent, with a message for logs and the DLQ.
///
/// Any `std::error::Error` converts into a *retryable* `HandlerError` with `?`, so unexpected errors are
/// retried up to the queue's `maxReceiveCount`. Say [`HandlerError::permanent`] when retrying cannot help.
/// (Like `anyhow::Error`, this type does not implement `std::error::Error` itself, which is what makes
/// the blanket `From` possible.)
pub struct HandlerError {
    kind: ErrorKind,
    message: String,
}

impl HandlerError {
    /// A failure worth retrying after the handler's backoff.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Retryable { delay: None },
            message: message.to_string(),
        }
    }

    /// A failure worth retrying after `delay` (capped at SQS's 12-hour visibility limit).
    pub fn retry_after(message: impl fmt::Display, delay: Duration) -> Self {
        Self {
            kind: ErrorKind::Retryable { delay: Some(delay) },
            message: message.to_string(),
        }
    }

    /// A failure that retrying cannot fix: the message goes to the DLQ at once with this reason.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            message: message.to_string(),
        }
    }

    /// Retryable or permanent.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True when the failure is permanent.
    pub fn is_permanent(&self) -> bool {
        self.kind == ErrorKind::Permanent
    }

    /// The failure's description.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::retryable(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_errors_become_retryable_with_their_causes() {
        let parse = "x".parse::<u32>().unwrap_err();
        let error = HandlerError::from(parse);
        assert_eq!(error.kind(), ErrorKind::Retryable { delay: None });
        assert!(error.message().contains("invalid digit"));
    }

    #[test]
    fn permanent_is_permanent() {
        assert!(HandlerError::permanent("bad address").is_permanent());
        assert!(!HandlerError::retry_after("slow down", Duration::from_secs(3)).is_permanent());
    }
}
