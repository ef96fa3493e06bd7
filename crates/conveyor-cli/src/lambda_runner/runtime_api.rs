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
//! dropped, and the connection stays usable; a body over 64 MB is refused at once and closes it).
//!
//! The routes are an axum router served by [`conveyor_http::serve`] (hyper's HTTP/1.1 server with
//! keep-alive, as `lambda_runtime`'s client expects), with its header and body deadlines.
//!
//! # Design note: handing out invocations
//!
//! The runner queues invocations and wakes the waiters; a `next` handler registers for the wake-up
//! *before* looking at the queue, so no wake-up is lost, and takes the first queued invocation. Several
//! may be outstanding at once: a bootstrap that serves concurrent invocations (Lambda Managed
//! Instances, `AWS_LAMBDA_MAX_CONCURRENCY`) holds that many `next` requests open, and each takes its
//! own invocation, with its own request id and deadline header. The handler marks the invocation open
//! when it takes it (the answer can only come after the client read it); an answer is accepted once,
//! for an open id. Everything that happens to one invocation (started, undelivered, answered) goes to
//! the receiver [`RuntimeApi::submit`] returned for it, so concurrent invocations never read each
//! other's events; the rest (`next` requested, init errors) goes to [`RuntimeApi::next_event`]. A
//! bootstrap killed mid-wait closes its connection; hyper notices the end of stream while the handler
//! is pending and drops the handler, so it never takes an invocation meant for the process that
//! replaces it. The event goes out as a response body ([`Delivery`]) that reports `Started` when hyper
//! takes its bytes, and `Undelivered` (closing the invocation) when it is dropped before that: the
//! connection died between the take and the write. The runner withdraws an invocation nobody took (a
//! crashed bootstrap) so it is never delivered late; withdrawing all of them (the environment is
//! replaced) ends every receiver.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Extension;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use conveyor_http::{Limits, OversizedBody};
use http_body::{Frame, SizeHint};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "/2018-06-01/runtime";
/// Lambda's error type for a response over the payload limit.
pub(crate) const RESPONSE_TOO_LARGE: &str = "Function.ResponseSizeTooLarge";
/// The largest response or error body accepted: Lambda's 6 MB synchronous response limit.
pub(crate) const MAX_BODY_BYTES: usize = 6 * 1024 * 1024;
/// A body over [`MAX_BODY_BYTES`] but under this is read and dropped, so the connection stays usable
/// and the route can answer 413 (a function's oversized response is a function error, as on Lambda);
/// a larger one is refused at once and closes the connection.
pub(crate) const MAX_DISCARDED_BYTES: usize = 64 * 1024 * 1024;

/// The API's request limits: Lambda's body limit; headers within 30 s (an idle keep-alive connection
/// is closed after that too: the runtime client reconnects), and a body within 60 s.
pub(crate) fn limits() -> Limits {
    Limits::default()
        .with_header_timeout(Duration::from_secs(30))
        .with_body_timeout(Duration::from_secs(60))
        .with_max_body(MAX_BODY_BYTES)
        .with_drain_oversized(MAX_DISCARDED_BYTES)
}
/// An event for the bootstrap.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
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
pub(crate) enum ApiEvent {
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
    /// Invocations submitted and not taken yet, first come first served.
    queued: Mutex<VecDeque<Invocation>>,
    ready: Notify,
    /// Invocations taken and not answered yet.
    open: Mutex<HashSet<String>>,
    /// Where each submitted invocation's events go.
    routes: Mutex<HashMap<String, mpsc::UnboundedSender<ApiEvent>>>,
    /// Events of no invocation (`next` requested, init errors).
    events: mpsc::UnboundedSender<ApiEvent>,
}

/// Locks `mutex`; a poisoned lock (a holder panicked) still gives its data.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ApiEvent {
    /// The invocation the event belongs to, if any.
    fn invocation(&self) -> Option<&str> {
        match self {
            ApiEvent::Started { id, .. }
            | ApiEvent::Undelivered { id }
            | ApiEvent::Response { id, .. }
            | ApiEvent::Error { id, .. } => Some(id),
            ApiEvent::NextRequested { .. } | ApiEvent::InitError { .. } => None,
        }
    }
}

