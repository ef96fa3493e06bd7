//! The operations endpoint (real clock, real TCP): /healthz, /readyz, /metrics and `healthcheck`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use conveyor_testing::MemoryQueue;
use conveyor_worker::healthcheck;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn health_readiness_and_metrics_are_served() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("ops"));
    queue.set_unavailable(true);
    let config = config(&[("ops", 1)])
        .with_listen_addr(Some("127.0.0.1:0".into()))
        .with_stats_interval(Duration::from_millis(100));
    let running = start(plain_worker(config, &log, &queue));
    let status = running.status.clone();
    eventually(5, "the endpoint to listen", || status.operations_addr().is_some()).await;
    let addr = status.operations_addr().unwrap();

    assert_eq!(get(addr, "/healthz").await.0, 200);
    // Ready as soon as it runs, until its first receive fails.
    let body = conveyor_testing::wait_for(Duration::from_secs(5), Duration::from_millis(20), async || {
        let (code, body) = get(addr, "/readyz").await;
        (code == 503 && body.contains("receive")).then_some(body)
    })
    .await
    .expect("SQS is unavailable: not ready");
    assert!(body.contains("not ready"), "{body}");
    healthcheck(&addr.to_string()).await.unwrap();

    queue.set_unavailable(false);
    for id in 0..3 {
        queue.push_message(message("plain", &job(id))).unwrap();
    }
    eventually(15, "readiness and the jobs", || {
        status.is_ready() && log.count(Kind::Succeeded) == 3
    })
    .await;
    assert_eq!(get(addr, "/readyz").await.0, 200);
    eventually(5, "the deletes", || queue.is_empty()).await;
    // Give the depth poller (100 ms) a round after the deletes.
    let metrics = conveyor_testing::wait_for(Duration::from_secs(5), Duration::from_millis(50), async || {
        let (_, body) = get(addr, "/metrics").await;
        body.contains("conveyor_queue_visible{queue=\"ops\"} 0")
            .then_some(body)
    })
    .await
    .unwrap();
    for expected in [
        "conveyor_messages_received_total{queue=\"ops\"} 3",
        "conveyor_messages_succeeded_total{queue=\"ops\",job_type=\"plain\"} 3",
        "conveyor_handler_duration_seconds_bucket{job_type=\"plain\",le=\"0.005\"}",
        // The gauge's value is the process's: other tests' workers share it here, so only its presence.
        "\nconveyor_in_flight ",
        "conveyor_queue_in_flight{queue=\"ops\"}",
    ] {
        assert!(metrics.contains(expected), "missing {expected:?} in:\n{metrics}");
    }
    assert_eq!(get(addr, "/nope").await.0, 404);

    let report = running.stop().await;
    assert_eq!(report.succeeded, 3);
    let error = healthcheck(&addr.to_string()).await.unwrap_err().to_string();
    assert!(error.contains("health check"), "{error}");
}

#[tokio::test]
async fn a_busy_listen_address_is_a_clear_error() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("busy"));
    let config = config(&[("busy", 1)]).with_listen_addr(Some(addr.clone()));
    let error = plain_worker(config, &log, &queue)
        .run(CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&addr) && error.contains("CONVEYOR_LISTEN_ADDR"),
        "{error}"
    );
}
