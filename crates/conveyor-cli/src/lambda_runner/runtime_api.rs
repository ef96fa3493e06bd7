//! The Lambda Runtime API, served on loopback for one bootstrap process.
//!
//! Routes (API version 2018-06-01, as `lambda_runtime` calls them):
//!
//! | route | behaviour |
//! |---|---|
//! | `GET /runtime/invocation/next` | held until the runner submits an event, then 200 with the event and the `Lambda-Runtime-*` headers |
//! | `POST /runtime/invocation/{id}/response` | 202; the runner gets the body |
//! | `POST /runtime/invocation/{id}/error` | 202; the runner gets the error |
//! | `POST /runtime/init/error` | 202; the runner gets the error |
//!
//! A response or error for an id that is not the open invocation (a late answer after a timeout) gets
//! 400 `InvalidRequestID`, as on Lambda. A response over 6 MB gets 413 and ends the invocation as a
//! function error, `Function.ResponseSizeTooLarge`, as on Lambda (not a timeout: the body is read and
//! dropped, and the connection stays usable).
//!
//! # Design note: handing out an invocation
//!
//! The runner puts one invocation in a slot and wakes the waiters; a `next` handler registers for the
//! wake-up *before* looking at the slot, so no wake-up is lost. The handler marks the invocation open
//! before writing it (the answer can only come after the client read it). While it waits it also
//! watches its socket: a bootstrap killed mid-wait closes the connection, and its handler must not
//! take the next invocation meant for the process that replaces it. The runner withdraws an event
//! nobody took (a crashed bootstrap) so it is never delivered late.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::http::{self, Request};

const PREFIX: &str = "/2018-06-01/runtime";
/// Lambda's error type for a response over the payload limit.
pub const RESPONSE_TOO_LARGE: &str = "Function.ResponseSizeTooLarge";

/// An event for the bootstrap.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// `Lambda-Runtime-Aws-Request-Id`.
    pub id: String,
    /// The event JSON.
    pub body: Vec<u8>,
    /// The function timeout: the deadline is counted from the moment the bootstrap takes the event.
    pub timeout: Duration,
    /// `Lambda-Runtime-Invoked-Function-Arn`.
    pub function_arn: String,
    /// `Lambda-Runtime-Trace-Id`.
    pub trace_id: String,
}

/// What happened on the API, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiEvent {
    /// The bootstrap asked for the next event.
    NextRequested {
        /// When.
        at: Instant,
    },
    /// The bootstrap took an invocation; it must answer by `deadline`.
    Started {
        /// The request id.
        id: String,
        /// The invocation deadline.
        deadline: Instant,
    },
    /// The bootstrap's connection failed while the invocation was written to it.
    Undelivered {
        /// The request id.
        id: String,
    },
    /// The function returned.
    Response {
        /// The request id.
        id: String,
        /// The returned JSON.
        body: Vec<u8>,
    },
    /// The function failed.
    Error {
        /// The request id.
        id: String,
        /// `Lambda-Runtime-Function-Error-Type`, when sent.
        error_type: Option<String>,
        /// The error document.
        body: Vec<u8>,
    },
    /// The bootstrap failed to initialise.
    InitError {
        /// `Lambda-Runtime-Function-Error-Type`, when sent.
        error_type: Option<String>,
        /// The error document.
        body: Vec<u8>,
    },
}

struct Shared {
    slot: Mutex<Option<Invocation>>,
    ready: Notify,
    open: Mutex<Option<String>>,
    events: mpsc::UnboundedSender<ApiEvent>,
}

/// Locks `mutex`; a poisoned lock (a holder panicked) still gives its data.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn emit(&self, event: ApiEvent) {
        // The receiver lives as long as the server; a send can only fail during shutdown.
        let _ = self.events.send(event);
    }
}

