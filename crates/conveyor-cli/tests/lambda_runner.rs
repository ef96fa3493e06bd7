//! End to end: `conveyor lambda run` with the example application's real `bootstrap` binary, against
//! LocalStack (SQS) and DynamoDB Local, as an SQS event source mapping would run it on AWS.
//!
//! The bootstrap lives in another package (`conveyor-examples`), so `bootstrap()` builds it with
//! `cargo build -p conveyor-examples --bin bootstrap` once per test process (a no-op when it is up to
//! date; `make test` builds it before the tests anyway) and finds it next to this package's `conveyor`
//! binary (`CARGO_BIN_EXE_conveyor`), which is where cargo puts every binary of the workspace's profile.
//!
//! `run_lambda` and `send_job` are meant to be copied (or moved into conveyor-testing) by the
//! cross-runtime test: worker then Lambda on one idempotency table.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use conveyor_testing::localstack::{
    aws_env, create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client, unique_name,
};
use conveyor_testing::{QueueSpec, TestQueue};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

/// How long one runner may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

static BOOTSTRAP: OnceCell<PathBuf> = OnceCell::const_new();

/// Variables cargo sets for the package under test, not meant for a nested build.
const PACKAGE_VARIABLES: &[&str] = &[
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "CARGO_CFG_",
    "OUT_DIR",
];

/// The example application's bootstrap, built for this profile.
async fn bootstrap() -> PathBuf {
    BOOTSTRAP
        .get_or_init(|| async {
            let conveyor = PathBuf::from(env!("CARGO_BIN_EXE_conveyor"));
            let profile_dir = conveyor.parent().unwrap().to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let mut command = tokio::process::Command::new(cargo);
            command
                .args(["build", "-p", "conveyor-examples", "--bin", "bootstrap"])
                .current_dir(conveyor_testing::localstack::repo_root());
            if profile_dir.file_name().is_some_and(|name| name == "release") {
                command.arg("--release");
            }
            // Cargo gives this test process its own package's variables (CARGO_MANIFEST_DIR,
            // CARGO_PKG_NAME, ...); build scripts (ring's) watch them, so passing them on would rebuild
            // half the dependency tree here and again in the next plain build.
            for (name, _) in std::env::vars_os() {
                let name = name.to_string_lossy();
                if PACKAGE_VARIABLES.iter().any(|prefix| name.starts_with(prefix)) {
                    command.env_remove(name.as_ref());
                }
            }
            let status = command.status().await.expect("running cargo");
            assert!(
                status.success(),
                "cargo build -p conveyor-examples --bin bootstrap failed"
            );
            let path = profile_dir.join("bootstrap");
            assert!(path.is_file(), "{} was not built", path.display());
            path
        })
        .await
        .clone()
}

/// What one `conveyor lambda run` printed.
struct RunOutput {
    stdout: String,
    stderr: String,
}

impl RunOutput {
    fn summary(&self) -> &str {
        self.stdout
            .lines()
            .find(|line| line.starts_with("summary:"))
            .unwrap_or_else(|| panic!("no summary line:\n{}\n{}", self.stdout, self.stderr))
    }
}

/// Runs `conveyor lambda run --until-empty` on `queue_url` with the bootstrap and `env` for the function.
async fn run_lambda(
    queue_url: &str,
    extra_args: &[&str],
    env: &[(&str, String)],
) -> anyhow::Result<RunOutput> {
    run_lambda_with(&bootstrap().await, queue_url, extra_args, env).await
}

/// `run_lambda` with another bootstrap than the example application's.
async fn run_lambda_with(
    bootstrap: &Path,
    queue_url: &str,
    extra_args: &[&str],
    env: &[(&str, String)],
) -> anyhow::Result<RunOutput> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
    command
        .args(["lambda", "run", "--until-empty", "--queue-url", queue_url])
        .arg("--bootstrap")
        .arg(bootstrap)
        .args(extra_args)
        .envs(aws_env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.arg("--env").arg(format!("{name}={value}"));
    }
    let child = command.spawn().context("starting conveyor")?;
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .with_context(|| format!("conveyor lambda run did not finish within {RUN_TIMEOUT:?}"))??;
    let run = RunOutput {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    if !output.status.success() {
        bail!(
            "conveyor lambda run failed ({}):\n{}\n{}",
            output.status,
            run.stdout,
            run.stderr
        );
    }
    Ok(run)
}

