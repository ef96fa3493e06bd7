//! Trace context across the queue, after OpenTelemetry's messaging conventions.
//!
//! - **Producer.** Every job Conveyor's producer encodes (single and batch sends, flows and their
//!   parents, schedules' ticks, outbox writes) gets the current span's W3C trace context in one
//!   message attribute, [`TRACEPARENT_ATTRIBUTE`] (plus [`TRACESTATE_ATTRIBUTE`] when the context
//!   carries vendor state, which is rare). It counts toward SQS's 10 attributes: when the job's own
//!   attributes leave no room, the job is sent without it (the trace loses its link, never the job),
//!   and it gives way to what is added later: a large payload's pointer, a flow's attributes, a
//!   deferral record ([`make_room`]).
//!   With the X-Ray propagator configured (`OTEL_PROPAGATORS=xray`), the context also goes in
//!   `AWSTraceHeader`, a system attribute that does not count.
//! - **Copies keep the producer's context.** A deferred copy, a delay hop, a DLQ copy and a redrive
//!   carry the received message's attributes as they were: the trace of every attempt leads back to
//!   the request that sent the job, not to the attempt before it.
//! - **Consumer.** Both runtimes open one span per message with [`message_span`]: `message_id`,
//!   `queue`, `receive_count`, `job_type` and the outcome: what settlement did, recorded after the queue
//!   call answered by [`record_settlement`] (`acked`, `duplicate`, `cancelled`, `ignored`, `retried`,
//!   `deferred`, `dead_lettered`, `released`). With the `otel` feature
//!   it is an OpenTelemetry consumer span (`process <queue>`, `messaging.system = aws_sqs`, ...) that
//!   links to the producer's span, or has it as its parent ([`ProducerRelation`]). The producer's
//!   context is read from the message itself, never from a process-wide variable.
//!
//! Without the `otel` feature nothing is injected or read, and the span is a plain `tracing` span.
//! With it, and no propagator or tracer installed (`conveyor-otel` installs both when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set), nothing is injected either: OpenTelemetry's default
//! propagator writes nothing.

use crate::message::{Attributes, Message};
use crate::outcome::{AckReason, Outcome};

/// The message attribute holding the producer's W3C `traceparent` (the name OpenTelemetry's SQS
/// instrumentations use in every language, so a Python or Node consumer reads it too).
pub const TRACEPARENT_ATTRIBUTE: &str = "traceparent";
/// The message attribute holding the producer's W3C `tracestate`, only when it is not empty.
pub const TRACESTATE_ATTRIBUTE: &str = "tracestate";

/// How a consumer span relates to the span that sent the job.
///
/// OpenTelemetry's messaging conventions make the producer a *link* of the consumer span: the job
/// runs in a trace of its own (a retry an hour later is not part of the request that sent it), which
/// the trace view joins through the link. Some teams want one trace from the request to the job:
/// [`ProducerRelation::Parent`] makes the producer's span the consumer span's parent, and the runtime's
/// own span (a Lambda invocation) a link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProducerRelation {
    /// The producer's span is a link of the consumer span (the default).
    #[default]
    Link,
    /// The producer's span is the consumer span's parent.
    Parent,
}

/// The span one message is processed in, in both runtimes. `job_type` is recorded later by the
/// runtime when it is not known yet.
pub fn message_span(message: &Message, queue: &str, relation: ProducerRelation) -> tracing::Span {
    let span = new_span(message, queue);
    #[cfg(feature = "otel")]
    otel::relate(&span, message, queue, relation);
    #[cfg(not(feature = "otel"))]
    let _ = relation;
    span
}

fn new_span(message: &Message, queue: &str) -> tracing::Span {
    tracing::info_span!(
        "message",
        message_id = %message.id,
        queue = %queue,
        receive_count = message.receive_count,
        job_type = message.job_type(),
        outcome = tracing::field::Empty,
        // Recorded only when an OpenTelemetry layer sees the span (`otel::relate`); an empty field is
        // not written, so log lines never carry them otherwise.
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    )
}

/// Records the job type on a span from [`message_span`] once the router found it.
pub fn record_job_type(span: &tracing::Span, job_type: &str) {
    span.record("job_type", job_type);
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        span.set_attribute(attribute::JOB_TYPE, job_type.to_owned());
    }
}

