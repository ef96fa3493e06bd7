//! The console's server against bad clients and other sites: a malformed request, an oversized body,
//! headers and a body that never finish, a request without the token, DNS rebinding, cross-site POSTs
//! (no AWS call is made: the queues come from a prefix, listed only when a page asks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use conveyor_console::{Console, ConsoleConfig};
use conveyor_http::Limits;
use conveyor_http::testing::raw_request;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";
const BEARER: &str = "Authorization: Bearer 0123456789abcdef0123\r\n";

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

/// Serves a console with `config` (the queues from a prefix) on a loopback port.
async fn serve(config: ConsoleConfig) -> (std::net::SocketAddr, Console, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = config.with_listen(addr).with_prefixes(vec!["jobs".to_owned()]);
    let console = Console::new(config, offline_sqs(), offline_dynamodb())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(console.clone().serve(listener, stop.clone()));
    (addr, console, stop)
}

#[tokio::test]
async fn bad_clients_are_refused_and_cut_off() {
    let limits = Limits::default()
        .with_header_timeout(Duration::from_millis(300))
        .with_body_timeout(Duration::from_millis(300))
        .with_max_body(64 * 1024)
        .with_drain_oversized(0);
    let config = ConsoleConfig::default()
        .with_token(Some(TOKEN.to_owned()))
        .with_limits(limits);
    let (addr, _console, stop) = serve(config).await;
    conveyor_http::testing::refuses_bad_clients_with(addr, "/send", &limits, BEARER)
        .await
        .unwrap();
    stop.cancel();
}

/// Without the token nothing is served, on loopback too; a body is not read before the token is
/// checked: a request announcing 1 GB without the token is answered 401 at once, its body never sent.
#[tokio::test]
async fn no_token_no_page_and_no_body_read() {
    let (addr, console, stop) = serve(ConsoleConfig::default()).await;
    assert_eq!(
        console.token().len(),
        64,
        "a token is generated when none is given"
    );
    let get = |extra: &str| {
        format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra}Connection: close\r\n\r\n",
            addr.port()
        )
    };
    let answer = raw_request(addr, &get("")).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("needs its token"), "{answer}");
    let wrong = raw_request(addr, &get(BEARER)).await.unwrap();
    assert!(wrong.starts_with("HTTP/1.1 401"), "another token: {wrong}");
    // The generated token opens the page: the cookie is set and the token leaves the address.
    let opened = raw_request(
        addr,
        &format!(
            "GET /static/console.css?token={} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n",
            console.token(),
            addr.port()
        ),
    )
    .await
    .unwrap();
    assert!(opened.starts_with("HTTP/1.1 303"), "{opened}");
    assert!(opened.contains("location: /static/console.css\r\n"), "{opened}");
    assert!(
        opened.contains(&format!(
            "conveyor_console_token={}; HttpOnly; SameSite=Strict; Path=/\r\n",
            console.token()
        )),
        "{opened}"
    );
    let header = format!("Authorization: Bearer {}\r\n", console.token());
    let served = raw_request(addr, &get(&header)).await.unwrap();
    assert!(!served.starts_with("HTTP/1.1 401"), "{served}");
    assert!(
        served.contains("referrer-policy: same-origin\r\n"),
        "the pages' own POSTs carry their origin: {served}"
    );
    // A cookie of the same name set first by a page on another local port does not lock the
    // operator out: every cookie of the name is tried.
    let shadowed = format!(
        "Cookie: conveyor_console_token=shadow\r\nCookie: other=1; conveyor_console_token={}\r\n",
        console.token()
    );
    let css = format!(
        "GET /static/console.css HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{shadowed}Connection: close\r\n\r\n",
        addr.port()
    );
    let served = raw_request(addr, &css).await.unwrap();
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    // The token in the address is percent-decoded: an encoded token opens the page too.
    let encoded: String = console
        .token()
        .bytes()
        .map(|byte| format!("%{byte:02X}"))
        .collect();
    let opened = raw_request(
        addr,
        &format!(
            "GET /static/console.css?token={encoded} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n",
            addr.port()
        ),
    )
    .await
    .unwrap();
    assert!(opened.starts_with("HTTP/1.1 303"), "{opened}");

    let head = format!(
        "POST /send HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 1000000000\r\n\r\n",
        addr.port()
    );
    let answer = raw_request(addr, &head).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    stop.cancel();
}

#[tokio::test]
async fn other_addresses_are_refused_without_a_tls_proxy() {
    let config = ConsoleConfig::default()
        .with_listen("0.0.0.0:8025".parse().unwrap())
        .with_prefixes(vec!["jobs".to_owned()]);
    let error = Console::new(config, offline_sqs(), offline_dynamodb())
        .await
        .expect_err("plain HTTP on 0.0.0.0")
        .to_string();
    assert!(error.contains("--behind-tls-proxy"), "{error}");
}

