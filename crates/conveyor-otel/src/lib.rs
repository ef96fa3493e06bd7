#![doc = include_str!("../README.md")]

mod counting;
mod settings;
mod tidy;

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{SpanContext, TracerProvider as _};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _};
use tracing_subscriber::registry::LookupSpan;

pub use counting::FlushReport;
pub use settings::{OtelError, describe_export, export_configured};

/// The provider [`layer`] installed, for [`flush`] and [`shutdown`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The instrumentation scope of Conveyor's spans.
const SCOPE: &str = "conveyor";

/// The `tracing` layer that turns Conveyor's spans (and the application's) into OpenTelemetry spans
/// exported over OTLP/HTTP, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set; `None`
/// when it is not (nothing is installed, nothing is slower).
///
/// The first call installs, process-wide, the tracer provider (batching, the sampler of
/// `OTEL_TRACES_SAMPLER`, the resource of `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`; on
/// Lambda the function's name when no service name is set) and the propagator of `OTEL_PROPAGATORS`
/// (`tracecontext,baggage` by default; `xray` too). A later call returns a layer on the same provider.
///
/// # Errors
///
/// [`OtelError`] names the variable whose value cannot work (an unknown propagator or sampler, a
/// protocol other than `http/protobuf`), or the exporter that could not be built.
pub fn layer<S>() -> Result<Option<OpenTelemetryLayer<S, SdkTracer>>, OtelError>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    if !export_configured() {
        return Ok(None);
    }
    let provider = match PROVIDER.get() {
        Some(provider) => provider.clone(),
        None => install()?,
    };
    let tracer = provider.tracer(SCOPE);
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// Builds and installs the provider and the propagator (see [`layer`]).
fn install() -> Result<SdkTracerProvider, OtelError> {
    let propagator = settings::propagator()?;
    settings::check_sampler()?;
    let exporter = settings::exporter()?;
    let counts = counting::counts();
    let exporter = counting::CountingExporter {
        inner: exporter,
        counts,
    };
    let batch = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(counting::Counting { inner: batch, counts })
        .with_resource(settings::resource())
        .build();
    // Two threads installing at once: the first provider stays; the second is dropped unused.
    let installed = PROVIDER.get_or_init(|| provider).clone();
    opentelemetry::global::set_text_map_propagator(propagator);
    opentelemetry::global::set_tracer_provider(installed.clone());
    Ok(installed)
}

/// Exports the spans ended so far and waits until the exporter answered (or gave up, after the
/// SDK's five seconds). It blocks; a Lambda function calls [`flush_within`] instead, which never
/// waits past the time it is given. Nothing when no provider is installed.
pub fn flush() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if let Err(error) = provider.force_flush() {
        tracing::debug!(%error, "could not export the spans ended so far");
    }
}

/// Exports the spans ended so far, waiting for the exporter at most `budget`: a Lambda function
/// calls it at the end of every invocation, before Lambda freezes the process, with the time the
/// invocation has left less what its response needs, so a slow, down or refusing collector never
/// makes the invocation late. What the export did (and what still waits when the time is up) comes
/// back counted, for a metric and a log line; nothing is counted and nothing waits when no provider
/// is installed.
///
/// The flush runs on a blocking thread. When the time is up it goes on there (and its spans leave
/// when the collector answers, perhaps after the process is thawed); the next call waits for that
/// same flush rather than starting another.
pub async fn flush_within(budget: Duration) -> FlushReport {
    let Some(provider) = PROVIDER.get() else {
        return FlushReport::default();
    };
    let deadline = tokio::time::Instant::now() + budget;
    // Joining a flush another invocation started (Managed Instances) is not enough: the spans this one
    // ended after it began were not in it, and the environment may get no later invocation to carry
    // them. One more flush, our own, within what is left.
    for _ in 0..2 {
        let provider = provider.clone();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if counting::bounded(left, move || flush_provider(&provider)).await != counting::Flushed::Joined {
            break;
        }
    }
    counting::counts().report()
}

