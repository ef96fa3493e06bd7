//! The example `bootstrap` under cargo-lambda, the usual local loop for Rust Lambda functions.
//!
//! `cargo lambda watch --only-lambda-apis` serves the Lambda Runtime API without building anything, and
//! `cargo lambda invoke` sends it an event; the function is the example's debug `bootstrap`, against
//! LocalStack and DynamoDB Local. cargo-lambda's Runtime API sends `Lambda-Runtime-Deadline-Ms: 600000`
//! (ten minutes as a duration, not an epoch time): the adapter must say so and run under its fallback
//! budget, not report every record as "not started". cargo-lambda comes from PyPI, pinned
//! (`localstack/install-cargo-lambda.sh`, on first use).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_lambda_events::sqs::SqsEvent;
use conveyor_core::port::Queue as _;
use conveyor_e2e::{app_env, binaries, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, repo_root};
use conveyor_testing::{free_port, wait_until};
use serde_json::Value;
use tokio::process::Command;

/// The pinned cargo-lambda binary, installed on first use.
fn cargo_lambda() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("localstack").join("install-cargo-lambda.sh");
    let output = std::process::Command::new(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "localstack/install-cargo-lambda.sh failed (needs python3 with venv and PyPI); run it by hand:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_bootstrap_answers_cargo_lambdas_invoke_with_the_right_partial_batch_response()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let cargo_lambda = cargo_lambda()?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "e2e-cargo-lambda").await?;
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::standard("e2e-cargo-lambda").visibility_timeout_secs(120),
    )
    .await?;
    let arn = localstack::queue_arn(&sqs, &queue.url).await?;

    // Two real messages (real receipt handles): a welcome email, and a job type no handler knows,
    // which the adapter retries (listed in batchItemFailures).
    let producer = Producer::new(sqs.clone(), &queue.url);
    let welcome = WelcomeEmail {
        user_id: 7,
        email: "user7@example.com".to_owned(),
        name: "user 7".to_owned(),
    };
    let key = welcome.idempotency_key();
    let good = producer
        .send(&NewJob::new("welcome_email", welcome).key(key))
        .await?;
    let unknown = producer
        .send(&NewJob::new("no_such_job", serde_json::json!({ "x": 1 })))
        .await?;
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let mut received = Vec::new();
    wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        if let Ok(more) = sqs_queue.receive(10, Duration::from_secs(1)).await {
            received.extend(more);
        }
        received.len() >= 2
    })
    .await?;
    let mut event = SqsEvent::default();
    event.records = received
        .iter()
        .map(|message| conveyor_lambda::to_record(message, &arn))
        .collect();
    let event_file = std::env::temp_dir().join(format!("{}.json", localstack::unique_name("sqs-event")));
    std::fs::write(&event_file, serde_json::to_vec(&event)?)?;

    // The Runtime API, then the function pointed at it.
    let port = free_port()?;
    let mut watch = Command::new(&cargo_lambda)
        .args([
            "lambda",
            "watch",
            "--only-lambda-apis",
            "--invoke-port",
            &port.to_string(),
        ])
        .current_dir(repo_root().join("examples"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting cargo lambda watch")?;
    wait_until(Duration::from_secs(60), Duration::from_millis(200), async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
    })
    .await
    .context("cargo lambda watch did not open its port")?;
    let outbox = outbox_path("e2e-cargo-lambda");
    let mut bootstrap = Command::new(binaries().path("bootstrap")?)
        .envs(app_env(&table, &outbox))
        .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt"))
        .env("AWS_LAMBDA_FUNCTION_NAME", "_")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "4096")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the example bootstrap")?;

    let invoked = Command::new(&cargo_lambda)
        .args([
            "lambda",
            "invoke",
            "_",
            "--invoke-port",
            &port.to_string(),
            "--output-format",
            "json",
        ])
        .arg("--data-file")
        .arg(&event_file)
        .current_dir(repo_root().join("examples"))
        .stdin(Stdio::null())
        .output();
    let invoked = tokio::time::timeout(Duration::from_secs(120), invoked)
        .await
        .context("cargo lambda invoke did not answer in 120 s")??;
    let _ = bootstrap.start_kill();
    let _ = watch.start_kill();
    let _ = std::fs::remove_file(&event_file);
    let stdout = String::from_utf8_lossy(&invoked.stdout);
    assert!(
        invoked.status.success(),
        "cargo lambda invoke failed: {stdout}{}",
        String::from_utf8_lossy(&invoked.stderr)
    );
    let response: Value =
        serde_json::from_str(stdout.trim()).with_context(|| format!("not JSON: {stdout}"))?;
    let listed: Vec<&str> = response["batchItemFailures"]
        .as_array()
        .with_context(|| format!("no batchItemFailures in {response}"))?
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str())
        .collect();
    assert_eq!(
        listed,
        vec![unknown.as_str()],
        "only the unknown job type is listed (the welcome email {good} ran): {response}"
    );
    let emails = conveyor_e2e::emails_per_user(&outbox)?;
    assert_eq!(emails.get(&7), Some(&1), "the welcome email ran once: {emails:?}");
    Ok(())
}