/// What settlement did with a message, once the queue call answered: the outcome its span records.
/// The pipeline's [`Outcome`] is what it asked for; this is what happened (a dead-letter send that
/// failed puts the message back, a copy that could not be sent leaves the original to come back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Deleted (or left out of Lambda's failure list, which deletes it), for this reason.
    Acknowledged(AckReason),
    /// Back in the queue after a backoff, on this receipt or on a fresh copy: a retry.
    Retried,
    /// A delayed copy sent and this receipt deleted: the job goes on later without spending a receive.
    Deferred,
    /// A copy with its failure record is in the dead-letter queue.
    DeadLettered,
    /// Back in the queue with nothing decided (shutdown, a call that did not answer in time): it comes
    /// back at its visibility timeout.
    Released,
}

impl Settlement {
    /// The name on spans: `acked`, `duplicate`, `cancelled`, `ignored`, `retried`, `deferred`,
    /// `dead_lettered`, `released`.
    pub fn name(self) -> &'static str {
        match self {
            Settlement::Acknowledged(AckReason::Completed) => "acked",
            Settlement::Acknowledged(AckReason::Duplicate) => "duplicate",
            Settlement::Acknowledged(AckReason::Cancelled) => "cancelled",
            Settlement::Acknowledged(AckReason::Ignored) => "ignored",
            Settlement::Retried => "retried",
            Settlement::Deferred => "deferred",
            Settlement::DeadLettered => "dead_lettered",
            Settlement::Released => "released",
        }
    }
}

/// Marks the OpenTelemetry span of a failed run an error (a retry or a rejection, with its reason).
/// Called when the run ends, before settlement; [`record_settlement`] records what happened after.
pub fn record_run_error(span: &tracing::Span, outcome: &Outcome) {
    #[cfg(feature = "otel")]
    if let Outcome::Retry { reason, .. } = outcome {
        otel::record_error(span, reason);
    } else if let Outcome::Reject(failure) = outcome {
        otel::record_error(span, &failure.error);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, outcome);
}

/// Records on a message's span what settlement did with it (its `outcome` field), after the queue
/// call answered. Both runtimes call it once per message.
pub fn record_settlement(span: &tracing::Span, settlement: Settlement) {
    span.record("outcome", settlement.name());
}

/// The OpenTelemetry `error.type` of a failed run: its class, never its message (low cardinality, as
/// the semantic conventions ask): `retryable`, `permanent`, `panic`, `timeout` or `cancelled`.
pub fn error_type(result: &crate::outcome::RunResult) -> Option<&'static str> {
    use crate::error::ErrorKind;
    use crate::outcome::RunResult;
    match result {
        RunResult::Succeeded => None,
        RunResult::Failed(error) => Some(match error.kind() {
            ErrorKind::Permanent => "permanent",
            ErrorKind::Retryable { .. } => "retryable",
        }),
        RunResult::Panicked(_) => Some("panic"),
        RunResult::TimedOut(_) => Some("timeout"),
        RunResult::Cancelled => Some("cancelled"),
    }
}

/// Records a failed run's [`error_type`] on the current span (the message's: both runtimes run a job
/// inside it). Nothing for a success, or without the `otel` feature.
pub fn record_error_type(result: &crate::outcome::RunResult) {
    #[cfg(feature = "otel")]
    if let Some(error_type) = error_type(result) {
        otel::set_error_type(&tracing::Span::current(), error_type);
    }
    #[cfg(not(feature = "otel"))]
    let _ = result;
}