impl Shared {
    /// Sends `event` to its invocation's receiver, or to the API's own.
    fn emit(&self, event: ApiEvent) {
        let route = event
            .invocation()
            .and_then(|id| lock(&self.routes).get(id).cloned());
        // A receiver gone (its invocation withdrawn, the server stopping) needs the event no more.
        let _ = match route {
            Some(route) => route.send(event),
            None => self.events.send(event),
        };
    }
}

/// The server: bound on `127.0.0.1:0` (a free port), serving until dropped.
pub(crate) struct RuntimeApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<ApiEvent>>,
    stop: CancellationToken,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl RuntimeApi {
    /// Binds a free loopback port and starts serving.
    pub(crate) async fn bind() -> std::io::Result<Self> {
        Self::bind_with(limits()).await
    }

    /// [`RuntimeApi::bind`] with other request limits (tests use short deadlines).
    pub(crate) async fn bind_with(limits: Limits) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (sender, events) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queued: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            open: Mutex::new(HashSet::new()),
            routes: Mutex::new(HashMap::new()),
            events: sender,
        });
        let stop = CancellationToken::new();
        tokio::spawn(conveyor_http::serve(
            listener,
            router(Arc::clone(&shared)),
            limits,
            stop.clone(),
        ));
        Ok(Self {
            addr,
            shared,
            events: tokio::sync::Mutex::new(events),
            stop,
        })
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Offers an invocation to the next (or a waiting) `next` request; its events come on the receiver
    /// returned, until it is withdrawn.
    pub(crate) fn submit(&self, invocation: Invocation) -> mpsc::UnboundedReceiver<ApiEvent> {
        let (route, events) = mpsc::unbounded_channel();
        lock(&self.shared.routes).insert(invocation.id.clone(), route);
        lock(&self.shared.queued).push_back(invocation);
        self.shared.ready.notify_waiters();
        events
    }

    /// Withdraws invocation `id`: not delivered if nobody took it, closed if open (a late answer gets
    /// 400), and its receiver ends.
    pub(crate) fn withdraw(&self, id: &str) {
        lock(&self.shared.queued).retain(|queued| queued.id != id);
        lock(&self.shared.open).remove(id);
        lock(&self.shared.routes).remove(id);
    }

    /// Withdraws every invocation (the environment is replaced).
    pub(crate) fn withdraw_all(&self) {
        lock(&self.shared.queued).clear();
        lock(&self.shared.open).clear();
        lock(&self.shared.routes).clear();
    }

    /// The next event of no invocation (`next` requested, an init error).
    pub(crate) async fn next_event(&self) -> Option<ApiEvent> {
        self.events.lock().await.recv().await
    }

    /// An event of no invocation already there, without waiting.
    pub(crate) fn try_next_event(&self) -> Option<ApiEvent> {
        self.events.try_lock().ok()?.try_recv().ok()
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(&format!("{PREFIX}/invocation/next"), get(next))
        .route(&format!("{PREFIX}/invocation/{{id}}/response"), post(response))
        .route(&format!("{PREFIX}/invocation/{{id}}/error"), post(error))
        .route(&format!("{PREFIX}/init/error"), post(error))
        .fallback(|request: axum::extract::Request| async move {
            json_reply(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("no route {}", request.uri().path()),
            )
        })
        .with_state(shared)
}

type Oversized = Option<Extension<OversizedBody>>;

/// `POST invocation/{id}/response`.
async fn response(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    oversized: Oversized,
    body: Bytes,
) -> Response {
    if let Some(Extension(OversizedBody(length))) = oversized {
        let message = format!(
            "Response payload size ({length} bytes) exceeded maximum allowed payload size ({MAX_BODY_BYTES} bytes)."
        );
        // The invocation ends as a function error; the runtime's request itself is refused.
        let document = error_body(RESPONSE_TOO_LARGE, &message);
        let _ = answer(&shared, &id, |id| ApiEvent::Error {
            id,
            error_type: Some(RESPONSE_TOO_LARGE.to_owned()),
            body: document,
        });
        return json_reply(StatusCode::PAYLOAD_TOO_LARGE, RESPONSE_TOO_LARGE, &message);
    }
    answer(&shared, &id, |id| ApiEvent::Response {
        id,
        body: body.to_vec(),
    })
}

