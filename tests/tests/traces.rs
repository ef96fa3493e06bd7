//! Traces across the queue, end to end: a real OTLP/HTTP receiver (`conveyor_testing::otlp`, the
//! protocol's own protobuf types) gets the spans of a producer (this process, OpenTelemetry's SDK and
//! OTLP exporter), of the worker (in this process, on LocalStack), and of the example `bootstrap` under
//! `conveyor lambda run` (another process, exporting because `OTEL_EXPORTER_OTLP_ENDPOINT` is set).
//!
//! Every run of a job, on either runtime, is a consumer span that leads back to the producer's span
//! (a link, OpenTelemetry's messaging default): a job retried once (two runs), a job not due yet
//! (deferred copies, one hop a second on a fast clock, then its run), a flow's child and its parent
//! (sent later by the worker that counted the child's end), and on Lambda a job done and a job
//! dead-lettered, each record's span inside its invocation's span.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use conveyor_core::port::{FlowSender, FlowStore, IdempotencyStore, Queue};
use conveyor_core::runtime::Clock;
use conveyor_core::{Context, Flows, Handler, HandlerError, Pipeline, Router};
use conveyor_sqs::{Flow, FlowProducer, NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, TestQueue, unique_name};
use conveyor_testing::otlp::{OtlpReceiver, ReceivedSpan};
use conveyor_testing::{MemoryFlows, MemoryIdempotencyStore, QueueSender, wait_until};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// How long spans may take to reach the receiver.
const SPANS_TIMEOUT: Duration = Duration::from_secs(60);
/// Virtual seconds per real second for the job not due yet.
const SPEED: u32 = 720;
/// OTLP's consumer span kind.
const CONSUMER: i32 = 5;
/// OTLP's `SPAN_KIND_PRODUCER`.
const PRODUCER: i32 = 4;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
}

/// Fails its first run (retryable), succeeds after.
struct Flaky {
    runs: Arc<AtomicU32>,
}

impl Handler for Flaky {
    type Job = Order;
    type Output = ();
    const JOB_TYPE: &'static str = "charge";

    async fn handle(&self, _job: Order, _ctx: Context) -> Result<(), HandlerError> {
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::retry_after(
                "the provider timed out",
                Duration::from_secs(1),
            ));
        }
        Ok(())
    }
}

/// Counts its runs per job type (the job not due yet, the flow's child and parent).
struct Counted {
    job_type: &'static str,
    runs: Arc<Mutex<Vec<&'static str>>>,
}

macro_rules! counted {
    ($name:ident, $job_type:literal) => {
        struct $name(Counted);
        impl Handler for $name {
            type Job = Order;
            type Output = u32;
            const JOB_TYPE: &'static str = $job_type;

            async fn handle(&self, job: Order, _ctx: Context) -> Result<u32, HandlerError> {
                self.0.runs.lock().unwrap().push(self.0.job_type);
                Ok(job.id)
            }
        }
    };
}
counted!(Reminder, "reminder");
counted!(Line, "invoice_line");
counted!(Invoice, "invoice");

/// A clock that runs `SPEED` times faster than the real one from now on.
fn fast_clock() -> Clock {
    let real_start = SystemTime::now();
    let started = std::time::Instant::now();
    Arc::new(move || real_start + started.elapsed() * SPEED)
}

/// The producer's side: OpenTelemetry's SDK exporting over OTLP/HTTP to `receiver`, under `tracing`,
/// with the W3C propagator, installed for this process.
fn install_producer_tracing(receiver: &OtlpReceiver) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(receiver.traces_url())
        .build()
        .unwrap();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("checkout")
                .build(),
        )
        .build();
    // The SDK's own spans (debug and trace) stay out: the producer's request and the worker's messages.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("checkout"))
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    provider
}

async fn flush(provider: &SdkTracerProvider) {
    let provider = provider.clone();
    tokio::task::spawn_blocking(move || provider.force_flush())
        .await
        .unwrap()
        .unwrap();
}

fn consumer_spans<'a>(spans: &'a [ReceivedSpan], job_type: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| is_record(span) && span.attribute("conveyor.job_type") == Some(job_type))
        .collect()
}

/// A message's span (`process <queue>`), not the Lambda invocation's (a consumer span too).
fn is_record(span: &ReceivedSpan) -> bool {
    span.kind == CONSUMER && span.name.starts_with("process ")
}

