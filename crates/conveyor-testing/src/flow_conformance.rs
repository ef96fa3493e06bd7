//! The flows conformance suite: the `FlowStore` port's contracts, checked against any backend
//! (`MemoryFlows` and `DynamoStore` on DynamoDB Local), including the race that decides which
//! child's count finishes the flow.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::port::{ChildEnd, Count, Created, FlowState, NewFlow, ParentDue, ParentMessage};
use conveyor_core::{ChildFailurePolicy, port::FlowStore};

use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "a_flow_is_created_once_and_a_conflicting_resend_is_refused",
    "a_child_counts_once",
    "exactly_one_count_finishes_the_flow",
    "a_failed_child_is_recorded_and_a_later_success_resumes_the_flow",
    "the_parent_and_the_failure_notice_are_marked_once",
    "a_child_of_no_flow_or_of_another_flow_is_not_counted",
    "overdue_flows_are_listed_until_closed",
    "a_refused_parent_is_counted_and_ends_the_flow_failed_once",
    "the_parent_ran_mark_is_set_once_and_closes_the_flow",
    "a_failed_child_stays_failed_once_the_parent_was_sent",
];

/// Runs every case against `store`; returns every failed case.
pub async fn run_all(store: Arc<dyn FlowStore>) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (CASES[0], Box::pin(created_once(store.as_ref()))),
        (CASES[1], Box::pin(a_child_counts_once(store.as_ref()))),
        (
            CASES[2],
            Box::pin(exactly_one_count_finishes_the_flow(Arc::clone(&store))),
        ),
        (CASES[3], Box::pin(failed_then_resumed(store.as_ref()))),
        (CASES[4], Box::pin(marked_once(store.as_ref()))),
        (CASES[5], Box::pin(not_in_flow(store.as_ref()))),
        (CASES[6], Box::pin(overdue_until_closed(store.as_ref()))),
        (CASES[7], Box::pin(refused_parent(store.as_ref()))),
        (CASES[8], Box::pin(parent_ran_once(store.as_ref()))),
        (CASES[9], Box::pin(failed_stays_after_parent(store.as_ref()))),
    ];
    run_cases("flows", CASES, cases).await
}

/// A flow of `children` children (ids `00000`, `00001`, ...) under a fresh id starting `case/`, its
/// parent a `report` job, due within the hour: what the cases here and the flow cost example write.
pub fn new_flow(case: &str, children: usize, policy: ChildFailurePolicy) -> NewFlow {
    let id = format!("{case}/{}", uuid::Uuid::new_v4().simple());
    NewFlow {
        parent: ParentMessage {
            queue_url: "http://127.0.0.1:4566/000000000000/jobs".to_owned(),
            body: r#"{"report":"r-1"}"#.to_owned(),
            attributes: BTreeMap::from([(
                "conveyor.type".to_owned(),
                ("String".to_owned(), "report".to_owned()),
            )]),
            group_id: None,
        },
        parent_record: format!("conveyor:report#flow:{id}"),
        children: (0..children)
            .map(|index| {
                (
                    format!("{index:05}"),
                    format!("conveyor:chunk#flow:{id}:{index:05}"),
                )
            })
            .collect(),
        policy,
        created_at: SystemTime::now(),
        deadline: SystemTime::now() + Duration::from_secs(3600),
        id,
    }
}

fn succeeded(output: &str) -> ChildEnd {
    ChildEnd::Succeeded {
        output: Some(output.to_owned()),
    }
}

/// The flow `flow_id`, which must exist.
async fn head(case: &'static str, store: &dyn FlowStore, flow_id: &str) -> Result<FlowState, SuiteFailure> {
    store
        .flow(flow_id)
        .await
        .or_fail(case, "flow")?
        .ok_or_else(|| SuiteFailure::new(case, format!("flow {flow_id} has no head")))
}

/// The flow a count answered with, or a failure naming what came instead.
fn counted(case: &'static str, count: Count) -> Result<FlowState, SuiteFailure> {
    match count {
        Count::Counted(flow) => Ok(flow),
        other => Err(SuiteFailure::new(
            case,
            format!("expected a new count, got {other:?}"),
        )),
    }
}

