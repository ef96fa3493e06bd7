//! Time budgets as a new user meets them (issue 10): a queue made with SQS's defaults and the example
//! `worker` with its defaults, and a queue whose visibility timeout is too short for the heartbeat.
//!
//! Real binaries against LocalStack and DynamoDB Local. Build them first:
//! `cargo build -p conveyor-examples -p conveyor-demo --bins` (`make test` does).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{SECRET, binaries, log_lines, log_path, message_of, outbox_path, receive_count};
use conveyor_examples::jobs::report::GenerateReport;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack;
use conveyor_testing::wait_until;
use serde_json::Value;
use tokio::process::{Child, Command};

/// The example `worker` as a new user runs it: the application's environment (emulators, table,
/// secret, outbox) and only `CONVEYOR_QUEUE_URL` and `CONVEYOR_LISTEN_ADDR=off` of the worker's own
/// settings; every other `CONVEYOR_*` variable of this process is removed, so the defaults apply.
/// Logs are JSON lines (info) in `log`.
fn default_worker(queue_url: &str, env: &[(String, String)], log: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(binaries().path("worker")?);
    for (key, _) in std::env::vars() {
        if key.starts_with("CONVEYOR_") || key == "RUST_BACKTRACE" || key == "RUST_LIB_BACKTRACE" {
            command.env_remove(key);
        }
    }
    command
        .envs(env.iter().cloned())
        .env("CONVEYOR_QUEUE_URL", queue_url)
        .env("CONVEYOR_LISTEN_ADDR", "off")
        .env("CONVEYOR_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log)?))
        .kill_on_drop(true);
    Ok(command)
}

/// The application's environment with info logs.
fn app_env(table: &str, outbox: &Path) -> Vec<(String, String)> {
    conveyor_demo::local_app_env(table, outbox, SECRET, "info")
}

/// A `u64` field of the `WorkerReport { ... }` the example logs as it stops (`report` field).
fn report_field(report: &str, field: &str) -> Option<u64> {
    let start = report.find(&format!("{field}: "))? + field.len() + 2;
    let digits: String = report[start..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The `WorkerReport` text the example worker logged when it stopped.
fn stopped_report(lines: &[Value]) -> Option<String> {
    lines
        .iter()
        .find(|line| message_of(line) == "worker stopped" && line["fields"]["report"].is_string())
        .and_then(|line| line["fields"]["report"].as_str().map(str::to_owned))
}

async fn wait_for_start(log: &Path) -> anyhow::Result<()> {
    wait_until(Duration::from_secs(30), Duration::from_millis(200), async || {
        log_lines(log).is_ok_and(|lines| lines.iter().any(|line| message_of(line) == "worker started"))
    })
    .await
    .with_context(|| format!("the worker did not start; its log: {}", log.display()))
}

/// The reproduction: `aws sqs create-queue` (30 s visibility), two example workers with their
/// defaults, one job of 45 s. It must run once, kept invisible by the heartbeat, never redelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_45_second_job_on_a_default_queue_runs_once_on_two_default_workers() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "e2e-defaults").await?;
    // No attributes at all, as `aws sqs create-queue --queue-name ...` makes it.
    let url = sqs
        .create_queue()
        .queue_name(localstack::unique_name("e2e-defaults"))
        .send()
        .await?
        .queue_url
        .context("no queue URL")?;
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::VisibilityTimeout)
        .send()
        .await?;
    assert_eq!(
        attributes
            .attributes()
            .and_then(|map| map.get(&QueueAttributeName::VisibilityTimeout))
            .map(String::as_str),
        Some("30"),
        "SQS's default visibility timeout"
    );
    let outbox = outbox_path("e2e-defaults");
    let env = app_env(&table, &outbox);
    let logs = [log_path("e2e-defaults-1"), log_path("e2e-defaults-2")];
    let mut first = default_worker(&url, &env, &logs[0])?.spawn()?;
    let mut second = default_worker(&url, &env, &logs[1])?.spawn()?;
    wait_for_start(&logs[0]).await?;
    wait_for_start(&logs[1]).await?;

    // The example's report job: 45 sections of 1 s, 45 s in all.
    let report_id = localstack::unique_name("report");
    let job = GenerateReport {
        report_id: report_id.clone(),
        sections: 45,
        section_millis: 1000,
    };
    Producer::new(sqs.clone(), &url)
        .send(&NewJob::new("report", job))
        .await?;

    let built = |outbox: &Path| -> anyhow::Result<usize> {
        Ok(conveyor_examples::outbox::Outbox::read_all(outbox)?
            .iter()
            .filter(|effect| effect["effect"] == "report_built" && effect["report_id"] == report_id.as_str())
            .count())
    };
    wait_until(Duration::from_secs(75), Duration::from_millis(500), async || {
        built(&outbox).is_ok_and(|count| count >= 1)
    })
    .await
    .with_context(|| format!("the report was not built; logs: {logs:?}"))?;
    let queue = SqsQueue::connect(sqs.clone(), &url).await?;
    wait_until(Duration::from_secs(20), Duration::from_millis(200), async || {
        queue_is_empty(&queue).await
    })
    .await
    .context("the message was not deleted")?;
    let (stopped_first, stopped_second) = tokio::join!(terminate(&mut first), terminate(&mut second));
    stopped_first?;
    stopped_second?;

    assert_eq!(built(&outbox)?, 1, "one effect");
    let mut progress_lines = 0;
    let mut workers_that_ran = 0;
    let mut received = 0;
    let mut extensions = 0;
    for log in &logs {
        let lines = log_lines(log)?;
        let progress: Vec<&Value> = lines
            .iter()
            .filter(|line| {
                message_of(line) == "report progress" && line["fields"]["report_id"] == report_id.as_str()
            })
            .collect();
        for line in &progress {
            assert_eq!(
                receive_count(line),
                Some(1),
                "progress from the first delivery only (not redelivered); {}: {line}",
                log.display()
            );
        }
        if !progress.is_empty() {
            workers_that_ran += 1;
        }
        progress_lines += progress.len();
        let report =
            stopped_report(&lines).with_context(|| format!("no final report in {}", log.display()))?;
        println!("{}: {report}", log.display());
        received += report_field(&report, "received").context("received")?;
        extensions += report_field(&report, "heartbeat_extensions").context("heartbeat_extensions")?;
        assert_eq!(report_field(&report, "leases_lost"), Some(0), "{report}");
    }
    assert_eq!(workers_that_ran, 1, "one worker ran the job; logs: {logs:?}");
    assert_eq!(progress_lines, 45, "each section once; logs: {logs:?}");
    assert_eq!(received, 1, "received once, by one worker, never redelivered");
    assert!(
        extensions >= 1,
        "a 45 s job at 30 s visibility was extended: {extensions} extensions"
    );
    Ok(())
}

/// A queue whose visibility timeout is 5 s: the worker refuses it at start-up, naming the queue, the
/// 10 s minimum and the fix, and leaves its messages alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_a_5_second_visibility_timeout_is_refused_at_start_up() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "e2e-short").await?;
    let name = localstack::unique_name("e2e-short-visibility");
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::VisibilityTimeout, "5")
        .send()
        .await?
        .queue_url
        .context("no queue URL")?;
    let job = GenerateReport {
        report_id: "short".to_owned(),
        sections: 1,
        section_millis: 10,
    };
    Producer::new(sqs.clone(), &url)
        .send(&NewJob::new("report", job))
        .await?;
    let outbox = outbox_path("e2e-short");
    let log = log_path("e2e-short");
    let mut command = default_worker(&url, &app_env(&table, &outbox), &log)?;
    // Plain text, as a user reads it on a terminal.
    command.env_remove("CONVEYOR_LOG_FORMAT");
    let mut worker: Child = command.spawn()?;
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .context("the worker did not exit within 30 s")??;
    let output = std::fs::read_to_string(&log)?;
    println!("{output}");

    assert!(!status.success(), "exit status {status}: {output}");
    assert!(output.contains(&name), "names the queue: {output}");
    assert!(
        output.contains("5s is too short"),
        "says what is wrong with it: {output}"
    );
    assert!(output.contains("at least 10s"), "states the minimum: {output}");
    assert!(
        output.contains("VisibilityTimeout") && output.contains("set-queue-attributes"),
        "says how to fix the queue: {output}"
    );
    assert!(
        output.contains("CONVEYOR_VISIBILITY_TIMEOUT_SECS"),
        "names the override: {output}"
    );
    let queue = SqsQueue::connect(sqs.clone(), &url).await?;
    let depth = conveyor_core::port::Queue::depth(&queue).await?;
    assert_eq!(
        (depth.visible, depth.in_flight),
        (1, 0),
        "the message was not touched"
    );
    assert!(
        conveyor_examples::outbox::Outbox::read_all(&outbox)?.is_empty(),
        "nothing ran"
    );
    Ok(())
}