/// Sends a job the way Conveyor's producer does: JSON body, `conveyor.type`, optional `conveyor.key`.
async fn send_job(
    client: &aws_sdk_sqs::Client,
    queue: &TestQueue,
    job_type: &str,
    body: Value,
    key: Option<&str>,
    group: Option<&str>,
) -> String {
    let string = |value: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .unwrap()
    };
    let mut request = client
        .send_message()
        .queue_url(&queue.url)
        .message_body(body.to_string())
        .message_attributes("conveyor.type", string(job_type));
    if let Some(key) = key {
        request = request.message_attributes("conveyor.key", string(key));
    }
    if let Some(group) = group {
        request = request
            .message_group_id(group)
            .message_deduplication_id(uuid_like());
    }
    request.send().await.unwrap().message_id.unwrap()
}

fn uuid_like() -> String {
    unique_name("d")
}

fn welcome(user_id: u64, email: &str) -> Value {
    json!({"user_id": user_id, "email": email, "name": format!("User {user_id}")})
}

fn outbox_path(name: &str) -> PathBuf {
    let dir = conveyor_testing::localstack::repo_root()
        .join("target")
        .join("test-outboxes");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}.jsonl", unique_name(name)))
}

/// The outbox lines (the example application's `Outbox` format: one JSON object per line).
fn effects(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => panic!("reading {}: {error}", path.display()),
    }
}

fn emailed_users(effects: &[Value]) -> Vec<u64> {
    effects
        .iter()
        .filter(|effect| effect["effect"] == "email_sent")
        .map(|effect| effect["to_user"].as_u64().unwrap())
        .collect()
}

/// Every message in a queue (the DLQ), received with a short poll loop until one comes back empty.
async fn drain(client: &aws_sdk_sqs::Client, url: &str) -> Vec<aws_sdk_sqs::types::Message> {
    let mut all = Vec::new();
    loop {
        let output = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(60)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        let messages = output.messages.unwrap_or_default();
        if messages.is_empty() {
            return all;
        }
        all.extend(messages);
    }
}

async fn depth(client: &aws_sdk_sqs::Client, url: &str) -> u64 {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap();
    output
        .attributes
        .unwrap_or_default()
        .values()
        .map(|value| value.parse::<u64>().unwrap())
        .sum()
}

fn app_env(outbox: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("WEBHOOK_SIGNING_SECRET", "e2e-secret".to_owned()),
        ("CONVEYOR_DEMO_OUTBOX", outbox.display().to_string()),
    ]
}

#[tokio::test]
async fn partial_failures_backoff_and_dead_letters() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::standard("lambda-partial")
        .visibility_timeout_secs(20)
        .max_receive_count(2);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("partial");

    for user in 1..=3 {
        send_job(
            &client,
            &queue,
            "welcome_email",
            welcome(user, "user@example.com"),
            None,
            None,
        )
        .await;
    }
    // Permanent: straight to the DLQ with the failure recorded, on the first delivery.
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(99, "no-address"),
        None,
        None,
    )
    .await;
    // Retryable (connection refused): backoff, then the DLQ with its last error on the second (last
    // allowed) attempt.
    let webhook =
        json!({"delivery_id": "d-1", "url": "http://127.0.0.1:1/hook", "event": "e", "payload": {}});
    send_job(&client, &queue, "webhook", webhook, None, None).await;
    // Runs into the invocation deadline (3 s - 500 ms margin): retried, then dead-lettered the same way.
    let report = json!({"report_id": "r-1", "sections": 8, "section_millis": 500});
    send_job(&client, &queue, "report", report, None, None).await;

    // A short retry budget, as a staging deployment might set: the one wait is at most 4 s.
    let mut env = app_env(&outbox);
    env.push(("CONVEYOR_RETRY_BUDGET_SECS", "2".to_owned()));
    let run = run_lambda(&queue.url, &["--function-timeout-secs", "3"], &env)
        .await
        .unwrap();

    let mut users = emailed_users(&effects(&outbox));
    users.sort_unstable();
    assert_eq!(users, vec![1, 2, 3], "each good email sent once");
    assert!(
        run.stdout.contains("batch 1: 6 records, 2 failures"),
        "the first batch lists the webhook and the report:\n{}",
        run.stdout
    );
    let summary = run.summary();
    assert!(summary.contains("0 invocation errors, 0 timeouts"), "{summary}");
    assert!(summary.contains("cold start"), "{summary}");

    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 3, "{dead:#?}");
    let in_dlq = |needle: &str| {
        dead.iter()
            .find(|message| message.body.as_deref().is_some_and(|body| body.contains(needle)))
            .unwrap_or_else(|| panic!("no DLQ message with {needle}: {dead:#?}"))
    };
    let failure = |message: &aws_sdk_sqs::types::Message| {
        message
            .message_attributes
            .as_ref()
            .and_then(|attributes| attributes.get("conveyor.failure"))
            .and_then(|value| value.string_value.clone())
    };
    let rejected: Value = serde_json::from_str(&failure(in_dlq("no-address")).unwrap()).unwrap();
    assert_eq!(
        rejected["receive_count"], 1,
        "dead-lettered on its first delivery"
    );
    assert!(
        rejected["error"].as_str().unwrap().contains("no valid email"),
        "{rejected}"
    );
    // The retried ones were sent by the adapter on their last allowed attempt, with their last error.
    for (needle, reason) in [("\"d-1\"", "webhook"), ("\"r-1\"", "timed out")] {
        let record = failure(in_dlq(needle)).unwrap_or_else(|| panic!("{needle} has no failure record"));
        let record: Value = serde_json::from_str(&record).unwrap();
        assert_eq!(record["retries_exhausted"], true, "{record}");
        assert_eq!(record["receive_count"], 2, "{record}");
        assert!(record["error"].as_str().unwrap().contains(reason), "{record}");
    }
    assert_eq!(depth(&client, &queue.url).await, 0);
}