/// Create, create again (a re-send: written, nothing reset), create with other children under the
/// same id (refused), read back the head, the parent and every child.
async fn created_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[0];
    let flow = new_flow(case, 3, ChildFailurePolicy::Ignore);
    let first = store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    ensure!(case, first == Created::Written, "first create: {first:?}");
    counted(
        case,
        store
            .child_finished(&flow.id, "00000", &succeeded("1"))
            .await
            .or_fail(case, "count")?,
    )?;
    let again = store
        .create_flow(&flow)
        .await
        .or_fail(case, "create_flow again")?;
    ensure!(case, again == Created::Written, "the same flow again: {again:?}");
    let other = NewFlow {
        children: BTreeMap::from([("00000".to_owned(), "k".to_owned())]),
        ..flow.clone()
    };
    let conflict = store
        .create_flow(&other)
        .await
        .or_fail(case, "create_flow other")?;
    ensure!(
        case,
        conflict == Created::Conflict,
        "other content under the same id: {conflict:?}"
    );
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.children == 3 && read.succeeded == 1 && read.policy == ChildFailurePolicy::Ignore,
        "the first write stands and the re-send reset nothing: {read:?}"
    );
    let parent = store.parent(&flow.id).await.or_fail(case, "parent")?;
    ensure!(case, parent.as_ref() == Some(&flow.parent), "parent: {parent:?}");
    let children = store.children(&flow.id).await.or_fail(case, "children")?;
    let keys: BTreeMap<String, String> = children
        .iter()
        .map(|child| (child.id.clone(), child.key.clone()))
        .collect();
    ensure!(case, keys == flow.children, "children: {children:?}");
    ensure!(
        case,
        children[0].end == Some(succeeded("1")) && children[1].end.is_none(),
        "the counted child keeps its output: {children:?}"
    );
    Ok(())
}

/// The same child counted twice: the second call is `Before`, the counter moved once.
async fn a_child_counts_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[1];
    let flow = new_flow(case, 2, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let first = counted(
        case,
        store
            .child_finished(&flow.id, "00000", &succeeded("1"))
            .await
            .or_fail(case, "count")?,
    )?;
    let second = store
        .child_finished(&flow.id, "00000", &succeeded("1"))
        .await
        .or_fail(case, "count again")?;
    let Count::Before(after) = second else {
        return Err(SuiteFailure::new(
            case,
            format!("a second count must be Before: {second:?}"),
        ));
    };
    ensure!(
        case,
        first.succeeded == 1 && after.succeeded == 1,
        "counted once: {after:?}"
    );
    ensure!(
        case,
        after.pending() == 1 && after.parent_due().is_none(),
        "one pending: {after:?}"
    );
    let failed = store
        .child_finished(&flow.id, "00000", &ChildEnd::Failed("late".into()))
        .await
        .or_fail(case, "a failure after a success")?;
    ensure!(
        case,
        matches!(&failed, Count::Before(flow) if flow.failed == 0),
        "a success stays: {failed:?}"
    );
    Ok(())
}

