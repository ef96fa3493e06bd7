#![doc = include_str!("../README.md")]

mod body;
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use body::OversizedBody;

/// The address of the client a request came from: [`serve`] adds it to every request's extensions
/// (read it with `Option<axum::Extension<ClientAddr>>`, absent when the router is called directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// The deadlines and size limits a server applies to every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct Limits {
    /// The request line and headers must arrive within this; an idle keep-alive connection is closed
    /// after it too.
    pub header_timeout: Duration,
    /// The whole body must arrive within this (a trickle of bytes does not extend it).
    pub body_timeout: Duration,
    /// The largest body accepted.
    pub max_body: usize,
    /// A body over `max_body` but at most this long is read and dropped, and the request reaches the
    /// router with an empty body and an [`OversizedBody`] extension (the route answers, the connection
    /// stays usable); a larger one is answered `413` at once. Zero: every oversized body gets `413`.
    pub drain_oversized: usize,
    /// Connections served at once; a client beyond waits in the listener's backlog until one closes
    /// (an idle one is closed after `header_timeout`).
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_body: 1024 * 1024,
            drain_oversized: 0,
            max_connections: 256,
        }
    }
}

/// The largest request line plus headers hyper buffers (it answers `431` / closes beyond).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Serves `router` on `listener` until `stop` is cancelled: HTTP/1.1 with keep-alive, every request
/// held to `limits`. On `stop` the listener closes and open connections finish the request they are on.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    serve_gated(listener, router, limits, stop, |router| router).await;
}

/// As [`serve`], with `gate` wrapped around the router *before* the body is read: the middleware
/// `gate` adds (a token check, a `Host` check) decides from the request's head alone, so a request
/// it refuses is answered without its body being read or buffered.
pub async fn serve_gated(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
    gate: impl FnOnce(Router) -> Router,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let router = gate(router.layer(axum::middleware::from_fn_with_state(limits, body::bound_body)));
    serve_within(listener, router, limits, stop, connections).await;
}

/// The accept loop: one of `connections`' permits per open connection.
async fn serve_within(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
    connections: Arc<Semaphore>,
) {
    loop {
        // A permit first: beyond the cap, clients wait in the kernel's backlog, not in our memory.
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => permit,
            () = stop.cancelled() => return,
        };
        let Ok(permit) = permit else {
            return; // never closed
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let (stream, client) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "http: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone().layer(axum::Extension(ClientAddr(client))));
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEAD_BYTES);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "http: connection ended");
            }
            drop(permit);
        });
    }
}

/// Binds `addr`, e.g. `127.0.0.1:9090`; the error names the address.
pub async fn bind(addr: &str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|source| BindError {
        addr: addr.to_owned(),
        source,
    })
}

/// An address could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source} (is another process using the port? pick another address)")]
pub struct BindError {
    /// The address.
    pub addr: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}
