//! The conformance suite every [`OutboxStore`] passes: the in-memory store in this crate's tests, the
//! DynamoDB store on DynamoDB Local, the Postgres store on a real Postgres. Each check panics with what
//! broke the contract (see [`crate::store`]).

use std::sync::Arc;

use async_trait::async_trait;

use crate::store::{JobRef, LeaseRecord, OutboxStore};

/// Commits jobs the way the store's writer does in an application's transaction.
#[async_trait]
pub trait Writer: Send + Sync {
    /// Commits one job with body `body` as `aggregate`'s next job, for the queue at `queue_url`.
    async fn commit(&self, queue_url: &str, aggregate: &str, body: &str);
}

/// Runs every check on `store`, with `writer` committing into it. Aggregate names start with `prefix`
/// so one store can be shared across runs.
pub async fn run(store: Arc<dyn OutboxStore>, writer: &dyn Writer, prefix: &str) {
    jobs_come_back_in_commit_order_and_are_removed_once(&*store, writer, prefix).await;
    failures_count_and_parking_blocks_until_unparked(&*store, writer, prefix).await;
    a_parked_head_never_takes_another_aggregates_turn(&*store, writer, prefix).await;
    leases_are_written_only_over_what_was_read(&*store, prefix).await;
}

async fn jobs_come_back_in_commit_order_and_are_removed_once(
    store: &dyn OutboxStore,
    writer: &dyn Writer,
    prefix: &str,
) {
    let queue = "http://localhost/000000000000/conformance";
    let first = format!("{prefix}order-a");
    let second = format!("{prefix}order-b");
    for body in ["a1", "a2", "a3"] {
        writer.commit(queue, &first, &format!("\"{body}\"")).await;
    }
    writer.commit(queue, &second, "\"b1\"").await;
    let jobs = store.jobs(&first, 10).await.unwrap_or_default();
    let bodies: Vec<&str> = jobs.iter().map(|job| job.message.body.as_str()).collect();
    assert_eq!(
        bodies,
        ["\"a1\"", "\"a2\"", "\"a3\""],
        "an aggregate's jobs in commit order"
    );
    let sequences: Vec<u64> = jobs.iter().map(|job| job.sequence).collect();
    assert!(
        sequences.windows(2).all(|pair| pair[0] < pair[1]),
        "sequences rise: {sequences:?}"
    );
    assert!(
        jobs.iter()
            .all(|job| job.queue_url == queue && job.parked_at_millis.is_none())
    );
    assert_eq!(
        store.jobs(&first, 2).await.map(|jobs| jobs.len()).ok(),
        Some(2),
        "the limit holds"
    );
    let pending = store.pending(1000, u64::MAX).await.unwrap_or_default();
    assert!(
        pending.contains(&first) && pending.contains(&second),
        "both aggregates pending: {pending:?}"
    );
    let head = jobs[0].reference();
    let removed = store.remove_sent(&[head.clone(), head.clone()]).await.ok();
    assert_eq!(
        removed,
        Some(vec![true, false]),
        "a job is removed once, and the second removal says so"
    );
    let missing = JobRef {
        aggregate: first.clone(),
        sequence: 999,
    };
    assert_eq!(store.remove_sent(&[missing]).await.ok(), Some(vec![false]));
    let left: Vec<u64> = store
        .jobs(&first, 10)
        .await
        .unwrap_or_default()
        .iter()
        .map(|job| job.sequence)
        .collect();
    assert_eq!(left, sequences[1..].to_vec());
    let rest: Vec<JobRef> = store
        .jobs(&first, 10)
        .await
        .unwrap_or_default()
        .iter()
        .chain(store.jobs(&second, 10).await.unwrap_or_default().iter())
        .map(crate::StoredJob::reference)
        .collect();
    assert_eq!(store.remove_sent(&rest).await.ok(), Some(vec![true; rest.len()]));
    writer.commit(queue, &first, "\"a4\"").await;
    let after = store.jobs(&first, 10).await.unwrap_or_default();
    assert_eq!(after.len(), 1);
    assert!(
        after[0].sequence > sequences[2],
        "a job committed after the aggregate emptied still comes after its earlier jobs"
    );
    let _ = store.remove_sent(&[after[0].reference()]).await;
}

