//! The example `bootstrap` under cargo-lambda, the usual local loop for Rust Lambda functions.
//!
//! `cargo lambda watch --only-lambda-apis` serves the Lambda Runtime API without building anything, and
//! `cargo lambda invoke` sends it an event; the function is the example's debug `bootstrap`, against
//! LocalStack and DynamoDB Local. cargo-lambda's Runtime API sends `Lambda-Runtime-Deadline-Ms: 600000`
//! (ten minutes as a duration, not an epoch time): the adapter must say so and run under its fallback
//! budget, not report every record as "not started". cargo-lambda comes from PyPI, pinned
//! (`localstack/install-cargo-lambda.sh`, on first use).
//!
//! Two events: one built from real messages (real receipt handles), and one written by hand the way
//! users write them, in the shape of `aws_lambda_events`' fixture `example-sqs-event.json` (receipt
//! handles SQS never issued, a first receive years ago; `crates/conveyor-lambda/tests/fixtures/
//! sqs-hand-written-event.json`, whose README says where it comes from).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_lambda_events::sqs::SqsEvent;
use conveyor_core::port::Queue as _;
use conveyor_e2e::{app_env, binaries, log_lines, log_path, message_of, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, repo_root};
use conveyor_testing::{free_port, wait_until};
use serde_json::Value;
use tokio::process::{Child, Command};

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

/// `cargo lambda watch --only-lambda-apis` and the example bootstrap pointed at it; both are killed
/// when this drops.
struct LocalLambda {
    cargo_lambda: PathBuf,
    port: u16,
    _watch: Child,
    _bootstrap: Child,
}

impl LocalLambda {
    /// Starts both; the bootstrap uses `table` and `outbox`, and writes its JSON log lines to `log`
    /// when given (else its log is dropped and its errors go to the test's stderr).
    async fn start(table: &str, outbox: &Path, log: Option<&Path>) -> anyhow::Result<Self> {
        let cargo_lambda = cargo_lambda()?;
        let port = free_port()?;
        let watch = Command::new(&cargo_lambda)
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
        let (stdout, stderr) = match log {
            Some(path) => {
                let file =
                    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
                (Stdio::from(file.try_clone()?), Stdio::from(file))
            }
            None => (Stdio::null(), Stdio::inherit()),
        };
        let bootstrap = Command::new(binaries().path("bootstrap")?)
            .envs(app_env(table, outbox))
            .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt"))
            .env("AWS_LAMBDA_FUNCTION_NAME", "_")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "4096")
            .env("AWS_LAMBDA_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("starting the example bootstrap")?;
        Ok(Self {
            cargo_lambda,
            port,
            _watch: watch,
            _bootstrap: bootstrap,
        })
    }

    /// `cargo lambda invoke` with the event in `event_file`: the message ids the partial batch
    /// response lists.
    async fn invoke(&self, event_file: &Path) -> anyhow::Result<Vec<String>> {
        let invoked = Command::new(&self.cargo_lambda)
            .args([
                "lambda",
                "invoke",
                "_",
                "--invoke-port",
                &self.port.to_string(),
                "--output-format",
                "json",
            ])
            .arg("--data-file")
            .arg(event_file)
            .current_dir(repo_root().join("examples"))
            .stdin(Stdio::null())
            .output();
        let invoked = tokio::time::timeout(Duration::from_secs(120), invoked)
            .await
            .context("cargo lambda invoke did not answer in 120 s")??;
        let stdout = String::from_utf8_lossy(&invoked.stdout);
        if !invoked.status.success() {
            bail!(
                "cargo lambda invoke failed: {stdout}{}",
                String::from_utf8_lossy(&invoked.stderr)
            );
        }
        let response: Value =
            serde_json::from_str(stdout.trim()).with_context(|| format!("not JSON: {stdout}"))?;
        let listed = response["batchItemFailures"]
            .as_array()
            .with_context(|| format!("no batchItemFailures in {response}"))?
            .iter()
            .filter_map(|failure| failure["itemIdentifier"].as_str().map(str::to_owned))
            .collect();
        Ok(listed)
    }
}

