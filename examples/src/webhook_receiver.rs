//! A local webhook receiver for the demo and the tests: verifies signatures and answers by path.
//!
//! `/ok` answers 200; `/flaky` answers 503 with `Retry-After: 1` to a delivery's first attempt, then 200;
//! `/gone` answers 410.
//! Every request is counted per delivery id, so the demo can say how many attempts a delivery took.
//! An axum router served by [`conveyor_http::serve`] (header and body deadlines, a 1 MiB body limit).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use conveyor_http::Limits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::jobs::webhook::{DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signature};

/// One request the receiver saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The path.
    pub path: String,
    /// The delivery id header.
    pub delivery_id: String,
    /// Whether the signature verified.
    pub signature_valid: bool,
    /// The status answered.
    pub status: u16,
}

/// A running receiver.
#[derive(Debug, Clone)]
pub struct WebhookReceiver {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Received>>>,
}

impl WebhookReceiver {
    /// Starts a receiver on a free loopback port, verifying signatures made with `secret`.
    pub async fn start(secret: Vec<u8>) -> std::io::Result<Self> {
        Self::start_with(secret, Limits::default()).await
    }

    /// [`WebhookReceiver::start`] with other request limits (tests use short deadlines). The receiver
    /// serves until the process ends.
    pub async fn start_with(secret: Vec<u8>, limits: Limits) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let receiver = Self {
            addr,
            log: Arc::clone(&log),
        };
        let router = Router::new().fallback(receive).with_state(Receiver {
            secret: Arc::new(secret),
            log,
        });
        tokio::spawn(conveyor_http::serve(
            listener,
            router,
            limits,
            CancellationToken::new(),
        ));
        Ok(receiver)
    }

    /// The URL of `path` (`/ok`, `/flaky`, `/gone`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Attempts per delivery id.
    pub fn attempts(&self) -> HashMap<String, usize> {
        let mut attempts = HashMap::new();
        for request in self.received() {
            *attempts.entry(request.delivery_id).or_insert(0) += 1;
        }
        attempts
    }
}

#[derive(Clone)]
struct Receiver {
    secret: Arc<Vec<u8>>,
    log: Arc<Mutex<Vec<Received>>>,
}

/// Any method, any path: verify, count, answer by path.
async fn receive(State(receiver): State<Receiver>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let delivery_id = header(DELIVERY_HEADER);
    let timestamp: u64 = header(TIMESTAMP_HEADER).parse().unwrap_or(0);
    let signature_valid = header(SIGNATURE_HEADER) == signature(&receiver.secret, timestamp, &body);
    let path = uri.path().to_owned();
    let status = {
        let mut log = receiver.log.lock().unwrap_or_else(PoisonError::into_inner);
        let earlier = log
            .iter()
            .filter(|request| request.delivery_id == delivery_id)
            .count();
        let status = match path.as_str() {
            _ if !signature_valid => 401,
            "/ok" => 200,
            "/flaky" if earlier == 0 => 503,
            "/flaky" => 200,
            "/gone" => 410,
            _ => 404,
        };
        log.push(Received {
            path,
            delivery_id,
            signature_valid,
            status,
        });
        status
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // A 503 says when to come back, as a well-behaved receiver does.
        return (status, [("retry-after", "1")]).into_response();
    }
    status.into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn bad_clients_are_refused_and_cut_off() {
        let limits = Limits::default()
            .with_header_timeout(Duration::from_millis(300))
            .with_body_timeout(Duration::from_millis(300))
            .with_max_body(64 * 1024)
            .with_drain_oversized(0);
        let receiver = WebhookReceiver::start_with(b"secret".to_vec(), limits)
            .await
            .unwrap();
        conveyor_http::testing::refuses_bad_clients(receiver.addr, "/ok", &limits)
            .await
            .unwrap();
        // The refused requests never reached the log.
        assert!(receiver.received().is_empty());
    }
}