/// The span of one of Conveyor's own sends (`Producer::send`, `send_batch`, the outbox relay's and the
/// batching producer's calls): with the `otel` feature an OpenTelemetry producer span `send <queue>`
/// (`messaging.operation.name` and `.type` = `send`, `messaging.batch.message_count` for a batch of
/// more than one). A job encoded inside it carries its context, so the consumer's span links to the
/// send. Without an OpenTelemetry layer it is a plain `tracing` span that writes no fields.
pub fn send_span(queue: &str, messages: usize) -> tracing::Span {
    let span = tracing::info_span!(
        "send",
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    otel::producer(&span, queue, messages);
    #[cfg(not(feature = "otel"))]
    let _ = (queue, messages);
    span
}

/// Links a batch send's span to the contexts its messages carry already (jobs encoded earlier, such as
/// the outbox's, committed with their request's context): the semantic conventions' links from a
/// batch send to each message's creation.
pub fn link_to_messages<'a>(span: &tracing::Span, messages: impl IntoIterator<Item = &'a Attributes>) {
    #[cfg(feature = "otel")]
    for attributes in messages {
        otel::link_to_carried(span, attributes);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, messages.into_iter().count());
}

/// Records on a send span that the send failed, with its class (`error.type`, e.g. `QueueMissing`)
/// and the error's text as the span's status.
pub fn record_send_error(span: &tracing::Span, error_type: &str, message: &str) {
    #[cfg(feature = "otel")]
    {
        otel::set_error_type(span, error_type);
        otel::record_error(span, message);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, error_type, message);
}

