//! The relay over the in-memory store: the store's conformance, and per-aggregate order with several
//! relays interleaving at every await (the simulator goes further: crashes, pauses, takeovers).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::port::OutgoingMessage;
use conveyor_outbox::memory::MemoryOutboxStore;
use conveyor_outbox::{JobSink, Relay, RelayOptions, SendFailure, Unfenced, conformance};
use conveyor_sqs::NewJob;

const QUEUE: &str = "http://localhost/000000000000/jobs";

struct MemoryWriter(MemoryOutboxStore);

#[async_trait]
impl conformance::Writer for MemoryWriter {
    async fn commit(&self, queue_url: &str, aggregate: &str, body: &str) {
        let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_millis() as u64);
        if let Err(error) = self.0.put(NewJob::new("t", value), queue_url, aggregate, now) {
            panic!("{error}");
        }
    }
}

#[tokio::test]
async fn the_memory_store_passes_the_conformance_suite() {
    let store = MemoryOutboxStore::new();
    conformance::run(Arc::new(store.clone()), &MemoryWriter(store), "m-").await;
}

/// Records what SQS accepted, in order, yielding before answering so relays interleave; refuses the
/// bodies listed in `refuse` until they are taken off.
#[derive(Default)]
struct RecordingSink {
    accepted: Mutex<Vec<String>>,
    refuse: Mutex<Vec<String>>,
    /// Refuses a whole call when one of its messages is refused, as SQS does for some bad entries.
    whole_calls: bool,
    /// Refusals say the queue is unavailable (retryable) instead of missing.
    unavailable: bool,
    /// Calls made, one per batch.
    calls: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl JobSink for RecordingSink {
    async fn send(
        &self,
        _queue_url: &str,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<String, SendFailure>> {
        tokio::task::yield_now().await;
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let refuse = self
            .refuse
            .lock()
            .map(|refuse| refuse.clone())
            .unwrap_or_default();
        let refusal = || {
            Err(SendFailure {
                message: if self.unavailable {
                    "SQS unavailable".to_owned()
                } else {
                    "queue jobs does not exist".to_owned()
                },
                retryable: self.unavailable,
            })
        };
        if self.whole_calls && messages.iter().any(|message| refuse.contains(&message.body)) {
            return messages.iter().map(|_| refusal()).collect();
        }
        let mut results = Vec::new();
        for message in messages {
            if refuse.contains(&message.body) {
                results.push(refusal());
                continue;
            }
            if let Ok(mut accepted) = self.accepted.lock() {
                accepted.push(message.body.clone());
            }
            results.push(Ok(uuid::Uuid::new_v4().to_string()));
        }
        tokio::task::yield_now().await;
        results
    }

    fn requests(&self) -> u64 {
        0
    }
}

fn commit_all(store: &MemoryOutboxStore, aggregates: usize, jobs: usize) {
    for job in 0..jobs {
        for aggregate in 0..aggregates {
            let body = format!("{aggregate}:{job}");
            if let Err(error) = store.put(
                NewJob::new("t", body),
                QUEUE,
                &format!("a{aggregate}"),
                1 + job as u64,
            ) {
                panic!("{error}");
            }
        }
    }
}

/// Per aggregate, the jobs in the order they were first accepted.
fn first_occurrences(accepted: &[String]) -> HashMap<String, Vec<usize>> {
    let mut order: HashMap<String, Vec<usize>> = HashMap::new();
    for body in accepted {
        let text = body.trim_matches('"');
        let Some((aggregate, job)) = text.split_once(':') else {
            continue;
        };
        let job: usize = job.parse().unwrap_or(usize::MAX);
        let seen = order.entry(aggregate.to_owned()).or_default();
        if !seen.contains(&job) {
            seen.push(job);
        }
    }
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_at_once_keep_each_aggregates_order_and_send_everything() {
    let store = MemoryOutboxStore::new();
    commit_all(&store, 30, 12);
    let sink = Arc::new(RecordingSink::default());
    let relays: Vec<Relay> = (0..3)
        .map(|_| Relay::new(Arc::new(store.clone()), sink.clone()).with_options(RelayOptions::default()))
        .collect();
    let runs = relays.iter().map(|relay| async move {
        loop {
            let report = relay.sweep(Duration::ZERO, 7, &Unfenced).await;
            if report.sent == 0 && report.raced == 0 {
                break;
            }
        }
    });
    futures_util::future::join_all(runs).await;
    assert!(store.unsent().is_empty(), "everything sent and removed");
    let accepted = sink
        .accepted
        .lock()
        .map(|accepted| accepted.clone())
        .unwrap_or_default();
    let order = first_occurrences(&accepted);
    assert_eq!(order.len(), 30);
    let expected: Vec<usize> = (0..12).collect();
    for (aggregate, jobs) in order {
        assert_eq!(jobs, expected, "aggregate {aggregate} out of order");
    }
    println!("{} sends for 360 jobs", accepted.len());
}

#[tokio::test]
async fn a_refused_job_is_parked_after_its_attempts_and_only_its_aggregate_waits() {
    let store = MemoryOutboxStore::new();
    commit_all(&store, 3, 2);
    let sink = Arc::new(RecordingSink::default());
    if let Ok(mut refuse) = sink.refuse.lock() {
        refuse.push("\"1:0\"".to_owned());
    }
    let mut options = RelayOptions::default();
    options.max_attempts = 2;
    options.backoff = Duration::ZERO;
    let relay = Relay::new(Arc::new(store.clone()), sink.clone()).with_options(options);
    let first = relay.sweep(Duration::ZERO, 10, &Unfenced).await;
    assert_eq!((first.sent, first.failed, first.parked), (4, 1, 0), "{first:?}");
    let second = relay.sweep(Duration::ZERO, 10, &Unfenced).await;
    assert_eq!((second.failed, second.parked), (1, 1), "{second:?}");
    let unsent: Vec<(String, u64)> = store
        .unsent()
        .iter()
        .map(|job| (job.aggregate.clone(), job.sequence))
        .collect();
    assert_eq!(
        unsent,
        [("a1".to_owned(), 1), ("a1".to_owned(), 2)],
        "a1's second job waits behind the parked one"
    );
    let third = relay.sweep(Duration::ZERO, 10, &Unfenced).await;
    assert_eq!(
        (third.sent, third.failed),
        (0, 0),
        "a parked aggregate is not tried again: {third:?}"
    );
}

#[tokio::test]
async fn a_batch_call_refused_whole_charges_only_the_job_that_fails_alone() {
    let store = MemoryOutboxStore::new();
    commit_all(&store, 3, 1);
    let sink = Arc::new(RecordingSink {
        whole_calls: true,
        refuse: Mutex::new(vec!["\"1:0\"".to_owned()]),
        ..RecordingSink::default()
    });
    let relay = Relay::new(Arc::new(store.clone()), sink.clone());
    let report = relay.sweep(Duration::ZERO, 10, &Unfenced).await;
    assert_eq!((report.sent, report.failed), (2, 1), "{report:?}");
    let unsent = store.unsent();
    assert_eq!(unsent.len(), 1, "{unsent:?}");
    assert_eq!(
        (unsent[0].aggregate.as_str(), unsent[0].attempts),
        ("a1", 1),
        "only the job SQS refuses alone counts an attempt"
    );
    assert_eq!(
        sink.calls.load(std::sync::atomic::Ordering::Relaxed),
        4,
        "the refused batch, then each job alone"
    );
}

/// Commits `aggregates` aggregates of two jobs each, named `{prefix}{n}`, at `at`.
fn commit_pairs(store: &MemoryOutboxStore, prefix: &str, aggregates: usize, at: u64) {
    for aggregate in 0..aggregates {
        for job in 0..2 {
            let body = format!("{prefix}{aggregate}:{job}");
            if let Err(error) = store.put(NewJob::new("t", body), QUEUE, &format!("{prefix}{aggregate}"), at)
            {
                panic!("{error}");
            }
        }
    }
}

/// 150 users whose first job's queue is gone (parked, or backing off while SQS is down for them), each
/// with a welcome email behind it, then 50 fresh users: one pass of 100 aggregates sends every fresh
/// user's jobs, whatever the blocked ones' age.
#[tokio::test]
async fn parked_or_backing_off_aggregates_never_take_the_fresh_ones_turns() {
    for unavailable in [false, true] {
        let store = MemoryOutboxStore::new();
        commit_pairs(&store, "blocked", 150, 1);
        let refused: Vec<String> = (0..150).map(|user| format!("\"blocked{user}:0\"")).collect();
        let sink = Arc::new(RecordingSink {
            refuse: Mutex::new(refused),
            unavailable,
            ..RecordingSink::default()
        });
        let mut options = RelayOptions::default();
        options.max_attempts = 1;
        options.backoff = Duration::from_secs(3600);
        options.max_backoff = Duration::from_secs(3600);
        let relay = Relay::new(Arc::new(store.clone()), sink.clone()).with_options(options);
        // Two passes of 100 find every blocked aggregate's first job refused.
        let mut failed = 0;
        for _ in 0..2 {
            failed += relay.sweep(Duration::ZERO, 100, &Unfenced).await.failed;
        }
        assert_eq!(failed, 150, "unavailable {unavailable}");
        commit_pairs(&store, "fresh", 50, 2);
        let report = relay.sweep(Duration::ZERO, 100, &Unfenced).await;
        assert_eq!(
            (report.sent, report.failed),
            (100, 0),
            "every fresh user's two jobs in one pass (unavailable {unavailable}): {report:?}"
        );
        assert_eq!(
            store.unsent().len(),
            300,
            "the blocked users' jobs wait, in place"
        );
    }
}
