//! A TCP proxy in front of an emulator that delays requests while a slowdown is on, and counts the
//! messages SQS hands out.
//!
//! Why a proxy and not `conveyor_testing::faults`: the fault layer wraps SDK clients inside one process,
//! and the example binaries build their own clients. A proxy slows the real processes, unmodified,
//! through the standard `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL_DYNAMODB`. It delays each chunk the
//! client writes (an HTTP request is one or two chunks) by the current delay; it never drops bytes, so
//! what it injects is latency, which the clients' deadlines then turn into timeouts and retries when it
//! is long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The marker counted in SQS's answers: one per message a `ReceiveMessage` returns (JSON protocol).
const RECEIPT_MARKER: &[u8] = b"\"ReceiptHandle\"";

/// The shared state of one proxy: the delay now in force, and counters.
#[derive(Debug, Default)]
pub struct ProxyState {
    delay_ms: AtomicU64,
    delayed_chunks: AtomicU64,
    receipts: AtomicU64,
    connections: AtomicU64,
}

impl ProxyState {
    /// Delays every request from now on by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(millis, Ordering::Relaxed);
    }

    /// Requests (written chunks) delayed so far.
    pub fn delayed_chunks(&self) -> u64 {
        self.delayed_chunks.load(Ordering::Relaxed)
    }

    /// Messages handed out by `ReceiveMessage` answers that went through this proxy.
    pub fn receipts(&self) -> u64 {
        self.receipts.load(Ordering::Relaxed)
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

/// A running proxy; it stops with the runtime.
#[derive(Debug, Clone)]
pub struct DelayProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ProxyState::default());
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        pipe(client, server, &state).await;
                    }
                });
            }
        });
        Ok(Self { addr, state })
    }

    /// `http://127.0.0.1:<port>`, for `AWS_ENDPOINT_URL_*`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's state and counters.
    pub fn state(&self) -> &Arc<ProxyState> {
        &self.state
    }
}

async fn pipe(client: TcpStream, server: TcpStream, state: &ProxyState) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let delay = state.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                state.delayed_chunks.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if server_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let answers = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        // The tail of the previous chunk, so a marker split across two reads is counted once.
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let read = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            carry.extend_from_slice(&buffer[..read]);
            let found = count(&carry, RECEIPT_MARKER);
            state.receipts.fetch_add(found, Ordering::Relaxed);
            let keep = carry.len().min(RECEIPT_MARKER.len() - 1);
            carry.drain(..carry.len() - keep);
            if client_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(requests, answers);
}

fn count(haystack: &[u8], needle: &[u8]) -> u64 {
    let hits = haystack
        .windows(needle.len())
        .filter(|window| *window == needle)
        .count();
    u64::try_from(hits).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_markers() {
        assert_eq!(
            count(br#"{"ReceiptHandle":"a"},{"ReceiptHandle":"b"}"#, RECEIPT_MARKER),
            2
        );
        assert_eq!(count(b"nothing", RECEIPT_MARKER), 0);
    }
}
