//! The large-payload settings from the environment, for the worker and the Lambda function alike.

use std::sync::Arc;

use conveyor_core::Payloads;

use crate::{S3PayloadStore, s3_client_from_env};

/// The bucket large payloads go to (producers) and come from (consumers); setting it turns them on.
pub const BUCKET_ENV: &str = "CONVEYOR_PAYLOAD_BUCKET";
/// `true` (default): consumers delete a payload object after its job succeeded; `false`: keep it (the
/// bucket's lifecycle rule removes it).
pub const CLEANUP_ENV: &str = "CONVEYOR_PAYLOAD_CLEANUP";

/// A variable with a value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not valid: {expected}")]
pub struct EnvError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What it must be.
    pub expected: &'static str,
}

/// `CONVEYOR_PAYLOAD_BUCKET`, when set and not empty.
pub fn payload_bucket_from_env() -> Option<String> {
    std::env::var(BUCKET_ENV)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The consumer's large-payload settings: `None` when `CONVEYOR_PAYLOAD_BUCKET` is not set (pointers then
/// fail with a reason saying to set it), else S3 through [`s3_client_from_env`], deleting objects of that
/// bucket (only) after success unless `CONVEYOR_PAYLOAD_CLEANUP=false`.
pub async fn payloads_from_env() -> Result<Option<Payloads>, EnvError> {
    let Some(bucket) = payload_bucket_from_env() else {
        return Ok(None);
    };
    let cleanup = match std::env::var(CLEANUP_ENV) {
        Err(_) => true,
        Ok(value) => parse_bool(&value).ok_or(EnvError {
            name: CLEANUP_ENV,
            value,
            expected: "true or false",
        })?,
    };
    let store = Arc::new(S3PayloadStore::new(s3_client_from_env().await));
    // Objects of other buckets a producer points at are read, never deleted (`Payloads::own_bucket`).
    let payloads = Payloads::new(store).own_bucket(bucket);
    Ok(Some(if cleanup {
        payloads
    } else {
        payloads.keep_after_success()
    }))
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bool;

    #[test]
    fn cleanup_values() {
        assert_eq!(parse_bool(" False "), Some(false));
        assert_eq!(parse_bool("1"), Some(true));
        assert_eq!(parse_bool("keep"), None);
    }
}
