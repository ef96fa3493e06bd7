//! Building an SQS client from the environment.

use aws_config::BehaviorVersion;

/// An SQS client configured the standard way: environment variables, shared config and credentials
/// files, SSO, container and instance credentials.
///
/// The SDK itself honours `AWS_ENDPOINT_URL_SQS` (and the general `AWS_ENDPOINT_URL`, or `endpoint_url`
/// in a profile), which is how the tests and `localstack/env.sh` point it at LocalStack.
pub async fn sqs_client_from_env() -> aws_sdk_sqs::Client {
    let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
    aws_sdk_sqs::Client::new(&config)
}
