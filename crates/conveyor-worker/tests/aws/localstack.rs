//! The worker against LocalStack (SQS) and DynamoDB Local, real clock: outcome paths, heartbeats,
//! shutdown under load, FIFO order under failures, and priorities under a backlog.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::aws::{self, connect, send_all, visible_ids};
use common::*;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::port::idempotency_key;
use conveyor_core::{
    port::{Queue, RecordStatus},
    {Pipeline, Router},
};
use conveyor_testing::faults::{Fault, Faults, Rule, with_faults_sqs};
use conveyor_testing::localstack::{QueueSpec, create_queue};
use conveyor_worker::Worker;
use conveyor_worker::config::PriorityMode;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_path_against_localstack() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::standard("outcomes").max_receive_count(5))
        .await
        .unwrap();
    let queue = connect(&client, &created.url).await;
    let dlq = connect(&client, created.dlq_url.as_deref().unwrap()).await;
    let store = aws::store().await;
    let log = Log::new();
    let pipeline =
        Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log))).with_store(Arc::clone(&store));
    let worker = Worker::new(
        aws::config(&[(&created.url, 1)]),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap();

    let mut messages: Vec<_> = (1..=5).map(|id| message("plain", &job(id))).collect();
    let flaky = TestJob {
        id: 10,
        fail: Fail::RetryAfter(1),
        fail_until: 1,
        ..TestJob::default()
    };
    messages.push(message("plain", &flaky));
    let poison = TestJob {
        id: 13,
        fail: Fail::Permanent,
        ..TestJob::default()
    };
    messages.push(message("plain", &poison));
    let mut garbage = message("plain", &job(14));
    garbage.body = "{not json".into();
    messages.push(garbage);
    messages.push(keyed_message("plain", &job(20), "welcome:42"));
    send_all(&queue, messages).await;

    let running = start(worker);
    eventually(30, "the first round", || log.count(Kind::Succeeded) == 7).await;
    send_all(&queue, vec![keyed_message("plain", &job(21), "welcome:42")]).await;
    eventually(30, "the duplicate", || running.status.report().duplicates == 1).await;
    let depth_is_zero = async || queue.depth().await.unwrap() == conveyor_core::port::QueueDepth::default();
    conveyor_testing::wait_until(Duration::from_secs(10), Duration::from_millis(100), depth_is_zero)
        .await
        .unwrap();
    let report = running.stop().await;

    let starts = log.ids(Kind::Started);
    let runs = |id: u64| starts.iter().filter(|started| **started == id).count();
    assert!((1..=5).all(|id| runs(id) == 1), "{starts:?}");
    assert_eq!(runs(10), 2, "failed once, retried once");
    assert_eq!(runs(13), 1, "the poison message ran once");
    assert_eq!((runs(14), runs(20), runs(21)), (0, 1, 0));
    assert_eq!(report.succeeded, 7);
    assert_eq!(
        (report.retried, report.dead_lettered, report.duplicates),
        (1, 2, 1)
    );

    let dead = dlq.receive(10, Duration::from_secs(2)).await.unwrap();
    let mut reasons: Vec<String> = dead
        .iter()
        .map(|message| message.string_attribute(FAILURE_ATTRIBUTE).unwrap().to_owned())
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().any(|reason| reason.contains("poison")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|reason| reason.contains("not a valid plain job")),
        "{reasons:?}"
    );

    let record = store
        .get(&idempotency_key("plain", Some("welcome:42"), ""))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output.as_deref(), Some("20"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_the_visibility_timeout_is_done_once() {
    let client = aws::sqs().await;
    let created = create_queue(
        &client,
        &QueueSpec::standard("long-job").visibility_timeout_secs(10),
    )
    .await
    .unwrap();
    let store = aws::store().await;
    let log = Log::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let queue = connect(&client, &created.url).await;
        let pipeline =
            Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log))).with_store(Arc::clone(&store));
        // The worker takes the visibility timeout from the queue (10 s) and sends it with each receive.
        let config = aws::config(&[(&created.url, 1)]);
        workers.push(start(
            Worker::new(config, pipeline, vec![queue as Arc<dyn Queue>]).unwrap(),
        ));
    }
    let queue = connect(&client, &created.url).await;
    send_all(&queue, vec![message("plain", &slow_job(1, 14_000))]).await;
    eventually(30, "the job", || log.count(Kind::Succeeded) == 1).await;
    // Once the message is deleted it cannot be delivered again: wait for that, then count the runs.
    conveyor_testing::wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        queue
            .depth()
            .await
            .is_ok_and(|depth| depth == conveyor_core::port::QueueDepth::default())
    })
    .await
    .unwrap();
    let mut extensions = 0;
    for worker in workers {
        let report = worker.stop().await;
        extensions += report.heartbeat_extensions;
        assert_eq!(report.leases_lost, 0);
    }
    assert_eq!(log.count(Kind::Started), 1, "exactly once: {:?}", log.events());
    assert!(
        extensions >= 2,
        "{extensions} extensions for a 14 s job at 10 s visibility (one when a third is left: at ~7 s and ~13 s)"
    );
    assert_eq!(
        queue.depth().await.unwrap(),
        conveyor_core::port::QueueDepth::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_load_finishes_running_jobs_and_releases_the_rest() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::standard("sigterm"))
        .await
        .unwrap();
    let queue = connect(&client, &created.url).await;
    send_all(
        &queue,
        (0..30).map(|id| message("slow", &slow_job(id, 3_000))).collect(),
    )
    .await;
    let log = Log::new();
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Slow>::new(&log)));
    let config = aws::config(&[(&created.url, 1)]).with_max_in_flight(20);
    let worker = Worker::new(config, pipeline, vec![queue.clone() as Arc<dyn Queue>])
        .unwrap()
        .limit_job_type("slow", 5);
    let running = start(worker);
    eventually(20, "5 running and 20 received", || {
        log.count(Kind::Started) == 5 && running.status.in_flight() == 20
    })
    .await;
    let started: HashSet<u64> = log.ids(Kind::Started).into_iter().collect();
    running.shutdown.cancel();
    let released_at_once = async || queue.depth().await.is_ok_and(|depth| depth.visible == 25);
    conveyor_testing::wait_until(
        Duration::from_secs(2),
        Duration::from_millis(50),
        released_at_once,
    )
    .await
    .unwrap();
    assert_eq!(
        log.count(Kind::Succeeded),
        0,
        "released before the running jobs finished"
    );
    let report = running.handle.await.unwrap().unwrap();
    let succeeded: HashSet<u64> = log.ids(Kind::Succeeded).into_iter().collect();
    assert_eq!(succeeded, started);
    assert_eq!((report.succeeded, report.released_at_shutdown), (5, 15));
    let all: HashSet<u64> = (0..30).collect();
    let left = visible_ids(&queue, 25, Duration::from_secs(15)).await;
    assert_eq!(
        left,
        &all - &succeeded,
        "nothing deleted unprocessed, nothing processed left"
    );
}