/// Writes `event` to a fresh file under the system's temp folder.
fn event_file(event: &impl serde::Serialize) -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("{}.json", localstack::unique_name("sqs-event")));
    std::fs::write(&path, serde_json::to_vec(event)?)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_bootstrap_answers_cargo_lambdas_invoke_with_the_right_partial_batch_response()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
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
    let event_file = event_file(&event)?;

    let outbox = outbox_path("e2e-cargo-lambda");
    let lambda = LocalLambda::start(&table, &outbox, None).await?;
    let listed = lambda.invoke(&event_file).await;
    drop(lambda);
    let _ = std::fs::remove_file(&event_file);
    assert_eq!(
        listed?,
        vec![unknown.clone()],
        "only the unknown job type is listed (the welcome email {good} ran)"
    );
    let emails = conveyor_e2e::emails_per_user(&outbox)?;
    assert_eq!(emails.get(&7), Some(&1), "the welcome email ran once: {emails:?}");
    Ok(())
}

/// The message a bootstrap logs once per invocation whose receipt handles SQS never issued.
const NOT_ISSUED_WARNING: &str = "SQS says it never issued the receipt handles";

/// A hand-written event (the fixture's made-up receipt handles, a first receive in 2018, pointed at
/// the test's queue as a user points it at theirs): the invocation is not Lambda's own, so the
/// bootstrap runs its records and answers as Lambda would, twice in a row: the welcome email (done
/// once, then a duplicate of its completed claim) is not listed, the webhook to a closed port fails
/// and is listed both times. One warning per invocation says why. Before, the visibility cover took
/// SQS's `ReceiptHandleIsInvalid` for "no longer ours": nothing ran and both were listed, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_event_gets_the_right_partial_batch_response_twice_in_a_row() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table =
        localstack::create_table(&localstack::dynamodb_client().await, "e2e-cargo-lambda-hand").await?;
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::standard("e2e-cargo-lambda-hand").visibility_timeout_secs(120),
    )
    .await?;
    let arn = localstack::queue_arn(&sqs, &queue.url).await?;
    let fixture = repo_root().join("crates/conveyor-lambda/tests/fixtures/sqs-hand-written-event.json");
    let mut event: Value = serde_json::from_str(
        &std::fs::read_to_string(&fixture).with_context(|| format!("reading {}", fixture.display()))?,
    )?;
    let region = arn.split(':').nth(3).unwrap_or("us-east-1").to_owned();
    for record in event["Records"]
        .as_array_mut()
        .context("the fixture has no Records")?
    {
        record["eventSourceARN"] = Value::from(arn.as_str());
        record["awsRegion"] = Value::from(region.as_str());
    }
    let event_file = event_file(&event)?;

    let outbox = outbox_path("e2e-cargo-lambda-hand");
    let log = log_path("e2e-cargo-lambda-hand");
    let lambda = LocalLambda::start(&table, &outbox, Some(&log)).await?;
    let first = lambda.invoke(&event_file).await;
    let second = lambda.invoke(&event_file).await;
    drop(lambda);
    let _ = std::fs::remove_file(&event_file);
    let lines = log_lines(&log)?;
    let messages: Vec<&str> = lines
        .iter()
        .map(message_of)
        .filter(|text| !text.is_empty())
        .collect();
    assert_eq!(
        first?,
        vec!["MessageID_2"],
        "first invocation; the bootstrap logged {messages:#?}"
    );
    assert_eq!(
        second?,
        vec!["MessageID_2"],
        "second invocation; the bootstrap logged {messages:#?}"
    );
    let emails = conveyor_e2e::emails_per_user(&outbox)?;
    assert_eq!(
        emails.get(&51),
        Some(&1),
        "the welcome email ran once: {emails:?}"
    );
    let warnings = messages
        .iter()
        .filter(|text| text.contains(NOT_ISSUED_WARNING))
        .count();
    assert_eq!(warnings, 2, "one warning per invocation: {messages:#?}");
    assert!(
        !messages.iter().any(|text| text.contains("no longer ours")),
        "a record was taken as no longer ours: {messages:#?}"
    );
    let _ = std::fs::remove_file(&log);
    Ok(())
}
