//! Flows through the real worker on `MemoryQueue` (strict like SQS) under a paused clock: a nested flow
//! whose parents run once each, after their children, with their outputs; duplicates of every child;
//! a failed child ignored or failing its parent as the flow says; a nested flow whose inner flow fails
//! with duplicate and redriven failure notices never runs its outer parent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::{
    port::{IdempotencyStore, Queue},
    {ChildFailurePolicy, Context, Flows, Handler, HandlerError, Pipeline, Router},
};
use conveyor_sqs::{Flow, FlowProducer, NewJob};
use conveyor_testing::{MemoryFlows, MemoryIdempotencyStore, MemoryQueue, QueueSender};
use conveyor_worker::Worker;
use serde::{Deserialize, Serialize};

use common::{config, eventually, start};

#[derive(Debug, Serialize, Deserialize)]
struct Leaf {
    n: u64,
}

/// Doubles its number; fails permanently on 0.
struct Double;

impl Handler for Double {
    type Job = Leaf;
    type Output = u64;
    const JOB_TYPE: &'static str = "double";

    async fn handle(&self, job: Leaf, _ctx: Context) -> Result<u64, HandlerError> {
        if job.n == 0 {
            return Err(HandlerError::permanent("zero is not a number here"));
        }
        Ok(job.n * 2)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct SumJob {
    name: String,
}

/// Each parent run: (name, outputs seen, failed children seen).
type Runs = Arc<Mutex<Vec<(String, Vec<u64>, usize)>>>;

/// Sums its children's outputs; records each run with what it saw.
struct Sum {
    runs: Runs,
}

impl Handler for Sum {
    type Job = SumJob;
    type Output = u64;
    const JOB_TYPE: &'static str = "sum";

    async fn handle(&self, job: SumJob, ctx: Context) -> Result<u64, HandlerError> {
        let outputs: Vec<u64> = ctx.child_outputs()?;
        let failed = ctx.failed_children();
        self.runs
            .lock()
            .unwrap()
            .push((job.name, outputs.clone(), failed));
        Ok(outputs.iter().sum())
    }
}

struct Setup {
    queue: Arc<MemoryQueue>,
    dlq: Arc<MemoryQueue>,
    runs: Runs,
    producer: FlowProducer,
    pipeline: Pipeline,
}

fn setup() -> Setup {
    let dlq = Arc::new(MemoryQueue::standard("flows-dlq"));
    let queue = Arc::new(
        MemoryQueue::standard("flows")
            .with_visibility_timeout(Duration::from_secs(30))
            .with_dead_letter_queue(dlq.clone(), 3),
    );
    let store = Arc::new(MemoryIdempotencyStore::new());
    let flows = Arc::new(MemoryFlows::new());
    let sender = Arc::new(QueueSender(queue.clone() as Arc<dyn Queue>));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let pipeline = Pipeline::new(Router::new().route(Double).route(Sum { runs: runs.clone() }))
        .with_store(store as Arc<dyn IdempotencyStore>)
        .with_flows(Flows {
            store: flows.clone(),
            sender: sender.clone(),
        });
    Setup {
        producer: FlowProducer::with_sender(sender, flows),
        queue,
        dlq,
        runs,
        pipeline,
    }
}

fn sum(name: &str) -> NewJob<SumJob> {
    NewJob::new(
        "sum",
        SumJob {
            name: name.to_owned(),
        },
    )
}

fn double(n: u64) -> NewJob<Leaf> {
    NewJob::new("double", Leaf { n })
}

const URL: &str = "http://memory.invalid/000000000000/flows";

fn workers(setup: &Setup, count: usize) -> Vec<common::Running> {
    (0..count)
        .map(|_| {
            let config = config(&[("flows", 1)]).with_listen_addr(None);
            start(
                Worker::new(
                    config,
                    setup.pipeline.clone(),
                    vec![setup.queue.clone() as Arc<dyn Queue>],
                )
                .unwrap(),
            )
        })
        .collect()
}

async fn stop_all(workers: Vec<common::Running>) {
    for worker in workers {
        worker.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_nested_flow_sent_twice_runs_each_parent_once_after_its_children_with_their_outputs() {
    let setup = setup();
    // top = sum(double 1, double 2, sub), sub = sum(double 3, double 4).
    let sub = Flow::new("sub", sum("sub"), URL)
        .child(double(3), URL)
        .child(double(4), URL);
    let top = Flow::new("top", sum("top"), URL)
        .child(double(1), URL)
        .child(double(2), URL)
        .child_flow(sub);
    let sent = setup.producer.send(&top).await.unwrap();
    assert_eq!(
        sent.messages_sent, 4,
        "the four leaves are sent now, the parents later"
    );
    setup.producer.send(&top).await.unwrap();

    let running = workers(&setup, 2);
    eventually(300, "both parents to run and the queue to empty", || {
        setup.runs.lock().unwrap().len() >= 2 && setup.queue.is_empty()
    })
    .await;
    stop_all(running).await;
    let runs = setup.runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        [
            ("sub".to_owned(), vec![6, 8], 0),
            ("top".to_owned(), vec![2, 4, 14], 0)
        ],
        "each parent once, the sub-flow's before the top's, with its children's outputs in order"
    );
    assert!(setup.dlq.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failed_child_is_ignored_or_fails_the_parent_as_each_flow_says() {
    let setup = setup();
    let ignoring = Flow::new("ignoring", sum("ignoring"), URL)
        .child(double(5), URL)
        .child(double(0), URL)
        .on_child_failure(ChildFailurePolicy::Ignore);
    let failing = Flow::new("failing", sum("failing"), URL)
        .child(double(6), URL)
        .child(double(0), URL);
    setup.producer.send(&ignoring).await.unwrap();
    setup.producer.send(&failing).await.unwrap();

    let running = workers(&setup, 1);
    eventually(
        300,
        "the ignoring parent to run and the failing one to reach the DLQ",
        || !setup.runs.lock().unwrap().is_empty() && setup.dlq.len() >= 3 && setup.queue.is_empty(),
    )
    .await;
    stop_all(running).await;
    let runs = setup.runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        [("ignoring".to_owned(), vec![10], 1)],
        "the failing flow's parent never runs"
    );
    // Two failed children and the failing flow's parent.
    let bodies: Vec<String> = setup
        .queue
        .messages_in_dlq()
        .into_iter()
        .map(|message| message.body)
        .collect();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert!(
        bodies.iter().any(|body| body.contains("\"failing\"")),
        "{bodies:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_flow_whose_inner_flow_fails_twice_never_runs_its_outer_parent() {
    let setup = setup();
    // outer = sum(double 7, inner), inner = sum(double 0, double 0): both inner children fail for
    // good, each may send a failure notice; then an operator sends the DLQ copy of the inner notice
    // again (a new message id). Every copy is a failure of `inner` in `outer`, never a success.
    let inner = Flow::new("inner", sum("inner"), URL)
        .child(double(0), URL)
        .child(double(0), URL);
    let outer = Flow::new("outer", sum("outer"), URL)
        .child(double(7), URL)
        .child_flow(inner);
    setup.producer.send(&outer).await.unwrap();

    let running = workers(&setup, 2);
    let notice_of = |flow: &str| {
        setup.queue.messages_in_dlq().into_iter().find(|message| {
            message.attributes.contains_key("conveyor.flow.failed")
                && message
                    .attributes
                    .get("conveyor.flow.parent")
                    .and_then(|value| value.string_value.as_deref())
                    == Some(flow)
        })
    };
    eventually(300, "both notices in the DLQ and the queue empty", || {
        notice_of("inner").is_some() && notice_of("outer").is_some() && setup.queue.is_empty()
    })
    .await;
    let notice = notice_of("inner").unwrap();
    for _ in 0..2 {
        let copy = conveyor_core::port::OutgoingMessage {
            body: notice.body.clone(),
            attributes: notice.attributes.clone(),
            delay: None,
            group_id: None,
            deduplication_id: None,
            trace_header: None,
        };
        setup.queue.send(copy).await.unwrap();
    }
    eventually(300, "the redriven copies to be settled", || {
        setup.queue.is_empty()
    })
    .await;
    // Time for a wrongly sent outer parent to arrive and run.
    tokio::time::sleep(Duration::from_secs(120)).await;
    eventually(300, "the queue to stay empty", || setup.queue.is_empty()).await;
    stop_all(running).await;
    let runs = setup.runs.lock().unwrap().clone();
    assert!(runs.is_empty(), "neither parent runs: {runs:?}");
}
