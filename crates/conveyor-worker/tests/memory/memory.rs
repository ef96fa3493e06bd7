//! The worker against `MemoryQueue` (and `MemoryIdempotencyStore`) under a paused clock: every outcome
//! path, heartbeats, shutdown, FIFO, priorities, receive errors and downstream protection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    port::{IdempotencyStore, Queue},
    {Pipeline, Router},
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, MessageState};
use conveyor_worker::config::{PriorityMode, WorkerConfig};
use conveyor_worker::{BreakerSettings, Worker};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn queue(name: &str) -> Arc<MemoryQueue> {
    Arc::new(MemoryQueue::standard(name).with_visibility_timeout(Duration::from_secs(30)))
}

/// A worker for one queue whose only route is `Recorder<Plain>`, idempotent through `store`.
fn store_worker(
    config: WorkerConfig,
    log: &Arc<Log>,
    queue: &Arc<MemoryQueue>,
    store: &Arc<MemoryIdempotencyStore>,
) -> Worker {
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(log)))
        .with_store(Arc::clone(store) as Arc<dyn IdempotencyStore>);
    Worker::new(config, pipeline, vec![Arc::clone(queue) as Arc<dyn Queue>]).unwrap()
}

/// The failure record the first DLQ copy carries.
fn first_dlq_failure(queue: &MemoryQueue) -> conveyor_core::runtime::Failure {
    let copy = &queue.messages_in_dlq()[0];
    let record = copy.attributes[FAILURE_ATTRIBUTE].string_value.clone().unwrap();
    serde_json::from_str(&record).unwrap()
}

fn queue_with_dlq(name: &str, max_receive_count: u32) -> Arc<MemoryQueue> {
    let dlq = Arc::new(MemoryQueue::standard(&format!("{name}-dlq")));
    Arc::new(
        MemoryQueue::standard(name)
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq, max_receive_count),
    )
}

#[tokio::test(start_paused = true)]
async fn successes_are_deleted_in_batches() {
    let log = Log::new();
    let queue = queue("ok");
    for id in 0..25 {
        queue.push_message(message("plain", &job(id))).unwrap();
    }
    let running = start(plain_worker(config(&[("ok", 1)]), &log, &queue));
    eventually(60, "25 successes and an empty queue", || {
        log.count(Kind::Succeeded) == 25 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.received, report.succeeded, report.retried), (25, 25, 0));
    assert_eq!(log.count(Kind::Started), 25, "each job ran once");
    let requests = queue.requests();
    assert!(requests.delete <= 6, "deletes are batched: {requests:?}");
    assert_eq!(
        requests.change_visibility, 0,
        "short jobs need no heartbeat: {requests:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_come_back_after_their_delay_then_succeed() {
    let log = Log::new();
    let queue = queue("retry");
    let script = TestJob {
        id: 1,
        fail: Fail::RetryAfter(7),
        fail_until: 2,
        ..TestJob::default()
    };
    queue.push_message(message("plain", &script)).unwrap();
    let running = start(plain_worker(config(&[("retry", 1)]), &log, &queue));
    eventually(120, "the third delivery to succeed", || {
        log.count(Kind::Succeeded) == 1
    })
    .await;
    eventually(5, "the delete", || queue.is_empty()).await;
    let report = running.stop().await;
    let starts: Vec<(u32, Instant)> = log
        .events()
        .iter()
        .filter(|event| event.kind == Kind::Started)
        .map(|event| (event.receive_count, event.at))
        .collect();
    assert_eq!(
        starts.iter().map(|(count, _)| *count).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    for pair in starts.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= Duration::from_secs(7),
            "the handler's delay is honoured"
        );
    }
    assert_eq!((report.retried, report.succeeded), (2, 1));
}