/// The span of one call of a batch handler (`batch <job type>`), linked to the span of every job
/// in the batch (`job_spans`, each job's message span). The call runs in a task of its own, so it is
/// no job's child.
pub fn batch_call_span(job_type: &str, job_spans: &[tracing::Span]) -> tracing::Span {
    let span = tracing::info_span!(
        "batch_call",
        job_type,
        jobs = job_spans.len(),
        otel.name = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    otel::batch_call(&span, job_type, job_spans);
    span
}

/// Adds the current span's trace context to a job's attributes (see the module docs), keeping at
/// most `max_attributes`. Does nothing when the attributes carry a context already (a copy, or a
/// producer that set its own), when there is no valid current context, or without the `otel` feature.
/// An X-Ray header goes in `trace_header` when the propagator writes one and none is set.
pub fn inject(attributes: &mut Attributes, trace_header: &mut Option<String>, max_attributes: usize) {
    #[cfg(feature = "otel")]
    otel::inject(attributes, trace_header, max_attributes);
    #[cfg(not(feature = "otel"))]
    let _ = (attributes, trace_header, max_attributes);
}

/// Frees attribute slots for the job's own attributes (a large payload's pointer, a flow's, a
/// deferral record) by dropping the trace context first: `tracestate`, then `traceparent`, until
/// `needed` more fit under `max_attributes`. Tracing never makes a send fail; the trace loses its
/// link, which is said on the current span (an event) and in the log. Returns how many it dropped.
pub fn make_room(attributes: &mut Attributes, needed: usize, max_attributes: usize) -> usize {
    let mut dropped = 0;
    for name in [TRACESTATE_ATTRIBUTE, TRACEPARENT_ATTRIBUTE] {
        if attributes.len() + needed <= max_attributes {
            break;
        }
        if attributes.remove(name).is_some() {
            dropped += 1;
            tracing::info!(
                attribute = name,
                attributes = attributes.len(),
                "trace context dropped to make room for the job's own attributes (SQS allows 10); \
                 the consumer's span will not link to the producer's"
            );
        }
    }
    dropped
}

#[cfg(feature = "otel")]
mod otel {
    //! The OpenTelemetry side of [`super`]: the carrier, injection, extraction and span relations.

    use std::collections::HashMap;

    use opentelemetry::propagation::{Extractor, Injector};
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::attribute::{
        BATCH_MESSAGE_COUNT, DESTINATION_NAME, ERROR_TYPE, JOB_TYPE, MESSAGE_ID, MESSAGING_SYSTEM,
        OPERATION_NAME, OPERATION_TYPE, RECEIVE_COUNT,
    };
    use super::{ProducerRelation, TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE};
    use crate::message::{AttributeValue, Attributes, Message};

    /// The propagator's header for X-Ray (`opentelemetry-aws`'s `XrayPropagator`).
    const XRAY_HEADER: &str = "x-amzn-trace-id";

    /// What a propagator writes and reads: lower-case header names to values.
    #[derive(Default)]
    struct Carrier(HashMap<String, String>);

    impl Injector for Carrier {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_ascii_lowercase(), value);
        }
    }

    impl Extractor for Carrier {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(&key.to_ascii_lowercase()).map(String::as_str)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }

    /// The context to propagate: the current `tracing` span's, or else OpenTelemetry's current one
    /// (a producer instrumented with the OpenTelemetry API directly).
    fn current_context() -> Option<opentelemetry::Context> {
        let from_span = tracing::Span::current().context();
        if from_span.span().span_context().is_valid() {
            return Some(from_span);
        }
        let current = opentelemetry::Context::current();
        current.span().span_context().is_valid().then_some(current)
    }

    pub(super) fn inject(
        attributes: &mut Attributes,
        trace_header: &mut Option<String>,
        max_attributes: usize,
    ) {
        if attributes.contains_key(TRACEPARENT_ATTRIBUTE) {
            return;
        }
        let Some(context) = current_context() else {
            return;
        };
        let mut carrier = Carrier::default();
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut carrier);
        });
        let mut headers = carrier.0;
        if trace_header.is_none() {
            *trace_header = headers.remove(XRAY_HEADER);
        }
        let Some(traceparent) = headers.remove(TRACEPARENT_ATTRIBUTE) else {
            return;
        };
        if attributes.len() >= max_attributes {
            tracing::debug!(
                attributes = attributes.len(),
                "no room for the traceparent attribute (SQS allows 10); the job is sent without it"
            );
            return;
        }
        attributes.insert(
            TRACEPARENT_ATTRIBUTE.to_owned(),
            AttributeValue::string(traceparent),
        );
        let state = headers
            .remove(TRACESTATE_ATTRIBUTE)
            .filter(|state| !state.is_empty());
        if let Some(state) = state
            && attributes.len() < max_attributes
        {
            attributes.insert(TRACESTATE_ATTRIBUTE.to_owned(), AttributeValue::string(state));
        }
    }

    /// The producer's context carried by `message`, if any.
    pub(super) fn producer_context(message: &Message) -> Option<opentelemetry::Context> {
        let mut carrier = Carrier::default();
        for name in [TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE] {
            if let Some(value) = message.string_attribute(name) {
                carrier.0.insert(name.to_owned(), value.to_owned());
            }
        }
        if let Some(header) = &message.trace_header {
            carrier.0.insert(XRAY_HEADER.to_owned(), header.clone());
        }
        if carrier.0.is_empty() {
            return None;
        }
        let context =
            opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
        context.span().span_context().is_valid().then_some(context)
    }

    pub(super) fn relate(span: &tracing::Span, message: &Message, queue: &str, relation: ProducerRelation) {
        // The span's parent is set before it starts: the producer's span when asked for, else the one it
        // has anyway (the runtime's span, or none). An error means no OpenTelemetry layer sees this span
        // (none installed, or the span filtered out): nothing more to do, and the log lines carry no
        // OpenTelemetry fields.
        let runtime = tracing::Span::current().context();
        let producer = producer_context(message);
        let parent = match (relation, &producer) {
            (ProducerRelation::Parent, Some(producer)) => producer.clone(),
            _ => runtime.clone(),
        };
        if span.set_parent(parent).is_err() {
            return;
        }
        span.record("otel.name", format!("process {queue}"));
        span.record("otel.kind", "consumer");
        span.set_attribute(MESSAGING_SYSTEM, "aws_sqs");
        span.set_attribute(OPERATION_NAME, "process");
        span.set_attribute(OPERATION_TYPE, "process");
        span.set_attribute(DESTINATION_NAME, queue.to_owned());
        span.set_attribute(MESSAGE_ID, message.id.clone());
        span.set_attribute(RECEIVE_COUNT, i64::from(message.receive_count));
        if let Some(job_type) = message.job_type() {
            span.set_attribute(JOB_TYPE, job_type.to_owned());
        }
        let Some(producer) = producer else {
            return;
        };
        match relation {
            ProducerRelation::Link => span.add_link(producer.span().span_context().clone()),
            ProducerRelation::Parent => span.add_link(runtime.span().span_context().clone()),
        }
    }

    pub(super) fn record_error(span: &tracing::Span, reason: &str) {
        span.set_status(opentelemetry::trace::Status::error(reason.to_owned()));
    }

    pub(super) fn set_error_type(span: &tracing::Span, error_type: &str) {
        span.set_attribute(ERROR_TYPE, error_type.to_owned());
    }

    pub(super) fn producer(span: &tracing::Span, queue: &str, messages: usize) {
        span.record("otel.name", format!("send {queue}"));
        span.record("otel.kind", "producer");
        span.set_attribute(MESSAGING_SYSTEM, "aws_sqs");
        span.set_attribute(OPERATION_NAME, "send");
        span.set_attribute(OPERATION_TYPE, "send");
        span.set_attribute(DESTINATION_NAME, queue.to_owned());
        if messages > 1 {
            span.set_attribute(BATCH_MESSAGE_COUNT, messages as i64);
        }
    }

    /// Links `span` to the producer context a message's attributes carry, if any.
    pub(super) fn link_to_carried(span: &tracing::Span, attributes: &Attributes) {
        let mut carrier = Carrier::default();
        for name in [TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE] {
            if let Some(value) = attributes
                .get(name)
                .and_then(|value| value.string_value.as_deref())
            {
                carrier.0.insert(name.to_owned(), value.to_owned());
            }
        }
        if carrier.0.is_empty() {
            return;
        }
        let context =
            opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
        let linked = context.span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }

    pub(super) fn batch_call(span: &tracing::Span, job_type: &str, job_spans: &[tracing::Span]) {
        span.record("otel.name", format!("batch {job_type}"));
        span.set_attribute(BATCH_MESSAGE_COUNT, job_spans.len() as i64);
        for job in job_spans {
            let linked = job.context().span().span_context().clone();
            if linked.is_valid() {
                span.add_link(linked);
            }
        }
    }
}

