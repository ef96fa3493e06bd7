//! Traces across the queue with OpenTelemetry's own SQS instrumentations in other languages, both
//! ways, on LocalStack, every span collected by one OTLP/HTTP receiver (`conveyor_testing::otlp`):
//!
//! - a Python producer instrumented by `opentelemetry-instrumentation-boto3sqs` and a Node producer
//!   instrumented by `@opentelemetry/instrumentation-aws-sdk` (`tests/otel_interop/sqs_otel.{py,cjs}`)
//!   send jobs that Conveyor's worker (in this process) and Lambda adapter (the example `bootstrap`
//!   under `conveyor lambda run`) run: each run's consumer span (`process <queue>`) follows the
//!   `<queue> send` span the other language exported for that very message;
//! - Conveyor's producer, inside a request span of this process, sends jobs that a Python and a Node
//!   consumer receive: the Python `<queue> process` span and the Node `<queue> receive` span link to
//!   a span Conveyor exported in the request's trace.
//!
//! The pinned Python and Node packages are installed on first need by
//! `localstack/install-otel-interop.sh` (into `.local/otel-interop/`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use conveyor_core::port::Queue;
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, TestQueue, repo_root};
use conveyor_testing::otlp::{OtlpReceiver, ReceivedSpan};
use conveyor_testing::wait_until;
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// How long spans may take to reach the receiver.
const SPANS_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one Python or Node run may take (interpreter start and imports included).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);
/// OTLP's producer span kind.
const PRODUCER: i32 = 4;
/// OTLP's consumer span kind.
const CONSUMER: i32 = 5;
/// The job type the worker's handler runs.
const JOB_TYPE: &str = "interop_order";
/// The service name of this process's spans (the request, Conveyor's producer and worker).
const SERVICE: &str = "conveyor-interop";

/// OpenTelemetry in another language, with its SQS instrumentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Language {
    /// `opentelemetry-instrumentation-boto3sqs` on boto3.
    Python,
    /// `@opentelemetry/instrumentation-aws-sdk` on `@aws-sdk/client-sqs`.
    Node,
}

impl Language {
    const ALL: [Language; 2] = [Language::Python, Language::Node];

    fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
        }
    }
}

/// Where the installer put the interpreters' packages.
struct Installed {
    python: PathBuf,
    node_modules: PathBuf,
    scripts: PathBuf,
}

/// Runs `localstack/install-otel-interop.sh` (pinned, idempotent) once per process.
fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Result<Installed, String>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        let root = repo_root();
        let script = root.join("localstack").join("install-otel-interop.sh");
        let output = std::process::Command::new(&script)
            .output()
            .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} failed (needs python3 with venv, npm, and access to PyPI and npm); run it by hand:\n{}{}",
                script.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let local = root.join(".local").join("otel-interop");
        Ok(Installed {
            python: local.join("venv").join("bin").join("python"),
            node_modules: local.join("node").join("node_modules"),
            scripts: root.join("tests").join("otel_interop"),
        })
    });
    installed.as_ref().unwrap_or_else(|message| panic!("{message}"))
}

/// Runs `tests/otel_interop/sqs_otel.{py,cjs}` in `language` with `args` (after the mode, queue URL,
/// traces URL and service name) and returns the JSON lines it printed.
async fn run_script(
    language: Language,
    mode: &str,
    queue_url: &str,
    receiver: &OtlpReceiver,
    service: &str,
    args: &[String],
) -> anyhow::Result<Vec<Value>> {
    let paths = installed();
    let mut command = match language {
        Language::Python => {
            let mut command = tokio::process::Command::new(&paths.python);
            command.arg(paths.scripts.join("sqs_otel.py"));
            command
        }
        Language::Node => {
            let mut command = tokio::process::Command::new("node");
            command
                .arg(paths.scripts.join("sqs_otel.cjs"))
                .env("NODE_PATH", &paths.node_modules)
                .env("NODE_NO_WARNINGS", "1");
            command
        }
    };
    for name in conveyor_e2e::INHERITED {
        command.env_remove(name);
    }
    command
        .args([mode, queue_url, &receiver.traces_url(), service])
        .args(args)
        .envs(localstack::aws_env())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, command.output())
        .await
        .with_context(|| format!("the {} {mode} ran past {SCRIPT_TIMEOUT:?}", language.name()))??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("the {} {mode} failed:\n{stdout}\n{stderr}", language.name());
    }
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("the {} {mode} printed:\n{stdout}\n{stderr}", language.name()))?;
    if lines.last().and_then(|line| line["event"].as_str()) != Some("done") {
        bail!(
            "the {} {mode} did not finish:\n{stdout}\n{stderr}",
            language.name()
        );
    }
    Ok(lines)
}

