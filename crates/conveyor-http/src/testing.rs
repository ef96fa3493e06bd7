//! Checks every server's tests run against it over a raw TCP connection: a malformed request, an
//! oversized body, a client that never finishes its headers, one that never finishes its body.
//!
//! Each check returns what went wrong as an `Err` with the server's raw answer, so a test reads
//! `refuses_bad_clients(addr, "/echo", &limits).await.unwrap()`. A server that checks a token before
//! it reads a body takes the checks with the token's header ([`refuses_bad_clients_with`]).
//! [`raw_request`] sends one request exactly as written, for tests of what a server answers to
//! headers a well-behaved client would not send.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads everything the server sends until it closes the connection, at most `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Result<String, String> {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    match read {
        Ok(Ok(_)) => Ok(text),
        // A reset after the answer is a close too.
        Ok(Err(error)) if !text.is_empty() || error.kind() == std::io::ErrorKind::ConnectionReset => Ok(text),
        Ok(Err(error)) => Err(format!("reading the answer failed: {error}")),
        Err(_) => Err(format!(
            "the connection was still open after {within:?}; received so far: {text:?}"
        )),
    }
}

/// Sends `request` exactly as written on a new connection and reads the answer until the server
/// closes it (send `Connection: close`), at most 10 s.
pub async fn raw_request(addr: SocketAddr, request: &str) -> Result<String, String> {
    let mut stream = connect(addr).await?;
    write(&mut stream, request.as_bytes()).await?;
    read_until_closed(&mut stream, Duration::from_secs(10)).await
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    TcpStream::connect(addr)
        .await
        .map_err(|error| format!("cannot connect to {addr}: {error}"))
}

async fn write(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), String> {
    stream
        .write_all(bytes)
        .await
        .map_err(|error| format!("writing the request failed: {error}"))
}

fn expect_status(answer: &str, status: u16) -> Result<(), String> {
    if answer.starts_with(&format!("HTTP/1.1 {status} ")) {
        return Ok(());
    }
    Err(format!("expected status {status}, got {answer:?}"))
}

/// A request line that is not HTTP gets `400` and a closed connection.
pub(crate) async fn malformed_request_is_refused(addr: SocketAddr) -> Result<(), String> {
    let mut stream = connect(addr).await?;
    write(&mut stream, b"THIS IS NOT HTTP\r\n\r\n").await?;
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).await?;
    expect_status(&answer, 400)
}

/// A `POST path` with a body of `length` bytes gets `413`.
pub(crate) async fn oversized_body_is_refused(
    addr: SocketAddr,
    path: &str,
    length: usize,
    headers: &str,
) -> Result<(), String> {
    let mut stream = connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n"
    );
    write(&mut stream, head.as_bytes()).await?;
    // The server may answer before the body is in: a failed write after that is fine.
    let _ = stream.write_all(&vec![b'x'; length]).await;
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await?;
    expect_status(&answer, 413)
}

/// A client that sends part of its headers and then nothing is cut off within `within`.
pub(crate) async fn unfinished_head_is_cut_off(addr: SocketAddr, within: Duration) -> Result<(), String> {
    let mut stream = connect(addr).await?;
    write(&mut stream, b"GET / HTTP/1.1\r\nHost: localhost\r\n").await?;
    read_until_closed(&mut stream, within).await.map(|_| ())
}

/// A client that announces a body and sends only part of it gets `408` (and a closed connection)
/// within `within`.
pub(crate) async fn unfinished_body_is_cut_off(
    addr: SocketAddr,
    path: &str,
    within: Duration,
    headers: &str,
) -> Result<(), String> {
    let mut stream = connect(addr).await?;
    let head =
        format!("POST {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Length: 100\r\n\r\n0123456789");
    write(&mut stream, head.as_bytes()).await?;
    let answer = read_until_closed(&mut stream, within).await?;
    expect_status(&answer, 408)
}

/// Every check above, against a server whose limits are `limits` and whose `post_path` takes a POST.
pub async fn refuses_bad_clients(
    addr: SocketAddr,
    post_path: &str,
    limits: &crate::Limits,
) -> Result<(), String> {
    refuses_bad_clients_with(addr, post_path, limits, "").await
}

/// [`refuses_bad_clients`], each POST carrying `headers` (header lines, each ending in `\r\n`, such
/// as a token: the checks of the body then reach the body).
pub async fn refuses_bad_clients_with(
    addr: SocketAddr,
    post_path: &str,
    limits: &crate::Limits,
    headers: &str,
) -> Result<(), String> {
    let slack = Duration::from_secs(3);
    malformed_request_is_refused(addr).await?;
    let oversized = limits.max_body.max(limits.drain_oversized) + 1;
    oversized_body_is_refused(addr, post_path, oversized, headers).await?;
    unfinished_head_is_cut_off(addr, limits.header_timeout + slack).await?;
    unfinished_body_is_cut_off(addr, post_path, limits.body_timeout + slack, headers).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::routing::{get, post};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::Limits;

    /// One `POST /echo` of `body` on a kept-alive connection, answered with `body`.
    async fn echo(stream: &mut TcpStream, body: &str) {
        let request = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buffer = [0u8; 512];
        let read = stream.read(&mut buffer).await.unwrap();
        let answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with(body),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn the_stack_refuses_bad_clients_and_serves_good_ones() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            header_timeout: Duration::from_millis(500),
            body_timeout: Duration::from_millis(500),
            max_body: 1000,
            drain_oversized: 0,
            max_connections: 2,
        };
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/echo", post(|body: String| async move { body }));
        let stop = CancellationToken::new();
        let router = router.layer(axum::middleware::from_fn_with_state(
            limits,
            crate::body::bound_body,
        ));
        let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        tokio::spawn(crate::serve_within(
            listener,
            router,
            limits,
            stop.clone(),
            Arc::clone(&connections),
        ));

        refuses_bad_clients(addr, "/echo", &limits).await.unwrap();

        // A well-formed request on a kept-alive connection is answered, twice.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            echo(&mut stream, "hello").await;
        }

        // The cap: with that connection and another idle one open, a third is not served until one
        // of them closes.
        let idle = TcpStream::connect(addr).await.unwrap();
        // The loop takes a permit before each accept: once none is left, the idle connection (first in
        // the kernel's queue) has the last one and nothing else is accepted until a connection closes.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while connections.available_permits() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the loop never took the last permit"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let waiting = tokio::spawn(raw_request(
            addr,
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ));
        // One more round trip on the first connection: the server is running, and still holds both.
        echo(&mut stream, "hi").await;
        assert_eq!(connections.available_permits(), 0);
        assert!(!waiting.is_finished(), "a third connection was served beside two");
        drop(stream);
        let answer = waiting.await.unwrap().unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        drop(idle);
        stop.cancel();
    }
}
