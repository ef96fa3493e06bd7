//! The emulator stopped and restarted under a running worker: it backs off, keeps running, reports
//! not ready, and resumes processing once the queue is back.
//!
//! Its own test target because restarting LocalStack wipes every queue (LocalStack runs without
//! persistence): tests in other targets run before or after it, never during.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use aws_sdk_sqs::types::QueueAttributeName;
use common::aws::{self, connect, send_all};
use common::*;
use conveyor_testing::localstack::{QueueSpec, create_queue, repo_root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_rides_out_an_emulator_restart() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::standard("restart"))
        .await
        .unwrap();
    let queue = connect(&client, &created.url).await;
    let log = Log::new();
    let running = start(plain_worker(aws::config(&[(&created.url, 1)]), &log, &queue));
    let status = running.status.clone();

    send_all(&queue, (0..5).map(|id| message("plain", &job(id))).collect()).await;
    eventually(30, "the first jobs", || {
        log.count(Kind::Succeeded) == 5 && status.is_ready()
    })
    .await;

    let script = repo_root().join("localstack").join("restart-sqs.sh");
    let restarted = tokio::process::Command::new("bash")
        .arg(&script)
        .output()
        .await
        .unwrap();
    assert!(
        restarted.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&restarted.stderr)
    );
    // The queue is gone with the old emulator: receives fail until it is created again.
    eventually(60, "the worker to report not ready", || !status.is_ready()).await;
    assert!(
        !running.handle.is_finished(),
        "the worker keeps running through the outage"
    );

    client
        .create_queue()
        .queue_name(&created.name)
        .attributes(QueueAttributeName::VisibilityTimeout, "30")
        .send()
        .await
        .unwrap();
    send_all(&queue, (5..10).map(|id| message("plain", &job(id))).collect()).await;
    eventually(90, "processing to resume", || {
        log.count(Kind::Succeeded) == 10 && status.is_ready()
    })
    .await;

    let report = running.stop().await;
    assert_eq!(report.succeeded, 10);
    assert_eq!(log.count(Kind::Started), 10, "no job ran twice");
}
