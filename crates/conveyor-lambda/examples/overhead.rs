//! The Lambda adapter's overhead: figures, not pass/fail.
//!
//! ```text
//! cargo run --release -p conveyor-lambda --example overhead
//! ```
//!
//! 1. Per batch of 10 no-op messages on `MemoryQueue`, beyond the handler: JSON → `SqsEvent` → records →
//!    pipeline → `SqsBatchResponse` and the EMF line (many iterations, µs per batch). Target < 1 ms.
//! 2. Start-up of the release `bootstrap` (examples/src/bin/bootstrap.rs): process start to its first
//!    `GET /runtime/invocation/next`, against a minimal Runtime API listener. Target < 50 ms.
//! 3. The stripped release `bootstrap`'s size.
//!
//! Parts 2 and 3 build the release bootstrap first when it is missing
//! (`cargo build --release -p conveyor-examples --bin bootstrap`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary: failing loudly is the point

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_core::{
    port::Queue,
    {Context, Handler, HandlerError, Pipeline, Router},
};
use conveyor_lambda::LambdaConfig;
use conveyor_lambda::{BatchProcessor, FixedQueue, SqsEvent, parse_event};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::time::Instant;

const BATCH: usize = 10;
const ITERATIONS: usize = 20_000;
const WARMUP: usize = 1_000;
const STARTS: usize = 15;

struct Noop;

impl Handler for Noop {
    type Job = IgnoredAny;
    type Output = ();
    const JOB_TYPE: &'static str = "noop";

