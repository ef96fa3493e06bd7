//! What tracing costs per message: figures, not pass/fail.
//!
//! ```text
//! cargo run --release -p conveyor-otel --example trace_cost
//! ```
//!
//! Every message carries a producer's `traceparent`. Three set-ups, on one thread each:
//!
//! - **no subscriber**: no `tracing` subscriber at all (spans are disabled at their call site);
//! - **logs**: a `fmt` subscriber at `info` writing to a sink (what a worker runs without OpenTelemetry);
//! - **logs + OpenTelemetry**: the same plus the OpenTelemetry layer, every span sampled and exported
//!   in batches over OTLP/HTTP to a receiver in this process (`conveyor_testing::otlp`).
//!
//! (a) no-op jobs per second through the worker on `MemoryQueue` (`BENCH_TRACE_MESSAGES`, default
//! 20000); (b) µs per Lambda batch of 10 no-op records through `BatchProcessor` (20,000 batches).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a benchmark binary

use std::sync::Arc;
use std::time::{Duration, Instant};

use conveyor_core::message::AttributeValue;
use conveyor_core::port::{OutgoingMessage, Queue};
use conveyor_core::trace::TRACEPARENT_ATTRIBUTE;
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_lambda::{BatchProcessor, FixedQueue, LambdaConfig, SqsEvent, parse_event};
use conveyor_testing::MemoryQueue;
use conveyor_testing::otlp::OtlpReceiver;
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const BATCH: usize = 10;
const BATCHES: usize = 20_000;

struct Noop;

impl Handler for Noop {
    type Job = serde::de::IgnoredAny;
    type Output = ();
    const JOB_TYPE: &'static str = "noop";

    async fn handle(&self, _job: serde::de::IgnoredAny, _ctx: Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    NoSubscriber,
    Logs,
    LogsAndOtel,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::NoSubscriber => "no subscriber",
            Setup::Logs => "logs",
            Setup::LogsAndOtel => "logs + OpenTelemetry",
        }
    }
}

/// The subscriber of `setup` for the current thread, and the provider to flush.
fn subscriber(
    setup: Setup,
    receiver: &OtlpReceiver,
) -> (
    Option<tracing::subscriber::DefaultGuard>,
    Option<SdkTracerProvider>,
) {
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_filter(tracing::level_filters::LevelFilter::INFO);
    match setup {
        Setup::NoSubscriber => (None, None),
        Setup::Logs => {
            let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(lines));
            (Some(guard), None)
        }
        Setup::LogsAndOtel => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(receiver.traces_url())
                .build()
                .unwrap();
            let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("bench"))
                .with_filter(tracing::level_filters::LevelFilter::INFO);
            let guard =
                tracing::subscriber::set_default(tracing_subscriber::registry().with(lines).with(layer));
            (Some(guard), Some(provider))
        }
    }
}

async fn worker_jobs_per_second(messages: usize) -> f64 {
    let queue = Arc::new(MemoryQueue::standard("trace-cost"));
    for index in 0..messages {
        let mut message = OutgoingMessage::job("noop", format!("{{\"n\":{index}}}"));
        message.attributes.insert(
            TRACEPARENT_ATTRIBUTE.to_owned(),
            AttributeValue::string(TRACEPARENT),
        );
        queue.send(message).await.unwrap();
    }
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new("http://memory.invalid/0/trace-cost")])
        .with_listen_addr(None)
        .with_max_in_flight(100);
    let pipeline = Pipeline::new(Router::single(Noop));
    let worker = Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>]).unwrap();
    let status = worker.status();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    conveyor_testing::wait_until(Duration::from_secs(600), Duration::from_millis(2), async || {
        status.report().succeeded >= messages as u64
    })
    .await
    .unwrap();
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    messages as f64 / elapsed.as_secs_f64()
}

fn event() -> SqsEvent {
    let records: Vec<serde_json::Value> = (0..BATCH)
        .map(|index| {
            json!({
                "messageId": format!("00000000-0000-4000-8000-{index:012}"),
                "receiptHandle": format!("rh-{index}"),
                "body": format!("{{\"n\":{index}}}"),
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
                "messageAttributes": {
                    "conveyor.type": {"stringValue": "noop", "dataType": "String"},
                    "traceparent": {"stringValue": TRACEPARENT, "dataType": "String"}
                },
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:trace-cost",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    parse_event(json!({ "Records": records })).unwrap()
}

/// `event` as the mapping hands it over just after its receive: its records' first receive is now, so
/// the adapter makes no visibility call for them (conveyor-lambda's `src/cover.rs`), as with a prompt
/// mapping; `MemoryQueue`, which never handed these receipts out, would refuse their renewal and the
/// records would not run. Done per batch, outside the timed part.
fn received_now(mut event: SqsEvent) -> SqsEvent {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    for record in &mut event.records {
        record
            .attributes
            .insert("ApproximateFirstReceiveTimestamp".to_owned(), now.clone());
    }
    event
}

async fn lambda_micros_per_batch() -> f64 {
    let queue: Arc<dyn Queue> = Arc::new(MemoryQueue::standard("trace-cost"));
    let processor = BatchProcessor::new(
        Pipeline::new(Router::single(Noop)),
        LambdaConfig::default(),
        Arc::new(FixedQueue(queue)),
    )
    .without_metrics();
    let event = event();
    let mut total = Duration::ZERO;
    for _ in 0..BATCHES {
        let event = received_now(event.clone());
        let started = Instant::now();
        let report = processor
            .process_batch_report(event, tokio::time::Instant::now() + Duration::from_secs(10))
            .await;
        total += started.elapsed();
        assert!(report.response.batch_item_failures.is_empty());
    }
    total.as_secs_f64() * 1e6 / BATCHES as f64
}

fn main() {
    let messages: usize = std::env::var("BENCH_TRACE_MESSAGES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(20_000);
    // The receiver decodes on a runtime of its own (a thread of its own), as a collector would elsewhere.
    let collector = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let receiver = collector.block_on(OtlpReceiver::start()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        println!("(a) worker on MemoryQueue, {messages} no-op jobs, one thread, max_in_flight 100:");
        for setup in [Setup::NoSubscriber, Setup::Logs, Setup::LogsAndOtel] {
            let (guard, provider) = subscriber(setup, &receiver);
            let rate = worker_jobs_per_second(messages).await;
            drop(guard);
            let exported = flush(provider).await;
            println!("    {:<22} {rate:>9.0} jobs/s{exported}", setup.name());
        }
        println!("(b) Lambda batch of {BATCH} no-op records, {BATCHES} batches, one thread:");
        for setup in [Setup::NoSubscriber, Setup::Logs, Setup::LogsAndOtel] {
            let (guard, provider) = subscriber(setup, &receiver);
            let micros = lambda_micros_per_batch().await;
            drop(guard);
            let exported = flush(provider).await;
            println!("    {:<22} {micros:>9.1} µs per batch{exported}", setup.name());
        }
        let received = receiver.spans().len();
        let made = messages + BATCHES * (BATCH + 1);
        println!(
            "spans made: {made}; decoded by the receiver: {received} (the SDK's batch processor drops what \
             its queue, OTEL_BSP_MAX_QUEUE_SIZE = 2048, cannot hold)"
        );
    });
}

/// Flushes and shuts down the provider (its batches go to the receiver); says how many spans it held.
async fn flush(provider: Option<SdkTracerProvider>) -> String {
    let Some(provider) = provider else {
        return String::new();
    };
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    " (spans exported over OTLP/HTTP)".to_owned()
}