/// `POST invocation/{id}/error` and `POST init/error` (no id).
async fn error(
    State(shared): State<Arc<Shared>>,
    id: Option<Path<String>>,
    headers: HeaderMap,
    oversized: Oversized,
    body: Bytes,
) -> Response {
    if oversized.is_some() {
        return too_large();
    }
    let (error_type, body) = (error_type(&headers), body.to_vec());
    let Some(Path(id)) = id else {
        shared.emit(ApiEvent::InitError { error_type, body });
        return accepted();
    };
    answer(&shared, &id, |id| ApiEvent::Error { id, error_type, body })
}

fn error_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get("lambda-runtime-function-error-type")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

fn too_large() -> Response {
    json_reply(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestTooLarge",
        &format!("the body is over {MAX_BODY_BYTES} bytes"),
    )
}

fn accepted() -> Response {
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"OK"}"#,
    )
        .into_response()
}

/// A response or error for `id`: accepted once, only for an open invocation.
fn answer(shared: &Shared, id: &str, event: impl FnOnce(String) -> ApiEvent) -> Response {
    if !lock(&shared.open).remove(id) {
        return json_reply(StatusCode::BAD_REQUEST, "InvalidRequestID", "Invalid request ID");
    }
    shared.emit(event(id.to_owned()));
    accepted()
}

/// `GET invocation/next`: waits for an invocation (see the design note), then answers with it.
async fn next(State(shared): State<Arc<Shared>>) -> Response {
    shared.emit(ApiEvent::NextRequested { at: Instant::now() });
    let invocation = loop {
        let notified = shared.ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(invocation) = lock(&shared.queued).pop_front() {
            lock(&shared.open).insert(invocation.id.clone());
            break invocation;
        }
        notified.await;
    };
    let deadline = Instant::now() + invocation.timeout;
    let deadline_ms = (SystemTime::now() + invocation.timeout)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let headers = [
        ("content-type", "application/json".to_owned()),
        ("lambda-runtime-aws-request-id", invocation.id.clone()),
        ("lambda-runtime-deadline-ms", deadline_ms.to_string()),
        (
            "lambda-runtime-invoked-function-arn",
            invocation.function_arn.clone(),
        ),
        ("lambda-runtime-trace-id", invocation.trace_id.clone()),
    ];
    let delivery = Delivery {
        body: Some(Bytes::from(invocation.body)),
        id: invocation.id,
        deadline,
        shared: Arc::clone(&shared),
        started: false,
    };
    let mut response = Response::new(Body::new(delivery));
    for (name, value) in headers {
        // Ids, ARNs and trace headers are ASCII; a value that is not goes out empty rather than not at all.
        let value = HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""));
        response
            .headers_mut()
            .insert(HeaderName::from_static(name), value);
    }
    response
}

/// An invocation's event as a response body: `Started` when hyper takes the bytes to write them,
/// `Undelivered` when dropped before (see the module's design note).
struct Delivery {
    body: Option<Bytes>,
    id: String,
    deadline: Instant,
    shared: Arc<Shared>,
    started: bool,
}

impl http_body::Body for Delivery {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(bytes) = self.body.take() else {
            return Poll::Ready(None);
        };
        if !self.started {
            self.started = true;
            self.shared.emit(ApiEvent::Started {
                id: self.id.clone(),
                deadline: self.deadline,
            });
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.body.as_ref().map_or(0, |bytes| bytes.len() as u64))
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.started {
            return;
        }
        lock(&self.shared.open).remove(&self.id);
        self.shared.emit(ApiEvent::Undelivered {
            id: std::mem::take(&mut self.id),
        });
    }
}

fn json_reply(status: StatusCode, error_type: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error_body(error_type, message),
    )
        .into_response()
}