/// Ten children counted at once, each twice: exactly one count sees the flow finished, and the counters
/// never pass the children's number.
async fn exactly_one_count_finishes_the_flow(store: Arc<dyn FlowStore>) -> CaseResult {
    let case = CASES[2];
    let flow = new_flow(case, 10, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let mut tasks = Vec::new();
    for index in 0..20 {
        let store = Arc::clone(&store);
        let flow_id = flow.id.clone();
        let child = format!("{:05}", index % 10);
        tasks.push(tokio::spawn(async move {
            store.child_finished(&flow_id, &child, &succeeded("1")).await
        }));
    }
    let mut finishing = 0;
    let mut new_counts = 0;
    for task in tasks {
        let count = task
            .await
            .or_fail(case, "join")?
            .or_fail(case, "child_finished")?;
        if let Count::Counted(flow) = count {
            new_counts += 1;
            ensure!(case, flow.succeeded <= 10, "counted past the children: {flow:?}");
            if flow.pending() == 0 {
                finishing += 1;
            }
        }
    }
    ensure!(case, new_counts == 10, "each child counted once: {new_counts}");
    ensure!(case, finishing >= 1, "some count saw the flow finished");
    let read = head(case, store.as_ref(), &flow.id).await?;
    ensure!(
        case,
        read.succeeded == 10 && read.parent_due() == Some(ParentDue::Run),
        "{read:?}"
    );
    Ok(())
}

/// A dead-lettered child is counted as failed with its reason; under `FailParent` the parent is due as
/// failed; the same child succeeding later (redriven) moves the count and the flow finishes.
async fn failed_then_resumed(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[3];
    let flow = new_flow(case, 2, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    counted(
        case,
        store
            .child_finished(&flow.id, "00000", &succeeded("1"))
            .await
            .or_fail(case, "count 0")?,
    )?;
    let failed = counted(
        case,
        store
            .child_finished(&flow.id, "00001", &ChildEnd::Failed("chunk 1: 404".into()))
            .await
            .or_fail(case, "count 1 failed")?,
    )?;
    ensure!(
        case,
        matches!(failed.parent_due(), Some(ParentDue::Fail(reason)) if reason.contains("chunk 1: 404")),
        "fail_parent: the parent is due as failed: {failed:?}"
    );
    let again = store
        .child_finished(&flow.id, "00001", &ChildEnd::Failed("again".into()))
        .await
        .or_fail(case, "count 1 failed again")?;
    ensure!(
        case,
        matches!(&again, Count::Before(flow) if flow.failed == 1),
        "{again:?}"
    );
    let resumed = counted(
        case,
        store
            .child_finished(&flow.id, "00001", &succeeded("2"))
            .await
            .or_fail(case, "count 1 succeeded")?,
    )?;
    ensure!(
        case,
        resumed.failed == 0 && resumed.succeeded == 2 && resumed.parent_due() == Some(ParentDue::Run),
        "a redriven child's success resumes the flow: {resumed:?}"
    );
    let children = store.children(&flow.id).await.or_fail(case, "children")?;
    ensure!(case, children[1].end == Some(succeeded("2")), "{children:?}");
    Ok(())
}

/// The parent's and the notice's times are set once; the notice is claimed by one message id.
async fn marked_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[4];
    let flow = new_flow(case, 1, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let first = UNIX_EPOCH + Duration::from_millis(1_796_000_000_000);
    for at in [first, first + Duration::from_secs(5)] {
        store
            .mark_failure_sent(&flow.id, at)
            .await
            .or_fail(case, "mark_failure_sent")?;
        store
            .mark_parent_sent(&flow.id, at)
            .await
            .or_fail(case, "mark_parent_sent")?;
    }
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.parent_sent_at == Some(1_796_000_000_000) && read.failure_sent_at == Some(1_796_000_000_000),
        "{read:?}"
    );
    let claims = (
        store
            .claim_failure_notice(&flow.id, "m-1")
            .await
            .or_fail(case, "claim m-1")?,
        store
            .claim_failure_notice(&flow.id, "m-2")
            .await
            .or_fail(case, "claim m-2")?,
        store
            .claim_failure_notice(&flow.id, "m-1")
            .await
            .or_fail(case, "claim m-1 again")?,
    );
    ensure!(
        case,
        claims == (true, false, true),
        "one notice per flow: {claims:?}"
    );
    Ok(())
}

/// Counting in an unknown flow, or a child id the flow does not have, is `NotInFlow` and creates
/// nothing.
async fn not_in_flow(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[5];
    let unknown = format!("{case}/{}", uuid::Uuid::new_v4().simple());
    let count = store
        .child_finished(&unknown, "00000", &succeeded("1"))
        .await
        .or_fail(case, "unknown")?;
    ensure!(case, count == Count::NotInFlow, "an unknown flow: {count:?}");
    let read = store.flow(&unknown).await.or_fail(case, "flow")?;
    ensure!(case, read.is_none(), "an unknown flow stays unknown: {read:?}");
    let flow = new_flow(case, 1, ChildFailurePolicy::Ignore);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let stranger = store
        .child_finished(&flow.id, "00007", &succeeded("1"))
        .await
        .or_fail(case, "stranger")?;
    ensure!(
        case,
        stranger == Count::NotInFlow,
        "a child the flow does not have: {stranger:?}"
    );
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.succeeded == 0 && read.parent_due().is_none(),
        "nothing counted: {read:?}"
    );
    Ok(())
}

/// A flow past its deadline is listed until closed; one sent is not listed.
async fn overdue_until_closed(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[6];
    let past = SystemTime::now() - Duration::from_secs(60);
    let late = NewFlow {
        deadline: past,
        ..new_flow(case, 1, ChildFailurePolicy::Ignore)
    };
    let sent = NewFlow {
        deadline: past,
        ..new_flow(case, 1, ChildFailurePolicy::Ignore)
    };
    let on_time = new_flow(case, 1, ChildFailurePolicy::Ignore);
    for flow in [&late, &sent, &on_time] {
        store.create_flow(flow).await.or_fail(case, "create_flow")?;
    }
    store
        .mark_parent_sent(&sent.id, SystemTime::now())
        .await
        .or_fail(case, "mark_parent_sent")?;
    let listed = store
        .overdue(SystemTime::now(), 1000)
        .await
        .or_fail(case, "overdue")?;
    ensure!(
        case,
        listed.contains(&late.id) && !listed.contains(&sent.id) && !listed.contains(&on_time.id),
        "overdue: {listed:?}"
    );
    store.close(&late.id).await.or_fail(case, "close")?;
    let listed = store
        .overdue(SystemTime::now(), 1000)
        .await
        .or_fail(case, "overdue again")?;
    ensure!(case, !listed.contains(&late.id), "closed: {listed:?}");
    Ok(())
}

