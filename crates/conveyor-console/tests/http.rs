//! The console's server against bad clients: a malformed request, an oversized body, headers and a body
//! that never finish (no AWS call is made: the queues come from a prefix, listed only when a page asks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use conveyor_console::{Console, ConsoleConfig};
use conveyor_http::Limits;
use tokio_util::sync::CancellationToken;

fn offline_sqs() -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

fn offline_dynamodb() -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

#[tokio::test]
async fn bad_clients_are_refused_and_cut_off_before_the_token_check() {
    let limits = Limits::default()
        .with_header_timeout(Duration::from_millis(300))
        .with_body_timeout(Duration::from_millis(300))
        .with_max_body(64 * 1024)
        .with_drain_oversized(0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ConsoleConfig::default()
        .with_listen(addr)
        .with_token(Some("0123456789abcdef0123".to_owned()))
        .with_prefixes(vec!["jobs".to_owned()])
        .with_limits(limits);
    let console = Console::new(config, offline_sqs(), offline_dynamodb())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));
    conveyor_http::testing::refuses_bad_clients(addr, "/send", &limits)
        .await
        .unwrap();
    stop.cancel();
}

#[tokio::test]
async fn other_addresses_are_refused_without_a_token() {
    let config = ConsoleConfig::default()
        .with_listen("0.0.0.0:8025".parse().unwrap())
        .with_prefixes(vec!["jobs".to_owned()]);
    let error = Console::new(config, offline_sqs(), offline_dynamodb())
        .await
        .expect_err("no token on 0.0.0.0")
        .to_string();
    assert!(error.contains("--token"), "{error}");
}
