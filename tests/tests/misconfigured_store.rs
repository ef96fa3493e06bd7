//! A store that cannot be used is a configuration error, not an outage: the example `worker` stops at
//! start with the fix and receives nothing; the example `bootstrap` fails its cold start naming the
//! table and the fix. Real binaries against LocalStack and DynamoDB Local, pointed at a table that does
//! not exist.

use std::process::Stdio;
use std::time::Duration;

use conveyor_core::port::Queue as _;
use conveyor_e2e::{app_env, binaries, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use tokio::process::Command;

/// Runs `binary` with `env` (plus `extra`) until it exits (60 s at most); returns its status and stderr.
async fn run_to_exit(
    binary: &str,
    env: &[(String, String)],
    extra: &[(&str, &str)],
) -> anyhow::Result<(std::process::ExitStatus, String)> {
    let child = Command::new(binaries().path(binary)?)
        .envs(env.iter().cloned())
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    Ok((
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_stops_the_worker_and_the_lambda_at_start_with_the_fix() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("e2e-no-table")).await?;
    let job = WelcomeEmail {
        user_id: 1,
        email: "user1@example.com".to_owned(),
        name: "user 1".to_owned(),
    };
    Producer::new(sqs.clone(), &queue.url)
        .send(&NewJob::new("welcome_email", job))
        .await?;
    let table = localstack::unique_name("e2e-no-such-table");
    let env = app_env(&table, &outbox_path("e2e-no-table"));

    let (status, stderr) = run_to_exit(
        "worker",
        &env,
        &[
            ("CONVEYOR_QUEUE_URL", &queue.url),
            ("CONVEYOR_LISTEN_ADDR", "off"),
        ],
    )
    .await?;
    assert!(
        !status.success(),
        "the worker must not run against a missing table: {stderr}"
    );
    assert!(
        stderr.contains(&table)
            && stderr.contains("does not exist")
            && stderr.contains("infra/modules/idempotency-table"),
        "the worker's error names the table and the fix: {stderr}"
    );

    let (status, stderr) = run_to_exit("bootstrap", &env, &[]).await?;
    assert!(
        !status.success(),
        "the bootstrap must fail its cold start: {stderr}"
    );
    assert!(
        stderr.contains(&table) && stderr.contains("does not exist") && stderr.contains("took no record"),
        "the bootstrap's error names the table and the fix: {stderr}"
    );

    // Nothing was received: the message is visible, its receive count untouched.
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let received = sqs_queue.receive(10, Duration::from_secs(2)).await?;
    assert_eq!(received.len(), 1, "the message is still in the queue");
    assert_eq!(
        received[0].receive_count, 1,
        "no consumer received it before this check"
    );
    Ok(())
}