/// The producer spans of `Producer::send` calls made inside `request`.
fn sends_in<'a>(spans: &'a [ReceivedSpan], request: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.kind == PRODUCER && span.name.starts_with("send ") && span.follows(request))
        .collect()
}

fn outcomes(spans: &[&ReceivedSpan]) -> Vec<String> {
    spans
        .iter()
        .map(|span| span.attribute("outcome").unwrap_or("none").to_owned())
        .collect()
}

/// The one span named `name` of `service`.
fn the_span<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.service == service && span.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {name} span of {service}: {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_run_of_a_job_leads_back_to_the_span_that_sent_it_on_the_worker_and_on_lambda() {
    localstack::ensure_local_aws().await.unwrap();
    let receiver = OtlpReceiver::start().await.unwrap();
    let provider = install_producer_tracing(&receiver);
    worker_runs_lead_back_to_the_producer(&receiver, &provider).await;
    lambda_runs_lead_back_to_the_producer(&receiver, &provider).await;
}

async fn worker_runs_lead_back_to_the_producer(receiver: &OtlpReceiver, provider: &SdkTracerProvider) {
    let sqs = localstack::sqs_client().await;
    let created = localstack::create_queue(&sqs, &QueueSpec::standard("traces").max_receive_count(5))
        .await
        .unwrap();
    let queue = Arc::new(SqsQueue::connect(sqs.clone(), &created.url).await.unwrap());
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotencyStore::new());
    let flows: Arc<dyn FlowStore> = Arc::new(MemoryFlows::new());
    let sender: Arc<dyn FlowSender> = Arc::new(QueueSender(Arc::clone(&queue) as Arc<dyn Queue>));
    let clock = fast_clock();
    let charges = Arc::new(AtomicU32::new(0));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let counted = |job_type| Counted {
        job_type,
        runs: Arc::clone(&runs),
    };
    let router = Router::new()
        .route(Flaky {
            runs: Arc::clone(&charges),
        })
        .route(Reminder(counted("reminder")))
        .route(Line(counted("invoice_line")))
        .route(Invoice(counted("invoice")));
    let pipeline = Pipeline::new(router)
        .with_store(Arc::clone(&store))
        .with_flows(Flows {
            store: Arc::clone(&flows),
            sender: Arc::clone(&sender),
        })
        .with_clock(Arc::clone(&clock))
        .with_max_delay_hop(Duration::from_secs(1));

    // The request that sends the three jobs.
    let request = tracing::info_span!("POST /checkout");
    async {
        let producer = Producer::new(sqs.clone(), &created.url);
        producer
            .send(&NewJob::new("charge", Order { id: 1 }))
            .await
            .unwrap();
        // Due in two (virtual) hours: hops of 1 s on the fast clock, each a deferred copy.
        let reminder =
            NewJob::new("reminder", Order { id: 2 }).deliver_at(clock() + Duration::from_secs(2 * 3600));
        let mut message = reminder.to_message(&created.url).unwrap();
        message.delay = Some(Duration::from_secs(1));
        queue.send(message).await.unwrap();
        let flow = Flow::new("invoice:3", NewJob::new("invoice", Order { id: 3 }), &created.url)
            .child(NewJob::new("invoice_line", Order { id: 31 }), &created.url);
        FlowProducer::with_sender(Arc::clone(&sender), Arc::clone(&flows))
            .send(&flow)
            .await
            .unwrap();
    }
    .instrument(request)
    .await;

    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(&created.url)])
        .with_listen_addr(None)
        .with_drain_deadline(Some(Duration::from_secs(10)));
    let worker = Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>]).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(Duration::from_secs(90), Duration::from_millis(100), async || {
        let runs = runs.lock().unwrap();
        charges.load(Ordering::SeqCst) >= 2 && runs.contains(&"reminder") && runs.contains(&"invoice")
    })
    .await
    .expect("the charge to run twice, the reminder once due, and the invoice after its line");
    shutdown.cancel();
    running.await.unwrap().unwrap();
    flush(provider).await;

    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            ["charge", "reminder", "invoice_line", "invoice"]
                .iter()
                .all(|job_type| !consumer_spans(spans, job_type).is_empty())
                && consumer_spans(spans, "charge").len() >= 2
        })
        .await
        .unwrap();
    let producer = the_span(&spans, "checkout", "POST /checkout");
    let charge = consumer_spans(&spans, "charge");
    assert_eq!(outcomes(&charge), ["retried", "acked"], "{charge:#?}");
    assert_eq!(charge[0].status_code, 2, "the failed run is an error span");
    let reminder = consumer_spans(&spans, "reminder");
    let reminder_outcomes = outcomes(&reminder);
    assert!(
        reminder_outcomes.len() >= 2
            && reminder_outcomes[..reminder_outcomes.len() - 1]
                .iter()
                .all(|outcome| outcome == "deferred")
            && reminder_outcomes.last().is_some_and(|outcome| outcome == "acked"),
        "hops deferred, then the run: {reminder_outcomes:?}"
    );
    // `Producer::send` sends in a producer span of its own (`send <queue>`, a child of the request);
    // the reminder and the flow went through the queue port, whose messages carry the request's context.
    let send = spans
        .iter()
        .find(|span| span.kind == PRODUCER && span.name == format!("send {}", created.name))
        .unwrap_or_else(|| panic!("Producer::send's span was exported: {spans:#?}"));
    assert!(
        send.follows(producer),
        "the send is the request's child: {send:#?}"
    );
    assert_eq!(send.attribute("messaging.operation.name"), Some("send"));
    assert_eq!(send.attribute("messaging.operation.type"), Some("send"));
    assert_eq!(
        send.attribute("messaging.destination.name"),
        Some(created.name.as_str())
    );
    for span in &charge {
        assert!(span.follows(send), "each charge run links to its send: {span:#?}");
    }
    assert_eq!(
        charge[0].attribute("error.type"),
        Some("retryable"),
        "the failed run's class"
    );
    for job_type in ["charge", "reminder", "invoice_line", "invoice"] {
        for span in consumer_spans(&spans, job_type) {
            assert!(
                span.follows(producer) || span.follows(send),
                "every run of {job_type} links to the request that sent it: {span:#?}\nproducer: {producer:#?}"
            );
            assert_eq!(span.attribute("messaging.operation.name"), Some("process"));
            assert!(span.attribute("messaging.aws.sqs.receive_count").is_some());
            assert_eq!(span.attribute("messaging.system"), Some("aws_sqs"));
            assert_eq!(
                span.attribute("messaging.destination.name"),
                Some(created.name.as_str())
            );
            assert_eq!(span.name, format!("process {}", created.name));
            assert_ne!(
                span.trace_id, producer.trace_id,
                "a link, not a parent: each run has its own trace"
            );
        }
    }
}