/// The message ids of the `sent` lines a producer printed.
fn sent_ids(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|line| line["event"] == "sent")
        .filter_map(|line| line["messageId"].as_str().map(str::to_owned))
        .collect()
}

/// Sends `bodies` as `job_type` jobs from `language`'s instrumented producer, exporting as `service`;
/// returns the message ids.
async fn produce(
    language: Language,
    queue_url: &str,
    receiver: &OtlpReceiver,
    service: &str,
    job_type: &str,
    bodies: &[Value],
) -> Vec<String> {
    let mut args = vec![job_type.to_owned()];
    args.extend(bodies.iter().map(Value::to_string));
    let lines = run_script(language, "produce", queue_url, receiver, service, &args)
        .await
        .unwrap();
    let ids = sent_ids(&lines);
    assert_eq!(ids.len(), bodies.len(), "one message per job: {lines:#?}");
    ids
}

/// The producer span `service` exported for the message `message_id`.
fn send_span<'a>(spans: &'a [ReceivedSpan], service: &str, message_id: &str) -> Option<&'a ReceivedSpan> {
    spans.iter().find(|span| {
        span.service == service
            && span.kind == PRODUCER
            && span.attribute("messaging.message.id") == Some(message_id)
    })
}

/// Conveyor's consumer spans on `queue` exported as `service`.
fn process_spans<'a>(spans: &'a [ReceivedSpan], service: &str, queue: &str) -> Vec<&'a ReceivedSpan> {
    let name = format!("process {queue}");
    spans
        .iter()
        .filter(|span| span.service == service && span.kind == CONSUMER && span.name == name)
        .collect()
}

/// Each message `producer` sent has its `<queue> send` span, and exactly one of Conveyor's consumer
/// spans (`consumer`, on `queue`) follows it: links to it or has it as its parent.
fn assert_each_run_follows_its_send(
    spans: &[ReceivedSpan],
    producer: &str,
    ids: &[String],
    consumer: &str,
    queue: &str,
) {
    let processed = process_spans(spans, consumer, queue);
    for id in ids {
        let send = send_span(spans, producer, id)
            .unwrap_or_else(|| panic!("{producer} exported a send span for {id}: {spans:#?}"));
        assert_eq!(send.name, format!("{queue} send"), "{send:#?}");
        let following: Vec<&&ReceivedSpan> = processed.iter().filter(|span| span.follows(send)).collect();
        assert_eq!(
            following.len(),
            1,
            "one {consumer} consumer span follows {producer}'s send of {id}: {send:#?}\nconsumer spans: {processed:#?}"
        );
    }
}

/// This process's spans: OpenTelemetry's SDK exporting over OTLP/HTTP to `receiver`, under `tracing`,
/// with the W3C propagator.
fn install_tracing(receiver: &OtlpReceiver) -> SdkTracerProvider {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(receiver.traces_url())
        .build()
        .unwrap();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(SERVICE)
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SERVICE))
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

/// Counts its runs.
struct Orders {
    runs: Arc<AtomicUsize>,
}

impl Handler for Orders {
    type Job = Value;
    type Output = ();
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, _job: Value, _ctx: Context) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn create_queue(name: &str) -> TestQueue {
    let sqs = localstack::sqs_client().await;
    localstack::create_queue(&sqs, &QueueSpec::standard(name).max_receive_count(3))
        .await
        .unwrap()
}