/// Queues job 13, which fails permanently, then job 14, which succeeds.
fn push_poison_then_plain(queue: &MemoryQueue) {
    let poison = TestJob {
        id: 13,
        fail: Fail::Permanent,
        ..TestJob::default()
    };
    queue.push_message(message("plain", &poison)).unwrap();
    queue.push_message(message("plain", &job(14))).unwrap();
}

/// A message's span says what settlement did, not what the pipeline asked for: a permanent failure
/// on a queue with no DLQ goes back to the queue, and its span says `retried` (it said
/// `dead_lettered`).
#[tokio::test(start_paused = true)]
async fn a_messages_span_says_what_settlement_did() {
    let outcomes = conveyor_testing::SpanOutcomes::default();
    let _capture = outcomes.capture();
    let log = Log::new();
    let queue = queue("no-dlq");
    push_poison_then_plain(&queue);
    let running = start(plain_worker(config(&[("no-dlq", 1)]), &log, &queue));
    eventually(60, "both messages settled", || outcomes.values().len() >= 2).await;
    running.stop().await;
    let seen = outcomes.values();
    assert_eq!(
        seen.iter().filter(|outcome| *outcome == "acked").count(),
        1,
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .all(|outcome| outcome == "acked" || outcome == "retried"),
        "the poison message went back to the queue each time: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_poison_message_reaches_the_dlq_with_its_reason_without_looping() {
    let log = Log::new();
    let queue = queue_with_dlq("poison", 5);
    push_poison_then_plain(&queue);
    let running = start(plain_worker(config(&[("poison", 1)]), &log, &queue));
    eventually(60, "the poison message in the DLQ", || {
        queue.messages_in_dlq().len() == 1
    })
    .await;
    eventually(5, "the main queue to empty", || queue.is_empty()).await;
    // Plenty of time for a loop to show itself.
    tokio::time::sleep(Duration::from_secs(300)).await;
    let report = running.stop().await;
    let dead = &queue.messages_in_dlq()[0];
    let failure = dead.attributes[FAILURE_ATTRIBUTE].string_value.clone().unwrap();
    let failure: serde_json::Value = serde_json::from_str(&failure).unwrap();
    assert!(failure["error"].as_str().unwrap().contains("poison"), "{failure}");
    assert_eq!(failure["handler"], "plain");
    assert_eq!(failure["receive_count"], 1);
    assert_eq!(
        log.ids(Kind::Started).iter().filter(|id| **id == 13).count(),
        1,
        "the handler ran once"
    );
    assert_eq!((report.dead_lettered, report.succeeded), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_body_is_rejected_without_running() {
    let log = Log::new();
    let queue = queue_with_dlq("garbage", 5);
    let mut garbage = message("plain", &job(1));
    garbage.body = "not json".into();
    queue.push_message(garbage).unwrap();
    let running = start(plain_worker(config(&[("garbage", 1)]), &log, &queue));
    eventually(60, "the DLQ copy", || {
        queue.messages_in_dlq().len() == 1 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Started), 0);
    assert_eq!(report.dead_lettered, 1);
}

#[tokio::test(start_paused = true)]
async fn panics_are_retried_and_the_last_allowed_attempt_goes_to_the_dlq_with_its_reason() {
    let log = Log::new();
    let queue = queue_with_dlq("panics", 3);
    let script = TestJob {
        id: 7,
        fail: Fail::Panic,
        ..TestJob::default()
    };
    queue.push_message(message("plain", &script)).unwrap();
    let running = start(plain_worker(config(&[("panics", 1)]), &log, &queue));
    eventually(120, "the DLQ copy", || queue.messages_in_dlq().len() == 1).await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Started), 3, "maxReceiveCount runs, then the DLQ");
    assert_eq!((report.retried, report.dead_lettered), (2, 1));
    let failure = first_dlq_failure(&queue);
    assert!(failure.error.contains("handler panicked"), "{}", failure.error);
    assert!(failure.retries_exhausted, "{failure:?}");
    assert_eq!(failure.receive_count, 3, "the attempt count");
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_send_is_acknowledged_without_running() {
    let log = Log::new();
    let queue = queue("dupes");
    let store = Arc::new(MemoryIdempotencyStore::new());
    queue
        .push_message(keyed_message("plain", &job(1), "welcome:42"))
        .unwrap();
    let running = start(store_worker(config(&[("dupes", 1)]), &log, &queue, &store));
    eventually(30, "the first run", || {
        log.count(Kind::Succeeded) == 1 && queue.is_empty()
    })
    .await;
    queue
        .push_message(keyed_message("plain", &job(2), "welcome:42"))
        .unwrap();
    eventually(30, "the duplicate's delete", || {
        queue.is_empty() && running.status.report().duplicates == 1
    })
    .await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Started), 1);
    assert_eq!((report.succeeded, report.duplicates), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_job_longer_than_the_visibility_timeout_runs_once_across_two_workers() {
    let log = Log::new();
    let visibility = Duration::from_secs(10);
    let queue = Arc::new(MemoryQueue::standard("long").with_visibility_timeout(visibility));
    let store = Arc::new(MemoryIdempotencyStore::new());
    queue
        .push_message(message("plain", &slow_job(1, 25_000)))
        .unwrap();
    let worker = |log: &Arc<Log>| {
        let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(log)))
            .with_store(store.clone() as Arc<dyn IdempotencyStore>);
        let config = config(&[("long", 1)]);
        Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap()
    };
    let first = start(worker(&log));
    let second = start(worker(&log));
    eventually(30, "the job to finish and be deleted", || {
        log.count(Kind::Succeeded) == 1 && queue.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (a, b) = (first.stop().await, second.stop().await);
    assert_eq!(log.count(Kind::Started), 1, "exactly once: {:?}", log.events());
    assert_eq!(a.received + b.received, 1);
    assert!(
        a.heartbeat_extensions + b.heartbeat_extensions >= 3,
        "{a:?} {b:?}"
    );
    assert_eq!(a.leases_lost + b.leases_lost, 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_running_jobs_and_releases_unstarted_ones_at_once() {
    let log = Log::new();
    let queue = queue("drain");
    for id in 0..30 {
        queue.push_message(message("slow", &slow_job(id, 8_000))).unwrap();
    }
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Slow>::new(&log)));
    let config = config(&[("drain", 1)]).with_max_in_flight(20);
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>])
        .unwrap()
        .limit_job_type("slow", 5);
    let running = start(worker);
    eventually(10, "5 running and 20 received", || {
        log.count(Kind::Started) == 5 && running.status.in_flight() == 20
    })
    .await;
    let started_at_shutdown: HashSet<u64> = log.ids(Kind::Started).into_iter().collect();
    let shutdown_at = Instant::now();
    running.shutdown.cancel();
    eventually(1, "the 15 waiting messages to be visible again", || {
        queue.counts().visible == 25
    })
    .await;
    assert!(Instant::now() - shutdown_at < Duration::from_secs(1));
    assert_eq!(
        log.count(Kind::Succeeded),
        0,
        "released before the running jobs finished"
    );
    let report = running.handle.await.unwrap().unwrap();

    let succeeded: HashSet<u64> = log.ids(Kind::Succeeded).into_iter().collect();
    assert_eq!(succeeded, started_at_shutdown, "the running jobs finished");
    assert_eq!(log.count(Kind::Started), 5, "nothing started after the shutdown");
    let left: HashSet<u64> = queue
        .snapshot()
        .iter()
        .map(|message| serde_json::from_str::<TestJob>(&message.body).unwrap().id)
        .collect();
    let all: HashSet<u64> = (0..30).collect();
    assert_eq!(
        left,
        &all - &succeeded,
        "exactly the unprocessed messages are left"
    );
    assert!(
        queue
            .snapshot()
            .iter()
            .all(|message| message.state == MessageState::Visible)
    );
    assert_eq!((report.succeeded, report.released_at_shutdown), (5, 15));
}