async fn lambda_runs_lead_back_to_the_producer(receiver: &OtlpReceiver, provider: &SdkTracerProvider) {
    let sqs = localstack::sqs_client().await;
    let created: TestQueue =
        localstack::create_queue(&sqs, &QueueSpec::standard("traces-lambda").max_receive_count(3))
            .await
            .unwrap();
    let request = tracing::info_span!("POST /signup");
    async {
        let producer = Producer::new(sqs.clone(), &created.url);
        for (user_id, email) in [(7, "ada@example.com"), (8, "no-address")] {
            let job = NewJob::new(
                "welcome_email",
                json!({"user_id": user_id, "email": email, "name": format!("User {user_id}")}),
            );
            producer.send(&job).await.unwrap();
        }
    }
    .instrument(request)
    .await;
    flush(provider).await;

    let table = localstack::create_table(&localstack::dynamodb_client().await, "traces")
        .await
        .unwrap();
    let outbox = std::env::temp_dir().join(format!("{}.jsonl", unique_name("traces-outbox")));
    // Quiet logs (`warn`), as in production: the level filters log lines, not the exported spans.
    let mut env = conveyor_demo::local_app_env(&table, &outbox, "traces-secret", "warn");
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), receiver.endpoint()));
    env.push(("OTEL_SERVICE_NAME".to_owned(), "signup-worker".to_owned()));
    let output = conveyor_e2e::lambda_run_until_empty(&created.url, &env, Duration::from_secs(120))
        .await
        .unwrap();

    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            spans
                .iter()
                .filter(|span| span.service == "signup-worker" && is_record(span))
                .count()
                >= 2
        })
        .await
        .unwrap_or_else(|error| {
            panic!(
                "{error}\nthe runner printed:\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let producer = the_span(&spans, "checkout", "POST /signup");
    let records: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.service == "signup-worker" && is_record(span))
        .collect();
    let mut seen = outcomes(&records);
    seen.sort();
    assert_eq!(seen, ["acked", "dead_lettered"], "{records:#?}");
    let sends = sends_in(&spans, producer);
    assert_eq!(sends.len(), 2, "a producer span per Producer::send: {spans:#?}");
    for record in records {
        assert!(
            sends.iter().any(|send| record.follows(send)),
            "each record's span links to its send, in the request's trace: {record:#?}"
        );
        let invocation = spans
            .iter()
            .find(|span| span.span_id == record.parent_span_id)
            .unwrap_or_else(|| panic!("the record's parent span was exported: {record:#?}"));
        assert_eq!(
            invocation.name, "invocation",
            "records run inside their invocation's span"
        );
        assert_eq!(invocation.service, "signup-worker");
    }
}

/// Runs `conveyor lambda run --until-empty` on `queue_url` with the example `bootstrap` and `extra`
/// arguments, as `conveyor_e2e::lambda_run_until_empty` does; its Runtime API sends Lambda's headers
/// (an epoch `Lambda-Runtime-Deadline-Ms`, `Lambda-Runtime-Trace-Id: Root=…;Parent=…;Sampled=0|1;Lineage=…`).
async fn lambda_run(queue_url: &str, env: &[(String, String)], extra: &[&str]) -> std::process::Output {
    let binaries = conveyor_e2e::binaries();
    let mut runner = tokio::process::Command::new(binaries.path("conveyor").unwrap());
    for name in conveyor_e2e::INHERITED {
        runner.env_remove(name);
    }
    runner
        .args(["lambda", "run", "--until-empty", "--queue-url", queue_url])
        .arg("--bootstrap")
        .arg(binaries.path("bootstrap").unwrap())
        .args(extra)
        .envs(env.iter().map(|(name, value)| (name.as_str(), value.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (name, value) in env {
        runner.arg("--env").arg(format!("{name}={value}"));
    }
    let output = tokio::time::timeout(Duration::from_secs(120), runner.output())
        .await
        .expect("conveyor lambda run ends within two minutes")
        .unwrap();
    assert!(
        output.status.success(),
        "conveyor lambda run failed:\n{}",
        printed(&output)
    );
    output
}

fn printed(output: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A queue with `users` welcome emails (no sender's span: the records' spans stand alone), a table,
/// and the example application's environment exporting to `endpoint` as `service`.
async fn welcome_emails(
    name: &str,
    users: &[u32],
    endpoint: &str,
    service: &str,
) -> (TestQueue, std::path::PathBuf, Vec<(String, String)>) {
    let sqs = localstack::sqs_client().await;
    let created = localstack::create_queue(&sqs, &QueueSpec::standard(name).max_receive_count(3))
        .await
        .unwrap();
    let producer = Producer::new(sqs.clone(), &created.url);
    for user_id in users {
        let job = NewJob::new(
            "welcome_email",
            json!({"user_id": user_id, "email": format!("user{user_id}@example.com"), "name": "Ada"}),
        );
        producer.send(&job).await.unwrap();
    }
    let table = localstack::create_table(&localstack::dynamodb_client().await, name)
        .await
        .unwrap();
    let outbox = std::env::temp_dir().join(format!("{}.jsonl", unique_name(name)));
    let mut env = conveyor_demo::local_app_env(&table, &outbox, "traces-secret", "warn");
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.to_owned()));
    env.push(("OTEL_SERVICE_NAME".to_owned(), service.to_owned()));
    (created, outbox, env)
}

/// How many times each user's welcome email went out (the example's outbox file).
fn emails_per_user(outbox: &std::path::Path) -> std::collections::BTreeMap<u64, u32> {
    let text = std::fs::read_to_string(outbox).unwrap_or_default();
    let mut sent = std::collections::BTreeMap::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let effect: serde_json::Value = serde_json::from_str(line).unwrap();
        if effect["effect"] == "email_sent" {
            *sent.entry(effect["to_user"].as_u64().unwrap()).or_insert(0) += 1;
        }
    }
    sent
}

/// Without X-Ray Active Tracing (Lambda's default) Lambda sends `Sampled=0` with a `Parent=`; with it,
/// `Sampled=1`. Under the default sampler the example `bootstrap` exports one consumer span per record
/// either way: inside the X-Ray trace with Active Tracing, in a trace of its own (linked to X-Ray's,
/// whose id it keeps) without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_exports_a_span_per_record_with_and_without_active_tracing() {
    localstack::ensure_local_aws().await.unwrap();
    let receiver = OtlpReceiver::start().await.unwrap();
    for active_tracing in [false, true] {
        let service = format!("signup-{}", if active_tracing { "xray" } else { "default" });
        let users = [1, 2, 3];
        let (created, outbox, env) =
            welcome_emails("traces-xray", &users, &receiver.endpoint(), &service).await;
        let extra: &[&str] = if active_tracing {
            &["--active-tracing"]
        } else {
            &[]
        };
        let output = lambda_run(&created.url, &env, extra).await;
        assert_eq!(
            emails_per_user(&outbox).into_values().collect::<Vec<_>>(),
            [1, 1, 1],
            "each job ran once\n{}",
            printed(&output)
        );
        let spans = receiver
            .wait_for(SPANS_TIMEOUT, |spans| {
                spans
                    .iter()
                    .filter(|span| span.service == service && is_record(span))
                    .count()
                    >= users.len()
            })
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "{error}: one consumer span per record (Active Tracing {active_tracing})\n{}",
                    printed(&output)
                )
            });
        let records: Vec<&ReceivedSpan> = spans
            .iter()
            .filter(|span| span.service == service && is_record(span))
            .collect();
        assert_eq!(records.len(), users.len(), "{records:#?}");
        for record in records {
            assert_eq!(record.attribute("conveyor.job_type"), Some("welcome_email"));
            assert_eq!(record.attribute("messaging.system"), Some("aws_sqs"));
            assert_eq!(record.attribute("messaging.operation.name"), Some("process"));
            assert_eq!(record.attribute("outcome"), Some("acked"));
            for copy in ["message_id", "queue", "receive_count", "job_type"] {
                assert_eq!(
                    record.attribute(copy),
                    None,
                    "{copy} is exported once, under its convention name: {record:#?}"
                );
            }
            let invocation = spans
                .iter()
                .find(|span| span.span_id == record.parent_span_id)
                .unwrap_or_else(|| panic!("the record's invocation span was exported: {record:#?}"));
            assert_eq!(invocation.name, "invocation");
            assert_invocation_attributes(invocation);
            let xray = invocation
                .attribute("aws.xray.trace_id")
                .unwrap_or_else(|| panic!("the invocation keeps its X-Ray trace id: {invocation:#?}"));
            // `1-5759e988-bd862e3fe1be46a994272793` is the W3C trace id 5759e988bd862e3fe1be46a994272793.
            let xray_as_w3c = xray.trim_start_matches("1-").replace('-', "");
            if active_tracing {
                assert_eq!(record.trace_id, xray_as_w3c, "Active Tracing: the X-Ray trace");
                assert!(
                    !invocation.parent_span_id.is_empty(),
                    "a child of Lambda's segment"
                );
            } else {
                assert_ne!(record.trace_id, xray_as_w3c, "not X-Ray's unsampled trace");
                assert!(
                    invocation.parent_span_id.is_empty(),
                    "the invocation starts its trace"
                );
                assert!(
                    invocation
                        .links
                        .iter()
                        .any(|(trace_id, _)| *trace_id == xray_as_w3c),
                    "linked to Lambda's unsampled segment: {invocation:#?}"
                );
            }
        }
    }
}

