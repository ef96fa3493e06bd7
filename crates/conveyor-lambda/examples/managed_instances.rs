//! Lambda Managed Instances figures, not pass/fail: records a second of *one* function process under
//! `conveyor lambda run` with `AWS_LAMBDA_MAX_CONCURRENCY=1` and `=4` (`--concurrency`, one execution
//! environment), and the process's peak resident memory (`VmHWM` when the runner stops it).
//!
//! ```text
//! cargo build -p conveyor-cli --bin conveyor
//! cargo build -p conveyor-lambda --example probe_function
//! cargo run -p conveyor-lambda --example managed_instances
//! ```
//!
//! (`--release` on all three for release figures.) Each run: a new queue holding `MANAGED_BENCH_JOBS`
//! (1,000) probe jobs, idempotency on one DynamoDB Local table, batches of 10, no batching window; the
//! rate is the runner's own (records from the first invocation's start to the last one's settlement).
//! Two kinds of job: no-op (the framework's and the emulators' own cost) and 50 ms of waiting each (an
//! I/O-bound handler, what several invocations in one process are for); without an idempotency store,
//! then with DynamoDB Local's (whose writes are serialized: its ceiling is the store's, not the process's).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary: failing loudly is the point

use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use conveyor_testing::QueueSpec;
use conveyor_testing::localstack::{
    self, create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client,
};
use serde_json::Value;

/// How long one runner may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// A binary of this example's profile (`target/<profile>/<relative>`), or how to build it.
fn binary(relative: &str, build: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = profile.join(relative);
    assert!(
        path.is_file(),
        "{} is missing: build it with `{build}`",
        path.display()
    );
    path
}

/// Sends `count` probe jobs of `work_ms` each, in batches of ten.
async fn fill(client: &aws_sdk_sqs::Client, url: &str, count: usize, work_ms: u64) {
    let probe = MessageAttributeValue::builder()
        .data_type("String")
        .string_value("probe")
        .build()
        .unwrap();
    for start in (0..count).step_by(10) {
        let entries = (start..(start + 10).min(count)).map(|n| {
            SendMessageBatchRequestEntry::builder()
                .id(n.to_string())
                .message_body(format!(r#"{{"sent_us":0,"work_ms":{work_ms}}}"#))
                .message_attributes("conveyor.type", probe.clone())
                .build()
                .unwrap()
        });
        let sent = client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .unwrap();
        assert!(sent.failed.is_empty(), "{:?}", sent.failed);
    }
}

#[tokio::main]
async fn main() {
    ensure_local_aws().await.unwrap();
    let jobs: usize = std::env::var("MANAGED_BENCH_JOBS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1_000);
    let conveyor = binary("conveyor", "cargo build -p conveyor-cli --bin conveyor");
    let function = binary(
        "examples/probe_function",
        "cargo build -p conveyor-lambda --example probe_function",
    );
    let sqs = sqs_client().await;
    let table = create_table(&dynamodb_client().await, "lmi-bench").await.unwrap();
    let rows = [
        (false, 0, 1usize),
        (false, 0, 4),
        (false, 50, 1),
        (false, 50, 4),
        (true, 50, 1),
        (true, 50, 4),
    ];
    for (store, work_ms, concurrency) in rows {
        let name = format!("lmi-bench-{work_ms}-{concurrency}");
        let queue = create_queue(&sqs, &QueueSpec::standard(&name).visibility_timeout_secs(60))
            .await
            .unwrap();
        fill(&sqs, &queue.url, jobs, work_ms).await;
        let log = std::env::temp_dir().join(format!("{}.log", localstack::unique_name(&name)));
        let mut command = tokio::process::Command::new(&conveyor);
        command
            .args([
                "--output",
                "json",
                "lambda",
                "run",
                "--until-empty",
                "--queue-url",
                &queue.url,
            ])
            .arg("--bootstrap")
            .arg(&function)
            .args(["--batch-size", "10"])
            .args(["--maximum-concurrency", &concurrency.to_string()])
            .args(["--concurrency", &concurrency.to_string()])
            .arg("--env")
            .arg(format!("CONVEYOR_PROBE_LOG={}", log.display()))
            .arg("--env")
            .arg("RUST_LOG=warn")
            .envs(localstack::aws_env())
            .kill_on_drop(true);
        if store {
            command
                .arg("--env")
                .arg(format!("CONVEYOR_IDEMPOTENCY_TABLE={table}"));
        }
        let run = command.output();
        let output = tokio::time::timeout(RUN_TIMEOUT, run).await.unwrap().unwrap();
        let _ = std::fs::remove_file(&log);
        // `MANAGED_BENCH_VERBOSE=1`: the runner's line per batch (and the function's warnings).
        if std::env::var_os("MANAGED_BENCH_VERBOSE").is_some() {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
        }
        assert!(output.status.success(), "conveyor lambda run failed: {output:?}");
        let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
        let records = summary["records"].as_u64().unwrap();
        let busy = summary["busy_ms"].as_f64().unwrap() / 1000.0;
        let peak = summary["bootstrap_peak_rss_kib"].as_u64().map_or_else(
            || "unknown".to_owned(),
            |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
        );
        println!(
            "figure: one process, AWS_LAMBDA_MAX_CONCURRENCY={concurrency}, jobs of {work_ms} ms, {}: {records} records in \
             {busy:.2} s = {:.0} records/s ({} batches, at most {} invocations at once); bootstrap peak RSS {peak}",
            if store {
                "DynamoDB Local idempotency"
            } else {
                "no idempotency store"
            },
            records as f64 / busy,
            summary["batches"],
            summary["peak_concurrency"],
        );
    }
}