/// A poison message in the middle of a group goes to the DLQ and the group goes on in order; a
/// retried last message comes back after its delay. (A retry *with followers in the batch* is tested
/// against MemoryQueue: LocalStack 4.8 unlocks a FIFO group as soon as any previously received message
/// of it becomes visible again, even while another message of the group is in flight, which real SQS
/// does not do; see the crate README.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_holds_under_failures() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::fifo("fifo-order").max_receive_count(5))
        .await
        .unwrap();
    let queue = connect(&client, &created.url).await;
    let dlq = connect(&client, created.dlq_url.as_deref().unwrap()).await;
    let mut messages = Vec::new();
    for id in 1..=5 {
        let mut script = slow_job(id, 50);
        if id == 2 {
            script.fail = Fail::Permanent;
        }
        if id == 5 {
            script.fail = Fail::RetryAfter(1);
            script.fail_until = 1;
        }
        messages.push(fifo_message("plain", &script, "a"));
        messages.push(fifo_message("plain", &slow_job(100 + id, 50), "b"));
    }
    // FIFO order is send order: send one by one.
    for message in messages {
        queue.send(message).await.unwrap();
    }
    let log = Log::new();
    let running = start(plain_worker(aws::config(&[(&created.url, 1)]), &log, &queue));
    eventually(60, "all but the poison one", || log.count(Kind::Succeeded) == 9).await;
    let report = running.stop().await;
    let succeeded = log.ids(Kind::Succeeded);
    let group_a: Vec<u64> = succeeded.iter().copied().filter(|id| *id < 100).collect();
    let group_b: Vec<u64> = succeeded.iter().copied().filter(|id| *id > 100).collect();
    assert_eq!(group_a, vec![1, 3, 4, 5]);
    assert_eq!(group_b, vec![101, 102, 103, 104, 105]);
    let starts = log.ids(Kind::Started);
    let runs = |id: u64| starts.iter().filter(|started| **started == id).count();
    assert_eq!(runs(5), 2, "failed once, retried once");
    assert!([1, 2, 3, 4].iter().all(|id| runs(*id) == 1), "{starts:?}");
    let position = |id: u64| starts.iter().position(|started| *started == id).unwrap();
    assert!(
        position(2) < position(3),
        "3 ran after the poison message was settled"
    );
    assert_eq!((report.succeeded, report.dead_lettered), (9, 1));
    let dead = dlq.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]
            .string_attribute(FAILURE_ATTRIBUTE)
            .unwrap()
            .contains("poison")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_overtake_a_backlog() {
    let client = aws::sqs().await;
    let high_queue = create_queue(&client, &QueueSpec::standard("urgent"))
        .await
        .unwrap();
    let low_queue = create_queue(&client, &QueueSpec::standard("backlog"))
        .await
        .unwrap();
    let high = connect(&client, &high_queue.url).await;
    let low = connect(&client, &low_queue.url).await;
    send_all(
        &low,
        (0..200)
            .map(|id| message("backlog", &slow_job(id, 400)))
            .collect(),
    )
    .await;
    let log = Log::new();
    let pipeline = Pipeline::new(
        Router::new()
            .route(Recorder::<Backlog>::new(&log))
            .route(Recorder::<Urgent>::new(&log)),
    );
    let config =
        aws::config(&[(&high_queue.url, 10), (&low_queue.url, 1)]).with_priority(PriorityMode::Strict);
    let queues = vec![high.clone() as Arc<dyn Queue>, low.clone() as Arc<dyn Queue>];
    let running = start(Worker::new(config, pipeline, queues).unwrap());
    eventually(60, "the backlog under way", || {
        log.count_of("backlog", Kind::Succeeded) >= 20
    })
    .await;
    let arrived = Instant::now();
    send_all(
        &high,
        (0..10)
            .map(|id| message("urgent", &slow_job(1000 + id, 100)))
            .collect(),
    )
    .await;
    eventually(60, "the urgent jobs", || {
        log.count_of("urgent", Kind::Succeeded) == 10
    })
    .await;
    running.stop().await;
    let events = log.events();
    let last_urgent = events
        .iter()
        .filter(|event| event.job_type == "urgent" && event.kind == Kind::Succeeded)
        .map(|event| event.at)
        .max()
        .unwrap();
    let overtaken = events
        .iter()
        .filter(|event| event.job_type == "backlog" && event.kind == Kind::Succeeded)
        .filter(|event| event.at > arrived && event.at <= last_urgent)
        .count();
    // About 10 backlog jobs run when the urgent ones arrive; the sends themselves take a few
    // milliseconds. A backlog job takes 400 ms, longer than a receive from a loaded LocalStack, so a
    // slow receive of the urgent jobs does not let whole generations of backlog jobs finish (with
    // 100 ms jobs this counted 17 and 26 on a loaded 2-core machine, with the priority working).
    assert!(
        overtaken <= 15,
        "{overtaken} backlog jobs finished before the last urgent one"
    );
}