/// OpenTelemetry's FaaS conventions on an invocation span of an SQS-triggered function.
fn assert_invocation_attributes(invocation: &ReceivedSpan) {
    assert_eq!(invocation.kind, CONSUMER, "{invocation:#?}");
    assert_eq!(invocation.attribute("faas.trigger"), Some("pubsub"));
    assert_eq!(invocation.attribute("cloud.provider"), Some("aws"));
    assert_eq!(invocation.attribute("cloud.platform"), Some("aws_lambda"));
    assert!(
        invocation
            .attribute("faas.invocation_id")
            .is_some_and(|id| !id.is_empty()),
        "{invocation:#?}"
    );
    assert!(
        invocation
            .attribute("cloud.resource_id")
            .is_some_and(|arn| arn.starts_with("arn:aws:lambda:")),
        "{invocation:#?}"
    );
    assert!(
        invocation.attribute("faas.coldstart").is_some(),
        "{invocation:#?}"
    );
}

/// Under Lambda Managed Instances one process serves several invocations at once
/// (`conveyor lambda run --concurrency 2`): each invocation is the root of a trace of its own, never a
/// child of a span the runtime keeps open for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_concurrent_invocation_of_one_process_has_a_trace_of_its_own() {
    localstack::ensure_local_aws().await.unwrap();
    let receiver = OtlpReceiver::start().await.unwrap();
    let service = "signup-managed";
    let users: Vec<u32> = (1..=12).collect();
    let (created, outbox, env) =
        welcome_emails("traces-managed", &users, &receiver.endpoint(), service).await;
    let output = lambda_run(
        &created.url,
        &env,
        &[
            "--concurrency",
            "2",
            "--maximum-concurrency",
            "2",
            "--batch-size",
            "2",
        ],
    )
    .await;
    assert_eq!(
        emails_per_user(&outbox).values().sum::<u32>(),
        12,
        "each job ran once\n{}",
        printed(&output)
    );
    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            spans
                .iter()
                .filter(|span| span.service == service && is_record(span))
                .count()
                >= users.len()
        })
        .await
        .unwrap_or_else(|error| panic!("{error}: one consumer span per record\n{}", printed(&output)));
    let invocations: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.service == service && span.name == "invocation")
        .collect();
    assert!(invocations.len() >= 2, "{invocations:#?}");
    let mut traces = std::collections::BTreeSet::new();
    for invocation in &invocations {
        assert!(
            invocation.parent_span_id.is_empty(),
            "an invocation is a root: {invocation:#?}"
        );
        assert_invocation_attributes(invocation);
        traces.insert(invocation.trace_id.clone());
    }
    assert_eq!(traces.len(), invocations.len(), "a trace per invocation");
    let cold = invocations
        .iter()
        .filter(|span| span.attribute("faas.coldstart") == Some("true"))
        .count();
    assert!(
        cold >= 1,
        "the first invocation of the environment is cold: {invocations:#?}"
    );
}

