//! An OTLP/HTTP receiver for tests (feature `otlp`): it answers `POST /v1/traces` as a collector does,
//! decoding the protocol's own protobuf messages (`opentelemetry-proto`), and keeps every span it was
//! sent, so a test asserts on what an exporter really put on the wire: which spans, in which traces,
//! with which parents, links and attributes.
//!
//! Point an exporter at [`OtlpReceiver::endpoint`] (`OTEL_EXPORTER_OTLP_ENDPOINT`: the exporter adds
//! `/v1/traces`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

/// One span as the receiver got it; ids in lower-case hex, as W3C `traceparent` writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The resource's `service.name`.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// OTLP's span kind (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// The trace id.
    pub trace_id: String,
    /// The span id.
    pub span_id: String,
    /// The parent's span id, empty for a root span.
    pub parent_span_id: String,
    /// The links: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// String, integer and boolean attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code (0 unset, 1 ok, 2 error).
    pub status_code: i32,
}

impl ReceivedSpan {
    /// An attribute's value as text.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }

    /// Whether this span is `other`'s child or links to it.
    pub fn follows(&self, other: &ReceivedSpan) -> bool {
        let parent = self.trace_id == other.trace_id && self.parent_span_id == other.span_id;
        let linked = self
            .links
            .iter()
            .any(|(trace, span)| *trace == other.trace_id && *span == other.span_id);
        parent || linked
    }
}

/// A collector's OTLP/HTTP traces endpoint on a free local port; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: CancellationToken,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl OtlpReceiver {
    /// Starts the receiver on `127.0.0.1` and a free port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let kept = Arc::clone(&spans);
        let router = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| {
                let kept = Arc::clone(&kept);
                async move { receive(&kept, &headers, &body) }
            }),
        );
        let limits = conveyor_http::Limits::default().with_max_body(16 * 1024 * 1024);
        tokio::spawn(conveyor_http::serve(listener, router, limits, stop.clone()));
        Ok(Self { addr, spans, stop })
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The full traces URL, for an exporter configured in code (`with_endpoint`).
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint())
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Waits until `done` holds for the spans received, checking every 100 ms, at most `timeout`;
    /// then returns them, or an error listing what was received.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> anyhow::Result<Vec<ReceivedSpan>> {
        let poll = Duration::from_millis(100);
        let arrived = crate::wait::wait_for(timeout, poll, async || {
            let spans = self.spans();
            done(&spans).then_some(spans)
        })
        .await;
        arrived.map_err(|_| {
            let names: Vec<String> = self
                .spans()
                .iter()
                .map(|span| format!("{}:{} ({})", span.service, span.name, span.span_id))
                .collect();
            anyhow::anyhow!("the spans awaited did not arrive within {timeout:?}; received: {names:?}")
        })
    }
}

fn receive(
    kept: &Mutex<Vec<ReceivedSpan>>,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let is_protobuf = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/x-protobuf"));
    if !is_protobuf {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let spans = flatten(request);
    kept.lock().unwrap_or_else(PoisonError::into_inner).extend(spans);
    let response = ExportTraceServiceResponse {
        partial_success: None,
    };
    (StatusCode::OK, protobuf, response.encode_to_vec())
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .map(|resource| attributes(resource.attributes))
            .and_then(|attributes| attributes.get("service.name").cloned())
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                out.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
                        .collect(),
                    attributes: attributes(span.attributes),
                    status_code: span.status.map_or(0, |status| status.code),
                });
            }
        }
    }
    out
}

fn attributes(list: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>) -> BTreeMap<String, String> {
    list.into_iter()
        .filter_map(|pair| Some((pair.key, text(pair.value?)?)))
        .collect()
}

fn text(value: AnyValue) -> Option<String> {
    match value.value? {
        any_value::Value::StringValue(text) => Some(text),
        any_value::Value::IntValue(number) => Some(number.to_string()),
        any_value::Value::BoolValue(flag) => Some(flag.to_string()),
        any_value::Value::DoubleValue(number) => Some(number.to_string()),
        _ => None,
    }
}