#[tokio::test]
async fn fifo_groups_keep_their_order_across_batches() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::fifo("lambda-fifo")
        .visibility_timeout_secs(20)
        .max_receive_count(3);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("fifo");

    let group_a = [1u64, 2, 3, 4, 5, 6];
    let group_b = [101u64, 102, 103, 104];
    for (index, user) in group_a.iter().enumerate() {
        // One permanent failure in the middle of group a: it goes to the DLQ and the group goes on.
        let email = if index == 2 { "broken" } else { "user@example.com" };
        send_job(
            &client,
            &queue,
            "welcome_email",
            welcome(*user, email),
            None,
            Some("a"),
        )
        .await;
    }
    for user in group_b {
        send_job(
            &client,
            &queue,
            "welcome_email",
            welcome(user, "user@example.com"),
            None,
            Some("b"),
        )
        .await;
    }

    let run = run_lambda(&queue.url, &["--batch-size", "3"], &app_env(&outbox))
        .await
        .unwrap();
    let users = emailed_users(&effects(&outbox));
    let a: Vec<u64> = users.iter().copied().filter(|user| *user < 100).collect();
    let b: Vec<u64> = users.iter().copied().filter(|user| *user > 100).collect();
    assert_eq!(a, vec![1, 2, 4, 5, 6], "group a in send order:\n{}", run.stdout);
    assert_eq!(b, group_b.to_vec(), "group b in send order:\n{}", run.stdout);
    assert!(run.summary().starts_with("summary: "), "{}", run.stdout);
    let batches = run
        .stdout
        .lines()
        .filter(|line| line.starts_with("batch "))
        .count();
    assert!(
        batches >= 4,
        "10 messages in batches of at most 3:\n{}",
        run.stdout
    );
    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].body.as_deref().unwrap().contains("broken"));
}

