//! Building an SQS client from the environment.

use aws_config::BehaviorVersion;

/// An SQS client configured the standard AWS way: environment variables, shared config and credential
/// files, SSO, container and instance credentials, in the SDK's usual order.
///
/// The endpoint follows the SDK's own rules: `AWS_ENDPOINT_URL_SQS` (or `endpoint_url` in an `[services]`
/// section of the shared config) wins, then `AWS_ENDPOINT_URL`, then the regional AWS endpoint. That is
/// how `source localstack/env.sh` points it at LocalStack; nothing here reads those variables itself.
pub async fn sqs_client_from_env() -> aws_sdk_sqs::Client {
    let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
    aws_sdk_sqs::Client::new(&config)
}
