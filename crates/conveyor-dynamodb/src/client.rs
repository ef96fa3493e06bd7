//! Building a DynamoDB client from the environment, with timeouts and retries that suit a claim on the
//! hot path: fail within seconds and let the queue retry later, rather than hang.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;

/// How long to wait for a TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one attempt may take (a 400 KB write included).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call may take across its retries.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts per call (the SDK's standard retry mode, which also backs off on throttling).
pub const MAX_ATTEMPTS: u32 = 3;
/// The first retry's backoff ceiling (full jitter, doubling, at most [`MAX_BACKOFF`]).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest backoff between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// [`CONNECT_TIMEOUT`], [`ATTEMPT_TIMEOUT`] and [`OPERATION_TIMEOUT`], for a client you build yourself.
pub fn timeout_config() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}

/// Standard retries with [`MAX_ATTEMPTS`], [`INITIAL_BACKOFF`] and [`MAX_BACKOFF`], for a client you
/// build yourself.
pub fn retry_config() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(MAX_ATTEMPTS)
        .with_initial_backoff(INITIAL_BACKOFF)
        .with_max_backoff(MAX_BACKOFF)
}

/// A DynamoDB client configured the standard way (environment variables, profile, instance or task
/// role; `AWS_ENDPOINT_URL_DYNAMODB` for DynamoDB Local) with [`timeout_config`] and [`retry_config`],
/// so an unreachable table becomes `StoreError::Unavailable` within seconds instead of hanging a claim.
///
/// The configuration is loaded once per process and shared with the other clients
/// (`conveyor_aws::shared_config`).
pub async fn dynamodb_client_from_env() -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::config::Builder::from(conveyor_aws::shared_config().await)
        .timeout_config(timeout_config())
        .retry_config(retry_config())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}