#[tokio::test(start_paused = true)]
async fn past_the_drain_deadline_jobs_are_cancelled_and_their_claims_released() {
    let log = Log::new();
    let queue = queue("deadline");
    let store = Arc::new(MemoryIdempotencyStore::new());
    queue
        .push_message(message("plain", &slow_job(1, 600_000)))
        .unwrap();
    let stubborn = TestJob {
        stubborn: true,
        ..slow_job(2, 600_000)
    };
    queue.push_message(message("plain", &stubborn)).unwrap();
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)))
        .with_store(store.clone() as Arc<dyn IdempotencyStore>);
    let config = config(&[("deadline", 1)]).with_drain_deadline(Some(Duration::from_secs(3)));
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap();
    let running = start(worker);
    eventually(10, "both jobs running", || log.count(Kind::Started) == 2).await;
    assert_eq!(store.records().len(), 2, "both claimed");
    let shutdown_at = Instant::now();
    let report = running.stop().await;
    let took = Instant::now() - shutdown_at;
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert_eq!(log.count(Kind::Cancelled), 1, "the cooperative job saw its token");
    assert_eq!(report.released_at_shutdown, 2);
    let now = std::time::SystemTime::now();
    assert!(
        store.records().iter().all(|record| record.is_free_at(now)),
        "claims released (free to claim at once): {:?}",
        store.records()
    );
    assert_eq!(
        queue.counts().visible,
        2,
        "both messages are visible again at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_signal_skips_the_drain() {
    let log = Log::new();
    let queue = queue("immediate");
    queue
        .push_message(message("plain", &slow_job(1, 600_000)))
        .unwrap();
    let worker = plain_worker(config(&[("immediate", 1)]), &log, &queue);
    let (graceful, immediate) = (CancellationToken::new(), CancellationToken::new());
    let handle = tokio::spawn(worker.run_with(graceful.clone(), immediate.clone()));
    eventually(10, "the job to start", || log.count(Kind::Started) == 1).await;
    let began = Instant::now();
    graceful.cancel();
    tokio::time::sleep(Duration::from_secs(1)).await;
    immediate.cancel();
    let report = handle.await.unwrap().unwrap();
    assert!(
        Instant::now() - began < Duration::from_secs(3),
        "did not wait for the 10 s drain"
    );
    assert_eq!(report.released_at_shutdown, 1);
    assert_eq!(queue.counts().visible, 1);
}

