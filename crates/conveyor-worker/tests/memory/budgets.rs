//! Issue 10's regressions, on `MemoryQueue` (strict like SQS) under a paused clock: every time budget
//! the long-poll path depends on is derived from the queue and enforced, not assumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conveyor_core::{
    port::{IdempotencyStore, Queue},
    {Pipeline, Router},
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, MessageState, ScriptedQueue};
use conveyor_worker::{BreakerSettings, Worker};
use tokio::time::Instant;

use common::*;

fn dlq_queue(name: &str, visibility_secs: u64, max_receive_count: u32) -> Arc<MemoryQueue> {
    let dlq = Arc::new(MemoryQueue::standard(&format!("{name}-dlq")));
    Arc::new(
        MemoryQueue::standard(name)
            .with_visibility_timeout(Duration::from_secs(visibility_secs))
            .with_dead_letter_queue(dlq, max_receive_count),
    )
}

/// SQS's defaults (30 s), two workers with default settings, a 45 s job: it runs once. The worker used
/// to assume 60 s and extend too late, so the second worker received the message at 30 s.
#[tokio::test(start_paused = true)]
async fn a_job_longer_than_the_queues_own_visibility_runs_once_on_two_default_workers() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("defaults").with_visibility_timeout(Duration::from_secs(30)));
    let store = Arc::new(MemoryIdempotencyStore::new());
    queue
        .push_message(message("plain", &slow_job(1, 45_000)))
        .unwrap();
    let worker = || {
        let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)))
            .with_store(store.clone() as Arc<dyn IdempotencyStore>);
        let config = config(&[("defaults", 1)]).with_listen_addr(None);
        assert_eq!(
            config.visibility_timeout, None,
            "no override: the queue's own is used"
        );
        start(Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap())
    };
    let (first, second) = (worker(), worker());
    eventually(120, "the job to finish and be deleted", || {
        log.count(Kind::Succeeded) == 1 && queue.is_empty()
    })
    .await;
    let (a, b) = (first.stop().await, second.stop().await);
    assert_eq!(log.count(Kind::Started), 1, "ran once");
    assert_eq!(a.received + b.received, 1, "never delivered to the second worker");
    assert!(a.heartbeat_extensions + b.heartbeat_extensions >= 2);
}

#[tokio::test(start_paused = true)]
async fn a_queue_too_short_for_the_heartbeat_is_refused_with_the_fix() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("short").with_visibility_timeout(Duration::from_secs(5)));
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)));
    let error = Worker::new(
        config(&[("short", 1)]),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("queue short"), "{error}");
    assert!(error.contains("at least 10s"), "{error}");
    assert!(error.contains("CONVEYOR_VISIBILITY_TIMEOUT_SECS"), "{error}");

    // The override is what every receive sends: the short queue works with it.
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)));
    let config = config(&[("short", 1)]).with_visibility_timeout(Some(Duration::from_secs(40)));
    queue
        .push_message(message("plain", &slow_job(1, 20_000)))
        .unwrap();
    let running = start(Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>]).unwrap());
    eventually(5, "the job to start", || log.count(Kind::Started) == 1).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        queue.snapshot()[0].state,
        MessageState::InFlight,
        "40 s applied, not the queue's 5 s"
    );
    assert_eq!(
        running.status.report().heartbeat_extensions,
        0,
        "no extension needed within 40 s"
    );
    eventually(30, "the job", || queue.is_empty()).await;
    running.stop().await;
    assert_eq!(log.count(Kind::Started), 1);
}

/// A 10-minute downstream outage with `maxReceiveCount` 5: the circuit defers jobs without spending
/// their receives, so none reaches the DLQ and each runs once it is back.
#[tokio::test(start_paused = true)]
async fn a_ten_minute_outage_behind_a_circuit_breaker_dead_letters_nothing() {
    let log = Log::new();
    let down = Arc::new(AtomicBool::new(true));
    let queue = dlq_queue("outage", 30, 5);
    for id in 0..20 {
        queue.push_message(message("email", &job(id))).unwrap();
    }
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Email>::with_downstream(&log, &down)));
    let settings = BreakerSettings::default()
        .with_failure_threshold(3)
        .with_open_for(Duration::from_secs(30))
        .with_max_open_for(Duration::from_secs(120));
    let worker = Worker::new(
        config(&[("outage", 1)]),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap()
    .circuit_breaker("email-provider", &["email"], settings);
    let running = start(worker);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        queue.messages_in_dlq().is_empty(),
        "nothing dead-lettered during the outage"
    );
    down.store(false, Ordering::SeqCst);
    eventually(900, "every job once the provider is back", || {
        log.count(Kind::Succeeded) == 20 && queue.is_empty()
    })
    .await;
    let report = running.stop().await;
    assert!(queue.messages_in_dlq().is_empty());
    assert_eq!(report.succeeded, 20);
    assert!(report.deferred > 0, "{report:?}");
    let mut ids = log.ids(Kind::Succeeded);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 20, "each once");
}

