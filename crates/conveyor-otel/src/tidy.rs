//! One name per fact on exported spans. A message span's `tracing` fields (`message_id`, `queue`,
//! `receive_count`, `job_type`) are what its log lines carry; `tracing-opentelemetry` exports them as
//! attributes too, next to the semantic-convention attributes Conveyor sets for the same facts
//! (`messaging.message.id`, `messaging.destination.name`, ...). Before a span is queued for export,
//! the field copies are dropped from spans that carry the convention's names, so a trace backend
//! shows each fact once, under its standard name. Log lines keep their short fields.

use conveyor_core::trace::attribute;
use opentelemetry_sdk::trace::SpanData;

/// The `tracing` field that repeats each convention attribute.
const COPIES: [(&str, &str); 4] = [
    ("message_id", attribute::MESSAGE_ID),
    ("queue", attribute::DESTINATION_NAME),
    ("receive_count", attribute::RECEIVE_COUNT),
    ("job_type", attribute::JOB_TYPE),
];

/// Drops from `span` each field copy whose convention attribute it carries.
pub(crate) fn drop_field_copies(span: &mut SpanData) {
    if !has(span, attribute::MESSAGING_SYSTEM) {
        return;
    }
    let copies: Vec<&str> = COPIES
        .iter()
        .filter(|(_, standard)| has(span, standard))
        .map(|(field, _)| *field)
        .collect();
    span.attributes
        .retain(|pair| !copies.contains(&pair.key.as_str()));
}

fn has(span: &SpanData, key: &str) -> bool {
    span.attributes.iter().any(|pair| pair.key.as_str() == key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

    use opentelemetry::KeyValue;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn a_message_spans_fields_are_exported_once_under_their_convention_names() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let mut message = conveyor_core::message::Message::new("m-1", "{}");
        message.receive_count = 2;
        drop(conveyor_core::trace::message_span(
            &message,
            "orders",
            conveyor_core::trace::ProducerRelation::Link,
        ));
        drop(tracing::info_span!("request", queue = "not a message span"));
        let mut spans = exporter.get_finished_spans().unwrap();
        let keys = |span: &SpanData| -> Vec<String> {
            span.attributes.iter().map(|pair| pair.key.to_string()).collect()
        };
        let before = keys(&spans[0]);
        assert!(
            before.contains(&"message_id".to_owned()),
            "tracing-opentelemetry exports the field: {before:?}"
        );
        for span in &mut spans {
            drop_field_copies(span);
        }
        let (consumer, request) = (&spans[0], &spans[1]);
        let after = keys(consumer);
        for field in ["message_id", "queue", "receive_count"] {
            assert!(!after.contains(&field.to_owned()), "{field} dropped: {after:?}");
        }
        for standard in [
            attribute::MESSAGE_ID,
            attribute::DESTINATION_NAME,
            attribute::RECEIVE_COUNT,
            attribute::OPERATION_NAME,
        ] {
            assert!(after.contains(&standard.to_owned()), "{standard} kept: {after:?}");
        }
        assert!(
            request
                .attributes
                .contains(&KeyValue::new("queue", "not a message span")),
            "other spans keep their fields"
        );
    }
}
