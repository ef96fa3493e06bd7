//! Building an SQS client from the environment, with a deadline on every call: an ordinary call fails
//! within seconds (and the caller's own retry policy, or the queue, takes over) instead of hanging the
//! heartbeat or a delete behind a stuck connection.
//!
//! The long-poll `ReceiveMessage` is the one call that legitimately takes long: it gets its own,
//! longer deadline per call from [`receive_timeout_config`].
//!
//! The configuration itself (region, credentials, endpoints) is loaded once per process by
//! `conveyor_aws::shared_config`; each service's client adds its own deadlines here.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;

/// How long to wait for a TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one attempt of an ordinary call (send, delete, visibility change, attributes) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);
/// How long an ordinary call may take across its retries.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per call (the SDK's standard retry mode, which also backs off on throttling).
pub const MAX_ATTEMPTS: u32 = 3;
/// The first retry's backoff ceiling (full jitter, doubling, at most [`MAX_BACKOFF`]).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest backoff between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// What a long-poll receive may take beyond its `WaitTimeSeconds` (see [`receive_timeout_config`]).
pub const RECEIVE_MARGIN: Duration = Duration::from_secs(5);

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

/// The deadline of one long-poll `ReceiveMessage` that waits up to `wait`: `wait` plus
/// [`RECEIVE_MARGIN`], for the attempt and for the whole call (a receive that fails fast is retried
/// inside the same budget), so the receive loop gets control back in bounded time whatever the network
/// does. The connect timeout stays [`CONNECT_TIMEOUT`].
///
/// The client's own deadlines ([`timeout_config`]) are shorter than any long poll, so apply this to
/// each receive call:
///
/// ```no_run
/// # async fn receive(client: aws_sdk_sqs::Client, url: &str) -> Result<(), aws_sdk_sqs::Error> {
/// use std::time::Duration;
///
/// let wait = Duration::from_secs(20);
/// let output = client
///     .receive_message()
///     .queue_url(url)
///     .wait_time_seconds(20)
///     .customize()
///     .config_override(
///         aws_sdk_sqs::config::Config::builder()
///             .timeout_config(conveyor_sqs::receive_timeout_config(wait)),
///     )
///     .send()
///     .await?;
/// # let _ = output;
/// # Ok(())
/// # }
/// ```
pub fn receive_timeout_config(wait: Duration) -> TimeoutConfig {
    let deadline = wait.saturating_add(RECEIVE_MARGIN);
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(deadline)
        .operation_timeout(deadline)
        .build()
}

/// The deadline of a visibility change or delete batch: one attempt may take the whole operation
/// timeout. A slow SQS (answers in 5 s, say) must still be able to extend a message; the worker cuts
/// each call itself at the visibility deadline it protects and retries with jitter, so a shorter
/// attempt timeout would only turn slow answers into failures.
pub fn lease_timeout_config() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(OPERATION_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}

/// An SQS client built from `config` (one you loaded yourself, with its region, credentials and
/// endpoint) with [`timeout_config`] and [`retry_config`] in place of the connect, attempt and operation
/// timeouts and the retry settings `config` carries (its other timeouts are kept), so it has the same
/// deadlines as [`sqs_client_from_env`].
///
/// To change one of them, start from this client's config:
/// `aws_sdk_sqs::Client::from_conf(client.config().to_builder().timeout_config(..).build())`.
pub fn sqs_client_with_timeouts(config: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::config::Builder::from(config)
        .timeout_config(timeout_config())
        .retry_config(retry_config())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// An SQS client configured the standard way (environment variables, shared config and credentials
/// files, SSO, container and instance credentials) with [`timeout_config`] and [`retry_config`]: every
/// call fails within [`OPERATION_TIMEOUT`] instead of hanging. Long-poll receives need
/// [`receive_timeout_config`] per call.
///
/// The SDK itself honours `AWS_ENDPOINT_URL_SQS` (and the general `AWS_ENDPOINT_URL`, or `endpoint_url`
/// in a profile), which is how the tests and `localstack/env.sh` point it at LocalStack.
///
/// The configuration is loaded once per process and shared with the other clients
/// (`conveyor_aws::shared_config`).
pub async fn sqs_client_from_env() -> aws_sdk_sqs::Client {
    sqs_client_with_timeouts(conveyor_aws::shared_config().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_calls_have_short_deadlines() {
        let timeouts = timeout_config();
        assert_eq!(timeouts.connect_timeout(), Some(CONNECT_TIMEOUT));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
        assert!(ATTEMPT_TIMEOUT < OPERATION_TIMEOUT);
        assert_eq!(retry_config().max_attempts(), MAX_ATTEMPTS);
    }

    #[test]
    fn a_receive_gets_its_wait_plus_the_margin() {
        let timeouts = receive_timeout_config(Duration::from_secs(20));
        assert_eq!(
            timeouts.operation_attempt_timeout(),
            Some(Duration::from_secs(25))
        );
        assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(25)));
        assert_eq!(timeouts.connect_timeout(), Some(CONNECT_TIMEOUT));
        assert_eq!(
            receive_timeout_config(Duration::ZERO).operation_timeout(),
            Some(RECEIVE_MARGIN)
        );
    }

    #[tokio::test]
    async fn a_client_built_from_any_config_gets_the_deadlines() {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .timeout_config(TimeoutConfig::disabled())
            .build();
        let client = sqs_client_with_timeouts(&config);
        let timeouts = client.config().timeout_config().cloned().unwrap();
        // Fields this crate sets replace the config's; the others (here the read timeout) are kept.
        assert_eq!(timeouts.connect_timeout(), Some(CONNECT_TIMEOUT));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
        let attempts = client.config().retry_config().map(RetryConfig::max_attempts);
        assert_eq!(attempts, Some(MAX_ATTEMPTS));
    }
}
