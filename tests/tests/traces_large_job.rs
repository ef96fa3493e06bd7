//! A job that fills SQS's attribute slots, with its body through S3 and tracing on, on LocalStack: the
//! large payload's pointer takes the trace context's slot, the send succeeds and the job runs once.
//! A binary of its own: it installs the process's subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::port::{PayloadStore, Queue};
use conveyor_core::{Context, Handler, HandlerError, Payloads, Pipeline, Router};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, unique_name};
use conveyor_testing::{MemoryIdempotencyStore, wait_until};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    id: u32,
}

/// Counts its runs.
struct Reports(Arc<Mutex<Vec<u32>>>);

impl Handler for Reports {
    type Job = Report;
    type Output = ();
    const JOB_TYPE: &'static str = "report";

    async fn handle(&self, job: Report, _ctx: Context) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push(job.id);
        Ok(())
    }
}

/// Eight attributes of the job's own making (its type, its version and six the caller set), a payload
/// offloaded to S3, and tracing on: the producer's context took the ninth slot, and the large
/// payload's pointer needs one more. The pointer wins: the job is sent without its trace link, and runs
/// once. The only test of its binary: its subscriber is the process's, so no other test's thread can
/// have cached a callsite's interest without it.
#[tokio::test]
async fn a_job_with_a_full_set_of_attributes_and_a_large_payload_is_sent_and_runs_once_with_tracing_on() {
    localstack::ensure_local_aws().await.unwrap();
    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("large"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );

    let sqs = localstack::sqs_client().await;
    let created = localstack::create_queue(&sqs, &QueueSpec::standard("traces-large").max_receive_count(3))
        .await
        .unwrap();
    let s3 = localstack::s3_client();
    let bucket = unique_name("traces-large").to_lowercase().replace('_', "-");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    let store = Arc::new(conveyor_s3::S3PayloadStore::new(s3));
    // Threshold 0: every body goes through S3 (the libraries' `always_through_s3`), as one over SQS's
    // limit does, with the same pointer and the same attribute.
    let producer = Producer::new(sqs.clone(), &created.url)
        .with_large_payloads(Arc::clone(&store) as _, &bucket)
        .with_payload_threshold(0);
    let mut job = NewJob::new("report", Report { id: 9 });
    for index in 0..6 {
        job = job.attribute(
            format!("own{index}"),
            conveyor_core::message::AttributeValue::string("x"),
        );
    }
    let id = tracing::info_span!("POST /reports")
        .in_scope(|| producer.send(&job))
        .await
        .expect("tracing never fails a send");
    assert!(!id.is_empty());

    let runs = Arc::new(Mutex::new(Vec::new()));
    let queue = Arc::new(SqsQueue::connect(sqs.clone(), &created.url).await.unwrap());
    let pipeline = Pipeline::new(Router::new().route(Reports(Arc::clone(&runs))))
        .with_store(Arc::new(MemoryIdempotencyStore::new()))
        .with_payloads(Payloads::new(store as Arc<dyn PayloadStore>));
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(&created.url)])
        .with_listen_addr(None)
        .with_drain_deadline(Some(Duration::from_secs(10)));
    let worker = Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>]).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(Duration::from_secs(60), Duration::from_millis(100), async || {
        !runs.lock().unwrap().is_empty()
    })
    .await
    .expect("the large job runs");
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(runs.lock().unwrap().len(), 1, "it ran once");
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let consumer = spans
        .iter()
        .find(|span| span.name == format!("process {}", created.name))
        .unwrap_or_else(|| panic!("the run's span: {spans:#?}"));
    assert!(
        consumer.links.links.is_empty(),
        "the trace lost its link, not the job: {consumer:#?}"
    );
    let send = spans
        .iter()
        .find(|span| span.name == format!("send {}", created.name))
        .unwrap_or_else(|| panic!("the send's span: {spans:#?}"));
    assert!(
        send.events
            .iter()
            .any(|event| event.name.contains("trace context dropped")),
        "the send's span says the link was dropped: {send:#?}"
    );
}