/// The OpenTelemetry attribute names Conveyor's spans carry (the messaging semantic conventions).
/// SQS's receive count has no name in the conventions: it goes under `messaging.aws.sqs.`, the prefix
/// OpenTelemetry's own SQS instrumentations use for what is SQS's alone (the Ruby one's
/// `messaging.aws.sqs.message_group_id`), as Pub/Sub's `messaging.gcp_pubsub.message.delivery_attempt`
/// does for Pub/Sub.
pub mod attribute {
    /// `aws_sqs` on every span of Conveyor's.
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    /// `process` on a consumer span, `send` on a producer span.
    pub const OPERATION_NAME: &str = "messaging.operation.name";
    /// `process` or `send`.
    pub const OPERATION_TYPE: &str = "messaging.operation.type";
    /// The queue's name.
    pub const DESTINATION_NAME: &str = "messaging.destination.name";
    /// SQS's message id.
    pub const MESSAGE_ID: &str = "messaging.message.id";
    /// How many messages a batch send (or a batch-handler call) carried; only above one.
    pub const BATCH_MESSAGE_COUNT: &str = "messaging.batch.message_count";
    /// SQS's `ApproximateReceiveCount` of the message.
    pub const RECEIVE_COUNT: &str = "messaging.aws.sqs.receive_count";
    /// The job's type.
    pub const JOB_TYPE: &str = "conveyor.job_type";
    /// A failed run's or send's class ([`super::error_type`]).
    pub const ERROR_TYPE: &str = "error.type";
}

#[cfg(test)]
#[cfg(feature = "otel")]
mod tests {
    use opentelemetry::trace::{SpanId, TraceContextExt as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;
    use crate::message::AttributeValue;

    /// Spans of this thread go to an in-memory exporter, with the W3C propagator installed.
    fn traced() -> (
        InMemorySpanExporter,
        SdkTracerProvider,
        tracing::subscriber::DefaultGuard,
    ) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        crate::test_logs::keep_callsites_open();
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        tracing::callsite::rebuild_interest_cache();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        (exporter, provider, guard)
    }

    fn finished(exporter: &InMemorySpanExporter, name: &str) -> SpanData {
        let spans = exporter.get_finished_spans().unwrap();
        spans
            .into_iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no span {name}"))
    }