    async fn handle(&self, _job: IgnoredAny, _ctx: Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn event_json(batch: usize) -> Value {
    let fixture = include_str!("../tests/fixtures/sqs-standard-event.json");
    let template = serde_json::from_str::<Value>(fixture).unwrap()["Records"][0].clone();
    let records: Vec<Value> = (0..batch)
        .map(|index| {
            let mut record = template.clone();
            record["messageId"] = json!(format!("00000000-0000-4000-8000-{index:012}"));
            record["body"] = json!(format!("{{\"n\":{index}}}"));
            record
        })
        .collect();
    json!({ "Records": records })
}

/// `event` as the mapping hands it over just after its receive: its records' first receive is now, so
/// the adapter makes no visibility call for them (`src/cover.rs`), as with a prompt mapping. (The
/// fixture's 2019 time would make each record look held past its visibility, and `MemoryQueue`, which
/// never handed these receipts out, would refuse their renewal: not run.) Done per batch, outside the
/// timed part.
fn received_now(mut event: SqsEvent) -> SqsEvent {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
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

fn processor(store: Option<Arc<MemoryIdempotencyStore>>) -> BatchProcessor {
    let mut pipeline = Pipeline::new(Router::single(Noop));
    if let Some(store) = store {
        pipeline = pipeline.with_store(store);
    }
    let queue: Arc<dyn Queue> = Arc::new(MemoryQueue::standard("my-queue"));
    BatchProcessor::new(pipeline, LambdaConfig::default(), Arc::new(FixedQueue(queue))).without_metrics()
}

/// Mean µs per batch of `run`, after a warm-up.
async fn measure<F, Fut>(mut run: F) -> f64
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    for iteration in 0..WARMUP {
        run(iteration).await;
    }
    let mut total = Duration::ZERO;
    for iteration in WARMUP..WARMUP + ITERATIONS {
        total += run(iteration).await;
    }
    total.as_secs_f64() * 1e6 / ITERATIONS as f64
}

async fn batch_overhead() {
    let event: SqsEvent = parse_event(event_json(BATCH)).unwrap();
    let plain = processor(None);
    let full = measure(|_| {
        let plain = &plain;
        let bytes = serde_json::to_vec(&received_now(event.clone())).unwrap();
        async move {
            let started = Instant::now();
            let payload: Value = serde_json::from_slice(&bytes).unwrap();
            let event = parse_event(payload).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let report = plain.process_batch_report(event, deadline).await;
            let lines: usize = report
                .metrics
                .iter()
                .map(|m| {
                    m.to_emf_lines(SystemTime::now())
                        .iter()
                        .map(String::len)
                        .sum::<usize>()
                })
                .sum();
            let response = serde_json::to_vec(&report.response).unwrap();
            assert!(lines > 0 && report.response.batch_item_failures.is_empty() && !response.is_empty());
            started.elapsed()
        }
    })
    .await;

    let pipeline_only = measure(|_| {
        let plain = &plain;
        let event = received_now(event.clone());
        async move {
            let started = Instant::now();
            let report = plain
                .process_batch_report(event, Instant::now() + Duration::from_secs(10))
                .await;
            assert!(report.response.batch_item_failures.is_empty());
            started.elapsed()
        }
    })
    .await;

    let store = Arc::new(MemoryIdempotencyStore::new());
    let idempotent = processor(Some(Arc::clone(&store)));
    let with_store = measure(|iteration| {
        let idempotent = &idempotent;
        let mut event = received_now(event.clone());
        for (index, record) in event.records.iter_mut().enumerate() {
            record.message_id = Some(format!("{iteration}-{index}"));
        }
        async move {
            let started = Instant::now();
            let report = idempotent
                .process_batch_report(event, Instant::now() + Duration::from_secs(10))
                .await;
            assert!(report.response.batch_item_failures.is_empty());
            started.elapsed()
        }
    })
    .await;

    println!("adapter overhead per batch of {BATCH} no-op messages ({ITERATIONS} batches, MemoryQueue):");
    println!("  JSON bytes -> SqsEvent -> pipeline -> SqsBatchResponse + EMF line   {full:8.1} µs/batch");
    println!(
        "  SqsEvent -> pipeline -> SqsBatchResponse (no JSON)                   {pipeline_only:8.1} µs/batch"
    );
    println!(
        "  the same with idempotency on MemoryIdempotencyStore (claim+complete) {with_store:8.1} µs/batch"
    );
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The release bootstrap, built when missing.
fn release_bootstrap() -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let path = target.join("release").join("bootstrap");
    if !path.is_file() {
        println!(
            "building the release bootstrap (cargo build --release -p conveyor-examples --bin bootstrap)..."
        );
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = std::process::Command::new(cargo);
        command
            .args([
                "build",
                "--release",
                "-p",
                "conveyor-examples",
                "--bin",
                "bootstrap",
            ])
            .current_dir(workspace_root());
        // Not this package's CARGO_PKG_* / CARGO_MANIFEST_DIR: build scripts watch them (rebuilds).
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let package_variable = [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
            ]
            .iter()
            .any(|prefix| name.starts_with(prefix));
            if package_variable {
                command.env_remove(name.as_ref());
            }
        }
        let status = command.status().unwrap();
        assert!(status.success(), "building the bootstrap failed");
    }
    path
}

/// Process start to the first `GET .../invocation/next`, once.
async fn start_once(bootstrap: &Path, extra_env: &[(&str, &str)]) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut command = tokio::process::Command::new(bootstrap);
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "overhead")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566")
        .env("WEBHOOK_SIGNING_SECRET", "overhead")
        .env(
            "CONVEYOR_DEMO_OUTBOX",
            std::env::temp_dir().join("overhead-outbox.jsonl"),
        )
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (name, value) in extra_env {
        command.env(name, value);
    }
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the bootstrap connected within 10 s")
        .unwrap();
    let mut lines = BufReader::new(stream).lines();
    let elapsed = loop {
        let line = lines.next_line().await.unwrap().expect("a request");
        if line.starts_with("GET ") && line.contains("/runtime/invocation/next") {
            break started.elapsed();
        }
    };
    child.kill().await.unwrap();
    elapsed
}

async fn start_up(bootstrap: &Path) {
    for (label, env) in [
        ("without idempotency", &[][..]),
        (
            "with CONVEYOR_IDEMPOTENCY_TABLE (DynamoDB client built)",
            &[
                ("CONVEYOR_IDEMPOTENCY_TABLE", "overhead"),
                ("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000"),
            ][..],
        ),
    ] {
        let mut samples = Vec::with_capacity(STARTS);
        for _ in 0..STARTS {
            samples.push(start_once(bootstrap, env).await);
        }
        samples.sort_unstable();
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        println!(
            "bootstrap start-up to first /next, {label}: median {:.1} ms, min {:.1} ms, max {:.1} ms ({STARTS} starts)",
            ms(samples[STARTS / 2]),
            ms(samples[0]),
            ms(samples[STARTS - 1])
        );
    }
}

#[tokio::main]
async fn main() {
    if cfg!(debug_assertions) {
        println!("note: a debug build; run with --release for the figures");
    }
    batch_overhead().await;
    let bootstrap = release_bootstrap();
    start_up(&bootstrap).await;
    let size = std::fs::metadata(&bootstrap).unwrap().len();
    println!(
        "release bootstrap (strip = true, thin LTO), host target: {:.1} MiB ({size} bytes), {}",
        size as f64 / (1024.0 * 1024.0),
        bootstrap.display()
    );
}
