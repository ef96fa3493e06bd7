//! Log lines that fit on a line. `tracing-subscriber`'s own formats print every span in scope with all
//! its fields: on Lambda, `lambda_runtime`'s `Lambda runtime invoke{requestId=… xrayTraceId=…}`, then the
//! adapter's `invocation{request_id=… xray_trace_id=…}`, then the record's span, several hundred
//! characters before the message. Here a line names the request id once and only the innermost span
//! of Conveyor's own (a record's: message id, queue, receive count, job type, outcome), never the X-Ray
//! header:
//!
//! ```text
//! INFO 8e4a…-request-id message{message_id=059f… queue=orders receive_count=1 job_type=welcome}: job done
//! ```
//!
//! With `AWS_LAMBDA_LOG_FORMAT=JSON` each line is one object as Lambda's managed runtimes and Powertools
//! write them, so Lambda's advanced logging controls can filter by level: `timestamp` (RFC 3339, UTC),
//! `level`, `requestId`, `message`, then `span` (the innermost span's name) and the span's and the
//! event's fields, flat.

use std::fmt;

use lambda_runtime::tracing::subscriber::fmt::format::Writer;
use lambda_runtime::tracing::subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use lambda_runtime::tracing::subscriber::layer::{Context, Layer};
use lambda_runtime::tracing::subscriber::registry::LookupSpan;
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};

/// Fields that hold the request id: shown once, at the start of the line.
const REQUEST_ID_FIELDS: [&str; 2] = ["requestId", "request_id"];
/// Fields never printed: the X-Ray header (in the trace, not the log), and OpenTelemetry's own.
fn hidden(name: &str) -> bool {
    matches!(name, "xrayTraceId" | "xray_trace_id")
        || name.starts_with("otel.")
        || REQUEST_ID_FIELDS.contains(&name)
}

/// A span's or an event's fields, in the order they were recorded.
#[derive(Debug, Default, Clone)]
struct Fields(Vec<(&'static str, Value)>);

impl Fields {
    fn put(&mut self, name: &'static str, value: Value) {
        match self.0.iter_mut().find(|(known, _)| *known == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, value)| value)
    }

    /// The request id among these fields, as text.
    fn request_id(&self) -> Option<String> {
        REQUEST_ID_FIELDS.iter().find_map(|name| match self.get(name)? {
            Value::String(text) => Some(text.clone()),
            other => Some(other.to_string()),
        })
    }

    /// The fields a line prints (not the request id, the trace header or OpenTelemetry's).
    fn shown(&self) -> impl Iterator<Item = &(&'static str, Value)> {
        self.0.iter().filter(|(name, _)| !hidden(name))
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(
            field.name(),
            Value::from(conveyor_core::runtime::display_chain(value)),
        );
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field.name(), Value::from(format!("{value:?}")));
    }
}

/// Keeps each span's fields as values, for [`LambdaLines`] to choose from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpanFields;

impl<S> Layer<S> for SpanFields
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
            values.record(fields);
        }
    }
}

/// What a line says about where it was written: the request id, and the innermost span of
/// Conveyor's own with its fields.
#[derive(Debug, Default)]
struct Place {
    request_id: Option<String>,
    span: Option<(&'static str, Fields)>,
}

impl Place {
    fn of<S, N>(ctx: &FmtContext<'_, S, N>) -> Self
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
        N: for<'writer> FormatFields<'writer> + 'static,
    {
        let mut place = Place::default();
        let Some(scope) = ctx.event_scope() else {
            return place;
        };
        for span in scope {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<Fields>() else {
                continue;
            };
            if place.request_id.is_none() {
                place.request_id = fields.request_id();
            }
            let runtime_own = span.metadata().target().starts_with("lambda_runtime");
            if place.span.is_none() && !runtime_own {
                place.span = Some((span.metadata().name(), fields.clone()));
            }
        }
        place
    }
}

/// The event formatter of [`init_tracing`](crate::init_tracing): text or JSON lines, one per event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LambdaLines {
    /// JSON objects (`AWS_LAMBDA_LOG_FORMAT=JSON`) instead of text.
    pub(crate) json: bool,
}

impl<S, N> FormatEvent<S, N> for LambdaLines
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    N: for<'writer> FormatFields<'writer> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut place = Place::of(ctx);
        if place.request_id.is_none() {
            place.request_id = fields.request_id();
        }
        let level = event.metadata().level().as_str();
        let line = if self.json {
            json_line(level, &place, &fields)
        } else {
            text_line(level, &place, &fields)
        };
        writeln!(writer, "{line}")
    }
}