/// A duplicate of a 10-minute job in progress on another worker is deferred without spending
/// receives, and acknowledged once the holder completes: never dead-lettered.
#[tokio::test(start_paused = true)]
async fn a_duplicate_of_a_long_job_in_progress_never_reaches_the_dlq() {
    let log = Log::new();
    let queue = dlq_queue("dupe", 30, 3);
    let store = Arc::new(MemoryIdempotencyStore::new());
    queue
        .push_message(keyed_message("plain", &slow_job(1, 600_000), "report:1"))
        .unwrap();
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)))
        .with_store(store.clone() as Arc<dyn IdempotencyStore>);
    let running = start(
        Worker::new(
            config(&[("dupe", 1)]),
            pipeline,
            vec![queue.clone() as Arc<dyn Queue>],
        )
        .unwrap(),
    );
    eventually(5, "the job to start", || log.count(Kind::Started) == 1).await;
    queue
        .push_message(keyed_message("plain", &slow_job(1, 600_000), "report:1"))
        .unwrap();
    eventually(900, "the job and its duplicate", || queue.is_empty()).await;
    let report = running.stop().await;
    assert!(
        queue.messages_in_dlq().is_empty(),
        "the duplicate never reached the DLQ"
    );
    assert_eq!(log.count(Kind::Started), 1);
    assert_eq!((report.succeeded, report.duplicates), (1, 1), "{report:?}");
    assert!(report.deferred >= 1, "{report:?}");
}

/// Deletes failing for 20 s are retried until they succeed (they used to stop after 0.7 s, and the
/// message ran again when it reappeared); the heartbeat keeps the message invisible meanwhile.
#[tokio::test(start_paused = true)]
async fn deletes_failing_for_a_while_are_retried_until_the_receipt_expires() {
    let log = Log::new();
    let inner = Arc::new(MemoryQueue::standard("deletes").with_visibility_timeout(Duration::from_secs(30)));
    let queue = ScriptedQueue::new(Arc::clone(&inner));
    queue.fail_deletes(true);
    inner.push_message(message("plain", &job(1))).unwrap();
    let running = start(plain_worker(config(&[("deletes", 1)]), &log, &queue));
    eventually(5, "the job", || log.count(Kind::Succeeded) == 1).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        inner.snapshot()[0].state,
        MessageState::InFlight,
        "kept invisible while deleting"
    );
    queue.fail_deletes(false);
    eventually(10, "the delete", || inner.is_empty()).await;
    let report = running.stop().await;
    assert_eq!(log.count(Kind::Started), 1, "never ran again");
    assert_eq!(report.deletes_failed, 0);
}

/// In a FIFO group the next message starts only once its predecessor's delete is confirmed.
#[tokio::test(start_paused = true)]
async fn a_fifo_successor_waits_for_its_predecessors_delete() {
    let log = Log::new();
    let inner = Arc::new(MemoryQueue::fifo("ordered.fifo").with_visibility_timeout(Duration::from_secs(30)));
    let queue = ScriptedQueue::new(Arc::clone(&inner));
    queue.fail_deletes(true);
    for id in 1..=2 {
        inner.push_message(fifo_message("plain", &job(id), "g")).unwrap();
    }
    let running = start(plain_worker(config(&[("ordered.fifo", 1)]), &log, &queue));
    eventually(5, "the first job", || log.count(Kind::Succeeded) == 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        log.count(Kind::Started),
        1,
        "the second waits while the first's delete fails"
    );
    queue.fail_deletes(false);
    eventually(10, "both", || log.count(Kind::Succeeded) == 2 && inner.is_empty()).await;
    running.stop().await;
    let first_delete = queue.deleted_at()[0];
    let second_start = log
        .events()
        .into_iter()
        .find(|event| event.id == 2 && event.kind == Kind::Started)
        .unwrap()
        .at;
    assert!(
        second_start >= first_delete,
        "started before its predecessor was deleted"
    );
}

/// Waits until the worker's receive has taken the queue's only message (it is in flight).
async fn taken(inner: &MemoryQueue) {
    eventually(5, "the receive to take the message", || {
        inner
            .snapshot()
            .first()
            .is_some_and(|m| m.state == MessageState::InFlight)
    })
    .await;
}

/// A long poll in flight at shutdown that answers within the grace (SQS was answering it as the signal
/// came): what it brings is made visible again at once instead of being stranded invisible for a
/// whole visibility timeout.
#[tokio::test(start_paused = true)]
async fn a_receive_in_flight_at_shutdown_releases_what_it_brings() {
    let log = Log::new();
    let inner = Arc::new(MemoryQueue::standard("late").with_visibility_timeout(Duration::from_secs(300)));
    let queue = ScriptedQueue::new(Arc::clone(&inner));
    queue.hold_receives(true);
    let config = config(&[("late", 1)]).with_max_in_flight(1);
    let running = start(plain_worker(config, &log, &queue));
    queue.receive_started().await;
    inner.push_message(message("plain", &job(1))).unwrap();
    taken(&inner).await;
    running.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    queue.release_receive();
    let report = running.handle.await.unwrap().unwrap();
    assert_eq!(
        inner.snapshot()[0].state,
        MessageState::Visible,
        "released at once, not in 300 s"
    );
    assert_eq!(log.count(Kind::Started), 0);
    assert_eq!(report.released_at_shutdown, 1);
}