#[tokio::test]
async fn duplicates_are_suppressed_through_the_idempotency_table() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let table = create_table(&dynamodb_client().await, "lambda-dupes")
        .await
        .unwrap();
    let spec = QueueSpec::standard("lambda-dupes")
        .visibility_timeout_secs(20)
        .max_receive_count(3);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("dupes");
    let mut env = app_env(&outbox);
    env.push(("CONVEYOR_IDEMPOTENCY_TABLE", table.clone()));

    // The same business key sent twice, as a producer retrying after a timeout would.
    let key = "welcome_email:user:42";
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(42, "user@example.com"),
        Some(key),
        None,
    )
    .await;
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(42, "user@example.com"),
        Some(key),
        None,
    )
    .await;
    let first = run_lambda(&queue.url, &["--batch-size", "1"], &env)
        .await
        .unwrap();
    assert_eq!(emailed_users(&effects(&outbox)), vec![42], "{}", first.stdout);

    // A third send, to a new execution environment (a second cold start): still a duplicate.
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(42, "user@example.com"),
        Some(key),
        None,
    )
    .await;
    // With --output json: the batch lines go to stderr, stdout is the summary as one JSON document.
    let second = run_lambda(&queue.url, &["--output", "json"], &env).await.unwrap();
    assert_eq!(emailed_users(&effects(&outbox)), vec![42], "{}", second.stdout);
    assert!(
        second.stderr.contains("batch 1: 1 records, 0 failures"),
        "{}",
        second.stderr
    );
    let summary: serde_json::Value = serde_json::from_str(&second.stdout)
        .unwrap_or_else(|error| panic!("stdout is not one JSON document ({error}):\n{}", second.stdout));
    assert_eq!(summary["batches"], 1, "{summary}");
    assert_eq!(summary["deleted"], 1, "{summary}");
    assert_eq!(summary["failures"], 0, "{summary}");
    assert_eq!(
        depth(&client, &queue.url).await,
        0,
        "duplicates are deleted, not retried"
    );
    assert!(drain(&client, queue.dlq_url.as_ref().unwrap()).await.is_empty());
}

/// The function's variables come from the caller's environment, as a deployed function's come from its
/// configuration: the example bootstrap needs WEBHOOK_SIGNING_SECRET, given here without --env.
#[tokio::test]
async fn the_callers_environment_reaches_the_bootstrap() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let queue = create_queue(&client, &QueueSpec::standard("lambda-env").max_receive_count(3))
        .await
        .unwrap();
    let outbox = outbox_path("env");
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(7, "env@example.com"),
        None,
        None,
    )
    .await;
    let bootstrap = bootstrap().await;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
    command
        .args(["lambda", "run", "--until-empty", "--queue-url", &queue.url])
        .arg("--bootstrap")
        .arg(&bootstrap)
        .envs(aws_env())
        .envs(app_env(&outbox))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(RUN_TIMEOUT, command.output())
        .await
        .expect("the runner ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("init error"), "{stderr}");
    assert_eq!(emailed_users(&effects(&outbox)), [7]);
}

// ---- Issue 12: the runner behaves like the event source mapping (concurrency, limits, failure modes).

/// The number after `label` in the summary line (`at most 2 invocations at once` -> `at most`).
fn summary_count(run: &RunOutput, before: &str) -> u64 {
    let summary = run.summary();
    let rest = summary
        .split(before)
        .nth(1)
        .unwrap_or_else(|| panic!("no {before:?} in {summary}"));
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no number after {before:?} in {summary}"))
}

/// The summary's `N failures reported` (the number after `M deleted,`).
fn failures_reported(run: &RunOutput) -> u64 {
    summary_count(run, "deleted,")
}

