//! The worker under injected faults (issue 10): slow visibility extensions, a DynamoDB brownout and
//! failing deletes, against LocalStack (SQS) and DynamoDB Local, real clock (the fault layer's docs:
//! a paused clock does not mix with the emulators).
//!
//! Two real workers per test, each with its own faulty SQS client (its own SDK retry quota, as two
//! processes would have) and a shared faulty DynamoDB store. Each test counts runs and effects per job
//! and asserts exactly once, and asserts that its fault really fired.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::aws::{self, send_all};
use common::*;
use conveyor_core::port::idempotency_key;
use conveyor_core::{
    port::{IdempotencyStore, OutgoingMessage, Queue, QueueDepth, RecordStatus},
    {Pipeline, Router},
};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::faults::{Fault, Faults, Rule, faulty_dynamodb_client, faulty_sqs_client};
use conveyor_testing::localstack::{QueueSpec, create_queue, create_table, ensure_local_aws};
use conveyor_worker::{Worker, WorkerReport};
use tokio::time::Instant;

/// An idempotency store on DynamoDB Local whose calls go through `faults`.
async fn faulty_store(faults: &Faults) -> Arc<dyn IdempotencyStore> {
    ensure_local_aws().await.unwrap();
    let client = faulty_dynamodb_client(faults).await;
    let table = create_table(&client, "faults").await.unwrap();
    Arc::new(DynamoStore::new(client, table))
}

/// Starts `count` workers on `url`, each on its own SQS client through `faults`, all with `store`,
/// routing `Recorder<Plain>` into `log`.
async fn start_workers(
    count: usize,
    url: &str,
    faults: &Faults,
    store: &Arc<dyn IdempotencyStore>,
    log: &Arc<Log>,
    max_in_flight: usize,
) -> Vec<Running> {
    let mut running = Vec::new();
    for _ in 0..count {
        let client = faulty_sqs_client(faults).await;
        let queue = Arc::new(SqsQueue::connect(client, url).await.unwrap());
        let pipeline =
            Pipeline::new(Router::new().route(Recorder::<Plain>::new(log))).with_store(Arc::clone(store));
        let config = aws::config(&[(url, 1)]).with_max_in_flight(max_in_flight);
        running.push(start(
            Worker::new(config, pipeline, vec![queue as Arc<dyn Queue>]).unwrap(),
        ));
    }
    running
}

/// Stops every worker (all at once: each may finish its last long poll) and adds up their reports
/// (each report is printed for the test's output).
async fn stop_all(workers: Vec<Running>) -> WorkerReport {
    for worker in &workers {
        worker.shutdown.cancel();
    }
    let mut total = WorkerReport::default();
    for (index, worker) in workers.into_iter().enumerate() {
        let report = worker.handle.await.unwrap().unwrap();
        println!("worker {index}: {report:?}");
        total.received += report.received;
        total.succeeded += report.succeeded;
        total.retried += report.retried;
        total.duplicates += report.duplicates;
        total.deferred += report.deferred;
        total.heartbeat_extensions += report.heartbeat_extensions;
        total.leases_lost += report.leases_lost;
        total.deletes_failed += report.deletes_failed;
        total.released_at_shutdown += report.released_at_shutdown;
    }
    total
}

/// Per job id: how many runs started and how many succeeded (the effect).
fn runs_and_effects(log: &Log) -> BTreeMap<u64, (usize, usize)> {
    let mut counts: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for event in log.events() {
        let entry = counts.entry(event.id).or_default();
        match event.kind {
            Kind::Started => entry.0 += 1,
            Kind::Succeeded => entry.1 += 1,
            Kind::Failed | Kind::Cancelled => {}
        }
    }
    counts
}

/// Asserts that jobs `1..=jobs` each ran once and had their effect once, and nothing else ran.
fn assert_exactly_once(log: &Log, jobs: u64) {
    let counts = runs_and_effects(log);
    let expected: BTreeMap<u64, (usize, usize)> = (1..=jobs).map(|id| (id, (1, 1))).collect();
    assert_eq!(
        counts,
        expected,
        "(runs, effects) per job; events: {:?}",
        log.events()
    );
}