fn error_body(error_type: &str, message: &str) -> Vec<u8> {
    serde_json::json!({"errorType": error_type, "errorMessage": message})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;

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
            head.push_str(&line.to_ascii_lowercase());
        }
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
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
    async fn ask_next(api: &RuntimeApi, client: &mut BufReader<TcpStream>) {
        send(
            client,
            b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\n\r\n",
        )
        .await;
        assert!(matches!(event(api).await, ApiEvent::NextRequested { .. }));
    }

    async fn event(api: &RuntimeApi) -> ApiEvent {
        tokio::time::timeout(Duration::from_secs(5), api.next_event())
            .await
            .expect("an API event within 5 s")
            .unwrap()
    }

    /// The next event of one invocation.
    async fn routed(events: &mut mpsc::UnboundedReceiver<ApiEvent>) -> ApiEvent {
        tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("an invocation event within 5 s")
            .unwrap()
    }

    #[tokio::test]
    async fn next_is_held_until_an_event_then_answers_flow_on_one_connection() {
        let api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        send(
            &mut client,
            b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(matches!(event(&api).await, ApiEvent::NextRequested { .. }));

        // Nothing is written before an invocation is submitted.
        let mut probe = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), client.get_mut().peek(&mut probe)).await;
        assert!(early.is_err(), "next answered before an event existed");

        let mut first = api.submit(invocation("req-1"));
        let (head, body) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("lambda-runtime-aws-request-id: req-1"), "{head}");
        assert!(head.contains("lambda-runtime-deadline-ms: "), "{head}");
        assert!(
            head.contains("lambda-runtime-invoked-function-arn: arn:aws:lambda:"),
            "{head}"
        );
        assert!(head.contains("lambda-runtime-trace-id: root="), "{head}");
        assert_eq!(body, br#"{"Records":[]}"#);
        assert!(matches!(routed(&mut first).await, ApiEvent::Started { id, .. } if id == "req-1"));

        // The answer comes on the same (kept-alive) connection.
        let response = br#"{"batchItemFailures":[]}"#;
        let request = format!(
            "POST /2018-06-01/runtime/invocation/req-1/response HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            response.len()
        );
        send(&mut client, request.as_bytes()).await;
        send(&mut client, response).await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 202"), "{head}");
        assert_eq!(
            routed(&mut first).await,
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
        assert!(head.starts_with("http/1.1 400"), "{head}");
        assert!(String::from_utf8(body).unwrap().contains("InvalidRequestID"));
    }

    /// Two `next` requests outstanding at once (a bootstrap serving concurrent invocations): each takes
    /// its own invocation with its own request id and deadline, and each answer reaches only its own
    /// invocation's receiver, whatever the order.
    #[tokio::test]
    async fn concurrent_invocations_each_get_their_own_id_deadline_and_answer() {
        let api = RuntimeApi::bind().await.unwrap();
        let mut one = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        let mut two = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        ask_next(&api, &mut one).await;
        ask_next(&api, &mut two).await;
        let mut short = invocation("req-short");
        short.timeout = Duration::from_secs(2);
        let mut long = invocation("req-long");
        long.timeout = Duration::from_secs(60);
        let mut short_events = api.submit(short);
        let mut long_events = api.submit(long);
        let (head_one, _) = read_response(&mut one).await;
        let (head_two, _) = read_response(&mut two).await;
        let header = |head: &str, name: &str| {
            head.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|value| value.trim().to_owned())
                .unwrap()
        };
        let ids = [
            header(&head_one, "lambda-runtime-aws-request-id:"),
            header(&head_two, "lambda-runtime-aws-request-id:"),
        ];
        assert!(
            ids.contains(&"req-short".to_owned()) && ids.contains(&"req-long".to_owned()),
            "{ids:?}"
        );
        let deadline_of = |id: &str| {
            let head = if ids[0] == id { &head_one } else { &head_two };
            header(head, "lambda-runtime-deadline-ms:")
                .parse::<u64>()
                .unwrap()
        };
        let apart = deadline_of("req-long") - deadline_of("req-short");
        assert!(
            (57_000..=59_000).contains(&apart),
            "each its own deadline: {apart} ms apart"
        );
        assert!(matches!(routed(&mut short_events).await, ApiEvent::Started { id, .. } if id == "req-short"));
        assert!(matches!(routed(&mut long_events).await, ApiEvent::Started { id, .. } if id == "req-long"));

        // The long one answers first, on whichever connection took it.
        let (long_client, short_client) = if ids[0] == "req-long" {
            (&mut one, &mut two)
        } else {
            (&mut two, &mut one)
        };
        for (client, id) in [(long_client, "req-long"), (short_client, "req-short")] {
            let request = format!(
                "POST /2018-06-01/runtime/invocation/{id}/response HTTP/1.1\r\nContent-Length: 2\r\n\r\n{{}}"
            );
            send(client, request.as_bytes()).await;
            let (head, _) = read_response(client).await;
            assert!(head.starts_with("http/1.1 202"), "{head}");
        }
        assert_eq!(
            routed(&mut long_events).await,
            ApiEvent::Response {
                id: "req-long".to_owned(),
                body: b"{}".to_vec()
            }
        );
        assert_eq!(
            routed(&mut short_events).await,
            ApiEvent::Response {
                id: "req-short".to_owned(),
                body: b"{}".to_vec()
            }
        );
    }

    #[tokio::test]
    async fn a_response_over_the_limit_is_a_function_error() {
        let api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        ask_next(&api, &mut client).await;
        let mut big = api.submit(invocation("req-big"));
        let _ = read_response(&mut client).await;
        assert!(matches!(routed(&mut big).await, ApiEvent::Started { .. }));
        let length = MAX_BODY_BYTES + 10;
        let head = format!(
            "POST /2018-06-01/runtime/invocation/req-big/response HTTP/1.1\r\nContent-Length: {length}\r\n\r\n"
        );
        send(&mut client, head.as_bytes()).await;
        send(&mut client, &vec![b'x'; length]).await;
        let (head, body) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 413"), "{head}");
        assert!(String::from_utf8(body).unwrap().contains(RESPONSE_TOO_LARGE));
        match routed(&mut big).await {
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
        ask_next(&api, &mut client).await;
    }

    #[tokio::test]
    async fn a_waiter_whose_client_left_does_not_take_the_next_event() {
        let api = RuntimeApi::bind().await.unwrap();
        let mut gone = TcpStream::connect(api.addr()).await.unwrap();
        gone.write_all(b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(event(&api).await, ApiEvent::NextRequested { .. }));
        drop(gone);

        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        ask_next(&api, &mut client).await;
        let _events = api.submit(invocation("req-2"));
        let (head, _) = read_response(&mut client).await;
        assert!(head.contains("lambda-runtime-aws-request-id: req-2"), "{head}");
    }

    #[tokio::test]
    async fn init_errors_invocation_errors_and_unknown_routes() {
        let api = RuntimeApi::bind().await.unwrap();
        let mut client = BufReader::new(TcpStream::connect(api.addr()).await.unwrap());
        send(&mut client, b"POST /2018-06-01/runtime/init/error HTTP/1.1\r\nLambda-Runtime-Function-Error-Type: Runtime.Boom\r\nContent-Length: 2\r\n\r\n{}").await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 202"), "{head}");
        assert_eq!(
            event(&api).await,
            ApiEvent::InitError {
                error_type: Some("Runtime.Boom".to_owned()),
                body: b"{}".to_vec()
            }
        );
        send(&mut client, b"GET /2018-06-01/runtime/nope HTTP/1.1\r\n\r\n").await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 404"), "{head}");
        send(
            &mut client,
            b"POST /2018-06-01/runtime/invocation/next HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        let (head, _) = read_response(&mut client).await;
        assert!(head.starts_with("http/1.1 405"), "{head}");

        // An invocation withdrawn before anyone took it is never delivered.
        let _events = api.submit(invocation("req-3"));
        api.withdraw("req-3");
        ask_next(&api, &mut client).await;
        let mut probe = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), client.get_mut().peek(&mut probe)).await;
        assert!(early.is_err(), "a withdrawn invocation was delivered");
    }

    #[tokio::test]
    async fn bad_clients_are_refused_and_cut_off() {
        let limits = limits()
            .with_header_timeout(Duration::from_millis(300))
            .with_body_timeout(Duration::from_millis(300));
        let api = RuntimeApi::bind_with(limits).await.unwrap();
        conveyor_http::testing::refuses_bad_clients(api.addr(), "/2018-06-01/runtime/init/error", &limits)
            .await
            .unwrap();
    }
}