fn reports_built(effects: &[Value]) -> Vec<String> {
    effects
        .iter()
        .filter(|effect| effect["effect"] == "report_built")
        .map(|effect| effect["report_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Sends four reports and four welcome emails, each twice back to back with its business key.
async fn send_each_job_twice(client: &aws_sdk_sqs::Client, queue: &TestQueue) {
    for n in 1..=4u64 {
        let report = json!({"report_id": format!("r-{n}"), "sections": 2, "section_millis": 150});
        let key = format!("report:r-{n}");
        for _ in 0..2 {
            send_job(client, queue, "report", report.clone(), Some(&key), None).await;
        }
        let key = format!("welcome_email:user:{n}");
        for _ in 0..2 {
            send_job(
                client,
                queue,
                "welcome_email",
                welcome(n, "u@example.com"),
                Some(&key),
                None,
            )
            .await;
        }
    }
}

/// Each of [`send_each_job_twice`]'s jobs ran once, with two invocations at once, no failure
/// reported, the queue and its DLQ empty, and (more than 16 batches) a copy met its twin's claim in
/// progress in the other invocation and was deferred as a delayed copy rather than run.
async fn assert_each_job_ran_once(
    client: &aws_sdk_sqs::Client,
    queue: &TestQueue,
    outbox: &Path,
    run: &RunOutput,
) {
    let effects = effects(outbox);
    let mut reports = reports_built(&effects);
    reports.sort_unstable();
    assert_eq!(
        reports,
        ["r-1", "r-2", "r-3", "r-4"],
        "each report once:\n{}",
        run.stdout
    );
    let mut users = emailed_users(&effects);
    users.sort_unstable();
    assert_eq!(users, [1, 2, 3, 4], "each email once:\n{}", run.stdout);
    assert_eq!(
        summary_count(run, "at most"),
        2,
        "two invocations ran at once:\n{}",
        run.stdout
    );
    assert_eq!(failures_reported(run), 0, "{}", run.stdout);
    assert_eq!(
        summary_count(run, "failures reported,"),
        0,
        "no invocation error: {}",
        run.stdout
    );
    assert!(
        summary_count(run, "batches,") > 16,
        "no duplicate met its twin in flight:\n{}",
        run.stdout
    );
    assert_eq!(depth(client, &queue.url).await, 0);
    assert!(drain(client, queue.dlq_url.as_ref().unwrap()).await.is_empty());
}

/// Sends each job twice ([`send_each_job_twice`]) to a new queue (a short visibility timeout: a deferred
/// duplicate waits for the other claim's lease, this long) with an idempotency table on DynamoDB Local,
/// runs the function with batches of one, two invocations at once and `extra` arguments, and checks
/// that each job ran once ([`assert_each_job_ran_once`]). Returns the run.
async fn each_job_sent_twice_runs_once(prefix: &str, extra: &[&str]) -> RunOutput {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let table = create_table(&dynamodb_client().await, prefix).await.unwrap();
    let spec = QueueSpec::standard(prefix)
        .visibility_timeout_secs(4)
        .max_receive_count(5);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path(prefix);
    let mut env = app_env(&outbox);
    env.push(("CONVEYOR_IDEMPOTENCY_TABLE", table));
    send_each_job_twice(&client, &queue).await;
    let mut args = vec![
        "--batch-size",
        "1",
        "--maximum-concurrency",
        "2",
        "--function-timeout-secs",
        "3",
    ];
    args.extend_from_slice(extra);
    let run = run_lambda(&queue.url, &args, &env).await.unwrap();
    assert_each_job_ran_once(&client, &queue, &outbox, &run).await;
    run
}

/// Two invocations at once (batches of one), each job sent twice back to back with its business key: the
/// copies land in different invocations at the same time (one finds the other's claim in progress and defers), and
/// every effect happens once.
#[tokio::test]
async fn concurrent_invocations_with_duplicates_across_them_run_each_job_once() {
    let run = each_job_sent_twice_runs_once("lambda-conc", &[]).await;
    assert!(
        run.stdout.contains("(environment 2)"),
        "a second environment invoked:\n{}",
        run.stdout
    );
}

/// The same with both invocations in one process (Lambda Managed Instances: `--concurrency 2`, so the
/// bootstrap gets AWS_LAMBDA_MAX_CONCURRENCY=2 and serves them with `run_concurrent`): the twins meet
/// in one process, on DynamoDB Local's idempotency table, and every effect still happens once.
#[tokio::test]
async fn one_process_serving_concurrent_invocations_runs_each_duplicate_once() {
    let run = each_job_sent_twice_runs_once("lambda-lmi", &["--concurrency", "2"]).await;
    assert!(
        !run.stdout.contains("(environment 2)"),
        "one environment served both:\n{}",
        run.stdout
    );
    assert!(
        run.stderr
            .contains("serving concurrent invocations in one process"),
        "the bootstrap ran its invocations concurrently:\n{}",
        run.stderr
    );
}

/// One process, two invocations in flight with different deadlines (they started 3 s apart, with a 6 s
/// function timeout): the first holds a report too long for its time, the second one that ends after the
/// first invocation's deadline. The second's report completes at its first delivery; the first's is
/// told to stop at its own cutoff, reported as a failure, comes back, and (at its last allowed receive)
/// reaches the DLQ. The idempotency store is DynamoDB Local's.
#[tokio::test]
async fn one_invocations_deadline_never_cuts_another_in_the_same_process() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let table = create_table(&dynamodb_client().await, "lambda-lmi-deadline")
        .await
        .unwrap();
    let spec = QueueSpec::standard("lambda-lmi-deadline")
        .visibility_timeout_secs(40)
        .max_receive_count(2);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("lmi-deadline");
    // 8 s of work in a 6 s invocation, and 3 s that fit (it keeps the second invocation slot busy
    // until the third report becomes visible).
    let too_long = json!({"report_id": "r-too-long", "sections": 16, "section_millis": 500});
    let fits = json!({"report_id": "r-fits", "sections": 6, "section_millis": 500});
    send_job(&client, &queue, "report", too_long, None, None).await;
    send_job(&client, &queue, "report", fits, None, None).await;
    // 4 s of work, visible 3 s later: it starts while the first invocation runs, and ends after its
    // deadline, inside its own.
    let later = json!({"report_id": "r-later", "sections": 8, "section_millis": 500});
    client
        .send_message()
        .queue_url(&queue.url)
        .message_body(later.to_string())
        .message_attributes(
            "conveyor.type",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("report")
                .build()
                .unwrap(),
        )
        .delay_seconds(3)
        .send()
        .await
        .unwrap();
    let mut env = app_env(&outbox);
    env.push(("CONVEYOR_IDEMPOTENCY_TABLE", table));
    env.push(("CONVEYOR_RETRY_BUDGET_SECS", "1".to_owned()));
    let run = run_lambda(
        &queue.url,
        &[
            "--batch-size",
            "1",
            "--maximum-concurrency",
            "2",
            "--concurrency",
            "2",
            "--function-timeout-secs",
            "6",
        ],
        &env,
    )
    .await
    .unwrap();

    assert!(run.summary().contains("0 timeouts"), "{}", run.stdout);
    assert_eq!(summary_count(&run, "at most"), 2, "{}", run.stdout);
    assert!(!run.stdout.contains("(environment 2)"), "{}", run.stdout);
    let effects = effects(&outbox);
    let built: Vec<(&str, u64)> = effects
        .iter()
        .filter(|effect| effect["effect"] == "report_built")
        .map(|effect| {
            (
                effect["report_id"].as_str().unwrap(),
                effect["receive_count"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = built.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [("r-fits", 1), ("r-later", 1)],
        "each fitting report once, at its first delivery, none cut by the other invocation's deadline:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert!(dead[0].body.as_deref().unwrap().contains("r-too-long"));
    assert!(
        failures_reported(&run) >= 1,
        "the cut report was listed:\n{}",
        run.stdout
    );
    assert_eq!(depth(&client, &queue.url).await, 0);
}

/// A FIFO group whose head fails for good, with two invocations at once and batches of two: the head
/// goes to the DLQ alone, the group's successors run after it in order, and the other groups too.
#[tokio::test]
async fn a_fifo_head_that_fails_for_good_lets_its_successors_run_in_order() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::fifo("lambda-fifo-head")
        .visibility_timeout_secs(20)
        .max_receive_count(3);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("fifo-head");
    for (group, first) in [("a", 1u64), ("b", 101), ("c", 201)] {
        for user in first..first + 5 {
            let email = if user == 1 { "broken" } else { "user@example.com" };
            send_job(
                &client,
                &queue,
                "welcome_email",
                welcome(user, email),
                None,
                Some(group),
            )
            .await;
        }
    }
    let run = run_lambda(
        &queue.url,
        &["--batch-size", "2", "--maximum-concurrency", "2"],
        &app_env(&outbox),
    )
    .await
    .unwrap();
    let users = emailed_users(&effects(&outbox));
    let group = |range: std::ops::Range<u64>| -> Vec<u64> {
        users
            .iter()
            .copied()
            .filter(|user| range.contains(user))
            .collect()
    };
    assert_eq!(
        group(0..100),
        [2, 3, 4, 5],
        "a's successors, in order:\n{}",
        run.stdout
    );
    assert_eq!(group(100..200), [101, 102, 103, 104, 105], "{}", run.stdout);
    assert_eq!(group(200..300), [201, 202, 203, 204, 205], "{}", run.stdout);
    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 1, "only the head is dead-lettered: {dead:#?}");
    assert!(dead[0].body.as_deref().unwrap().contains("broken"));
    assert_eq!(depth(&client, &queue.url).await, 0);
}

/// A handler that outlives the invocation's deadline: the adapter answers before the deadline (no
/// timeout, so the batch's other records are not run again), the unsettled record is listed as a
/// failure and comes back exactly once (here its last allowed attempt, which dead-letters it).
#[tokio::test]
async fn a_handler_past_the_deadline_is_answered_before_it_and_comes_back_once() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::standard("lambda-deadline")
        .visibility_timeout_secs(12)
        .max_receive_count(2);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("deadline");
    for user in 1..=2 {
        send_job(
            &client,
            &queue,
            "welcome_email",
            welcome(user, "u@example.com"),
            None,
            None,
        )
        .await;
    }
    // 3 s of work in a 2 s invocation.
    let slow = json!({"report_id": "r-slow", "sections": 6, "section_millis": 500});
    send_job(&client, &queue, "report", slow, None, None).await;
    let mut env = app_env(&outbox);
    env.push(("CONVEYOR_RETRY_BUDGET_SECS", "1".to_owned()));
    let run = run_lambda(&queue.url, &["--function-timeout-secs", "2"], &env)
        .await
        .unwrap();

    assert!(run.summary().contains("0 timeouts"), "{}", run.stdout);
    let first = run
        .stdout
        .lines()
        .find(|line| line.starts_with("batch 1:"))
        .unwrap_or_else(|| panic!("no first batch:\n{}", run.stdout));
    assert!(first.starts_with("batch 1: 3 records, 1 failures"), "{first}");
    let before: f64 = first
        .split(", ")
        .find_map(|part| part.split_once(" ms before the deadline"))
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or_else(|| panic!("no time before the deadline in {first}"));
    assert!(before > 0.0, "answered before the deadline: {first}");
    // Three records, then the slow one once more: nothing else came back.
    assert_eq!(summary_count(&run, "batches,"), 4, "{}", run.stdout);
    let effects = effects(&outbox);
    assert_eq!(emailed_users(&effects), [1, 2], "{}", run.stdout);
    assert!(reports_built(&effects).is_empty());
    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let failure: Value = serde_json::from_str(
        dead[0]
            .message_attributes
            .as_ref()
            .and_then(|attributes| attributes.get("conveyor.failure"))
            .and_then(|value| value.string_value.as_deref())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(failure["receive_count"], 2, "{failure}");
    assert_eq!(depth(&client, &queue.url).await, 0);
}

/// Ten messages of about 900 KB in one FIFO group, batches of ten: the event would be about 9 MB, so the
/// batch is cut to what fits in 6 MB and the rest goes back visible. LocalStack then unlocks the group
/// and the second environment receives the rest while the first batch runs: the runner holds them
/// until the group is free. Every job runs once, in order, none lost.
#[tokio::test]
async fn an_oversized_batch_is_cut_and_nothing_is_lost() {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::fifo("lambda-big")
        .visibility_timeout_secs(30)
        .max_receive_count(5);
    let queue = create_queue(&client, &spec).await.unwrap();
    let outbox = outbox_path("big");
    let padding = "p".repeat(900 * 1024);
    for user in 1..=10u64 {
        let mut body = welcome(user, "big@example.com");
        body["padding"] = Value::String(padding.clone());
        send_job(&client, &queue, "welcome_email", body, None, Some("big")).await;
    }
    let run = run_lambda(
        &queue.url,
        &["--batch-size", "10", "--maximum-concurrency", "2"],
        &app_env(&outbox),
    )
    .await
    .unwrap();
    assert!(
        run.stdout.contains("to fit the 6 MB invocation payload limit"),
        "{}",
        run.stdout
    );
    assert!(
        run.summary()
            .contains("over the 6 MB payload limit returned unrun"),
        "{}",
        run.stdout
    );
    assert_eq!(
        emailed_users(&effects(&outbox)),
        (1..=10).collect::<Vec<u64>>(),
        "every job once, in order:\n{}",
        run.stdout
    );
    assert_eq!(depth(&client, &queue.url).await, 0);
    assert!(drain(&client, queue.dlq_url.as_ref().unwrap()).await.is_empty());
}

/// A stand-in bootstrap (sh + curl) for what the example cannot do: fail at init, or answer with a
/// response over 6 MB. Each start appends a line to `starts`.
fn script_bootstrap(name: &str) -> (PathBuf, PathBuf) {
    let dir = conveyor_testing::localstack::repo_root()
        .join("target")
        .join("test-bootstraps");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(unique_name(name));
    let starts = dir.join(format!("{}.starts", unique_name(name)));
    let script = format!(
        r#"#!/bin/sh
echo start >> '{starts}'
api="http://$AWS_LAMBDA_RUNTIME_API/2018-06-01/runtime"
if [ "$SCRIPT_MODE" = init-error ]; then
  echo 'cannot read my configuration' >&2
  curl -sS -o /dev/null -X POST -H 'Lambda-Runtime-Function-Error-Type: Runtime.Config' \
    --data-binary '{{"errorType":"Runtime.Config","errorMessage":"MY_SETTING is not set"}}' "$api/init/error"
  exit 1
fi
while true; do
  id=$(curl -sS -D - -o /dev/null "$api/invocation/next" | tr -d '\r' | sed -n 's/^[Ll]ambda-[Rr]untime-[Aa]ws-[Rr]equest-[Ii]d: //p')
  head -c 7000000 /dev/zero | tr '\0' x | curl -sS -o /dev/null -H 'Expect:' -X POST --data-binary @- "$api/invocation/$id/response"
done
"#,
        starts = starts.display()
    );
    std::fs::write(&path, script).unwrap();
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).unwrap();
    (path, starts)
}

async fn run_script(queue_url: &str, bootstrap: &Path, mode: &str) -> RunOutput {
    run_lambda_with(bootstrap, queue_url, &[], &[("SCRIPT_MODE", mode.to_owned())])
        .await
        .unwrap()
}

/// A standard queue holding one welcome email job, which comes back 1 s after each failed invocation
/// and reaches the DLQ after `max_receive_count` receives.
async fn queue_with_one_job(prefix: &str, max_receive_count: u32) -> (aws_sdk_sqs::Client, TestQueue) {
    ensure_local_aws().await.unwrap();
    let client = sqs_client().await;
    let spec = QueueSpec::standard(prefix)
        .visibility_timeout_secs(1)
        .max_receive_count(max_receive_count);
    let queue = create_queue(&client, &spec).await.unwrap();
    send_job(
        &client,
        &queue,
        "welcome_email",
        welcome(1, "u@example.com"),
        None,
        None,
    )
    .await;
    (client, queue)
}

/// An init error fails that invocation (its batch comes back after the visibility timeout) and the next
/// invocation initialises again; three in a row are reported as a crash loop, and the runner goes on
/// until SQS's redrive has moved the message to the DLQ.
#[tokio::test]
async fn an_init_error_fails_the_invocation_and_the_next_one_initialises_again() {
    let (client, queue) = queue_with_one_job("lambda-init", 3).await;
    let (bootstrap, starts) = script_bootstrap("init-error");
    let run = run_script(&queue.url, &bootstrap, "init-error").await;

    assert_eq!(
        summary_count(&run, "invocation errors, 0 timeouts,"),
        3,
        "{}",
        run.stdout
    );
    assert!(
        run.summary()
            .contains("crash loop: 3 failed invocations in a row"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("crash loop: 3 invocations in a row"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("init error, batch left in the queue")
            && run.stdout.contains("MY_SETTING is not set"),
        "{}",
        run.stdout
    );
    let started = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert_eq!(started, 3, "one new process per invocation: {}", run.stdout);
    let dead = drain(&client, queue.dlq_url.as_ref().unwrap()).await;
    assert_eq!(dead.len(), 1, "the message is not lost: SQS redrove it");
}

/// A response over 6 MB is a function error (Function.ResponseSizeTooLarge) at once, not a timeout; the
/// environment is kept and the batch comes back after its visibility timeout.
#[tokio::test]
async fn a_response_over_6_mb_is_a_function_error_not_a_timeout() {
    let (client, queue) = queue_with_one_job("lambda-bigresp", 2).await;
    let (bootstrap, starts) = script_bootstrap("big-response");
    let run = run_script(&queue.url, &bootstrap, "big-response").await;

    let errors = run
        .stdout
        .lines()
        .filter(|line| line.contains("invocation error (Function.ResponseSizeTooLarge"))
        .count();
    assert_eq!(errors, 2, "{}", run.stdout);
    assert!(
        run.summary()
            .contains("2 invocation errors, 0 timeouts, 0 init errors, 0 restarts"),
        "{}",
        run.stdout
    );
    let started = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert_eq!(started, 1, "the environment is kept after a function error");
    assert_eq!(drain(&client, queue.dlq_url.as_ref().unwrap()).await.len(), 1);
}