/// Waits until nothing is visible, in flight or delayed.
async fn wait_empty(queue: &SqsQueue, secs: u64) {
    conveyor_testing::wait_until(
        Duration::from_secs(secs),
        Duration::from_millis(200),
        async || {
            queue
                .depth()
                .await
                .is_ok_and(|depth| depth == QueueDepth::default())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("the queue did not empty: {error}"));
}

/// `keyed_message` with the key `job:<id>`, so the test can read each job's idempotency record.
fn keyed(id: u64, ms: u64) -> OutgoingMessage {
    keyed_message("plain", &slow_job(id, ms), &format!("job:{id}"))
}

async fn assert_records_completed(store: &Arc<dyn IdempotencyStore>, jobs: u64) {
    for id in 1..=jobs {
        let key = idempotency_key("plain", Some(&format!("job:{id}")), "");
        let record = store.get(&key).await.unwrap();
        assert_eq!(
            record.map(|record| record.status),
            Some(RecordStatus::Completed),
            "job {id}'s record"
        );
    }
}

/// Every `ChangeMessageVisibilityBatch` answers `delay` late, while jobs longer than the visibility
/// timeout run on two workers: the heartbeat must keep them invisible, so each runs once.
async fn slow_visibility_extensions(delay: Duration, jobs: u64) {
    let plain = aws::sqs().await;
    let created = create_queue(
        &plain,
        &QueueSpec::standard("slow-extensions").visibility_timeout_secs(12),
    )
    .await
    .unwrap();
    let observer = aws::connect(&plain, &created.url).await;
    let faults = Faults::new(1);
    let store = faulty_store(&faults).await;
    let log = Log::new();
    let slow = faults.add(Rule::new(Fault::Delay(delay)).on("ChangeMessageVisibilityBatch"));
    let workers = start_workers(2, &created.url, &faults, &store, &log, 20).await;
    // 20 s each: past the 12 s visibility timeout, so every job needs at least one extension.
    send_all(&observer, (1..=jobs).map(|id| keyed(id, 20_000)).collect()).await;

    let started = Instant::now();
    let done =
        conveyor_testing::wait_until(Duration::from_secs(45), Duration::from_millis(100), async || {
            log.count(Kind::Succeeded) >= jobs as usize
        })
        .await;
    println!(
        "after {:?}: {} succeeded, {} started, {} cancelled; extensions: {:?}",
        started.elapsed(),
        log.count(Kind::Succeeded),
        log.count(Kind::Started),
        log.count(Kind::Cancelled),
        faults.stats(slow)
    );
    done.unwrap_or_else(|error| {
        panic!(
            "not every job succeeded with {delay:?} visibility extensions: {error}; events: {:?}",
            log.events()
        )
    });
    wait_empty(&observer, 30).await;
    let report = stop_all(workers).await;
    faults.clear();

    let extension_calls = faults.calls("ChangeMessageVisibilityBatch");
    assert!(
        extension_calls > 0 && faults.stats(slow).injected == extension_calls,
        "the delay applied to every extension: {:?} of {extension_calls} calls",
        faults.stats(slow)
    );
    assert_exactly_once(&log, jobs);
    assert_eq!(report.leases_lost, 0, "{report:?}");
    assert!(
        report.heartbeat_extensions >= jobs,
        "every 20 s job was extended at least once at 12 s visibility: {report:?}"
    );
    assert_records_completed(&store, jobs).await;
}

/// The case: each extension answers 5 s late, more than the third of the 12 s visibility
/// timeout at which the heartbeat extends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visibility_extensions_slower_than_a_third_of_the_timeout_keep_jobs_once() {
    slow_visibility_extensions(Duration::from_secs(5), 4).await;
}

/// Extensions 3 s late (just under the third) with 24 jobs, so each worker has several batches of
/// extensions out at once: one slow call must not hold up the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_slow_visibility_extensions_at_once_keep_jobs_once() {
    slow_visibility_extensions(Duration::from_secs(3), 24).await;
}

