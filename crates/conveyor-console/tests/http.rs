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

/// One request on its own connection, as written; the answer's status line and body.
async fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// DNS rebinding and cross-site POSTs against the token-less default (loopback): a request addressed to
/// another name is refused before anything (the page's CSRF value included) is served, whatever the
/// path; a POST from another origin or site is refused before its form is read; the console's own
/// names (any port, as through an SSH tunnel) are served.
#[tokio::test]
async fn another_sites_page_can_neither_read_nor_post_through_dns_rebinding() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ConsoleConfig::default()
        .with_listen(addr)
        .with_prefixes(vec!["jobs".to_owned()]);
    let console = Console::new(config, offline_sqs(), offline_dynamodb())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));

    let get =
        |host: &str| format!("GET /static/console.css HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    for host in [
        format!("127.0.0.1:{}", addr.port()),
        "localhost:9999".to_owned(),
        "[::1]:8025".to_owned(),
    ] {
        let answer = raw(addr, &get(&host)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
    }
    for host in [
        "rebind.evil.example:8025",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
    ] {
        let answer = raw(addr, &get(host)).await;
        assert!(answer.starts_with("HTTP/1.1 421"), "{host}: {answer}");
        assert!(answer.contains("Unknown host"), "{answer}");
    }
    let answer = raw(addr, "GET / HTTP/1.0\r\n\r\n").await;
    assert!(answer.contains(" 421 "), "no Host at all: {answer}");

    let body = "queue=q&action=purge&csrf=x";
    let post = |extra: &str| {
        format!(
            "POST /queues/purge HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra}Content-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            addr.port(),
            body.len()
        )
    };
    for extra in [
        "Origin: http://rebind.evil.example\r\n",
        "Origin: null\r\nSec-Fetch-Site: cross-site\r\n",
        "Sec-Fetch-Site: same-site\r\n",
    ] {
        let answer = raw(addr, &post(extra)).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{extra}: {answer}");
        assert!(answer.contains("Cross-site request refused"), "{extra}: {answer}");
    }
    // From the console's own page: past the cross-site check, refused by the CSRF check instead.
    let own = format!(
        "Origin: http://127.0.0.1:{}\r\nSec-Fetch-Site: same-origin\r\n",
        addr.port()
    );
    let answer = raw(addr, &post(&own)).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(!answer.contains("Cross-site request refused"), "{answer}");
    assert!(answer.contains("CSRF"), "{answer}");
    stop.cancel();
}
