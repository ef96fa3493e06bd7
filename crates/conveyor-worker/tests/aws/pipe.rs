//! A closed log pipe must not change what happens to a job (issue 19, point 2).
//!
//! `worker 2>&1 | head -1`: once the reader is gone every log write fails with `EPIPE`. Before the fix,
//! `tracing-subscriber` reported each failed write with `eprintln!`, which panicked inside the job's
//! task: a welcome email was sent again on every delivery, a permanent failure was copied to the DLQ on
//! every receive, and SIGTERM was ignored (the signal task logged before it cancelled).
//!
//! The real example `worker` binary (built by `cargo build -p conveyor-examples --bins`, which `make
//! test` runs first) against LocalStack and DynamoDB Local, its stdout and stderr pipes whose read ends
//! the test closes at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_sdk_sqs::types::MessageAttributeValue;
use conveyor_core::port::Queue as _;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::{wait_for, wait_until};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

/// The example `worker` binary next to this test's executable (`target/debug/worker`), or the one
/// `WORKER_BINARY` names (to run this test against an older build).
fn worker_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("WORKER_BINARY") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target directory above the test executable")?;
    let path = debug.join("worker");
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build -p conveyor-examples --bins` (make test does)",
            path.display()
        );
    }
    Ok(path)
}

/// `GET path` on the operations endpoint: (status code, body), or `None` when it does not answer.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())?;
    Some((code, body))
}

fn string(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

/// Sends a welcome email job; `email` without '@' is a permanent failure.
async fn send_welcome(sqs: &aws_sdk_sqs::Client, url: &str, user_id: u64, email: &str) {
    let body = serde_json::json!({ "user_id": user_id, "email": email, "name": "Ada" });
    sqs.send_message()
        .queue_url(url)
        .message_body(body.to_string())
        .message_attributes("conveyor.type", string("welcome_email"))
        .message_attributes("conveyor.key", string(&format!("welcome_email:user:{user_id}")))
        .send()
        .await
        .unwrap();
}

/// Emails recorded in the outbox for `user_id`.
fn emails_to(outbox: &std::path::Path, user_id: u64) -> usize {
    let Ok(text) = std::fs::read_to_string(outbox) else {
        return 0;
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|effect| effect["effect"] == "email_sent" && effect["to_user"] == user_id)
        .count()
}

fn depth_total(depth: conveyor_core::port::QueueDepth) -> u64 {
    depth.visible + depth.in_flight + depth.delayed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_changes_nothing_a_job_does_and_sigterm_still_stops_the_worker()
-> anyhow::Result<()> {
    let binary = worker_binary()?;
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "pipe").await?;
    // A short visibility timeout: a job abandoned by a panicking task would come back within seconds.
    let spec = QueueSpec::standard("pipe")
        .visibility_timeout_secs(10)
        .max_receive_count(5);
    let created = localstack::create_queue(&sqs, &spec).await?;
    let queue = SqsQueue::connect(sqs.clone(), &created.url).await?;
    let dlq = SqsQueue::connect(sqs.clone(), created.dlq_url.as_deref().unwrap()).await?;
    let outbox = std::env::temp_dir().join(format!("{}.jsonl", localstack::unique_name("pipe-outbox")));
    let port = conveyor_testing::free_port().unwrap();

    let mut worker = Command::new(&binary)
        .envs(localstack::aws_env())
        .env("CONVEYOR_IDEMPOTENCY_TABLE", &table)
        .env("WEBHOOK_SIGNING_SECRET", "pipe-secret")
        .env("CONVEYOR_DEMO_OUTBOX", &outbox)
        .env("CONVEYOR_QUEUE_URL", &created.url)
        .env("CONVEYOR_VISIBILITY_TIMEOUT_SECS", "10")
        .env("CONVEYOR_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("CONVEYOR_LOG_FORMAT", "text")
        // As a user would run it; every job logs at least one line into the closed pipe.
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the worker binary")?;
    // Read one log line, then close the read ends, as `2>&1 | head -1` does.
    drop(worker.stdout.take());
    let stderr = worker.stderr.take().context("no stderr pipe")?;
    let mut first_line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(stderr).read_line(&mut first_line),
    )
    .await
    .context("the worker wrote no log line within 30 s")??;
    assert!(!first_line.is_empty(), "the worker closed its stderr at once");

    wait_until(Duration::from_secs(40), Duration::from_millis(100), async || {
        get(port, "/readyz").await.is_some_and(|(code, _)| code == 200)
    })
    .await
    .context("the worker's /readyz never said ready")?;

    send_welcome(&sqs, &created.url, 1, "ada@example.com").await;
    send_welcome(&sqs, &created.url, 2, "no-address").await;

    // Both settled: the email deleted after its effect, the permanent failure copied once and deleted.
    // A task that panicked would leave its message in flight, to come back after 10 s and run again.
    wait_until(Duration::from_secs(60), Duration::from_millis(200), async || {
        let drained = queue.depth().await.is_ok_and(|depth| depth_total(depth) == 0);
        let dead = dlq.depth().await.is_ok_and(|depth| depth.visible >= 1);
        drained && dead && emails_to(&outbox, 1) >= 1
    })
    .await
    .with_context(|| {
        format!(
            "the jobs did not settle: {} email(s) to user 1",
            emails_to(&outbox, 1)
        )
    })?;

    assert_eq!(emails_to(&outbox, 1), 1, "user 1 got exactly one email");
    assert_eq!(
        depth_total(dlq.depth().await?),
        1,
        "the permanent failure is in the DLQ once"
    );

    // The pipe really was broken: the worker counted the log lines it dropped.
    let dropped = wait_for(Duration::from_secs(10), Duration::from_millis(200), async || {
        let (_, metrics) = get(port, "/metrics").await?;
        let line = metrics
            .lines()
            .find(|line| line.starts_with("conveyor_log_write_errors_total"))?;
        let count: f64 = line.split_whitespace().last()?.parse().ok()?;
        (count > 0.0).then_some(count)
    })
    .await
    .context("conveyor_log_write_errors_total never counted a dropped log line")?;
    assert!(dropped > 0.0);

    let pid = worker.id().context("the worker already exited")?;
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(40), worker.wait())
        .await
        .context("the worker ignored SIGTERM for 40 s")??;
    assert!(status.success(), "the worker exited with {status} after SIGTERM");

    // Once each: both messages were deleted, so neither can come back.
    assert_eq!(emails_to(&outbox, 1), 1, "user 1 got exactly one email");
    assert_eq!(emails_to(&outbox, 2), 0, "user 2 has no address");
    let dead_letters = dlq.depth().await?;
    assert_eq!(
        depth_total(dead_letters),
        1,
        "the permanent failure is in the DLQ once"
    );
    assert_eq!(depth_total(queue.depth().await?), 0, "nothing left in the queue");
    let _ = std::fs::remove_file(&outbox);
    Ok(())
}