/// Behind a TLS proxy the cookie is `__Host-` and `Secure`, and the proxy's name is answered.
#[tokio::test]
async fn behind_a_tls_proxy_the_cookie_is_secure() {
    let config = ConsoleConfig::default()
        .with_token(Some(TOKEN.to_owned()))
        .with_behind_tls_proxy(true)
        .with_public_names(vec!["console.example.com".to_owned()]);
    let (addr, _console, stop) = serve(config).await;
    let opened = raw_request(
        addr,
        &format!("GET /?token={TOKEN} HTTP/1.1\r\nHost: console.example.com\r\nConnection: close\r\n\r\n"),
    )
    .await
    .unwrap();
    assert!(opened.starts_with("HTTP/1.1 303"), "{opened}");
    assert!(
        opened.contains(&format!(
            "__Host-conveyor_console_token={TOKEN}; HttpOnly; SameSite=Strict; Secure; Path=/\r\n"
        )),
        "{opened}"
    );
    let plain_cookie = raw_request(
        addr,
        &format!(
            "GET /static/console.css HTTP/1.1\r\nHost: console.example.com\r\n\
             Cookie: conveyor_console_token={TOKEN}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
    .unwrap();
    assert!(
        plain_cookie.starts_with("HTTP/1.1 401"),
        "behind TLS only the __Host- cookie counts: {plain_cookie}"
    );
    stop.cancel();
}

/// DNS rebinding and cross-site POSTs: a request addressed to another name is refused before anything
/// (the page's CSRF value included) is served, whatever the path, token or not; a POST from another
/// origin or site is refused before its form is read; the console's own names (any port, as through
/// an SSH tunnel) are served.
#[tokio::test]
async fn another_sites_page_can_neither_read_nor_post_through_dns_rebinding() {
    let config = ConsoleConfig::default().with_token(Some(TOKEN.to_owned()));
    let (addr, _console, stop) = serve(config).await;
    let get = |host: &str| {
        format!("GET /static/console.css HTTP/1.1\r\nHost: {host}\r\n{BEARER}Connection: close\r\n\r\n")
    };
    for host in [
        format!("127.0.0.1:{}", addr.port()),
        "localhost:9999".to_owned(),
        "[::1]:8025".to_owned(),
    ] {
        let answer = raw_request(addr, &get(&host)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
    }
    for host in [
        "rebind.evil.example:8025",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
    ] {
        let answer = raw_request(addr, &get(host)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 421"), "{host}: {answer}");
        assert!(answer.contains("Unknown host"), "{answer}");
    }
    let answer = raw_request(addr, "GET / HTTP/1.0\r\n\r\n").await.unwrap();
    assert!(answer.contains(" 421 "), "no Host at all: {answer}");

    let body = "queue=q&action=purge&csrf=x";
    let post = |extra: &str| {
        format!(
            "POST /queues/purge HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{BEARER}{extra}Content-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            addr.port(),
            body.len()
        )
    };
    for extra in [
        "Origin: http://rebind.evil.example\r\n",
        "Origin: null\r\nSec-Fetch-Site: cross-site\r\n",
        "Sec-Fetch-Site: same-site\r\n",
        // A sandboxed frame or a `data:` page: the console's own pages send their real origin.
        "Origin: null\r\n",
        "Origin: null\r\nSec-Fetch-Site: same-origin\r\n",
    ] {
        let answer = raw_request(addr, &post(extra)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{extra}: {answer}");
        assert!(answer.contains("Cross-site request refused"), "{extra}: {answer}");
    }
    // From the console's own page: past the cross-site check, refused by the CSRF check instead.
    let own = format!(
        "Origin: http://127.0.0.1:{}\r\nSec-Fetch-Site: same-origin\r\n",
        addr.port()
    );
    let answer = raw_request(addr, &post(&own)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(!answer.contains("Cross-site request refused"), "{answer}");
    assert!(answer.contains("CSRF"), "{answer}");
    stop.cancel();
}

/// A viewer's token sees pages without bodies and takes no action: every POST, and every GET that
/// asks for a body, a payload or a job's output, is refused before the handler runs; the operator's
/// token is not.
#[tokio::test]
async fn a_viewer_token_is_refused_every_action_and_body_read() {
    const VIEWER: &str = "viewer-0123456789abcdef";
    let config = ConsoleConfig::default()
        .with_token(Some(TOKEN.to_owned()))
        .with_viewer_token(Some(VIEWER.to_owned()));
    let (addr, _console, stop) = serve(config).await;
    let host = format!("Host: 127.0.0.1:{}\r\n", addr.port());
    let get = |path: &str, token: &str| {
        format!("GET {path} HTTP/1.1\r\n{host}Authorization: Bearer {token}\r\nConnection: close\r\n\r\n")
    };
    let served = raw_request(addr, &get("/static/console.css", VIEWER))
        .await
        .unwrap();
    assert!(
        served.starts_with("HTTP/1.1 200"),
        "a viewer reads pages: {served}"
    );
    for path in [
        "/dlq?queue=q&show=m-1",
        "/dlq?queue=q&show=m-1&fetch=1",
        "/jobs?job_type=t&key=k&show_output=1",
    ] {
        let answer = raw_request(addr, &get(path, VIEWER)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(answer.contains("Read-only"), "{path}: {answer}");
    }
    for path in [
        "/queues/purge",
        "/dlq/peek",
        "/dlq/act",
        "/dlq/cancel-task",
        "/delays/act",
        "/schedules/act",
        "/send",
        "/tasks/1/stop",
    ] {
        let body = "queue=q&action=purge&confirm=yes&csrf=x";
        let post = |token: &str| {
            format!(
                "POST {path} HTTP/1.1\r\n{host}Authorization: Bearer {token}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        };
        let answer = raw_request(addr, &post(VIEWER)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(answer.contains("Read-only"), "{path}: {answer}");
        let operator = raw_request(addr, &post(TOKEN)).await.unwrap();
        assert!(!operator.contains("Read-only"), "{path}: {operator}");
    }
    stop.cancel();
}