/// `LEVEL request-id span{k=v …}: message k=v …`.
fn text_line(level: &str, place: &Place, fields: &Fields) -> String {
    let mut line = String::from(level);
    if let Some(request_id) = &place.request_id {
        line.push(' ');
        line.push_str(request_id);
    }
    if let Some((name, span_fields)) = &place.span {
        line.push(' ');
        line.push_str(name);
        let shown: Vec<String> = span_fields
            .shown()
            .map(|(name, value)| pair(name, value))
            .collect();
        if !shown.is_empty() {
            line.push('{');
            line.push_str(&shown.join(" "));
            line.push('}');
        }
        line.push(':');
    }
    if let Some(message) = fields.get("message") {
        line.push(' ');
        line.push_str(&text(message));
    }
    for (name, value) in fields.shown().filter(|(name, _)| *name != "message") {
        line.push(' ');
        line.push_str(&pair(name, value));
    }
    line
}

/// `name=value`, the value quoted when it has spaces, quotes or `=` in it.
fn pair(name: &str, value: &Value) -> String {
    let text = text(value);
    if text.is_empty() || text.contains([' ', '"', '=', '\t']) {
        format!("{name}={}", Value::from(text))
    } else {
        format!("{name}={text}")
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `{"timestamp":…,"level":…,"requestId":…,"message":…,"span":…, fields…}`, in that order. A field named
/// like one of the first five is written as `fields.<name>`; an event's field replaces its span's.
fn json_line(level: &str, place: &Place, fields: &Fields) -> String {
    let mut object = Fields::default();
    let now = conveyor_core::runtime::format_time(std::time::SystemTime::now());
    object.put("timestamp", Value::from(now));
    object.put("level", Value::from(level));
    if let Some(request_id) = &place.request_id {
        object.put("requestId", Value::from(request_id.as_str()));
    }
    object.put(
        "message",
        fields.get("message").cloned().unwrap_or(Value::from("")),
    );
    let mut named = Fields::default();
    if let Some((name, span_fields)) = &place.span {
        object.put("span", Value::from(*name));
        named.0.extend(span_fields.shown().cloned());
    }
    for (name, value) in fields.shown().filter(|(name, _)| *name != "message") {
        named.put(name, value.clone());
    }
    let mut line = String::from("{");
    let keys = object.0.iter().map(|(name, value)| ((*name).to_owned(), value));
    let others = named.0.iter().map(|(name, value)| {
        let reserved = matches!(*name, "timestamp" | "level" | "requestId" | "message" | "span");
        let key = if reserved {
            format!("fields.{name}")
        } else {
            (*name).to_owned()
        };
        (key, value)
    });
    for (index, (key, value)) in keys.chain(others).enumerate() {
        if index > 0 {
            line.push(',');
        }
        line.push_str(&Value::from(key).to_string());
        line.push(':');
        line.push_str(&value.to_string());
    }
    line.push('}');
    line
}

/// The log layer of [`init_tracing`](crate::init_tracing), writing to `writer`: [`SpanFields`] and a
/// `fmt` layer with [`LambdaLines`], no ANSI colours.
pub(crate) fn log_layer<S, W>(json: bool, writer: W) -> impl Layer<S>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    W: for<'writer> lambda_runtime::tracing::subscriber::fmt::MakeWriter<'writer> + Send + Sync + 'static,
{
    let lines = lambda_runtime::tracing::subscriber::fmt::layer()
        .with_ansi(false)
        .event_format(LambdaLines { json })
        .with_writer(writer)
        // A closed or full stdout drops log lines (counted) instead of panicking a record's task.
        .log_internal_errors(false);
    SpanFields.and_then(lines)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};

    use conveyor_core::port::{OutgoingMessage, Queue};
    use conveyor_core::{Handler, HandlerError, Pipeline, Router};
    use conveyor_testing::MemoryQueue;
    use lambda_runtime::LambdaEvent;
    use lambda_runtime::tracing::subscriber::layer::SubscriberExt as _;
    use tracing::Instrument as _;

    use super::*;
    use crate::{BatchProcessor, FixedQueue, LambdaConfig, SqsEvent};

    const REQUEST_ID: &str = "8e4a0d62-5f9c-4b7e-9a51-3f1d2c7b6a90";
    const XRAY: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0";

    /// Logs one line per job.
    struct Logs;

    impl Handler for Logs {
        type Job = serde_json::Value;
        type Output = ();
        const JOB_TYPE: &'static str = "log_lines";

        async fn handle(
            &self,
            job: serde_json::Value,
            _ctx: conveyor_core::Context,
        ) -> Result<(), HandlerError> {
            tracing::info!(n = job["n"].as_u64(), "job ran");
            Ok(())
        }
    }

    /// Collects what the log layer writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines logged while the adapter handles one invocation of three records, inside
    /// `lambda_runtime`'s own request span (request id and X-Ray header), as on Lambda.
    async fn one_invocation(json: bool) -> Vec<String> {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber =
            lambda_runtime::tracing::subscriber::registry().with(log_layer(json, move || writer.clone()));
        // A global registry keeps every callsite's cached interest open: a test thread without a
        // subscriber would cache "never" for the adapter's callsites, and this capture would miss them.
        static KEEP_INTEREST: std::sync::Once = std::sync::Once::new();
        KEEP_INTEREST.call_once(|| {
            let _ = tracing::subscriber::set_global_default(lambda_runtime::tracing::subscriber::registry());
        });
        let _default = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();

        let queue = Arc::new(MemoryQueue::standard("orders"));
        for n in 0..3 {
            let body = serde_json::json!({ "n": n }).to_string();
            queue
                .push_message(OutgoingMessage {
                    body,
                    ..OutgoingMessage::default()
                })
                .unwrap();
        }
        let arn = "arn:aws:sqs:us-east-1:123456789012:orders";
        let messages = queue.receive(10, Duration::ZERO).await.unwrap();
        let mut event = SqsEvent::default();
        event.records = messages
            .iter()
            .map(|message| crate::to_record(message, arn))
            .collect();
        let payload = serde_json::to_value(event).unwrap();
        let resolver = FixedQueue(Arc::clone(&queue) as Arc<dyn Queue>);
        let pipeline = Pipeline::new(Router::single(Logs));
        let processor =
            BatchProcessor::new(pipeline, LambdaConfig::default(), Arc::new(resolver)).without_metrics();
        let mut context = lambda_runtime::Context::default();
        context.request_id = REQUEST_ID.to_owned();
        context.xray_trace_id = Some(XRAY.to_owned());
        let deadline = SystemTime::now() + Duration::from_secs(60);
        context.deadline = deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let span = lambda_runtime::layers::trace::request_span(&context);
        let response = crate::runtime::handle(&processor, LambdaEvent::new(payload, context))
            .instrument(span)
            .await
            .unwrap();
        assert!(response.batch_item_failures.is_empty());

        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_text_line_names_the_request_once_and_fits_on_a_line() {
        let lines = one_invocation(false).await;
        let ran: Vec<&String> = lines.iter().filter(|line| line.contains("job ran")).collect();
        assert_eq!(ran.len(), 3, "{lines:#?}");
        for line in &lines {
            assert!(!line.contains("Root="), "the X-Ray header in a log line: {line}");
            assert!(
                line.matches(REQUEST_ID).count() <= 1,
                "the request id twice: {line}"
            );
        }
        for line in ran {
            assert!(
                line.starts_with(&format!("INFO {REQUEST_ID} message{{message_id=")),
                "not one compact prefix: {line}"
            );
            assert!(
                line.contains("job_type=log_lines") && line.ends_with(": job ran n=0")
                    || line.contains(": job ran n="),
                "{line}"
            );
            assert!(line.len() <= 200, "{} characters: {line}", line.len());
        }
    }

    #[tokio::test]
    async fn a_json_line_has_lambdas_fields() {
        let lines = one_invocation(true).await;
        let parsed: Vec<Value> = lines
            .iter()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}")))
            .collect();
        let ran: Vec<&Value> = parsed
            .iter()
            .filter(|line| line["message"] == "job ran")
            .collect();
        assert_eq!(ran.len(), 3, "{lines:#?}");
        for line in ran {
            let timestamp = line["timestamp"].as_str().unwrap_or_default();
            assert!(timestamp.len() == 24 && timestamp.ends_with('Z'), "{line}");
            assert_eq!(line["level"], "INFO", "{line}");
            assert_eq!(line["requestId"], REQUEST_ID, "{line}");
            assert_eq!(line["span"], "message", "{line}");
            assert_eq!(
                (&line["queue"], &line["receive_count"]),
                (&Value::from("orders"), &Value::from(1)),
                "{line}"
            );
            assert!(line["n"].is_u64() && line["message_id"].is_string(), "{line}");
        }
        for line in &lines {
            assert!(!line.contains("Root=") && !line.contains("xray"), "{line}");
        }
    }
}