fn flush_provider(provider: &SdkTracerProvider) {
    if let Err(error) = provider.force_flush() {
        // A failed export is counted (FlushReport::dropped) and said once per invocation by the caller.
        tracing::debug!(%error, "the span flush did not complete");
    }
}

/// Exports what is left and stops the exporter, waiting at most `budget`: a worker calls it on its way
/// out with what is left of its stop timeout, so a slow collector never has the platform kill it.
/// The spans still unexported when the time is up are counted in the report.
pub async fn shutdown_within(budget: Duration) -> FlushReport {
    let Some(provider) = PROVIDER.get() else {
        return FlushReport::default();
    };
    let provider = provider.clone();
    counting::bounded(budget, move || {
        if let Err(error) = provider.shutdown_with_timeout(budget) {
            tracing::debug!(%error, "the exporter did not stop cleanly");
        }
    })
    .await;
    counting::counts().report()
}

/// Exports what is left and stops the exporter (blocking, up to the SDK's five seconds); a worker
/// calls [`shutdown_within`] instead.
pub fn shutdown() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if let Err(error) = provider.shutdown() {
        tracing::warn!(%error, "could not export the last spans at shutdown");
    }
}

/// What an invocation's span says about the invocation ([`relate_invocation`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Invocation<'a> {
    /// Lambda's request id (`faas.invocation_id`).
    pub request_id: &'a str,
    /// The invoked function's ARN (`cloud.resource_id`).
    pub function_arn: &'a str,
    /// Whether this is the first invocation of the process (`faas.coldstart`).
    pub cold_start: bool,
    /// How many SQS records the event carries (`messaging.batch.message_count`).
    pub records: usize,
}

impl<'a> Invocation<'a> {
    /// An invocation of `function_arn` with `request_id`, carrying `records` records.
    pub fn new(request_id: &'a str, function_arn: &'a str, cold_start: bool, records: usize) -> Self {
        Self {
            request_id,
            function_arn,
            cold_start,
            records,
        }
    }
}

/// Makes `span` an invocation's span after OpenTelemetry's FaaS and messaging conventions: a consumer
/// span with `faas.trigger` = `pubsub`, `faas.invocation_id`, `faas.coldstart`, `cloud.provider`,
/// `cloud.platform`, `cloud.resource_id` and `messaging.batch.message_count`, related to the
/// invocation's X-Ray header by [`parent_on_xray`]'s rule. Without a header it is a root all the same:
/// never the child of a span the Lambda runtime keeps open for the process (under Managed Instances
/// that span outlives every invocation, and would make one endless trace of them all). The span must
/// declare the `otel.kind` field. Call it before the span is first entered.
pub fn relate_invocation(span: &tracing::Span, xray_header: Option<&str>, invocation: &Invocation<'_>) {
    match xray_header {
        Some(header) => parent_on_xray(span, header),
        None => {
            if span.set_parent(opentelemetry::Context::new()).is_err() {
                tracing::debug!("the invocation's span had started; it stays where it is");
            }
        }
    }
    span.record("otel.kind", "consumer");
    span.set_attribute("faas.trigger", "pubsub");
    span.set_attribute("faas.invocation_id", invocation.request_id.to_owned());
    span.set_attribute("faas.coldstart", invocation.cold_start);
    span.set_attribute("cloud.provider", "aws");
    span.set_attribute("cloud.platform", "aws_lambda");
    if !invocation.function_arn.is_empty() {
        span.set_attribute("cloud.resource_id", invocation.function_arn.to_owned());
    }
    span.set_attribute(conveyor_core::trace::attribute::MESSAGING_SYSTEM, "aws_sqs");
    span.set_attribute(conveyor_core::trace::attribute::OPERATION_TYPE, "process");
    span.set_attribute(conveyor_core::trace::attribute::OPERATION_NAME, "process");
    span.set_attribute(
        conveyor_core::trace::attribute::BATCH_MESSAGE_COUNT,
        invocation.records as i64,
    );
}