/// Issue 55: an idle worker (its receive loops each in a 20 s long poll) stops within about a second
/// of shutdown on LocalStack (it took 19.9 s), with 20 ms added to every SQS call (a real region's
/// latency), well within the `at_most` its shutdown line logs (8.0 s idle). Prints the figure, and
/// when a message sent just after the stop could be received again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_stops_within_about_a_second() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::standard("idle-stop").max_receive_count(5))
        .await
        .unwrap();
    let faults = Faults::new(55);
    faults.add(Rule::new(Fault::Delay(Duration::from_millis(20))));
    let queue = connect(&with_faults_sqs(&client, &faults), &created.url).await;
    let log = Log::new();
    let config = aws::config(&[(&created.url, 1)]).with_max_in_flight(100);
    let running = start(plain_worker(config, &log, &queue));
    eventually(10, "the worker to run", || running.status.is_ready()).await;
    // A long poll is on the wire (the call was made; SQS holds it up to 20 s).
    eventually(10, "a long poll in flight", || {
        faults.calls("ReceiveMessage") >= 1
    })
    .await;
    let began = Instant::now();
    let report = running.stop().await;
    let took = began.elapsed();
    println!("figure: idle shutdown on LocalStack took {took:?} (4 long polls of 20 s in flight)");
    assert!(took <= Duration::from_millis(2_500), "shutdown took {took:?}");
    assert_eq!(report.received, 0);

    // SQS keeps an abandoned long poll open until its wait ends (LocalStack too): a message sent now
    // may be taken by it, and then comes back only after its visibility timeout. Not lost.
    send_all(&queue, vec![message("plain", &job(1))]).await;
    let seen = visible_ids(&queue, 1, Duration::from_secs(90)).await;
    let back = began.elapsed();
    println!(
        "figure: a message sent just after the stop was received again {back:?} after the stop ({})",
        if back > Duration::from_secs(5) {
            "an abandoned poll took it: back after the visibility timeout"
        } else {
            "no abandoned poll took it"
        }
    );
    assert_eq!(seen.len(), 1, "not lost");
}