#[tokio::test(start_paused = true)]
async fn fifo_groups_run_in_order_and_a_failure_sends_the_rest_back_in_order() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::fifo("orders").with_visibility_timeout(Duration::from_secs(30)));
    for id in 1..=5 {
        let mut script = slow_job(id, 100);
        if id == 2 {
            script.fail = Fail::RetryAfter(3);
            script.fail_until = 1;
        }
        queue.push_message(fifo_message("plain", &script, "a")).unwrap();
        queue
            .push_message(fifo_message("plain", &slow_job(100 + id, 100), "b"))
            .unwrap();
    }
    let worker = plain_worker(config(&[("orders.fifo", 1)]), &log, &queue);
    let running = start(worker);
    eventually(60, "all ten to succeed", || log.count(Kind::Succeeded) == 10).await;
    eventually(5, "the deletes", || queue.is_empty()).await;
    let report = running.stop().await;

    let succeeded = log.ids(Kind::Succeeded);
    let group_a: Vec<u64> = succeeded.iter().copied().filter(|id| *id < 100).collect();
    let group_b: Vec<u64> = succeeded.iter().copied().filter(|id| *id > 100).collect();
    assert_eq!(group_a, vec![1, 2, 3, 4, 5]);
    assert_eq!(group_b, vec![101, 102, 103, 104, 105]);
    let starts = log.ids(Kind::Started);
    assert_eq!(
        starts.iter().filter(|id| **id == 1).count(),
        1,
        "done once, not replayed"
    );
    assert_eq!(
        starts.iter().filter(|id| **id == 2).count(),
        2,
        "failed once, then succeeded"
    );
    for later in 3..=5 {
        assert_eq!(
            starts.iter().filter(|id| **id == later).count(),
            1,
            "{later} never ran before 2 succeeded"
        );
    }
    // Groups run in parallel: group b finished while group a waited out its retry delay.
    let events = log.events();
    let b_done = events
        .iter()
        .find(|e| e.id == 105 && e.kind == Kind::Succeeded)
        .unwrap()
        .at;
    let a_done = events
        .iter()
        .find(|e| e.id == 2 && e.kind == Kind::Succeeded)
        .unwrap()
        .at;
    assert!(b_done < a_done);
    assert!(report.fifo_requeued >= 3, "{report:?}");
}

