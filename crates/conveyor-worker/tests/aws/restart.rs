//! The emulator stopped and restarted under a running worker: it backs off, keeps running, reports
//! not ready, and resumes processing once the queue is back.
//!
//! The test starts a LocalStack of its own on a free port (`OwnLocalStack`) and restarts that one:
//! restarting wipes every queue (LocalStack runs without persistence), so the shared emulator on 4566,
//! which other tests and other checkouts use at the same time, is never touched. The instance is killed
//! when the test ends, panics included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use aws_sdk_sqs::types::QueueAttributeName;
use common::aws::{self, connect, send_all};
use common::*;
use conveyor_testing::localstack::{OwnLocalStack, QueueSpec, create_queue};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_rides_out_an_emulator_restart() {
    let mut localstack = OwnLocalStack::start().await.unwrap();
    let client = localstack.sqs_client();
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

    localstack.restart(false).await.unwrap();
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
