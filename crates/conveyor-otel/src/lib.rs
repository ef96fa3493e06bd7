#![doc = include_str!("../README.md")]

mod settings;

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _};
use tracing_subscriber::registry::LookupSpan;

pub use settings::{OtelError, export_configured};

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
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(settings::resource())
        .build();
    // Two threads installing at once: the first provider stays; the second is dropped unused.
    let installed = PROVIDER.get_or_init(|| provider).clone();
    opentelemetry::global::set_text_map_propagator(propagator);
    opentelemetry::global::set_tracer_provider(installed.clone());
    Ok(installed)
}

/// Exports the spans ended so far and waits until the exporter answered (or gave up). A Lambda
/// function calls it at the end of every invocation, before Lambda freezes the process; it blocks, so
/// async code calls [`flush_async`]. Nothing when no provider is installed.
pub fn flush() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if let Err(error) = provider.force_flush() {
        tracing::warn!(%error, "could not export the spans of this invocation");
    }
}

/// [`flush`] on a blocking thread.
pub async fn flush_async() {
    if PROVIDER.get().is_none() {
        return;
    }
    if tokio::task::spawn_blocking(flush).await.is_err() {
        tracing::warn!("the span flush panicked");
    }
}

/// Exports what is left and stops the exporter: a worker calls it on its way out.
pub fn shutdown() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if let Err(error) = provider.shutdown() {
        tracing::warn!(%error, "could not export the last spans at shutdown");
    }
}

/// Makes the X-Ray trace of a Lambda invocation (`Lambda-Runtime-Trace-Id`, read from that
/// invocation's context, never from the process-wide `_X_AMZN_TRACE_ID`) the parent of `span`, the
/// invocation's span. Nothing for a header that does not parse or an unsampled trace.
pub fn parent_on_xray(span: &tracing::Span, header: &str) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;

    let carrier = std::collections::HashMap::from([("x-amzn-trace-id".to_owned(), header.to_owned())]);
    let context = opentelemetry_aws::trace::XrayPropagator::default().extract(&carrier);
    if context.span().span_context().is_valid() && span.set_parent(context).is_err() {
        tracing::debug!("the invocation's span had started; its X-Ray parent is not set");
    }
}