/// Runs a backlog of 200 low-priority jobs, adds 10 high-priority ones, and counts how many
/// low-priority jobs finished between the high ones' arrival and the last high one's finish.
async fn low_jobs_finished_while_urgent_work_waited(priority: PriorityMode) -> usize {
    let log = Log::new();
    let high = queue("high");
    let low = queue("low");
    for id in 0..200 {
        low.push_message(message("backlog", &slow_job(id, 100))).unwrap();
    }
    let pipeline = Pipeline::new(
        Router::new()
            .route(Recorder::<Backlog>::new(&log))
            .route(Recorder::<Urgent>::new(&log)),
    );
    let config = config(&[("high", 10), ("low", 1)]).with_priority(priority);
    let queues = vec![high.clone() as Arc<dyn Queue>, low.clone() as Arc<dyn Queue>];
    let running = start(Worker::new(config, pipeline, queues).unwrap());
    eventually(60, "the backlog to be under way", || {
        log.count_of("backlog", Kind::Succeeded) >= 20
    })
    .await;
    let arrived = Instant::now();
    for id in 0..10 {
        high.push_message(message("urgent", &slow_job(1000 + id, 100)))
            .unwrap();
    }
    eventually(60, "the urgent jobs", || {
        log.count_of("urgent", Kind::Succeeded) == 10
    })
    .await;
    let events = log.events();
    let last_urgent = events
        .iter()
        .filter(|event| event.job_type == "urgent" && event.kind == Kind::Succeeded)
        .map(|event| event.at)
        .max()
        .unwrap();
    running.stop().await;
    events
        .iter()
        .filter(|event| event.job_type == "backlog" && event.kind == Kind::Succeeded)
        .filter(|event| event.at > arrived && event.at <= last_urgent)
        .count()
}

#[tokio::test(start_paused = true)]
async fn strict_priority_puts_urgent_jobs_ahead_of_a_backlog() {
    let overtaken = low_jobs_finished_while_urgent_work_waited(PriorityMode::Strict).await;
    // 9 backlog jobs were already running when the urgent ones arrived; they may finish. Sharing
    // freed slots evenly would let about 18 finish first; a FIFO of messages, 180.
    assert!(
        overtaken <= 10,
        "{overtaken} backlog jobs finished before the last urgent one"
    );
}

#[tokio::test(start_paused = true)]
async fn weighted_priority_puts_urgent_jobs_ahead_of_a_backlog() {
    let overtaken = low_jobs_finished_while_urgent_work_waited(PriorityMode::Weighted).await;
    assert!(
        overtaken <= 10,
        "{overtaken} backlog jobs finished before the last urgent one"
    );
}