/// Issue 55: shutdown no longer waits for a long poll in flight past its grace (it waited the whole
/// 20 s). A receive that has taken a message and answers later is abandoned: the message stays in
/// flight for its visibility timeout, then comes back and runs once. Nothing is lost.
#[tokio::test(start_paused = true)]
async fn an_abandoned_receive_loses_nothing_its_message_comes_back_after_the_visibility_timeout() {
    let log = Log::new();
    let inner = Arc::new(MemoryQueue::standard("gone").with_visibility_timeout(Duration::from_secs(60)));
    let queue = ScriptedQueue::new(Arc::clone(&inner));
    queue.hold_receives(true);
    let settings = config(&[("gone", 1)]).with_max_in_flight(1);
    let running = start(plain_worker(settings.clone(), &log, &queue));
    queue.receive_started().await;
    inner.push_message(message("plain", &job(1))).unwrap();
    taken(&inner).await;
    let began = Instant::now();
    running.shutdown.cancel();
    let report = running.handle.await.unwrap().unwrap();
    let took = began.elapsed();
    assert!(took <= Duration::from_secs(2), "shutdown took {took:?}");
    assert_eq!((log.count(Kind::Started), report.released_at_shutdown), (0, 0));
    assert_eq!(inner.snapshot()[0].state, MessageState::InFlight);

    queue.hold_receives(false);
    let next = start(plain_worker(settings, &log, &inner));
    eventually(120, "the message to come back and run", || {
        log.count(Kind::Succeeded) == 1
    })
    .await;
    assert!(
        began.elapsed() >= Duration::from_secs(55),
        "came back only after its visibility timeout"
    );
    next.stop().await;
    assert_eq!(log.count(Kind::Started), 1, "ran once");
    assert_eq!(inner.counts().visible + inner.counts().in_flight, 0, "deleted");
}

/// An idle worker with its 20 s long polls in flight stops within about a second of shutdown (it
/// waited for them: up to 20 s, or the drain deadline).
#[tokio::test(start_paused = true)]
async fn an_idle_worker_stops_within_a_second_of_shutdown() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("idle").with_visibility_timeout(Duration::from_secs(300)));
    let config = config(&[("idle", 1)]).with_max_in_flight(40);
    let running = start(plain_worker(config, &log, &queue));
    eventually(5, "the worker to run", || running.status.is_ready()).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let began = Instant::now();
    let report = running.stop().await;
    let took = began.elapsed();
    assert!(took <= Duration::from_millis(1_100), "shutdown took {took:?}");
    assert_eq!(report.received, 0);
}

/// A message sent while an idle worker stops is received by a long poll still in its grace and made
/// visible again at once, without running: never stranded, and the shutdown still takes about a second.
#[tokio::test(start_paused = true)]
async fn a_message_sent_during_the_shutdown_is_visible_again_at_once() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("idle").with_visibility_timeout(Duration::from_secs(300)));
    let config = config(&[("idle", 1)]).with_max_in_flight(40);
    let running = start(plain_worker(config, &log, &queue));
    eventually(5, "the worker to run", || running.status.is_ready()).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let began = Instant::now();
    running.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    queue.push_message(message("plain", &job(1))).unwrap();
    let report = running.handle.await.unwrap().unwrap();
    let took = began.elapsed();
    assert!(took <= Duration::from_secs(2), "shutdown took {took:?}");
    assert_eq!(log.count(Kind::Started), 0, "nothing runs after the shutdown");
    // Released once per long poll that took it: a release wakes the other loop's poll, which takes
    // and releases it again.
    assert!(
        report.released_at_shutdown >= 1,
        "a long poll took it and released it: {report:?}"
    );
    assert_eq!(queue.counts().visible, 1, "visible again at once");
}

/// Shutdown fits in the stop timeout: a job that ignores cancellation cannot stretch it.
#[tokio::test(start_paused = true)]
async fn shutdown_fits_in_the_stop_timeout() {
    let log = Log::new();
    let queue = Arc::new(MemoryQueue::standard("stop").with_visibility_timeout(Duration::from_secs(30)));
    let stubborn = TestJob {
        stubborn: true,
        ..slow_job(1, 3_600_000)
    };
    queue.push_message(message("plain", &stubborn)).unwrap();
    let config = config(&[("stop", 1)])
        .with_drain_deadline(None)
        .with_stop_timeout(Duration::from_secs(30));
    let running = start(plain_worker(config, &log, &queue));
    eventually(5, "the job", || log.count(Kind::Started) == 1).await;
    let began = Instant::now();
    running.shutdown.cancel();
    running.handle.await.unwrap().unwrap();
    let took = began.elapsed();
    assert!(took <= Duration::from_secs(30), "shutdown took {took:?}");
    assert!(
        took >= Duration::from_secs(23),
        "the drain deadline is what fits: {took:?}"
    );
}
