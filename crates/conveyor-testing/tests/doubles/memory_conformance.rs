//! Both conformance suites against the in-memory doubles, on tokio's paused clock (the visibility
//! timeouts and delays pass instantly).

use std::sync::Arc;

use conveyor_testing::{
    MemoryFlows, MemoryIdempotencyStore, MemoryQueueFactory, flow_conformance, queue_conformance,
    store_conformance, tracking_conformance,
};

#[tokio::test(start_paused = true)]
async fn memory_queue_passes_the_queue_suite() {
    queue_conformance::run_all(&MemoryQueueFactory).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_store_suite() {
    store_conformance::run_all(Arc::new(MemoryIdempotencyStore::new()))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_tracking_suite() {
    tracking_conformance::run_all(Arc::new(MemoryIdempotencyStore::new()))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_flows_pass_the_flows_suite() {
    flow_conformance::run_all(Arc::new(MemoryFlows::new()))
        .await
        .unwrap();
}

#[tokio::test]
async fn memory_payload_store_passes_the_payload_suite() {
    let store = conveyor_testing::MemoryPayloadStore::with_bucket("payloads");
    conveyor_testing::payload_conformance::run_all(&store, "payloads", "no-such-bucket")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_timers_pass_the_timers_suite() {
    conveyor_testing::timer_conformance::run_all(Arc::new(conveyor_testing::MemoryTimers::new()))
        .await
        .unwrap();
}