/// The attribute that keeps an invocation's X-Ray trace id (`1-5759e988-bd862e3fe1be46a994272793`)
/// on its span, whether or not the span joined that trace.
pub const XRAY_TRACE_ID_ATTRIBUTE: &str = "aws.xray.trace_id";

/// What an invocation's X-Ray header (`Lambda-Runtime-Trace-Id`) makes of the invocation's span.
#[derive(Debug, Clone, PartialEq)]
pub enum XrayRelation {
    /// `Sampled=1` (X-Ray Active Tracing on, or an upstream that sampled): the span is a child of the
    /// X-Ray segment, so it joins the X-Ray trace.
    Parent(SpanContext),
    /// `Sampled=0` (Active Tracing off, Lambda's default) or undecided: the span starts a trace of its
    /// own, which the configured sampler alone decides on, linked to the X-Ray segment. Parenting on an
    /// unsampled context would have the default parent-based sampler drop every span of the function.
    Link(SpanContext),
    /// No valid X-Ray context in the header: the span starts a trace of its own.
    Unrelated,
}

/// The rule for an invocation's X-Ray header: sampled, a parent; otherwise a link (see
/// [`XrayRelation`]).
pub fn xray_relation(header: &str) -> XrayRelation {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;

    let carrier = std::collections::HashMap::from([("x-amzn-trace-id".to_owned(), header.to_owned())]);
    let context = opentelemetry_aws::trace::XrayPropagator::default().extract(&carrier);
    let span_context = context.span().span_context().clone();
    if !span_context.is_valid() {
        return XrayRelation::Unrelated;
    }
    if span_context.is_sampled() {
        XrayRelation::Parent(span_context)
    } else {
        XrayRelation::Link(span_context)
    }
}

/// The X-Ray trace id of a trace header (its `Root=`), as X-Ray writes it.
pub fn xray_trace_id(header: &str) -> Option<&str> {
    header
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Root="))
        .map(str::trim)
        .filter(|root| !root.is_empty())
}