/// Whether the overdue listing holds `flow_id`.
async fn listed(case: &'static str, store: &dyn FlowStore, flow_id: &str) -> Result<bool, SuiteFailure> {
    let listed = store
        .overdue(SystemTime::now(), 1000)
        .await
        .or_fail(case, "overdue")?;
    Ok(listed.iter().any(|id| id == flow_id))
}

/// Each refusal of the parent adds one and keeps its reason; the flow ends failed once (the first
/// time and reason stand) and leaves the overdue listing; an unknown flow answers `None`.
async fn refused_parent(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[7];
    let flow = NewFlow {
        deadline: SystemTime::now() - Duration::from_secs(60),
        ..new_flow(case, 1, ChildFailurePolicy::Ignore)
    };
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let first = store
        .parent_refused(&flow.id, "queue missing")
        .await
        .or_fail(case, "parent_refused")?;
    let second = store
        .parent_refused(&flow.id, "access denied")
        .await
        .or_fail(case, "parent_refused again")?;
    ensure!(
        case,
        (first, second) == (Some(1), Some(2)),
        "refusals: {first:?}, {second:?}"
    );
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.parent_refusals == 2
            && read.parent_error.as_deref() == Some("access denied")
            && !read.is_finished(),
        "two refusals, the last reason, not finished: {read:?}"
    );
    ensure!(
        case,
        listed(case, store, &flow.id).await?,
        "still overdue before it fails"
    );
    let at = UNIX_EPOCH + Duration::from_millis(1_796_000_000_000);
    for (when, reason) in [(at, "access denied"), (at + Duration::from_secs(5), "later")] {
        store
            .mark_parent_failed(&flow.id, reason, when)
            .await
            .or_fail(case, "mark_parent_failed")?;
    }
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.parent_failed_at == Some(1_796_000_000_000)
            && read.parent_error.as_deref() == Some("access denied")
            && read.is_finished()
            && read.parent_state().contains("access denied"),
        "ended failed once, with the reason: {read:?}"
    );
    ensure!(
        case,
        !listed(case, store, &flow.id).await?,
        "a failed flow leaves the overdue listing"
    );
    let unknown = format!("{case}/{}", uuid::Uuid::new_v4().simple());
    let none = store
        .parent_refused(&unknown, "x")
        .await
        .or_fail(case, "parent_refused unknown")?;
    ensure!(case, none.is_none(), "an unknown flow: {none:?}");
    Ok(())
}

/// The parent-ran mark keeps its first time, finishes the flow and leaves the overdue listing.
async fn parent_ran_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[8];
    let flow = NewFlow {
        deadline: SystemTime::now() - Duration::from_secs(60),
        ..new_flow(case, 1, ChildFailurePolicy::Ignore)
    };
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let at = UNIX_EPOCH + Duration::from_millis(1_796_000_000_000);
    for when in [at, at + Duration::from_secs(5)] {
        store
            .mark_parent_ran(&flow.id, when)
            .await
            .or_fail(case, "mark_parent_ran")?;
    }
    let read = head(case, store, &flow.id).await?;
    ensure!(
        case,
        read.parent_ran_at == Some(1_796_000_000_000) && read.is_finished() && read.parent_sent_at.is_none(),
        "{read:?}"
    );
    ensure!(
        case,
        !listed(case, store, &flow.id).await?,
        "a flow whose parent ran leaves the overdue listing"
    );
    Ok(())
}

/// Once the parent was sent (or ran), it saw a failed child as failed: the child's later success is
/// `Before` and the flow keeps the failure; before that, the success moves the count.
async fn failed_stays_after_parent(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[9];
    for ran in [false, true] {
        let flow = new_flow(case, 2, ChildFailurePolicy::Ignore);
        store.create_flow(&flow).await.or_fail(case, "create_flow")?;
        for (child, end) in [
            ("00000", succeeded("1")),
            ("00001", ChildEnd::Failed("404".into())),
        ] {
            counted(
                case,
                store
                    .child_finished(&flow.id, child, &end)
                    .await
                    .or_fail(case, "count")?,
            )?;
        }
        let now = SystemTime::now();
        let marked = match ran {
            false => store.mark_parent_sent(&flow.id, now).await,
            true => store.mark_parent_ran(&flow.id, now).await,
        };
        marked.or_fail(case, "mark")?;
        let late = store
            .child_finished(&flow.id, "00001", &succeeded("2"))
            .await
            .or_fail(case, "late success")?;
        ensure!(
            case,
            matches!(&late, Count::Before(flow) if flow.failed == 1 && flow.succeeded == 1),
            "ran {ran}: a late success after the parent keeps the failure: {late:?}"
        );
        let children = store.children(&flow.id).await.or_fail(case, "children")?;
        ensure!(
            case,
            children[1].end == Some(ChildEnd::Failed("404".into())),
            "ran {ran}: {children:?}"
        );
    }
    Ok(())
}
