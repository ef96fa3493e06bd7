//! The DynamoDB table: the store suites (idempotency, job tracking, flows, timers) against every
//! DynamoDB implementation that installs from the registries here, `DynamoStore` on DynamoDB Local 3.3.1
//! and on moto's server, and against the memory doubles beside them (`MemoryIdempotencyStore`,
//! `MemoryFlows`, `MemoryTimers`). See the parent module for how a run is judged.
//!
//! The suites' races (20 claims of one key, counts that finish a flow, relays claiming a timer) run
//! once per case, so a store whose conditional writes are not atomic fails them only sometimes. The probe
//! [`claim_race_exactly_one_wins_many_times`] repeats the idempotency race until it fails, which is
//! what pins such a store down in every run.

use std::sync::Arc;

use conveyor_core::port::{FlowStore, IdempotencyStore, TimerStore};
use conveyor_dynamodb::DynamoStore;
use conveyor_testing::localstack::{OwnMoto, create_table, dynamodb_client, ensure_local_aws};
use conveyor_testing::suite::SuiteFailures;
use conveyor_testing::{
    MemoryFlows, MemoryIdempotencyStore, MemoryTimers, flow_conformance, store_conformance,
    timer_conformance, tracking_conformance,
};

use super::{Deviation, Failed, Implementation, Matrix, Row, Seen};

/// The implementations, in the table's order.
const COLUMNS: &[Implementation] = &[
    Implementation::DynamoDbLocal,
    Implementation::MotoDynamoDb,
    Implementation::MemoryStores,
];

/// The suites, as the rows' keys name them (`suite/case`), with their cases.
const SUITES: [(&str, &[&str]); 4] = [
    ("store", store_conformance::CASES),
    ("tracking", tracking_conformance::CASES),
    ("flows", flow_conformance::CASES),
    ("timers", timer_conformance::CASES),
];

/// The probe's name, and how many races it runs on a store that wins every one.
const PROBE: &str = "claim_race_exactly_one_wins_many_times";
const RACES: usize = 40;

/// What moto does to a claim race: more than one conditional write wins.
const MOTO_RACE: &str = "Lets more than one of 20 concurrent conditional writes of one key succeed: it checks \
                         the condition and writes in two steps, and its server runs requests on threads \
                         without a lock.";
/// What AWS says about single writes.
const ATOMIC_WRITES: &str = "Individual write operations such as UpdateItem are atomic and always operate on \
                             the most recent version of the item, regardless of concurrency.";
const ATOMIC_WRITES_SOURCE: &str = "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/BestPractices_ImplementingVersionControl.html";
/// What moto does to the flows suite: a cancelled transaction rolls the whole table back.
const MOTO_ROLLBACK: &str = "Loses writes: a cancelled `TransactWriteItems` puts back a copy of every table it \
                             touches taken when it began, undoing what other requests wrote to other items \
                             meanwhile (here the racing counts of `exactly_one_count_finishes_the_flow`, whose \
                             transactions are also not atomic: a child can count twice).";
/// What AWS says about transactions beside other writes.
const SERIALIZABLE: &str = "Serializable isolation ensures that the results of multiple concurrent operations \
                            are the same as if no operation begins until the previous one has finished.";
const SERIALIZABLE_SOURCE: &str = "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html#transaction-isolation";

/// A deviation of moto's DynamoDB.
const fn moto(
    case: &'static str,
    seen: Seen,
    does: &'static str,
    aws_says: &'static str,
    source: &'static str,
) -> Deviation {
    Deviation {
        implementation: Implementation::MotoDynamoDb,
        case,
        seen,
        does,
        aws_says,
        source,
    }
}