    #[test]
    fn the_sending_span_goes_in_traceparent_unless_a_context_is_there_or_room_is_not() {
        let (exporter, _provider, _guard) = traced();
        let request = tracing::info_span!("request");
        let (fresh, kept, full) = request.in_scope(|| {
            let mut fresh = Attributes::new();
            let mut header = None;
            inject(&mut fresh, &mut header, 9);
            assert_eq!(header, None, "no X-Ray propagator, no AWSTraceHeader");

            let mut kept = Attributes::new();
            kept.insert(TRACEPARENT_ATTRIBUTE.into(), AttributeValue::string("00-copy-01"));
            inject(&mut kept, &mut None, 9);

            let mut full: Attributes = (0..9)
                .map(|n| (format!("a{n}"), AttributeValue::string("x")))
                .collect();
            inject(&mut full, &mut None, 9);
            (fresh, kept, full)
        });
        drop(request);
        let sent = finished(&exporter, "request").span_context;
        let expected = format!("00-{}-{}-01", sent.trace_id(), sent.span_id());
        assert_eq!(
            fresh[TRACEPARENT_ATTRIBUTE].string_value.as_deref(),
            Some(expected.as_str())
        );
        assert!(
            !fresh.contains_key(TRACESTATE_ATTRIBUTE),
            "an empty tracestate is not sent"
        );
        assert_eq!(
            kept[TRACEPARENT_ATTRIBUTE].string_value.as_deref(),
            Some("00-copy-01"),
            "a copy keeps its producer's context"
        );
        assert!(
            !full.contains_key(TRACEPARENT_ATTRIBUTE),
            "no room: the job goes without it"
        );
        let mut outside = Attributes::new();
        inject(&mut outside, &mut None, 9);
        assert!(outside.is_empty(), "no current span, nothing injected");
    }

    #[test]
    fn a_message_span_links_to_its_producer_or_has_it_as_parent_and_carries_the_outcome() {
        let (exporter, _provider, _guard) = traced();
        let mut message = Message::new("m-1", "{}");
        tracing::info_span!("producer").in_scope(|| inject(&mut message.attributes, &mut None, 9));
        let producer = finished(&exporter, "producer").span_context;

        let linked = message_span(&message, "orders", ProducerRelation::Link);
        record_run_error(
            &linked,
            &Outcome::Retry {
                delay: std::time::Duration::ZERO,
                reason: "timeout".into(),
            },
        );
        record_settlement(&linked, Settlement::Retried);
        drop(linked);
        let runtime = tracing::info_span!("invocation");
        let parented = runtime.in_scope(|| message_span(&message, "orders", ProducerRelation::Parent));
        let invocation = runtime.context().span().span_context().clone();
        record_run_error(&parented, &Outcome::Ack(AckReason::Completed));
        record_settlement(&parented, Settlement::Acknowledged(AckReason::Completed));
        drop(parented);
        drop(runtime);

        let spans = exporter.get_finished_spans().unwrap();
        let consumers: Vec<&SpanData> = spans
            .iter()
            .filter(|span| span.name == "process orders")
            .collect();
        assert_eq!(consumers.len(), 2);
        let (linked, parented) = (consumers[0], consumers[1]);
        assert_eq!(linked.span_kind, opentelemetry::trace::SpanKind::Consumer);
        assert_ne!(
            linked.span_context.trace_id(),
            producer.trace_id(),
            "a link starts its own trace"
        );
        assert_eq!(linked.links.links.len(), 1);
        assert_eq!(linked.links.links[0].span_context.span_id(), producer.span_id());
        assert_eq!(linked.status, opentelemetry::trace::Status::error("timeout"));
        let attribute = |span: &SpanData, key: &str| {
            span.attributes
                .iter()
                .find(|pair| pair.key.as_str() == key)
                .map(|pair| pair.value.to_string())
        };
        assert_eq!(attribute(linked, "outcome").as_deref(), Some("retried"));
        assert_eq!(attribute(linked, "messaging.system").as_deref(), Some("aws_sqs"));
        assert_eq!(attribute(linked, "messaging.message.id").as_deref(), Some("m-1"));

        assert_eq!(
            parented.span_context.trace_id(),
            producer.trace_id(),
            "one trace with the producer"
        );
        assert_eq!(parented.parent_span_id, producer.span_id());
        assert_ne!(parented.parent_span_id, SpanId::INVALID);
        assert_eq!(parented.links.links.len(), 1, "the runtime's span becomes a link");
        assert_eq!(
            parented.links.links[0].span_context.span_id(),
            invocation.span_id()
        );
        assert_eq!(attribute(parented, "outcome").as_deref(), Some("acked"));
    }

