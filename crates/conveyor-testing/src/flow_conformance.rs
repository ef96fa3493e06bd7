//! The flows conformance suite: the `FlowStore` port's contracts, checked against any backend
//! (`MemoryFlows` and `DynamoStore` on DynamoDB Local), including the race that decides which
//! child's count sends the parent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::port::{ChildEnd, NewFlow, ParentMessage};
use conveyor_core::{ChildFailurePolicy, port::FlowStore};

use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "a_flow_is_created_once_and_read_back",
    "a_child_counts_once",
    "exactly_one_count_finishes_the_flow",
    "a_failed_child_is_recorded_with_its_reason",
    "the_parent_is_marked_sent_once",
    "an_unknown_flow_is_an_error",
];

/// Runs every case against `store`; returns every failed case.
pub async fn run_all(store: Arc<dyn FlowStore>) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (
            CASES[0],
            Box::pin(a_flow_is_created_once_and_read_back(store.as_ref())),
        ),
        (CASES[1], Box::pin(a_child_counts_once(store.as_ref()))),
        (
            CASES[2],
            Box::pin(exactly_one_count_finishes_the_flow(Arc::clone(&store))),
        ),
        (
            CASES[3],
            Box::pin(a_failed_child_is_recorded_with_its_reason(store.as_ref())),
        ),
        (CASES[4], Box::pin(the_parent_is_marked_sent_once(store.as_ref()))),
        (CASES[5], Box::pin(an_unknown_flow_is_an_error(store.as_ref()))),
    ];
    run_cases("flows", cases).await
}

fn new_flow(case: &str, children: usize, policy: ChildFailurePolicy) -> NewFlow {
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
        id,
    }
}

/// Create, create again with other children (a re-send), read: the first write stands.
pub(crate) async fn a_flow_is_created_once_and_read_back(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[0];
    let flow = new_flow(case, 3, ChildFailurePolicy::Ignore);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let again = NewFlow {
        children: BTreeMap::new(),
        ..flow.clone()
    };
    store
        .create_flow(&again)
        .await
        .or_fail(case, "create_flow again")?;
    let read = store
        .flow(&flow.id)
        .await
        .or_fail(case, "flow")?
        .ok_or_else(|| SuiteFailure::new(case, "the flow was not found"))?;
    ensure!(
        case,
        read.children == flow.children,
        "children: {:?}",
        read.children
    );
    ensure!(case, read.parent == flow.parent, "parent: {:?}", read.parent);
    ensure!(
        case,
        read.policy == ChildFailurePolicy::Ignore,
        "policy: {:?}",
        read.policy
    );
    ensure!(
        case,
        read.pending() == 3 && read.parent_sent_at.is_none(),
        "{read:?}"
    );
    Ok(())
}

/// The same child's success counted twice counts once; the second answer says so.
pub(crate) async fn a_child_counts_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[1];
    let flow = new_flow(case, 2, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let first = store
        .child_finished(&flow.id, "00000", &ChildEnd::Succeeded)
        .await
        .or_fail(case, "child_finished")?;
    let second = store
        .child_finished(&flow.id, "00000", &ChildEnd::Succeeded)
        .await
        .or_fail(case, "child_finished again")?;
    ensure!(
        case,
        first.first_time && !second.first_time,
        "first {first:?}, second {second:?}"
    );
    ensure!(
        case,
        second.flow.done == ["00000"],
        "done: {:?}",
        second.flow.done
    );
    ensure!(
        case,
        second.flow.pending() == 1,
        "pending: {}",
        second.flow.pending()
    );
    ensure!(
        case,
        second.flow.parent_due().is_none(),
        "one child pending: the parent is not due"
    );
    Ok(())
}

/// 20 children counted concurrently, each twice: exactly one first-time count leaves none pending.
pub(crate) async fn exactly_one_count_finishes_the_flow(store: Arc<dyn FlowStore>) -> CaseResult {
    let case = CASES[2];
    let flow = new_flow(case, 20, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let calls = flow.children.keys().chain(flow.children.keys()).map(|child| {
        let store = Arc::clone(&store);
        let (flow_id, child) = (flow.id.clone(), child.clone());
        tokio::spawn(async move { store.child_finished(&flow_id, &child, &ChildEnd::Succeeded).await })
    });
    let mut finishing = 0;
    let mut first_times = 0;
    for call in futures_util::future::join_all(calls).await {
        let counted = call
            .map_err(|error| SuiteFailure::new(case, format!("task failed: {error}")))?
            .or_fail(case, "child_finished")?;
        if counted.first_time {
            first_times += 1;
            if counted.flow.pending() == 0 {
                finishing += 1;
            }
        }
    }
    ensure!(
        case,
        first_times == 20,
        "{first_times} first-time counts for 20 children"
    );
    ensure!(
        case,
        finishing == 1,
        "{finishing} counts finished the flow; exactly one must"
    );
    Ok(())
}

/// A dead-lettered child's reason is kept; its later success does not count; the policy decides.
pub(crate) async fn a_failed_child_is_recorded_with_its_reason(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[3];
    let flow = new_flow(case, 2, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let failed = store
        .child_finished(&flow.id, "00001", &ChildEnd::Failed("chunk 1: 404".to_owned()))
        .await
        .or_fail(case, "child_finished")?;
    ensure!(case, failed.first_time, "{failed:?}");
    ensure!(
        case,
        failed.flow.failed.get("00001").map(String::as_str) == Some("chunk 1: 404"),
        "failed: {:?}",
        failed.flow.failed
    );
    let due = failed.flow.parent_due();
    ensure!(
        case,
        matches!(&due, Some(Some(reason)) if reason.contains("chunk 1: 404")),
        "fail_parent: the parent is due as failed: {due:?}"
    );
    let late = store
        .child_finished(&flow.id, "00001", &ChildEnd::Succeeded)
        .await
        .or_fail(case, "child_finished late")?;
    ensure!(
        case,
        !late.first_time && late.flow.done.is_empty(),
        "a failed child's later success must not count: {late:?}"
    );
    Ok(())
}

/// The first time the parent is marked sent stays.
pub(crate) async fn the_parent_is_marked_sent_once(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[4];
    let flow = new_flow(case, 1, ChildFailurePolicy::FailParent);
    store.create_flow(&flow).await.or_fail(case, "create_flow")?;
    let first = UNIX_EPOCH + Duration::from_millis(1_796_000_000_000);
    store
        .mark_parent_sent(&flow.id, first)
        .await
        .or_fail(case, "mark_parent_sent")?;
    store
        .mark_parent_sent(&flow.id, first + Duration::from_secs(5))
        .await
        .or_fail(case, "mark_parent_sent again")?;
    let read = store.flow(&flow.id).await.or_fail(case, "flow")?;
    let sent = read.and_then(|flow| flow.parent_sent_at);
    ensure!(case, sent == Some(1_796_000_000_000), "parent_sent_at: {sent:?}");
    Ok(())
}

/// Counting a child of a flow that has no record is an error, never a silent success.
pub(crate) async fn an_unknown_flow_is_an_error(store: &dyn FlowStore) -> CaseResult {
    let case = CASES[5];
    let unknown = format!("{case}/{}", uuid::Uuid::new_v4().simple());
    let result = store
        .child_finished(&unknown, "00000", &ChildEnd::Succeeded)
        .await;
    ensure!(case, result.is_err(), "counting in an unknown flow: {result:?}");
    let read = store.flow(&unknown).await.or_fail(case, "flow")?;
    ensure!(case, read.is_none(), "an unknown flow reads as none: {read:?}");
    Ok(())
}
