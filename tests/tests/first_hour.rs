//! Issue 55, "the first hour": the README's `main`s, copied into a crate on the facade (features
//! `worker`/`lambda` and `dynamodb`, no `.with_store(..)`: src/bin/first_hour_*.rs), with
//! `CONVEYOR_IDEMPOTENCY_TABLE` set, run a duplicated key once on LocalStack + DynamoDB Local, in both
//! runtimes; the worker takes a queue *name* in `CONVEYOR_QUEUE_URL`; each start line names the table.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{INHERITED, lambda_run_until_empty_with, log_lines, log_path, message_of};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;

/// A job of the test binaries' handler, with a producer key: every copy is the same job.
fn job(n: u64) -> NewJob<serde_json::Value> {
    NewJob::new("first_hour", serde_json::json!({ "n": n })).key(format!("first-hour:{n}"))
}

/// A fresh file for the handler's effects.
fn effects_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.jsonl", localstack::unique_name(name)))
}

/// How many runs the handler recorded.
fn runs(effects: &Path) -> usize {
    std::fs::read_to_string(effects).map_or(0, |text| text.lines().count())
}

fn queue_spec(prefix: &str) -> QueueSpec {
    QueueSpec::standard(prefix)
        .visibility_timeout_secs(10)
        .max_receive_count(5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_worker_with_the_table_variable_runs_a_duplicate_once() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "first-hour-w").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("first-hour-w")).await?;
    let effects = effects_path("first-hour-w");
    let log = log_path("first-hour-w");
    let producer = Producer::new(sqs.clone(), &queue.url);
    producer.send(&job(1)).await?;
    producer.send(&job(1)).await?;

    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_first_hour_worker"));
    for name in INHERITED {
        worker.env_remove(name);
    }
    let mut worker = worker
        .envs(localstack::aws_env())
        // A queue name, as docs/configuration.md allows: resolved with GetQueueUrl.
        .env("CONVEYOR_QUEUE_URL", &queue.name)
        .env("CONVEYOR_IDEMPOTENCY_TABLE", &table)
        .env("CONVEYOR_LISTEN_ADDR", "off")
        .env("CONVEYOR_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("FIRST_HOUR_EFFECTS", &effects)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .context("starting first_hour_worker")?;
    let port = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let done = wait_until(Duration::from_secs(90), Duration::from_millis(200), async || {
        runs(&effects) >= 1 && queue_is_empty(&port).await
    })
    .await;
    let stopped = terminate(&mut worker).await;
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    done.with_context(|| format!("the worker did not empty the queue; its log:\n{logged}"))?;
    stopped?;
    assert_eq!(
        runs(&effects),
        1,
        "the key ran more than once: idempotency was off; the worker's log:\n{logged}"
    );
    let lines = log_lines(&log)?;
    let start = lines
        .iter()
        .find(|line| message_of(line) == "worker started")
        .with_context(|| format!("no start line in:\n{logged}"))?;
    assert_eq!(
        start["fields"]["idempotency"].as_str(),
        Some(format!("table {table}").as_str()),
        "{start}"
    );
    for field in [
        "tracking",
        "timers_relay",
        "schedules",
        "outbox_relay",
        "flows_sweep",
        "tenants",
        "tracing",
    ] {
        assert!(start["fields"][field].is_string(), "{field} missing: {start}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_lambda_function_with_the_table_variable_runs_a_duplicate_once() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "first-hour-l").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("first-hour-l")).await?;
    let effects = effects_path("first-hour-l");
    let mut env: Vec<(String, String)> = localstack::aws_env()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    env.push(("CONVEYOR_IDEMPOTENCY_TABLE".to_owned(), table.clone()));
    env.push(("FIRST_HOUR_EFFECTS".to_owned(), effects.display().to_string()));
    env.push(("RUST_LOG".to_owned(), "info".to_owned()));
    let bootstrap = Path::new(env!("CARGO_BIN_EXE_first_hour_bootstrap"));
    let producer = Producer::new(sqs.clone(), &queue.url);

    let mut printed = String::new();
    for round in 0..2 {
        producer.send(&job(2)).await?;
        let output =
            lambda_run_until_empty_with(bootstrap, &queue.url, &env, Duration::from_secs(120)).await?;
        printed.push_str(&String::from_utf8_lossy(&output.stdout));
        printed.push_str(&String::from_utf8_lossy(&output.stderr));
        assert_eq!(
            runs(&effects),
            1,
            "round {round}: the key ran {} times: idempotency was off; the run printed:\n{printed}",
            runs(&effects)
        );
    }
    let start = printed
        .lines()
        .find(|line| line.contains("conveyor function started"))
        .with_context(|| format!("no start line in:\n{printed}"))?;
    assert!(
        start.contains(&format!("table {table}")) && start.contains(&queue.name),
        "{start}"
    );
    Ok(())
}