    fn attribute(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|pair| pair.key.as_str() == key)
            .map(|pair| pair.value.to_string())
    }

    #[test]
    fn a_send_span_is_a_producer_span_whose_context_the_jobs_carry_and_that_links_to_encoded_ones() {
        let (exporter, _provider, _guard) = traced();
        let mut committed = Attributes::new();
        tracing::info_span!("commit").in_scope(|| inject(&mut committed, &mut None, 9));
        let commit = finished(&exporter, "commit").span_context;

        let single = send_span("orders", 1);
        let mut fresh = Attributes::new();
        single.in_scope(|| inject(&mut fresh, &mut None, 9));
        record_send_error(&single, "QueueMissing", "queue orders does not exist");
        drop(single);
        let batch = send_span("orders", 2);
        link_to_messages(&batch, [&committed, &Attributes::new()]);
        drop(batch);

        let spans = exporter.get_finished_spans().unwrap();
        let sends: Vec<&SpanData> = spans.iter().filter(|span| span.name == "send orders").collect();
        assert_eq!(sends.len(), 2, "{spans:#?}");
        let (single, batch) = (sends[0], sends[1]);
        assert_eq!(single.span_kind, opentelemetry::trace::SpanKind::Producer);
        assert_eq!(
            attribute(single, "messaging.operation.name").as_deref(),
            Some("send")
        );
        assert_eq!(
            attribute(single, "messaging.operation.type").as_deref(),
            Some("send")
        );
        assert_eq!(
            attribute(single, "messaging.destination.name").as_deref(),
            Some("orders")
        );
        assert_eq!(
            attribute(single, "messaging.batch.message_count"),
            None,
            "one job is no batch"
        );
        assert_eq!(attribute(single, "error.type").as_deref(), Some("QueueMissing"));
        let expected = format!(
            "00-{}-{}-01",
            single.span_context.trace_id(),
            single.span_context.span_id()
        );
        assert_eq!(
            fresh[TRACEPARENT_ATTRIBUTE].string_value.as_deref(),
            Some(expected.as_str()),
            "a job encoded in the send carries the send's context"
        );
        assert_eq!(
            attribute(batch, "messaging.batch.message_count").as_deref(),
            Some("2")
        );
        assert_eq!(
            batch.links.links.len(),
            1,
            "one link per job that carries a context"
        );
        assert_eq!(batch.links.links[0].span_context.span_id(), commit.span_id());
    }

    #[test]
    fn a_failed_runs_class_is_its_error_type_and_a_batch_call_links_to_its_jobs() {
        use crate::outcome::RunResult;
        assert_eq!(error_type(&RunResult::Succeeded), None);
        assert_eq!(
            error_type(&RunResult::Failed(crate::HandlerError::permanent("bad input"))),
            Some("permanent")
        );
        assert_eq!(
            error_type(&RunResult::Failed(crate::HandlerError::retryable("503"))),
            Some("retryable")
        );
        assert_eq!(
            error_type(&RunResult::TimedOut(std::time::Duration::from_secs(1))),
            Some("timeout")
        );
        assert_eq!(error_type(&RunResult::Panicked("boom".into())), Some("panic"));

        let (exporter, _provider, _guard) = traced();
        let jobs: Vec<tracing::Span> = ["m-1", "m-2"]
            .iter()
            .map(|id| message_span(&Message::new(*id, "{}"), "orders", ProducerRelation::Link))
            .collect();
        jobs[0].in_scope(|| record_error_type(&RunResult::TimedOut(std::time::Duration::from_secs(1))));
        let call = batch_call_span("invoice_line", &jobs);
        let job_ids: Vec<SpanId> = jobs
            .iter()
            .map(|span| span.context().span().span_context().span_id())
            .collect();
        drop(call);
        drop(jobs);
        let spans = exporter.get_finished_spans().unwrap();
        let call = finished(&exporter, "batch invoice_line");
        let linked: Vec<SpanId> = call
            .links
            .links
            .iter()
            .map(|link| link.span_context.span_id())
            .collect();
        assert_eq!(linked, job_ids);
        assert_eq!(
            attribute(&call, "messaging.batch.message_count").as_deref(),
            Some("2")
        );
        let timed_out = spans
            .iter()
            .find(|span| attribute(span, "messaging.message.id").as_deref() == Some("m-1"))
            .unwrap();
        assert_eq!(attribute(timed_out, "error.type").as_deref(), Some("timeout"));
    }

    #[test]
    fn without_an_opentelemetry_layer_log_lines_carry_no_opentelemetry_fields() {
        let (lines, _guard) = crate::test_logs::capture();
        let mut message = Message::new("m-2", "{}");
        message.attributes.insert(
            TRACEPARENT_ATTRIBUTE.into(),
            AttributeValue::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let span = message_span(&message, "orders", ProducerRelation::Link);
        span.in_scope(|| tracing::info!("job succeeded"));
        let text = lines.text();
        assert!(
            text.contains("message_id=m-2") && text.contains("job succeeded"),
            "{text}"
        );
        assert!(!text.contains("otel."), "{text}");
    }

    #[test]
    fn an_sns_notification_links_to_the_publisher_whose_context_is_in_its_body() {
        let (exporter, _provider, _guard) = traced();
        let mut published = Attributes::new();
        tracing::info_span!("publish").in_scope(|| inject(&mut published, &mut None, 9));
        let publisher = finished(&exporter, "publish").span_context;
        let traceparent = published[TRACEPARENT_ATTRIBUTE].string_value.clone().unwrap();
        let body = serde_json::json!({
            "Type": "Notification",
            "MessageId": "sns-1",
            "TopicArn": "arn:aws:sns:us-east-1:000000000000:orders",
            "Message": "{}",
            "Timestamp": "2026-12-05T03:00:00.000Z",
            "MessageAttributes": {"traceparent": {"Type": "String", "Value": traceparent}}
        });
        let pipeline = crate::Pipeline::new(crate::Router::new());
        let span = pipeline.message_span(&Message::new("m-3", body.to_string()), "orders");
        drop(span);
        let consumer = finished(&exporter, "process orders");
        assert_eq!(consumer.links.links.len(), 1, "{consumer:?}");
        assert_eq!(
            consumer.links.links[0].span_context.span_id(),
            publisher.span_id()
        );
    }
}

