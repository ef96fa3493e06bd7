//! `/readyz` tells the truth, and `/metrics` shows watched DLQs' depth (issue 19, point 6). Real clock,
//! real TCP, in-memory queues.
//!
//! Before: `/readyz` said ready only after the first receive returned, which on an empty queue is the
//! end of a 20 s long poll, and stayed ready while the worker drained after SIGTERM, so a load balancer
//! or ECS kept sending it traffic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use conveyor_core::port::{IdempotencyStore, Queue};
use conveyor_core::{Pipeline, Router};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, wait_for};
use conveyor_worker::Worker;
use conveyor_worker::config::WorkerConfig;
use tokio::time::Instant;

/// Waits (up to `secs`) until `/readyz` answers `code`; returns its body.
async fn readyz_becomes(addr: SocketAddr, code: u16, secs: u64) -> String {
    wait_for(Duration::from_secs(secs), Duration::from_millis(20), async || {
        let (answered, body) = get(addr, "/readyz").await;
        (answered == code).then_some(body)
    })
    .await
    .unwrap_or_else(|_| panic!("/readyz did not answer {code} within {secs} s"))
}

fn with_endpoint(config: WorkerConfig) -> WorkerConfig {
    config.with_listen_addr(Some("127.0.0.1:0".into()))
}

async fn operations_addr(running: &Running) -> SocketAddr {
    let status = running.status.clone();
    eventually(10, "the endpoint to listen", || {
        status.operations_addr().is_some()
    })
    .await;
    status.operations_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_once_the_queues_are_connected_not_after_the_first_long_poll() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("idle"));
    let config = with_endpoint(config(&[("idle", 1)])).with_receive_wait(Duration::from_secs(20));
    let started = Instant::now();
    let running = start(plain_worker(config, &log, &queue));
    let addr = operations_addr(&running).await;

    readyz_becomes(addr, 200, 10).await;
    let waited = started.elapsed();
    // The queue is empty: the first long poll is still waiting out its 20 s.
    assert!(waited < Duration::from_secs(15), "ready only after {waited:?}");
    assert!(queue.requests().receive >= 1, "the worker is receiving");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_draining_a_long_job() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("draining"));
    queue.push_message(message("plain", &slow_job(1, 3_000))).unwrap();
    let config = with_endpoint(config(&[("draining", 1)]))
        .with_receive_wait(Duration::from_secs(1))
        .with_drain_deadline(Some(Duration::from_secs(20)));
    let running = start(plain_worker(config, &log, &queue));
    let addr = operations_addr(&running).await;
    eventually(10, "the long job to start", || log.count(Kind::Started) == 1).await;
    readyz_becomes(addr, 200, 10).await;

    running.shutdown.cancel();
    let body = readyz_becomes(addr, 503, 5).await;
    assert!(body.contains("draining"), "{body}");
    assert!(running.status.is_draining());
    assert_eq!(
        log.count(Kind::Succeeded),
        0,
        "the job was still running when /readyz said not ready"
    );

    let report = running.handle.await.unwrap().unwrap();
    assert_eq!(report.succeeded, 1, "the drain let the job finish");
    assert!(!running.status.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_dead_letter_queues_depth_is_a_gauge() {
    let log = Log::new();
    let dlq = Arc::new(MemoryQueue::standard("watched-dlq"));
    let queue = Arc::new(MemoryQueue::standard("watched").with_dead_letter_queue(Arc::clone(&dlq), 3));
    dlq.push("a dead letter").unwrap();
    dlq.push("another").unwrap();
    let config = with_endpoint(config(&[("watched", 1)])).with_stats_interval(Duration::from_millis(100));
    let worker =
        plain_worker(config, &log, &queue).watch_dead_letter_queue(Arc::clone(&dlq) as Arc<dyn Queue>);
    let running = start(worker);
    let addr = operations_addr(&running).await;

    let expected = "conveyor_dlq_messages{queue=\"watched-dlq\"} 2";
    let metrics = wait_for(Duration::from_secs(10), Duration::from_millis(50), async || {
        let (_, body) = get(addr, "/metrics").await;
        body.contains(expected).then_some(body)
    })
    .await
    .unwrap_or_else(|_| panic!("no {expected:?} on /metrics"));
    assert!(metrics.contains("# HELP conveyor_dlq_messages"), "{metrics}");
    // Only watched DLQs: the worker's own queue has no such gauge.
    assert!(
        !metrics.contains("conveyor_dlq_messages{queue=\"watched\"}"),
        "{metrics}"
    );
    running.stop().await;
}

/// The store's table deleted (or a permission revoked) while the worker runs, after its start-up
/// check: the job is deferred, not run unclaimed and not lost, and `/readyz` turns not ready with the
/// store's message until a claim is answered again (issue 34, point 7).
#[tokio::test(start_paused = true)]
async fn a_store_misconfigured_at_run_time_makes_the_worker_not_ready_until_it_is_fixed() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("misconfigured"));
    let store = Arc::new(MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)))
        .with_store(store.clone() as Arc<dyn IdempotencyStore>);
    let worker = Worker::new(
        config(&[("misconfigured", 1)]),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap();
    let running = start(worker);
    eventually(10, "the worker to be ready", || running.status.is_ready()).await;

    store.set_misconfigured(true);
    queue.push_message(message("plain", &job(1))).unwrap();
    eventually(30, "the worker to turn not ready", || !running.status.is_ready()).await;
    assert_eq!(log.count(Kind::Started), 0, "not run unclaimed");

    store.set_misconfigured(false);
    eventually(120, "the deferred job to run once the store is fixed", || {
        log.count(Kind::Succeeded) == 1
    })
    .await;
    assert!(running.status.is_ready(), "ready again once a claim is answered");
    let report = running.stop().await;
    assert!(report.deferred >= 1, "deferred while misconfigured: {report:?}");
}
