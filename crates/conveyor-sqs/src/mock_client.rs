//! The mocked SQS client the request-shape tests share.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::BatchResultErrorEntry;
use aws_smithy_mocks::{MockResponseInterceptor, Rule, RuleMode, create_mock_http_client};

/// A client answered by `rules` (first match wins, rules stay). Built by hand rather than with
/// `mock_client!`, whose `with_test_defaults_v2` needs a newer aws-sdk-sqs than the workspace's.
pub(crate) fn mock_sqs<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Client {
    let mut interceptor = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for rule in rules {
        interceptor = interceptor.with_rule(rule);
    }
    let config = aws_sdk_sqs::config::Config::builder()
        .with_test_defaults()
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
        .http_client(create_mock_http_client())
        .interceptor(interceptor)
        .build();
    Client::from_conf(config)
}

/// A batch entry's failure as SQS reports it: the entry `id`, the error `code`, whose fault, and the
/// optional message.
pub(crate) fn failed_entry(
    id: &str,
    code: &str,
    sender_fault: bool,
    message: Option<&str>,
) -> BatchResultErrorEntry {
    BatchResultErrorEntry::builder()
        .id(id)
        .code(code)
        .sender_fault(sender_fault)
        .set_message(message.map(str::to_owned))
        .build()
        .expect("id, code and sender_fault are set")
}