async fn failures_count_and_parking_blocks_until_unparked(
    store: &dyn OutboxStore,
    writer: &dyn Writer,
    prefix: &str,
) {
    let queue = "http://localhost/000000000000/conformance";
    let aggregate = format!("{prefix}poison");
    writer.commit(queue, &aggregate, "\"p1\"").await;
    writer.commit(queue, &aggregate, "\"p2\"").await;
    let first = store.jobs(&aggregate, 1).await.unwrap_or_default()[0].reference();
    assert!(store.record_failure(&first, "queue missing", None).await.is_ok());
    let job = store.jobs(&aggregate, 1).await.unwrap_or_default()[0].clone();
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error.as_deref(), Some("queue missing"));
    assert!(job.parked_at_millis.is_none());
    assert!(
        store
            .record_failure(&first, "still missing", Some(1_000))
            .await
            .is_ok()
    );
    let job = store.jobs(&aggregate, 1).await.unwrap_or_default()[0].clone();
    assert_eq!(
        (job.attempts, job.parked_at_millis),
        (2, Some(1_000)),
        "parked with when"
    );
    let backlog = store.backlog(100).await.unwrap_or_default();
    assert!(
        backlog.parked.iter().any(
            |parked| parked.reference() == first && parked.last_error.as_deref() == Some("still missing")
        ),
        "the backlog lists the parked job with its reason: {:?}",
        backlog.parked
    );
    assert_eq!(store.unpark(&aggregate).await.ok(), Some(1));
    let job = store.jobs(&aggregate, 1).await.unwrap_or_default()[0].clone();
    assert_eq!(
        (job.attempts, job.parked_at_millis),
        (0, None),
        "unparked and its count reset"
    );
    let backlog = store.backlog(100).await.unwrap_or_default();
    assert!(backlog.parked.iter().all(|parked| parked.aggregate != aggregate));
    assert!(backlog.oldest_pending_millis.is_some());
    remove_all(store, &[&aggregate]).await;
    // Recording a failure of a job already removed is no error.
    assert!(store.record_failure(&first, "late", None).await.is_ok());
}

/// An aggregate whose first job is parked has nothing to send until an operator unparks it: listing
/// it as pending would spend a pass's turn on it, and a pass's worth of such aggregates (a deleted
/// queue's jobs, each with a later job behind it) would stop the relay for everyone.
async fn a_parked_head_never_takes_another_aggregates_turn(
    store: &dyn OutboxStore,
    writer: &dyn Writer,
    prefix: &str,
) {
    let queue = "http://localhost/000000000000/conformance";
    let blocked = format!("{prefix}parked-head");
    let fresh = format!("{prefix}behind-no-one");
    writer.commit(queue, &blocked, "\"gone\"").await;
    writer.commit(queue, &blocked, "\"welcome\"").await;
    let head = store.jobs(&blocked, 1).await.unwrap_or_default()[0].reference();
    assert!(
        store
            .record_failure(&head, "queue does not exist", Some(1_000))
            .await
            .is_ok()
    );
    writer.commit(queue, &fresh, "\"fresh\"").await;
    let pending = store.pending(1000, u64::MAX).await.unwrap_or_default();
    assert!(
        !pending.contains(&blocked),
        "an aggregate whose head is parked is not pending, whatever waits behind it: {pending:?}"
    );
    assert!(pending.contains(&fresh), "the fresh aggregate is: {pending:?}");
    assert_eq!(store.unpark(&blocked).await.ok(), Some(1));
    let pending = store.pending(1000, u64::MAX).await.unwrap_or_default();
    assert!(
        pending.contains(&blocked),
        "unparked, it is pending again: {pending:?}"
    );
    remove_all(store, &[&blocked, &fresh]).await;
}

/// Removes the (up to ten) jobs of each of `aggregates`: a check's cleanup, so a shared store is left
/// as the check found it.
async fn remove_all(store: &dyn OutboxStore, aggregates: &[&str]) {
    let mut all: Vec<JobRef> = Vec::new();
    for aggregate in aggregates {
        let jobs = store.jobs(aggregate, 10).await.unwrap_or_default();
        all.extend(jobs.iter().map(crate::StoredJob::reference));
    }
    let _ = store.remove_sent(&all).await;
}

async fn leases_are_written_only_over_what_was_read(store: &dyn OutboxStore, prefix: &str) {
    let name = format!("{prefix}lease");
    assert_eq!(store.read_lease(&name).await.ok(), Some(None));
    let first = LeaseRecord {
        owner: "a".to_owned(),
        epoch: 1,
        version: 0,
    };
    assert_eq!(store.write_lease(&name, None, &first).await.ok(), Some(true));
    assert_eq!(
        store.write_lease(&name, None, &first).await.ok(),
        Some(false),
        "exists already"
    );
    let renewed = LeaseRecord {
        version: 1,
        ..first.clone()
    };
    assert_eq!(
        store.write_lease(&name, Some(&first), &renewed).await.ok(),
        Some(true)
    );
    let taken = LeaseRecord {
        owner: "b".to_owned(),
        epoch: 2,
        version: 0,
    };
    assert_eq!(
        store.write_lease(&name, Some(&first), &taken).await.ok(),
        Some(false),
        "a write over a stale read fails"
    );
    assert_eq!(store.read_lease(&name).await.ok(), Some(Some(renewed)));
}