#[tokio::test(start_paused = true)]
async fn weighted_sharing_follows_the_weights_under_two_backlogs() {
    let log = Log::new();
    let heavy = queue("heavy");
    let light = queue("light");
    for id in 0..300 {
        heavy.push_message(message("urgent", &slow_job(id, 100))).unwrap();
        light
            .push_message(message("backlog", &slow_job(id, 100)))
            .unwrap();
    }
    let pipeline = Pipeline::new(
        Router::new()
            .route(Recorder::<Backlog>::new(&log))
            .route(Recorder::<Urgent>::new(&log)),
    );
    let config = config(&[("heavy", 3), ("light", 1)]).with_max_in_flight(20);
    let queues = vec![heavy.clone() as Arc<dyn Queue>, light.clone() as Arc<dyn Queue>];
    let running = start(Worker::new(config, pipeline, queues).unwrap());
    eventually(60, "200 jobs", || log.count(Kind::Succeeded) >= 200).await;
    running.stop().await;
    let (heavy_done, light_done) = (
        log.count_of("urgent", Kind::Succeeded) as f64,
        log.count_of("backlog", Kind::Succeeded) as f64,
    );
    let ratio = heavy_done / light_done;
    assert!(
        (2.5..=4.0).contains(&ratio),
        "3:1 weights gave {heavy_done}:{light_done}"
    );
}

#[tokio::test(start_paused = true)]
async fn receive_errors_back_off_then_processing_resumes() {
    let log = Log::new();
    let queue = queue("flaky");
    queue.set_unavailable(true);
    let running = start(plain_worker(config(&[("flaky", 1)]), &log, &queue));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!running.status.is_ready());
    let attempts = queue.requests().receive;
    // Backoff doubles to 20 s: about 10 tries in a minute, not thousands.
    assert!(
        (5..=15).contains(&attempts),
        "{attempts} receive attempts in 60 s"
    );
    queue.set_unavailable(false);
    queue.push_message(message("plain", &job(1))).unwrap();
    eventually(30, "processing to resume", || {
        log.count(Kind::Succeeded) == 1 && queue.is_empty()
    })
    .await;
    assert!(running.status.is_ready());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_job_type_concurrency_limit_holds() {
    let log = Log::new();
    let queue = queue("limited");
    for id in 0..10 {
        queue.push_message(message("slow", &slow_job(id, 1_000))).unwrap();
        queue
            .push_message(message("plain", &slow_job(100 + id, 1_000)))
            .unwrap();
    }
    let pipeline = Pipeline::new(
        Router::new()
            .route(Recorder::<Slow>::new(&log))
            .route(Recorder::<Plain>::new(&log)),
    );
    let config = config(&[("limited", 1)]).with_max_in_flight(20);
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>])
        .unwrap()
        .limit_job_type("slow", 2);
    let running = start(worker);
    eventually(60, "all jobs", || log.count(Kind::Succeeded) == 20).await;
    running.stop().await;
    assert_eq!(log.max_concurrent("slow"), 2);
    assert!(
        log.max_concurrent("plain") >= 5,
        "other job types are not held back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_paces_starts() {
    let log = Log::new();
    let queue = queue("paced");
    for id in 0..7 {
        queue.push_message(message("plain", &job(id))).unwrap();
    }
    let worker = plain_worker(config(&[("paced", 1)]), &log, &queue).rate_limit_job_type("plain", 2.0, 1);
    let running = start(worker);
    eventually(60, "all jobs", || log.count(Kind::Succeeded) == 7).await;
    running.stop().await;
    let starts: Vec<Instant> = log
        .events()
        .iter()
        .filter(|e| e.kind == Kind::Started)
        .map(|e| e.at)
        .collect();
    let spread = *starts.iter().max().unwrap() - *starts.iter().min().unwrap();
    assert!(
        spread >= Duration::from_millis(2_900),
        "7 starts at 2/s took {spread:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_defers_jobs_unrun_until_a_probe_succeeds() {
    let log = Log::new();
    let down = Arc::new(AtomicBool::new(true));
    let queue = Arc::new(
        MemoryQueue::standard("provider")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(Arc::new(MemoryQueue::standard("provider-dlq")), 100),
    );
    for id in 0..10 {
        queue.push_message(message("email", &job(id))).unwrap();
    }
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Email>::with_downstream(&log, &down)));
    let config = config(&[("provider", 1)]).with_max_in_flight(1);
    let settings = BreakerSettings::default()
        .with_failure_threshold(3)
        .with_open_for(Duration::from_secs(10))
        .with_max_open_for(Duration::from_secs(20));
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>])
        .unwrap()
        .circuit_breaker("email-provider", &["email"], settings);
    let running = start(worker);
    eventually(10, "the circuit to open", || log.count(Kind::Failed) == 3).await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        log.count(Kind::Started),
        3,
        "no handler call while the circuit is open"
    );
    assert!(running.status.report().circuit_deferred >= 1);
    // The probe after 10 s fails: open again, now for 20 s.
    eventually(10, "the first probe", || log.count(Kind::Started) == 4).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(log.count(Kind::Started), 4);
    down.store(false, Ordering::SeqCst);
    eventually(120, "everything once the provider is back", || {
        log.count(Kind::Succeeded) == 10 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Failed), 4, "3 failures opened it, 1 failed probe");
    assert_eq!(report.succeeded, 10);
}