/// Both directions through this process's tracing: the worker runs Python's and Node's jobs, and
/// Python's and Node's consumers receive Conveyor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_other_languages_instrumentations_follow_each_others_spans() {
    localstack::ensure_local_aws().await.unwrap();
    installed();
    let receiver = OtlpReceiver::start().await.unwrap();
    let provider = install_tracing(&receiver);
    worker_runs_follow_python_and_node_sends(&receiver, &provider).await;
    python_and_node_consumers_follow_conveyors_send(&receiver, &provider).await;
}

async fn worker_runs_follow_python_and_node_sends(receiver: &OtlpReceiver, provider: &SdkTracerProvider) {
    let created = create_queue("interop-worker").await;
    let mut sent = Vec::new();
    for language in Language::ALL {
        let service = format!("{}-producer", language.name());
        let bodies = [json!({"order": 1, "from": language.name()}), json!({"order": 2})];
        let ids = produce(language, &created.url, receiver, &service, JOB_TYPE, &bodies).await;
        sent.push((service, ids));
    }

    let sqs = localstack::sqs_client().await;
    let queue = Arc::new(SqsQueue::connect(sqs, &created.url).await.unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let pipeline = Pipeline::new(Router::new().route(Orders {
        runs: Arc::clone(&runs),
    }));
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(&created.url)])
        .with_listen_addr(None)
        .with_drain_deadline(Some(Duration::from_secs(10)));
    let worker = Worker::new(config, pipeline, vec![queue as Arc<dyn Queue>]).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let expected: usize = sent.iter().map(|(_, ids)| ids.len()).sum();
    wait_until(Duration::from_secs(60), Duration::from_millis(100), async || {
        runs.load(Ordering::SeqCst) >= expected
    })
    .await
    .expect("the worker to run every job Python and Node sent");
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), expected, "each job ran once");
    flush(provider).await;

    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            process_spans(spans, SERVICE, &created.name).len() >= expected
                && sent
                    .iter()
                    .all(|(service, ids)| ids.iter().all(|id| send_span(spans, service, id).is_some()))
        })
        .await
        .unwrap();
    for (service, ids) in &sent {
        assert_each_run_follows_its_send(&spans, service, ids, SERVICE, &created.name);
    }
}

