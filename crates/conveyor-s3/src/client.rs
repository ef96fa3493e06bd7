//! Building an S3 client from the environment, with deadlines that suit a 5 MiB payload on the hot path.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;

/// How long to wait for a TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one attempt may take (a multi-MiB body included).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a call may take across its retries.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(45);
/// Attempts per call (the SDK's standard retry mode, which also backs off on throttling and 5xx).
pub const MAX_ATTEMPTS: u32 = 3;

/// [`CONNECT_TIMEOUT`], [`ATTEMPT_TIMEOUT`] and [`OPERATION_TIMEOUT`], for a client you build yourself.
pub fn timeout_config() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}

/// Standard retries with [`MAX_ATTEMPTS`], for a client you build yourself.
pub fn retry_config() -> RetryConfig {
    RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS)
}

/// An S3 client configured the standard way (environment variables, profile, instance or task role)
/// with [`timeout_config`] and [`retry_config`]. When an endpoint is overridden (`AWS_ENDPOINT_URL_S3`
/// or `AWS_ENDPOINT_URL`: LocalStack, MinIO) requests use path-style addressing
/// (`http://host/bucket/key`), which emulators on `127.0.0.1` need; against AWS, virtual-hosted style.
///
/// The configuration is loaded once per process and shared with the other clients
/// (`conveyor_aws::shared_config`).
pub async fn s3_client_from_env() -> aws_sdk_s3::Client {
    s3_client(conveyor_aws::shared_config().await, None)
}

/// An S3 client from `config` (which you loaded, with your profile and region) with [`timeout_config`]
/// and [`retry_config`], calling `endpoint` when given. Requests use path-style addressing when the
/// endpoint is overridden (`endpoint`, `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`), as
/// [`s3_client_from_env`] says.
pub fn s3_client(config: &aws_config::SdkConfig, endpoint: Option<&str>) -> aws_sdk_s3::Client {
    let overridden = endpoint.is_some()
        || ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    let mut s3_config = aws_sdk_s3::config::Builder::from(config)
        .timeout_config(timeout_config())
        .retry_config(retry_config())
        .force_path_style(overridden);
    if let Some(endpoint) = endpoint {
        s3_config = s3_config.endpoint_url(endpoint);
    }
    aws_sdk_s3::Client::from_conf(s3_config.build())
}