/// SQS takes messages up to 1 MiB since August 2025 (issue 56), and LocalStack 4.8.1 creates queues at
/// that limit: a 900 KiB job goes through inline (no S3), runs once, and, failing for good, reaches the
/// DLQ whole, its failure record added beside the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_900_kib_job_runs_and_reaches_the_dlq_whole() {
    let client = aws::sqs().await;
    let created = create_queue(&client, &QueueSpec::standard("inline-900k").max_receive_count(5))
        .await
        .unwrap();
    let queue = connect(&client, &created.url).await;
    let dlq = connect(&client, created.dlq_url.as_deref().unwrap()).await;
    let log = Log::new();
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(&log)));
    let worker = Worker::new(
        aws::config(&[(&created.url, 1)]),
        pipeline,
        vec![queue.clone() as Arc<dyn Queue>],
    )
    .unwrap();
    let poison = TestJob {
        id: 900,
        fail: Fail::Permanent,
        ..TestJob::default()
    };
    let mut large = message("plain", &poison);
    let mut body: serde_json::Value = serde_json::from_str(&large.body).unwrap();
    body["padding"] = serde_json::Value::String("x".repeat(900 * 1024));
    large.body = body.to_string();
    let size = large.body.len();
    assert!(size > 900 * 1024, "over SQS's old 256 KiB limit by far");
    send_all(&queue, vec![large]).await;

    let running = start(worker);
    eventually(30, "the large job dead-lettered", || {
        running.status.report().dead_lettered == 1
    })
    .await;
    running.stop().await;

    assert_eq!(log.ids(Kind::Started), vec![900], "ran once");
    let dead = dlq.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body.len(), size, "the whole body, not a pointer to S3");
    let failure = dead[0].string_attribute(FAILURE_ATTRIBUTE).unwrap();
    assert!(failure.contains("poison"), "{failure}");
}