/// Every known deviation. The test fails when a run disagrees with this list in either direction. On
/// moto every flows case that writes is marked sometimes (all but `not_in_flow`): a write lands while
/// another case's transaction may be cancelled and undo it. In 12 runs of the suites on moto each of them
/// failed at least once but `created_once`, which the same rollback can undo.
const DEVIATIONS: &[Deviation] = &[
    moto(
        PROBE,
        Seen::Always,
        MOTO_RACE,
        ATOMIC_WRITES,
        ATOMIC_WRITES_SOURCE,
    ),
    moto(
        "store/claim_race_exactly_one_wins",
        Seen::Sometimes,
        MOTO_RACE,
        ATOMIC_WRITES,
        ATOMIC_WRITES_SOURCE,
    ),
    moto(
        "flows/exactly_one_count_finishes_the_flow",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
    moto(
        "flows/a_flow_is_created_once_and_a_conflicting_resend_is_refused",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
    moto(
        "flows/a_child_counts_once",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
    moto(
        "flows/a_failed_child_is_recorded_and_a_later_success_resumes_the_flow",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
    moto(
        "flows/the_parent_and_the_failure_notice_are_marked_once",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
    moto(
        "flows/overdue_flows_are_listed_until_closed",
        Seen::Sometimes,
        MOTO_ROLLBACK,
        SERIALIZABLE,
        SERIALIZABLE_SOURCE,
    ),
];

fn matrix() -> Matrix {
    let mut rows: Vec<Row> = SUITES
        .iter()
        .flat_map(|(suite, cases)| {
            cases
                .iter()
                .map(move |case| Row::new(format!("{suite}/{case}"), Some(*suite)))
        })
        .collect();
    rows.push(Row::new(PROBE, Some("probe")));
    Matrix {
        marker: "fidelity-matrix-dynamodb",
        columns: COLUMNS,
        rows,
        deviations: DEVIATIONS,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dynamodb_implementation_deviates_only_as_the_matrix_says() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let moto = OwnMoto::start().await?;
    let (local, on_moto) = tokio::try_join!(
        Stores::dynamo(dynamodb_client().await),
        Stores::dynamo(moto.dynamodb_client())
    )?;
    let implementations = [
        (Implementation::DynamoDbLocal, local),
        (Implementation::MotoDynamoDb, on_moto),
        (Implementation::MemoryStores, Stores::memory()),
    ];
    matrix()
        .judge(&implementations, async |stores: &Stores| {
            run_implementation(stores).await
        })
        .await
}

/// One implementation's stores, one per suite: `DynamoStore` on a table of its own per suite (the flows
/// and timers suites list what their table holds), or a fresh double.
struct Stores {
    idempotency: Arc<dyn IdempotencyStore>,
    tracking: Arc<dyn IdempotencyStore>,
    flows: Arc<dyn FlowStore>,
    timers: Arc<dyn TimerStore>,
}

impl Stores {
    async fn dynamo(client: aws_sdk_dynamodb::Client) -> anyhow::Result<Self> {
        let (idempotency, tracking, flows, timers) = tokio::try_join!(
            create_table(&client, "fidelity-store"),
            create_table(&client, "fidelity-tracking"),
            create_table(&client, "fidelity-flows"),
            create_table(&client, "fidelity-timers"),
        )?;
        Ok(Self {
            idempotency: Arc::new(DynamoStore::new(client.clone(), idempotency)),
            tracking: Arc::new(DynamoStore::new(client.clone(), tracking)),
            flows: Arc::new(DynamoStore::new(client.clone(), flows)),
            timers: Arc::new(DynamoStore::new(client, timers)),
        })
    }

    fn memory() -> Self {
        Self {
            idempotency: Arc::new(MemoryIdempotencyStore::new()),
            tracking: Arc::new(MemoryIdempotencyStore::new()),
            flows: Arc::new(MemoryFlows::new()),
            timers: Arc::new(MemoryTimers::new()),
        }
    }
}

/// The four suites and the probe, concurrently, against one implementation.
async fn run_implementation(stores: &Stores) -> Failed {
    let (store, tracking, flows, timers, probe) = tokio::join!(
        store_conformance::run_all(Arc::clone(&stores.idempotency)),
        tracking_conformance::run_all(Arc::clone(&stores.tracking)),
        flow_conformance::run_all(Arc::clone(&stores.flows)),
        timer_conformance::run_all(Arc::clone(&stores.timers)),
        claim_race_exactly_one_wins_many_times(Arc::clone(&stores.idempotency)),
    );
    let mut failed = Failed::new();
    for (suite, result) in [
        ("store", store),
        ("tracking", tracking),
        ("flows", flows),
        ("timers", timers),
    ] {
        let Err(SuiteFailures(failures)) = result else {
            continue;
        };
        for failure in failures {
            failed.insert(format!("{suite}/{}", failure.case), failure.message);
        }
    }
    if let Err(message) = probe {
        failed.insert(PROBE.to_owned(), message);
    }
    failed
}

/// The idempotency suite's race (20 concurrent claims of one fresh key: exactly one acquires), run
/// [`RACES`] times one after another, stopping at the first race with no single winner.
async fn claim_race_exactly_one_wins_many_times(store: Arc<dyn IdempotencyStore>) -> Result<(), String> {
    for race in 1..=RACES {
        if let Err(failure) = store_conformance::claim_race_exactly_one_wins(Arc::clone(&store)).await {
            return Err(format!("race {race} of {RACES}: {}", failure.message));
        }
    }
    Ok(())
}