/// The server: bound on `127.0.0.1:0` (a free port), serving until dropped.
pub struct RuntimeApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    events: mpsc::UnboundedReceiver<ApiEvent>,
    accept: JoinHandle<()>,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl RuntimeApi {
    /// Binds a free loopback port and starts serving.
    pub async fn bind() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (sender, events) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            slot: Mutex::new(None),
            ready: Notify::new(),
            open: Mutex::new(None),
            events: sender,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            addr,
            shared,
            events,
            accept,
        })
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Offers an invocation to the next (or a waiting) `next` request.
    pub fn submit(&self, invocation: Invocation) {
        *lock(&self.shared.slot) = Some(invocation);
        self.shared.ready.notify_waiters();
    }

    /// Withdraws an invocation nobody took and closes the open one: late answers get 400.
    pub fn withdraw(&self) {
        lock(&self.shared.slot).take();
        lock(&self.shared.open).take();
    }

    /// The next API event.
    pub async fn next_event(&mut self) -> Option<ApiEvent> {
        self.events.recv().await
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve(stream, Arc::clone(&shared)));
            }
            Err(error) => {
                tracing::warn!(%error, "runtime API accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One connection: requests one after another until the client closes it.
async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let request = match http::read_request(&mut reader).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "runtime API: bad request");
                if let Some(status) = error.status() {
                    let body = error_body("InvalidRequest", &error.to_string());
                    let _ = http::write_response(&mut write, status, &json_type(), &body, true).await;
                }
                return;
            }
        };
        let keep_open = route(&request, &shared, &mut reader, &mut write).await;
        if request.close || !keep_open {
            return;
        }
    }
}

/// Answers one request; false closes the connection.
async fn route(
    request: &Request,
    shared: &Shared,
    reader: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
) -> bool {
    let path = request.path.strip_prefix(PREFIX).unwrap_or("");
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let Some(length) = request.oversized {
        let document = error_body(
            RESPONSE_TOO_LARGE,
            &format!(
                "Response payload size ({length} bytes) exceeded maximum allowed payload size ({} bytes).",
                http::MAX_BODY_BYTES
            ),
        );
        if let ("POST", ["invocation", id, "response"]) = (request.method.as_str(), segments.as_slice()) {
            // The invocation ends as a function error; the runtime's request itself is refused.
            let _ = answer(shared, id, |id| ApiEvent::Error {
                id,
                error_type: Some(RESPONSE_TOO_LARGE.to_owned()),
                body: document.clone(),
            });
        }
        return http::write_response(write, 413, &json_type(), &document, request.close)
            .await
            .is_ok();
    }
    let reply = match (request.method.as_str(), segments.as_slice()) {
        ("GET", ["invocation", "next"]) => return next(shared, reader, write, request.close).await,
        ("POST", ["invocation", id, "response"]) => answer(shared, id, |id| ApiEvent::Response {
            id,
            body: request.body.clone(),
        }),
        ("POST", ["invocation", id, "error"]) => answer(shared, id, |id| ApiEvent::Error {
            id,
            error_type: request
                .header("lambda-runtime-function-error-type")
                .map(str::to_owned),
            body: request.body.clone(),
        }),
        ("POST", ["init", "error"]) => {
            shared.emit(ApiEvent::InitError {
                error_type: request
                    .header("lambda-runtime-function-error-type")
                    .map(str::to_owned),
                body: request.body.clone(),
            });
            accepted()
        }
        (_, ["invocation", "next"] | ["invocation", _, "response" | "error"] | ["init", "error"]) => {
            (405, error_body("MethodNotAllowed", "wrong method for this route"))
        }
        _ => (404, error_body("NotFound", &format!("no route {}", request.path))),
    };
    http::write_response(write, reply.0, &json_type(), &reply.1, request.close)
        .await
        .is_ok()
}