#[tokio::test(start_paused = true)]
async fn fifo_followers_go_back_at_once_on_shutdown() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::fifo("stop").with_visibility_timeout(Duration::from_secs(30)));
    for id in 1..=4 {
        queue
            .push_message(fifo_message("plain", &slow_job(id, 5_000), "g"))
            .unwrap();
    }
    let running = start(plain_worker(config(&[("stop.fifo", 1)]), &log, &queue));
    eventually(10, "the first job to start", || log.count(Kind::Started) == 1).await;
    running.shutdown.cancel();
    eventually(1, "the 3 followers to be visible", || queue.counts().visible == 3).await;
    let report = running.handle.await.unwrap().unwrap();
    assert_eq!(log.ids(Kind::Succeeded), vec![1]);
    assert_eq!((report.succeeded, report.released_at_shutdown), (1, 3));
    let bodies: Vec<u64> = queue
        .snapshot()
        .iter()
        .map(|message| serde_json::from_str::<TestJob>(&message.body).unwrap().id)
        .collect();
    assert_eq!(bodies, vec![2, 3, 4]);
}

#[tokio::test]
async fn queues_must_line_up_with_the_config() {
    let log = Log::new();
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)));
    let error = Worker::new(
        config(&[("a", 1), ("b", 1)]),
        pipeline,
        vec![queue("a") as Arc<dyn Queue>],
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("1 queue(s)") && error.contains("lists 2"),
        "{error}"
    );
}

/// Point 2 of the FIFO rules: a failed head is retried in place while its group waits, its runs
/// counted by the store, so the messages received behind it spend no receive, and it reaches the DLQ
/// after `maxReceiveCount` runs at its first receive.
#[tokio::test(start_paused = true)]
async fn a_failed_fifo_head_is_retried_in_place_and_its_followers_spend_no_receive() {
    let log = Log::new();
    let dlq = Arc::new(MemoryQueue::fifo("orders-dlq"));
    let queue = Arc::new(
        MemoryQueue::fifo("orders")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq, 3),
    );
    let head = TestJob {
        id: 1,
        fail: Fail::RetryAfter(2),
        fail_until: u32::MAX,
        ..TestJob::default()
    };
    queue.push_message(fifo_message("plain", &head, "a")).unwrap();
    for id in 2..=3 {
        queue.push_message(fifo_message("plain", &job(id), "a")).unwrap();
    }
    let store = Arc::new(MemoryIdempotencyStore::new());
    let running = start(store_worker(config(&[("orders.fifo", 1)]), &log, &queue, &store));
    eventually(120, "the followers' runs and the head's DLQ copy", || {
        log.count(Kind::Succeeded) == 2 && queue.messages_in_dlq().len() == 1 && queue.is_empty()
    })
    .await;
    running.stop().await;

    let events = log.events();
    let starts: Vec<(u64, u32)> = events
        .iter()
        .filter(|event| event.kind == Kind::Started)
        .map(|event| (event.id, event.receive_count))
        .collect();
    assert_eq!(
        starts,
        vec![(1, 1), (1, 1), (1, 1), (2, 1), (3, 1)],
        "three runs of the head at its first receive, then the followers, each at its first receive"
    );
    let failure = first_dlq_failure(&queue);
    assert!(failure.retries_exhausted, "{failure:?}");
    assert!(failure.error.contains("attempt 3 of the 3"), "{}", failure.error);
}