/// An OTLP endpoint that takes every connection and never answers: each export waits out the
/// exporter's own timeout (ten seconds), past any short function's deadline.
async fn holding_collector() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    format!("http://{address}")
}

/// An OTLP endpoint where nothing listens: each export is refused at once.
async fn refusing_collector() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{address}")
}

/// The sum of an EMF metric over the lines the function printed.
fn emf_sum(output: &std::process::Output, metric: &str) -> u64 {
    printed(output)
        .lines()
        .filter_map(|line| line.find('{').map(|start| &line[start..]))
        .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
        .filter_map(|document| document.get(metric).and_then(serde_json::Value::as_u64))
        .sum()
}

/// A collector that holds every export past the deadline, and one that refuses connections: every
/// response is posted before its invocation's deadline, every job runs once, and the spans that did
/// not leave are counted (`SpansUnflushed`, `SpansDropped`) and said in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_refusing_collector_never_makes_an_invocation_late() {
    localstack::ensure_local_aws().await.unwrap();
    for (case, endpoint) in [
        ("holding", holding_collector().await),
        ("refusing", refusing_collector().await),
    ] {
        let users = [1, 2, 3];
        let (created, outbox, env) =
            welcome_emails(&format!("traces-{case}"), &users, &endpoint, "signup").await;
        // A short function: the SDK's own flush (five seconds) would not fit. Active Tracing, so that
        // spans are sampled whatever the X-Ray rule (without it a parented span would not be).
        let output = lambda_run(
            &created.url,
            &env,
            &["--function-timeout-secs", "4", "--active-tracing"],
        )
        .await;
        let text = printed(&output);
        assert!(
            text.contains(" 0 timeouts") && !text.contains("timed out"),
            "{case}: every response before its deadline\n{text}"
        );
        assert_eq!(
            emails_per_user(&outbox).into_values().collect::<Vec<_>>(),
            [1, 1, 1],
            "{case}: each job ran once\n{text}"
        );
        // A refused export is counted as dropped when it fails within the invocation's flush; on a
        // loaded machine the flush can run out of time first, and the spans are counted as waiting.
        // Which counter is conveyor-otel's unit tests' business (counting.rs); here, that they count.
        let uncounted = emf_sum(&output, "SpansUnflushed") + emf_sum(&output, "SpansDropped");
        assert!(
            uncounted > 0,
            "{case}: the spans that did not leave are counted (SpansUnflushed, SpansDropped)\n{text}"
        );
        assert!(
            text.contains("spans not exported by the end of the invocation"),
            "{case}: and said in the log\n{text}"
        );
    }
}