fn accepted() -> (u16, Vec<u8>) {
    (202, br#"{"status":"OK"}"#.to_vec())
}

/// A response or error for `id`: accepted only for the open invocation.
fn answer(shared: &Shared, id: &str, event: impl FnOnce(String) -> ApiEvent) -> (u16, Vec<u8>) {
    let mut open = lock(&shared.open);
    if open.as_deref() != Some(id) {
        return (400, error_body("InvalidRequestID", "Invalid request ID"));
    }
    open.take();
    drop(open);
    shared.emit(event(id.to_owned()));
    accepted()
}

/// `GET next`: waits for an invocation (see the design note), then writes it.
async fn next(
    shared: &Shared,
    reader: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
    close: bool,
) -> bool {
    shared.emit(ApiEvent::NextRequested { at: Instant::now() });
    let mut watch_socket = true;
    let invocation = loop {
        let notified = shared.ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(invocation) = lock(&shared.slot).take() {
            *lock(&shared.open) = Some(invocation.id.clone());
            break invocation;
        }
        tokio::select! {
            () = &mut notified => {}
            buffered = reader.fill_buf(), if watch_socket => match buffered {
                // Closed (or failed) while waiting: this client is gone.
                Ok([]) | Err(_) => return false,
                // The client sent more while waiting (not done by lambda_runtime): keep it for later.
                Ok(_) => watch_socket = false,
            },
        }
    };
    let deadline = Instant::now() + invocation.timeout;
    let deadline_ms = (SystemTime::now() + invocation.timeout)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let headers = [
        ("Content-Type", "application/json".to_owned()),
        ("Lambda-Runtime-Aws-Request-Id", invocation.id.clone()),
        ("Lambda-Runtime-Deadline-Ms", deadline_ms.to_string()),
        (
            "Lambda-Runtime-Invoked-Function-Arn",
            invocation.function_arn.clone(),
        ),
        ("Lambda-Runtime-Trace-Id", invocation.trace_id.clone()),
    ];
    if http::write_response(write, 200, &headers, &invocation.body, close)
        .await
        .is_err()
    {
        lock(&shared.open).take();
        shared.emit(ApiEvent::Undelivered { id: invocation.id });
        return false;
    }
    shared.emit(ApiEvent::Started {
        id: invocation.id,
        deadline,
    });
    true
}

fn json_type() -> [(&'static str, String); 1] {
    [("Content-Type", "application/json".to_owned())]
}

fn error_body(error_type: &str, message: &str) -> Vec<u8> {
    serde_json::json!({"errorType": error_type, "errorMessage": message})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn invocation(id: &str) -> Invocation {
        Invocation {
            id: id.to_owned(),
            body: br#"{"Records":[]}"#.to_vec(),
            timeout: Duration::from_secs(3),
            function_arn: "arn:aws:lambda:us-east-1:000000000000:function:f".to_owned(),
            trace_id: "Root=1-00000000-000000000000000000000000".to_owned(),
        }
    }

    /// Reads one response (head and `Content-Length` body) from a raw connection.
    async fn read_response(stream: &mut BufReader<TcpStream>) -> (String, Vec<u8>) {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await.unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("Content-Length: "))
            .map_or(0, |value| value.trim().parse::<usize>().unwrap());
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        (head, body)
    }

    /// Writes raw request bytes on a test connection.
    async fn send(client: &mut BufReader<TcpStream>, bytes: &[u8]) {
        client.get_mut().write_all(bytes).await.unwrap();
    }

    /// Asks for the next invocation on `client` and waits until the API has the request.
    async fn ask_next(api: &mut RuntimeApi, client: &mut BufReader<TcpStream>) {
        send(
            client,
            b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\n\r\n",
        )
        .await;
        assert!(matches!(event(api).await, ApiEvent::NextRequested { .. }));
    }

    async fn event(api: &mut RuntimeApi) -> ApiEvent {
        tokio::time::timeout(Duration::from_secs(5), api.next_event())
            .await
            .expect("an API event within 5 s")
            .unwrap()
    }

    #[tokio::test]
    async fn next_is_held_until_an_event_then_answers_flow_on_one_connection() {
        let mut api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        send(
            &mut client,
            b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(matches!(event(&mut api).await, ApiEvent::NextRequested { .. }));

        // Nothing is written before an invocation is submitted.
        let mut probe = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), client.get_mut().peek(&mut probe)).await;
        assert!(early.is_err(), "next answered before an event existed");

        api.submit(invocation("req-1"));
        let (head, body) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("Lambda-Runtime-Aws-Request-Id: req-1"), "{head}");
        assert!(head.contains("Lambda-Runtime-Deadline-Ms: "), "{head}");
        assert!(
            head.contains("Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:"),
            "{head}"
        );
        assert!(head.contains("Lambda-Runtime-Trace-Id: Root="), "{head}");
        assert_eq!(body, br#"{"Records":[]}"#);
        assert!(matches!(event(&mut api).await, ApiEvent::Started { id, .. } if id == "req-1"));

        // The answer comes on the same (kept-alive) connection.
        let response = br#"{"batchItemFailures":[]}"#;
        let request = format!(
            "POST /2018-06-01/runtime/invocation/req-1/response HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            response.len()
        );
        send(&mut client, request.as_bytes()).await;
        send(&mut client, response).await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 202"), "{head}");
        assert_eq!(
            event(&mut api).await,
            ApiEvent::Response {
                id: "req-1".to_owned(),
                body: response.to_vec()
            }
        );

        // A second answer for the same id is refused.
        send(
            &mut client,
            b"POST /2018-06-01/runtime/invocation/req-1/error HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        )
        .await;
        let (head, body) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
        assert!(String::from_utf8(body).unwrap().contains("InvalidRequestID"));
    }

    #[tokio::test]
    async fn a_response_over_the_limit_is_a_function_error() {
        let mut api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        ask_next(&mut api, &mut client).await;
        api.submit(invocation("req-big"));
        let _ = read_response(&mut client).await;
        assert!(matches!(event(&mut api).await, ApiEvent::Started { .. }));
        let length = http::MAX_BODY_BYTES + 10;
        let head = format!(
            "POST /2018-06-01/runtime/invocation/req-big/response HTTP/1.1\r\nContent-Length: {length}\r\n\r\n"
        );
        send(&mut client, head.as_bytes()).await;
        send(&mut client, &vec![b'x'; length]).await;
        let (head, body) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 413"), "{head}");
        assert!(String::from_utf8(body).unwrap().contains(RESPONSE_TOO_LARGE));
        match event(&mut api).await {
            ApiEvent::Error { id, error_type, body } => {
                assert_eq!(id, "req-big");
                assert_eq!(error_type.as_deref(), Some(RESPONSE_TOO_LARGE));
                assert!(
                    String::from_utf8(body)
                        .unwrap()
                        .contains("exceeded maximum allowed payload size")
                );
            }
            other => panic!("expected a function error, got {other:?}"),
        }
        // The connection still works: the runtime asks for the next event.
        ask_next(&mut api, &mut client).await;
    }

    #[tokio::test]
    async fn a_waiter_whose_client_left_does_not_take_the_next_event() {
        let mut api = RuntimeApi::bind().await.unwrap();
        let mut gone = TcpStream::connect(api.addr()).await.unwrap();
        gone.write_all(b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(event(&mut api).await, ApiEvent::NextRequested { .. }));
        drop(gone);

        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        ask_next(&mut api, &mut client).await;
        api.submit(invocation("req-2"));
        let (head, _) = read_response(&mut client).await;
        assert!(head.contains("Lambda-Runtime-Aws-Request-Id: req-2"), "{head}");
    }

    #[tokio::test]
    async fn init_errors_invocation_errors_and_unknown_routes() {
        let mut api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        send(&mut client, b"POST /2018-06-01/runtime/init/error HTTP/1.1\r\nLambda-Runtime-Function-Error-Type: Runtime.Boom\r\nContent-Length: 2\r\n\r\n{}").await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 202"), "{head}");
        assert_eq!(
            event(&mut api).await,
            ApiEvent::InitError {
                error_type: Some("Runtime.Boom".to_owned()),
                body: b"{}".to_vec()
            }
        );
        send(&mut client, b"GET /2018-06-01/runtime/nope HTTP/1.1\r\n\r\n").await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");
        send(
            &mut client,
            b"POST /2018-06-01/runtime/invocation/next HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 405"), "{head}");

        // An invocation withdrawn before anyone took it is never delivered.
        api.submit(invocation("req-3"));
        api.withdraw();
        ask_next(&mut api, &mut client).await;
        let mut probe = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), client.get_mut().peek(&mut probe)).await;
        assert!(early.is_err(), "a withdrawn invocation was delivered");
    }
}