async fn python_and_node_consumers_follow_conveyors_send(
    receiver: &OtlpReceiver,
    provider: &SdkTracerProvider,
) {
    let sqs = localstack::sqs_client().await;
    let mut queues = Vec::new();
    for language in Language::ALL {
        queues.push((
            language,
            create_queue(&format!("interop-{}", language.name())).await,
        ));
    }
    let request = tracing::info_span!("POST /orders");
    async {
        for (_, created) in &queues {
            let producer = Producer::new(sqs.clone(), &created.url);
            for order in [1, 2] {
                producer
                    .send(&NewJob::new(JOB_TYPE, json!({"order": order})))
                    .await
                    .unwrap();
            }
        }
    }
    .instrument(request)
    .await;
    flush(provider).await;

    let mut consumed = Vec::new();
    for (language, created) in &queues {
        let service = format!("{}-consumer", language.name());
        let count = ["2".to_owned()];
        let lines = run_script(*language, "consume", &created.url, receiver, &service, &count)
            .await
            .unwrap();
        consumed.push((*language, service, created, lines));
    }

    let request_span = |spans: &[ReceivedSpan]| {
        spans
            .iter()
            .find(|span| span.service == SERVICE && span.name == "POST /orders")
            .cloned()
    };
    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            request_span(spans).is_some()
                && consumed.iter().all(|(_, service, _, _)| {
                    spans
                        .iter()
                        .any(|span| span.service == *service && span.kind == CONSUMER)
                })
        })
        .await
        .unwrap();
    let request = request_span(&spans).unwrap();
    // Every span Conveyor's side exported in the request's trace: the request, and its `send` span
    // when the producer opens one.
    let conveyor_side: BTreeSet<&str> = spans
        .iter()
        .filter(|span| span.service == SERVICE && span.trace_id == request.trace_id)
        .map(|span| span.span_id.as_str())
        .collect();
    for (language, service, created, lines) in &consumed {
        let processed: Vec<&Value> = lines.iter().filter(|line| line["event"] == "processed").collect();
        assert_eq!(processed.len(), 2, "{language:?} consumed both jobs: {lines:#?}");
        // The span each consumer links from: Python's per-message `process` span, Node's `receive` span.
        let linking = match language {
            Language::Python => format!("{} process", created.name),
            Language::Node => format!("{} receive", created.name),
        };
        let links: Vec<&(String, String)> = spans
            .iter()
            .filter(|span| span.service == *service && span.kind == CONSUMER && span.name == linking)
            .flat_map(|span| &span.links)
            .collect();
        for line in processed {
            assert_eq!(
                line["jobType"], JOB_TYPE,
                "the job's own attributes arrived: {line}"
            );
            let traceparent = line["traceparent"]
                .as_str()
                .unwrap_or_else(|| panic!("Conveyor sent a traceparent: {line}"));
            let parts: Vec<&str> = traceparent.split('-').collect();
            let (trace_id, span_id) = (parts[1], parts[2]);
            assert_eq!(trace_id, request.trace_id, "the request's trace: {line}");
            assert!(
                conveyor_side.contains(span_id),
                "the traceparent names a span Conveyor exported in the request's trace: {line}\n{conveyor_side:?}"
            );
            assert!(
                links
                    .iter()
                    .any(|(trace, span)| trace == trace_id && span == span_id),
                "{language:?}'s {linking} span links to Conveyor's span {span_id}: {links:?}\n{spans:#?}"
            );
        }
    }
}

/// The Lambda adapter (the example `bootstrap` under `conveyor lambda run`, exporting because
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set) runs welcome emails sent by Python and Node: each record's
/// span follows the send span of its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_runs_follow_python_and_node_sends() {
    localstack::ensure_local_aws().await.unwrap();
    installed();
    let receiver = OtlpReceiver::start().await.unwrap();
    let created = create_queue("interop-lambda").await;
    let mut sent = Vec::new();
    for (language, user_id) in Language::ALL.into_iter().zip([41_u32, 42]) {
        let service = format!("{}-producer", language.name());
        let body = json!({"user_id": user_id, "email": format!("user{user_id}@example.com"), "name": "Ada"});
        let ids = produce(
            language,
            &created.url,
            &receiver,
            &service,
            "welcome_email",
            &[body],
        )
        .await;
        sent.push((service, ids));
    }

    let table = localstack::create_table(&localstack::dynamodb_client().await, "interop")
        .await
        .unwrap();
    let outbox = conveyor_e2e::outbox_path("interop-outbox");
    let mut env = conveyor_e2e::app_env(&table, &outbox);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), receiver.endpoint()));
    env.push(("OTEL_SERVICE_NAME".to_owned(), "conveyor-lambda".to_owned()));
    let output = conveyor_e2e::lambda_run_until_empty(&created.url, &env, Duration::from_secs(120))
        .await
        .unwrap();
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        conveyor_e2e::emails_per_user(&outbox)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        [(41, 1), (42, 1)],
        "each job ran once\n{printed}"
    );

    let spans = receiver
        .wait_for(SPANS_TIMEOUT, |spans| {
            process_spans(spans, "conveyor-lambda", &created.name).len() >= 2
                && sent
                    .iter()
                    .all(|(service, ids)| ids.iter().all(|id| send_span(spans, service, id).is_some()))
        })
        .await
        .unwrap_or_else(|error| panic!("{error}\nthe runner printed:\n{printed}"));
    for (service, ids) in &sent {
        assert_each_run_follows_its_send(&spans, service, ids, "conveyor-lambda", &created.name);
    }
}
