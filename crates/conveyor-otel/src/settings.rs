//! The standard `OTEL_*` variables, read and checked: a value that cannot work is an error naming the
//! variable and what it accepts, never a silent fallback (the SDK's own reading of a mistyped sampler
//! logs a line nobody sees and samples everything).

use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const PROPAGATORS: &str = "OTEL_PROPAGATORS";
const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Set by Lambda in every function's environment.
const LAMBDA_FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// The samplers the SDK implements (`OTEL_TRACES_SAMPLER`).
const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

/// Why OpenTelemetry export cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// An `OTEL_*` variable has a value Conveyor cannot use.
    #[error("{variable}={value:?}: {problem}")]
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong and what works.
        problem: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP/HTTP span exporter: {0}")]
    Exporter(String),
}

fn variable(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

/// Whether spans are to be exported: an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` turns export off.
pub fn export_configured() -> bool {
    if variable(SDK_DISABLED).is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    if variable(TRACES_EXPORTER).is_some_and(|value| value.trim().eq_ignore_ascii_case("none")) {
        return false;
    }
    variable(ENDPOINT).is_some() || variable(TRACES_ENDPOINT).is_some()
}

/// What a start line says of span export: `otlp <endpoint>` (the traces endpoint when set, else the
/// general one), or why it is off.
pub fn describe_export() -> String {
    if !export_configured() {
        return "off (OTEL_EXPORTER_OTLP_ENDPOINT unset, or export disabled)".to_owned();
    }
    let endpoint = variable(TRACES_ENDPOINT)
        .or_else(|| variable(ENDPOINT))
        .unwrap_or_default();
    format!("otlp {endpoint}")
}

/// The propagator `OTEL_PROPAGATORS` names (default `tracecontext,baggage`).
pub(crate) fn propagator() -> Result<TextMapCompositePropagator, OtelError> {
    let value = variable(PROPAGATORS).unwrap_or_else(|| "tracecontext,baggage".to_owned());
    let mut propagators: Vec<Box<dyn TextMapPropagator + Send + Sync>> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
        match name {
            "tracecontext" => propagators.push(Box::new(TraceContextPropagator::new())),
            "baggage" => propagators.push(Box::new(BaggagePropagator::new())),
            "xray" => propagators.push(Box::new(opentelemetry_aws::trace::XrayPropagator::default())),
            "none" => {}
            other => {
                return Err(OtelError::Setting {
                    variable: PROPAGATORS,
                    value: value.clone(),
                    problem: format!(
                        "Conveyor does not know the propagator {other:?}; use a comma-separated list of \
                         tracecontext, baggage, xray or none"
                    ),
                });
            }
        }
    }
    Ok(TextMapCompositePropagator::new(propagators))
}

/// Refuses an `OTEL_TRACES_SAMPLER` the SDK does not implement (it would sample everything).
pub(crate) fn check_sampler() -> Result<(), OtelError> {
    let Some(value) = variable(SAMPLER) else {
        return Ok(());
    };
    if SAMPLERS.contains(&value.trim()) {
        return Ok(());
    }
    Err(OtelError::Setting {
        variable: SAMPLER,
        value,
        problem: format!(
            "not a sampler OpenTelemetry's Rust SDK implements; use one of {}",
            SAMPLERS.join(", ")
        ),
    })
}

/// The OTLP/HTTP (protobuf) exporter, at the endpoint the standard variables give.
pub(crate) fn exporter() -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    for name in [TRACES_PROTOCOL, PROTOCOL] {
        let Some(value) = variable(name) else {
            continue;
        };
        if value.trim() != "http/protobuf" {
            return Err(OtelError::Setting {
                variable: if name == PROTOCOL {
                    PROTOCOL
                } else {
                    TRACES_PROTOCOL
                },
                value,
                problem: "Conveyor exports over http/protobuf only (port 4318 of a collector); unset it or \
                          set http/protobuf"
                    .to_owned(),
            });
        }
        break;
    }
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|error| OtelError::Exporter(error.to_string()))
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), named after the Lambda
/// function when no service name is set and it runs on Lambda.
pub(crate) fn resource() -> Resource {
    let builder = Resource::builder();
    match (variable(SERVICE_NAME), variable(LAMBDA_FUNCTION_NAME)) {
        (None, Some(function)) => builder.with_service_name(function).build(),
        _ => builder.build(),
    }
}