#[cfg(test)]
mod room_tests {
    use super::*;
    use crate::message::AttributeValue;

    fn attributes(own: usize, traced: &[&str]) -> Attributes {
        let mut attributes: Attributes = (0..own)
            .map(|index| (format!("own.{index}"), AttributeValue::string("x")))
            .collect();
        for name in traced {
            attributes.insert((*name).to_owned(), AttributeValue::string("00-trace-01"));
        }
        attributes
    }

    #[test]
    fn the_trace_context_gives_way_to_the_jobs_own_attributes_state_first() {
        let mut full = attributes(7, &[TRACEPARENT_ATTRIBUTE, TRACESTATE_ATTRIBUTE]);
        assert_eq!(make_room(&mut full, 1, 9), 1);
        assert!(full.contains_key(TRACEPARENT_ATTRIBUTE) && !full.contains_key(TRACESTATE_ATTRIBUTE));
        assert_eq!(make_room(&mut full, 2, 9), 1);
        assert!(!full.contains_key(TRACEPARENT_ATTRIBUTE));
        assert_eq!(full.len(), 7, "the job's own attributes are all kept");
    }

    #[test]
    fn nothing_is_dropped_when_there_is_room_or_no_trace_context() {
        let mut roomy = attributes(5, &[TRACEPARENT_ATTRIBUTE]);
        assert_eq!(make_room(&mut roomy, 1, 9), 0);
        assert!(roomy.contains_key(TRACEPARENT_ATTRIBUTE));
        let mut untraced = attributes(9, &[]);
        assert_eq!(make_room(&mut untraced, 1, 9), 0);
        assert_eq!(untraced.len(), 9, "the job's own attributes are never dropped");
    }
}