/// Relates `span`, the invocation's span, to the invocation's X-Ray trace (`Lambda-Runtime-Trace-Id`,
/// read from that invocation's context, never from the process-wide `_X_AMZN_TRACE_ID`), by
/// [`xray_relation`]'s rule: a sampled X-Ray context (Active Tracing) is its parent, so the spans
/// join the X-Ray trace; an unsampled one is never its parent: the span starts its own trace, which
/// the configured sampler decides on, with a link to the X-Ray segment. Either way the span is the
/// root of the function's spans for this invocation (not a child of the runtime's spans) and keeps
/// the X-Ray trace id in [`XRAY_TRACE_ID_ATTRIBUTE`]. Call it before the span is first entered.
pub fn parent_on_xray(span: &tracing::Span, header: &str) {
    use opentelemetry::trace::TraceContextExt as _;

    let parent = match xray_relation(header) {
        XrayRelation::Parent(xray) => opentelemetry::Context::new().with_remote_span_context(xray),
        XrayRelation::Link(xray) => {
            span.add_link(xray);
            opentelemetry::Context::new()
        }
        XrayRelation::Unrelated => opentelemetry::Context::new(),
    };
    if span.set_parent(parent).is_err() {
        tracing::debug!("the invocation's span had started; its X-Ray relation is not set");
    }
    if let Some(trace_id) = xray_trace_id(header) {
        span.set_attribute(XRAY_TRACE_ID_ATTRIBUTE, trace_id.to_owned());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{SpanId, TraceId};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    const ROOT: &str = "1-5759e988-bd862e3fe1be46a994272793";
    const PARENT: &str = "53995c3f42cd8ad8";

    /// What Lambda sends: with Active Tracing `Sampled=1`, without it (the default) `Sampled=0`.
    fn header(sampled: bool) -> String {
        format!(
            "Root={ROOT};Parent={PARENT};Sampled={};Lineage=a87bd80c:1|68fd508a:5",
            u8::from(sampled)
        )
    }

    fn xray_trace() -> TraceId {
        TraceId::from_hex("5759e988bd862e3fe1be46a994272793").unwrap()
    }

    #[test]
    fn a_sampled_xray_context_is_the_parent_and_an_unsampled_one_only_a_link() {
        let XrayRelation::Parent(sampled) = xray_relation(&header(true)) else {
            panic!("Active Tracing's context is the parent");
        };
        assert_eq!(sampled.trace_id(), xray_trace());
        assert_eq!(sampled.span_id(), SpanId::from_hex(PARENT).unwrap());
        let XrayRelation::Link(unsampled) = xray_relation(&header(false)) else {
            panic!("an unsampled context is a link, never the parent");
        };
        assert_eq!(unsampled.trace_id(), xray_trace());
        assert!(!unsampled.is_sampled());
        // The old local runner's header (no Parent=) and garbage relate to nothing.
        assert_eq!(
            xray_relation(&format!("Root={ROOT};Sampled=0")),
            XrayRelation::Unrelated
        );
        assert_eq!(xray_relation("not a header"), XrayRelation::Unrelated);
        assert_eq!(xray_trace_id(&header(false)), Some(ROOT));
        assert_eq!(xray_trace_id("Parent=1;Sampled=0"), None);
    }

    /// Keeps what it is given to export.
    #[derive(Debug, Clone, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    /// An invocation span related to `header` with one record span inside, under the SDK's default
    /// sampler (parent-based, always on): the spans exported.
    fn invocation_under_default_sampler(header: &str) -> Vec<SpanData> {
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let runtime = tracing::info_span!("Lambda runtime invoke");
            let _runtime = runtime.enter();
            let invocation = tracing::info_span!("invocation");
            parent_on_xray(&invocation, header);
            let _invocation = invocation.enter();
            let record = tracing::info_span!("process jobs");
            drop(record.enter());
        });
        kept.0.lock().unwrap().clone()
    }

    fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("a {name} span was exported: {spans:#?}"))
    }

    #[test]
    fn without_active_tracing_the_default_sampler_exports_every_span_in_a_trace_linked_to_xray() {
        let spans = invocation_under_default_sampler(&header(false));
        let invocation = named(&spans, "invocation");
        let record = named(&spans, "process jobs");
        assert_ne!(
            invocation.span_context.trace_id(),
            xray_trace(),
            "a trace of its own"
        );
        assert_eq!(
            invocation.parent_span_id,
            SpanId::INVALID,
            "the invocation is the root"
        );
        assert_eq!(record.parent_span_id, invocation.span_context.span_id());
        let links: Vec<_> = invocation
            .links
            .iter()
            .map(|link| link.span_context.clone())
            .collect();
        assert!(
            links
                .iter()
                .any(|link| link.trace_id() == xray_trace()
                    && link.span_id() == SpanId::from_hex(PARENT).unwrap()),
            "linked to the X-Ray segment: {links:?}"
        );
        assert!(
            invocation
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == XRAY_TRACE_ID_ATTRIBUTE && kv.value.as_str() == ROOT),
            "{:?}",
            invocation.attributes
        );
    }

    #[test]
    fn with_active_tracing_the_spans_join_the_xray_trace() {
        let spans = invocation_under_default_sampler(&header(true));
        let invocation = named(&spans, "invocation");
        let record = named(&spans, "process jobs");
        assert_eq!(invocation.span_context.trace_id(), xray_trace());
        assert_eq!(invocation.parent_span_id, SpanId::from_hex(PARENT).unwrap());
        assert_eq!(record.span_context.trace_id(), xray_trace());
        assert!(invocation.links.is_empty());
    }
}
