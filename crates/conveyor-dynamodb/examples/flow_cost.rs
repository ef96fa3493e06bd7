//! DynamoDB requests per flow child, and the time to count a fan-out, against DynamoDB Local.
//!
//! ```text
//! ./localstack/start.sh && cargo run --release -p conveyor-dynamodb --example flow_cost [-- <children>...]
//! ```
//!
//! For each size (default 1,000 and 10,000 children): creates the flow, counts every child's end from
//! 16 tasks at once (as 16 consumers finishing children would), then reads the children as the parent
//! does. Requests are counted on the wire, per operation (the fault layer's call counts, no fault).
//! Every item this writes is under 1 KB: a `PutItem` or `UpdateItem` is 1 write unit, a transaction
//! item 2. Figures, not pass/fail: DynamoDB Local on a laptop is not DynamoDB.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conveyor_core::ChildFailurePolicy;
use conveyor_core::port::{ChildEnd, Count, FlowStore};
use conveyor_dynamodb::DynamoStore;
use conveyor_testing::faults::{Faults, with_faults_dynamodb};
use conveyor_testing::{flow_conformance, localstack};
use futures_util::{StreamExt, stream};

const OPERATIONS: [&str; 6] = [
    "PutItem",
    "UpdateItem",
    "TransactWriteItems",
    "GetItem",
    "BatchGetItem",
    "Query",
];

fn calls(faults: &Faults) -> BTreeMap<&'static str, u64> {
    OPERATIONS
        .iter()
        .map(|operation| (*operation, faults.calls(operation)))
        .collect()
}

fn print_phase(
    phase: &str,
    children: usize,
    before: &BTreeMap<&str, u64>,
    after: &BTreeMap<&str, u64>,
    took: Duration,
) {
    let per_child: Vec<String> = OPERATIONS
        .iter()
        .filter_map(|operation| {
            let made = after[operation] - before[operation];
            (made > 0).then(|| format!("{operation} {:.3}", made as f64 / children as f64))
        })
        .collect();
    println!(
        "  {phase:<8} {:>8.1} s   per child: {}",
        took.as_secs_f64(),
        per_child.join(", ")
    );
}

async fn measure(store: Arc<DynamoStore>, faults: &Faults, children: usize) {
    println!("{children} children");
    let flow = flow_conformance::new_flow("cost", children, ChildFailurePolicy::FailParent);

    let before = calls(faults);
    let started = Instant::now();
    store.create_flow(&flow).await.expect("create the flow");
    print_phase("create", children, &before, &calls(faults), started.elapsed());

    let before = calls(faults);
    let started = Instant::now();
    let ids: Vec<String> = flow.children.keys().cloned().collect();
    let counted: Vec<Count> = stream::iter(ids)
        .map(|child| {
            let store = Arc::clone(&store);
            let flow_id = flow.id.clone();
            async move {
                let end = ChildEnd::Succeeded {
                    output: Some(format!(r#"{{"rows":{}}}"#, child.len())),
                };
                store
                    .child_finished(&flow_id, &child, &end)
                    .await
                    .expect("count a child")
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let took = started.elapsed();
    print_phase("count", children, &before, &calls(faults), took);
    println!(
        "           {:.0} counts/s; counted once each: {}",
        children as f64 / took.as_secs_f64(),
        counted.iter().all(|count| matches!(count, Count::Counted(_)))
    );

    let before = calls(faults);
    let started = Instant::now();
    let read = store.children(&flow.id).await.expect("read the children");
    print_phase("children", children, &before, &calls(faults), started.elapsed());
    assert_eq!(read.len(), children, "every child read back");
    let head = store
        .flow(&flow.id)
        .await
        .expect("read the head")
        .expect("the flow exists");
    assert_eq!(head.pending(), 0, "every child counted: {head:?}");
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|size| size.parse().expect("a number of children"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        sizes
    };
    let client = localstack::dynamodb_client().await;
    let table = localstack::create_table(&client, "flow-cost")
        .await
        .expect("DynamoDB Local is running (./localstack/start.sh)");
    let faults = Faults::new(1);
    let store = Arc::new(DynamoStore::new(with_faults_dynamodb(&client, &faults), &table));
    for size in sizes {
        measure(Arc::clone(&store), &faults, size).await;
    }
}
