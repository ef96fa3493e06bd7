//! The operations endpoint: `/healthz`, `/readyz` and Prometheus `/metrics`, an axum router served by
//! [`conveyor_http::serve`] (header and body deadlines, body limit), and the client side of
//! `worker --healthcheck`.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use conveyor_http::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::WorkerError;
use crate::prometheus::MetricsHandle;
use crate::report::WorkerStatus;
use crate::telemetry::record_log_write_errors;

/// How long the health check waits for an answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The endpoint's limits: its requests have no body, and a client gets 5 s for its headers.
pub(crate) fn limits() -> Limits {
    Limits::default()
        .with_header_timeout(REQUEST_TIMEOUT)
        .with_body_timeout(REQUEST_TIMEOUT)
        .with_max_body(8 * 1024)
        .with_drain_oversized(0)
}

/// Binds the endpoint's address.
pub(crate) async fn bind(addr: &str) -> Result<TcpListener, WorkerError> {
    conveyor_http::bind(addr)
        .await
        .map_err(|error| WorkerError::Listen {
            addr: error.addr,
            source: error.source,
        })
}

#[derive(Clone)]
struct Endpoint {
    status: WorkerStatus,
    metrics: Option<MetricsHandle>,
}

/// The routes (GET and HEAD; any other method gets 405, any other path 404).
fn router(status: WorkerStatus, metrics: Option<MetricsHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: try /healthz, /readyz or /metrics\n",
            )
        })
        .with_state(Endpoint { status, metrics })
}

async fn readyz(State(endpoint): State<Endpoint>) -> Response {
    match endpoint.status.not_ready_because() {
        None => "ready\n".into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

async fn render_metrics(State(endpoint): State<Endpoint>) -> Response {
    let Some(handle) = endpoint.metrics else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no Prometheus recorder: this build has no `prometheus` feature, or the application installed its own recorder before the worker\n",
        )
            .into_response();
    };
    record_log_write_errors();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

/// Serves until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    status: WorkerStatus,
    metrics: Option<MetricsHandle>,
    stop: CancellationToken,
) {
    conveyor_http::serve(listener, router(status, metrics), limits(), stop).await;
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
    use conveyor_core::runtime::StoreHealth;

    #[tokio::test]
    async fn bad_clients_are_refused_and_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = limits()
            .with_header_timeout(Duration::from_millis(300))
            .with_body_timeout(Duration::from_millis(300));
        let stop = CancellationToken::new();
        let router = router(WorkerStatus::new(1, StoreHealth::default()), None);
        tokio::spawn(conveyor_http::serve(listener, router, limits, stop.clone()));
        conveyor_http::testing::refuses_bad_clients(addr, "/healthz", &limits)
            .await
            .unwrap();
        stop.cancel();
    }

    #[test]
    fn wildcard_addresses_are_checked_on_loopback() {
        assert_eq!(loopback_for_wildcard("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(loopback_for_wildcard("[::]:9090"), "[::1]:9090");
        assert_eq!(loopback_for_wildcard("10.0.0.5:9090"), "10.0.0.5:9090");
    }
}
