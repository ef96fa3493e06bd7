//! The operations endpoint: `/healthz`, `/readyz` and Prometheus `/metrics` over a tiny HTTP/1.1
//! server (one request per connection), and the client side of `worker --healthcheck`.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::WorkerError;
use crate::report::WorkerStatus;
use crate::telemetry::record_log_write_errors;

/// The longest request head accepted.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the endpoint's address.
pub(crate) async fn bind(addr: &str) -> Result<TcpListener, WorkerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| WorkerError::Listen {
            addr: addr.to_owned(),
            source,
        })
}

/// Serves until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    status: WorkerStatus,
    metrics: Option<PrometheusHandle>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "operations endpoint: accept failed");
                continue;
            }
        };
        let status = status.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(error) = respond(stream, &status, metrics.as_ref()).await {
                tracing::debug!(%error, "operations endpoint: connection failed");
            }
        });
    }
}

async fn respond(
    mut stream: TcpStream,
    status: &WorkerStatus,
    metrics: Option<&PrometheusHandle>,
) -> std::io::Result<()> {
    let Ok(head) = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await else {
        return Ok(());
    };
    let head = head?;
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (code, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/healthz") => (200, "text/plain", "ok\n".to_owned()),
        ("GET" | "HEAD", "/readyz") => match status.not_ready_because() {
            None => (200, "text/plain", "ready\n".to_owned()),
            Some(reason) => (503, "text/plain", format!("{reason}\n")),
        },
        ("GET" | "HEAD", "/metrics") => match metrics {
            Some(handle) => {
                record_log_write_errors();
                handle.run_upkeep();
                (200, "text/plain; version=0.0.4", handle.render())
            }
            None => (
                503,
                "text/plain",
                "metrics go to the application's own recorder, installed before the worker's\n".to_owned(),
            ),
        },
        ("GET" | "HEAD", _) => (
            404,
            "text/plain",
            "not found: try /healthz, /readyz or /metrics\n".to_owned(),
        ),
        _ => (405, "text/plain", "method not allowed\n".to_owned()),
    };
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut response = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads the request line and headers (up to the blank line), bounded.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buffer = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if buffer.windows(4).any(|window| window == b"\r\n\r\n") || buffer.len() >= MAX_REQUEST_BYTES {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buffer).into_owned())
}

/// Checks a worker's `/healthz` at `addr` (for `worker --healthcheck` in an ECS container health check).
/// A wildcard listen address (`0.0.0.0:9090`, `[::]:9090`) is checked on the loopback interface.
pub async fn healthcheck(addr: &str) -> Result<(), WorkerError> {
    let unhealthy = |problem: String| WorkerError::Unhealthy {
        addr: addr.to_owned(),
        problem,
    };
    let target = loopback_for_wildcard(addr);
    let exchange = async {
        let mut stream = TcpStream::connect(target.as_str()).await?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| unhealthy(format!("no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|error| unhealthy(error.to_string()))?;
    let status_line = response.lines().next().unwrap_or("");
    if status_line.split_whitespace().nth(1) == Some("200") {
        return Ok(());
    }
    Err(unhealthy(format!("answered {status_line:?}")))
}

/// `0.0.0.0:port` → `127.0.0.1:port`, `[::]:port` → `[::1]:port`; anything else as is.
fn loopback_for_wildcard(addr: &str) -> String {
    if let Some(port) = addr.strip_prefix("0.0.0.0:") {
        return format!("127.0.0.1:{port}");
    }
    if let Some(port) = addr.strip_prefix("[::]:") {
        return format!("[::1]:{port}");
    }
    addr.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_addresses_are_checked_on_loopback() {
        assert_eq!(loopback_for_wildcard("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(loopback_for_wildcard("[::]:9090"), "[::1]:9090");
        assert_eq!(loopback_for_wildcard("10.0.0.5:9090"), "10.0.0.5:9090");
    }
}