/// DynamoDB answers every `UpdateItem` (claims, claim extensions, completions) 4 s late
/// for 20 s while jobs longer than the visibility timeout run with idempotency on: visibility
/// extensions must not wait for the slow claim extensions, no lease is lost, each job runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_brownout_loses_no_lease_and_runs_each_job_once() {
    let plain = aws::sqs().await;
    let created = create_queue(
        &plain,
        &QueueSpec::standard("dynamodb-brownout").visibility_timeout_secs(12),
    )
    .await
    .unwrap();
    let observer = aws::connect(&plain, &created.url).await;
    let faults = Faults::new(2);
    let store = faulty_store(&faults).await;
    let log = Log::new();
    let jobs = 6;
    let brownout = faults.add(
        Rule::new(Fault::Delay(Duration::from_secs(4)))
            .on("UpdateItem")
            .lasting(Duration::from_secs(20)),
    );
    let workers = start_workers(2, &created.url, &faults, &store, &log, 10).await;
    // 16 s each: claimed at ~4 s, extended while the brownout lasts, completed near its end.
    send_all(&observer, (1..=jobs).map(|id| keyed(id, 16_000)).collect()).await;

    eventually(60, "every job", || log.count(Kind::Succeeded) >= jobs as usize).await;
    wait_empty(&observer, 30).await;
    let report = stop_all(workers).await;

    assert!(
        faults.injected("UpdateItem") > jobs,
        "the brownout really slowed claims and updates: {:?}, UpdateItem {}",
        faults.stats(brownout),
        faults.injected("UpdateItem")
    );
    assert_exactly_once(&log, jobs);
    assert!(
        report.heartbeat_extensions >= jobs,
        "the visibility extensions went on: {report:?}"
    );
    assert_eq!(report.leases_lost, 0, "{report:?}");
    assert_records_completed(&store, jobs).await;
}

/// `DeleteMessageBatch` fails with a 5xx on every attempt for 10 s while short jobs complete: deletes
/// are retried (the heartbeat keeping the messages invisible past the 12 s visibility timeout) until
/// they succeed; nothing runs twice, nothing is left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_failing_for_ten_seconds_lose_nothing_and_rerun_nothing() {
    let plain = aws::sqs().await;
    let created = create_queue(
        &plain,
        &QueueSpec::standard("deletes-failing").visibility_timeout_secs(12),
    )
    .await
    .unwrap();
    let observer = aws::connect(&plain, &created.url).await;
    let faults = Faults::new(3);
    let store = faulty_store(&faults).await;
    let log = Log::new();
    let jobs = 30;
    let window = Duration::from_secs(10);
    let failing = faults.add(
        Rule::new(Fault::ServerError)
            .on("DeleteMessageBatch")
            .lasting(window),
    );
    let fault_ends = Instant::now() + window;
    let workers = start_workers(2, &created.url, &faults, &store, &log, 20).await;
    send_all(&observer, (1..=jobs).map(|id| keyed(id, 100)).collect()).await;

    eventually(30, "every job", || log.count(Kind::Succeeded) >= jobs as usize).await;
    let done_while_failing = log
        .events()
        .iter()
        .filter(|event| event.kind == Kind::Succeeded && event.at < fault_ends)
        .count();
    wait_empty(&observer, 30).await;
    let report = stop_all(workers).await;
    println!(
        "{done_while_failing} jobs done while deletes failed; DeleteMessageBatch: {:?}, {} calls; \
         duplicates acknowledged: {}",
        faults.stats(failing),
        faults.calls("DeleteMessageBatch"),
        report.duplicates
    );

    assert!(
        done_while_failing > 0,
        "some jobs finished while deletes failed: {:?}",
        log.events()
    );
    // 3 SDK attempts per call: at least one whole call failed.
    assert!(faults.stats(failing).injected >= 3, "{:?}", faults.stats(failing));
    assert_exactly_once(&log, jobs);
    assert_eq!(
        report.deletes_failed, 0,
        "deletes are retried until they succeed: {report:?}"
    );
    assert_eq!(report.leases_lost, 0, "{report:?}");
    assert_eq!(report.succeeded, jobs, "{report:?}");
    assert_records_completed(&store, jobs).await;
    assert_eq!(observer.depth().await.unwrap(), QueueDepth::default());
}
