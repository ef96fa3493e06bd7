//! A local webhook receiver for the demo and the tests: verifies signatures and answers by path.
//!
//! `/ok` answers 200; `/flaky` answers 503 with `Retry-After: 1` to a delivery's first attempt, then 200;
//! `/gone` answers 410.
//! Every request is counted per delivery id, so the demo can say how many attempts a delivery took.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let receiver = Self {
            addr,
            log: Arc::clone(&log),
        };
        let secret = Arc::new(secret);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                let secret = Arc::clone(&secret);
                tokio::spawn(async move {
                    if let Err(error) = serve(stream, &secret, &log).await {
                        tracing::debug!(%error, "webhook receiver connection ended");
                    }
                });
            }
        });
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

async fn serve(mut stream: TcpStream, secret: &[u8], log: &Mutex<Vec<Received>>) -> std::io::Result<()> {
    loop {
        let Some((path, headers, body)) = read_request(&mut stream).await? else {
            return Ok(());
        };
        let header = |name: &str| headers.get(name).cloned().unwrap_or_default();
        let delivery_id = header(DELIVERY_HEADER);
        let timestamp: u64 = header(TIMESTAMP_HEADER).parse().unwrap_or(0);
        let signature_valid = header(SIGNATURE_HEADER) == signature(secret, timestamp, &body);
        let status = {
            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
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
        // A 503 says when to come back, as a well-behaved receiver does.
        let retry_after = if status == 503 { "retry-after: 1\r\n" } else { "" };
        let response = format!("HTTP/1.1 {status} X\r\n{retry_after}content-length: 0\r\n\r\n");
        stream.write_all(response.as_bytes()).await?;
    }
}

type Request = (String, HashMap<String, String>, Vec<u8>);

/// Reads one HTTP/1.1 request (headers, then `content-length` bytes); `None` at end of stream.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end;
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
    let mut lines = head.lines();
    let path = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[header_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    body.truncate(length);
    Ok(Some((path, headers, body)))
}
