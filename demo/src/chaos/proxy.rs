//! A TCP proxy in front of an emulator that delays requests while a slowdown is on, cuts every
//! connection while an outage is on, and counts the messages SQS hands out and the requests by operation.
//!
//! Why a proxy and not `conveyor_testing::faults`: the fault layer wraps SDK clients inside one process,
//! and the example binaries build their own clients. A proxy slows or breaks the real processes,
//! unmodified, through the standard `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL_DYNAMODB`.
//!
//! - **Slowdown** ([`ProxyState::set_delay`]): each chunk the client writes (an HTTP request is one or two
//!   chunks) waits the current delay; no byte is dropped, so what it injects is latency, which the
//!   clients' deadlines turn into timeouts and retries when it is long.
//! - **Outage** ([`ProxyState::set_down`]): a new connection is closed as soon as it is accepted, and a
//!   request on an open (pooled) connection is dropped unforwarded with the connection, so the client
//!   sees its connection close without an answer: what an unreachable service looks like to the SDK
//!   (a dispatch failure, retried, then an error). Answers already on their way still arrive.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The marker counted in SQS's answers: one per message a `ReceiveMessage` returns (JSON protocol).
const RECEIPT_MARKER: &[u8] = b"\"ReceiptHandle\"";

/// The header naming a JSON-protocol request's operation (`DynamoDB_20120810.PutItem`,
/// `AmazonSQS.ReceiveMessage`), lower-cased as the SDK writes it.
const TARGET_HEADER: &[u8] = b"x-amz-target:";

/// The shared state of one proxy: the delay now in force, whether an outage is on, and counters.
#[derive(Debug, Default)]
pub struct ProxyState {
    delay_ms: AtomicU64,
    down: AtomicBool,
    delayed_chunks: AtomicU64,
    cut: AtomicU64,
    receipts: AtomicU64,
    connections: AtomicU64,
    operations: Mutex<BTreeMap<String, u64>>,
}

impl ProxyState {
    /// Delays every request from now on by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(millis, Ordering::Relaxed);
    }

    /// Starts (`true`) or ends an outage: while it is on, every connection is closed unanswered.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Connections and requests cut by an outage so far.
    pub fn cut(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
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

    /// Requests forwarded so far by operation (`PutItem`, `ReceiveMessage`, ...), from their
    /// `x-amz-target` header.
    pub fn operations(&self) -> BTreeMap<String, u64> {
        self.operations
            .lock()
            .map(|operations| operations.clone())
            .unwrap_or_default()
    }

    fn count_operation(&self, chunk: &[u8]) {
        let Some(operation) = operation_of(chunk) else {
            return;
        };
        if let Ok(mut operations) = self.operations.lock() {
            *operations.entry(operation).or_insert(0) += 1;
        }
    }
}

/// The operation a request chunk starts, if it holds the request's `x-amz-target` header.
fn operation_of(chunk: &[u8]) -> Option<String> {
    let lower = chunk.to_ascii_lowercase();
    let start = lower
        .windows(TARGET_HEADER.len())
        .position(|window| window == TARGET_HEADER)?
        + TARGET_HEADER.len();
    let value = &chunk[start..];
    let end = value.iter().position(|byte| *byte == b'\r' || *byte == b'\n')?;
    let target = std::str::from_utf8(&value[..end]).ok()?.trim();
    Some(target.rsplit('.').next().unwrap_or(target).to_owned())
}

/// A running proxy; it stops with the runtime.
#[derive(Debug, Clone)]
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ProxyState::default());
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                if shared.is_down() {
                    shared.cut.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
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

    /// A proxy in front of the emulator at `endpoint` (`http://IP:PORT`, `localhost` allowed).
    pub async fn in_front_of(endpoint: &str) -> anyhow::Result<Self> {
        let upstream = socket_of(endpoint)?;
        Self::start(upstream)
            .await
            .with_context(|| format!("starting a proxy in front of {endpoint}"))
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

/// The socket address of an emulator endpoint (`http://IP:PORT`; `localhost` becomes 127.0.0.1).
pub fn socket_of(endpoint: &str) -> anyhow::Result<SocketAddr> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.replace("localhost", "127.0.0.1");
    authority.parse().with_context(|| {
        format!("a proxy needs an emulator endpoint of the form http://IP:PORT, got {endpoint}")
    })
}

/// How the client's side of a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The client closed it (or a write to the server failed).
    Closed,
    /// An outage cut it: the connection is dropped at once, unanswered.
    Cut,
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
            if state.is_down() {
                state.cut.fetch_add(1, Ordering::Relaxed);
                return Ended::Cut;
            }
            let delay = state.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                state.delayed_chunks.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            state.count_operation(&buffer[..read]);
            if server_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
        Ended::Closed
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
    tokio::pin!(requests, answers);
    // Returning drops both sockets: after a cut the client sees its connection close unanswered.
    tokio::select! {
        ended = &mut requests => {
            if ended == Ended::Closed {
                answers.await;
            }
        }
        () = &mut answers => {
            requests.await;
        }
    }
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

    #[test]
    fn operations_are_read_from_the_target_header() {
        let request =
            b"POST / HTTP/1.1\r\nhost: x\r\nx-amz-target: DynamoDB_20120810.TransactWriteItems\r\n\r\n{}";
        assert_eq!(operation_of(request).as_deref(), Some("TransactWriteItems"));
        let title_case = b"POST / HTTP/1.1\r\nX-Amz-Target: AmazonSQS.ReceiveMessage\r\n\r\n";
        assert_eq!(operation_of(title_case).as_deref(), Some("ReceiveMessage"));
        assert_eq!(operation_of(b"{\"body\": \"no header here\"}"), None);
    }

    #[test]
    fn endpoints_become_socket_addresses() {
        assert_eq!(
            socket_of("http://localhost:8000/").ok(),
            Some(SocketAddr::from(([127, 0, 0, 1], 8000)))
        );
        assert!(socket_of("https://dynamodb.us-east-1.amazonaws.com").is_err());
    }

    /// An outage closes new and pooled connections unanswered; when it ends, requests pass again.
    #[tokio::test]
    async fn an_outage_cuts_connections_until_it_ends() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = upstream.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 64];
                    while let Ok(read) = socket.read(&mut buffer).await {
                        if read == 0 || socket.write_all(&buffer[..read]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = FaultProxy::start(upstream_addr).await.unwrap();
        let echo = async |socket: &mut TcpStream| -> Option<Vec<u8>> {
            socket.write_all(b"ping").await.ok()?;
            let mut answer = [0_u8; 4];
            socket.read_exact(&mut answer).await.ok()?;
            Some(answer.to_vec())
        };
        let mut pooled = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(echo(&mut pooled).await.as_deref(), Some(&b"ping"[..]));

        proxy.state().set_down(true);
        assert_eq!(echo(&mut pooled).await, None, "a pooled connection is cut");
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(echo(&mut fresh).await, None, "a new connection is closed");
        assert_eq!(proxy.state().cut(), 2);

        proxy.state().set_down(false);
        let mut after = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(echo(&mut after).await.as_deref(), Some(&b"ping"[..]));
    }
}