/// The retry budget counts runs, not receives (issue 51, rule 3): a FIFO message whose receives went
/// by unrun (it waited behind its group, say) gets all its runs at its last receive, retried in place,
/// instead of one run labelled "retries exhausted".
#[tokio::test(start_paused = true)]
async fn a_fifo_message_at_its_last_receive_still_gets_every_run_of_its_budget() {
    let log = Log::new();
    let dlq = Arc::new(MemoryQueue::fifo("orders-dlq"));
    let queue = Arc::new(
        MemoryQueue::fifo("orders")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq, 3),
    );
    let failing = TestJob {
        id: 1,
        fail: Fail::RetryAfter(2),
        fail_until: u32::MAX,
        ..TestJob::default()
    };
    queue.push_message(fifo_message("plain", &failing, "a")).unwrap();
    for _ in 0..2 {
        assert_eq!(queue.receive(1, Duration::ZERO).await.unwrap().len(), 1);
        tokio::time::advance(Duration::from_secs(31)).await;
    }
    let store = Arc::new(MemoryIdempotencyStore::new());
    let running = start(store_worker(config(&[("orders.fifo", 1)]), &log, &queue, &store));
    eventually(120, "the job's DLQ copy", || {
        queue.messages_in_dlq().len() == 1 && queue.is_empty()
    })
    .await;
    running.stop().await;

    let starts: Vec<(u64, u32)> = log
        .events()
        .iter()
        .filter(|event| event.kind == Kind::Started)
        .map(|event| (event.id, event.receive_count))
        .collect();
    assert_eq!(
        starts,
        vec![(1, 3), (1, 3), (1, 3)],
        "three runs at its third (last) receive"
    );
    let failure = first_dlq_failure(&queue);
    assert!(failure.retries_exhausted, "{failure:?}");
    assert!(failure.error.contains("attempt 3 of the 3"), "{}", failure.error);
}

#[tokio::test(start_paused = true)]
async fn a_message_past_twelve_hours_from_its_first_receive_goes_on_as_a_fresh_copy() {
    // SQS's 12 hours of visibility count from the first receive (the stricter reading): a message
    // received again after them can be held no longer than this receive's visibility timeout, so the
    // worker sends a fresh copy (unrun, its earlier run carried) instead of running it there.
    let log = Log::new();
    let queue = queue("aged");
    queue.push_message(message("plain", &job(1))).unwrap();
    let first = queue.receive(1, Duration::ZERO).await.unwrap();
    assert_eq!(first.len(), 1, "the first receive starts SQS's 12 hours");
    tokio::time::advance(Duration::from_secs(12 * 3600 + 60)).await;
    let running = start(plain_worker(config(&[("aged", 1)]), &log, &queue));
    eventually(120, "the job ran once and the queue is empty", || {
        log.count(Kind::Succeeded) == 1 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Started), 1, "run once, on the copy");
    assert_eq!(
        report.deferred, 1,
        "the aged receipt went on as a copy: {report:?}"
    );
    assert_eq!(
        queue.requests().change_visibility,
        0,
        "no visibility change past the limit"
    );
}
