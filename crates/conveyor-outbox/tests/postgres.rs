//! The Postgres outbox on a real Postgres: the store's conformance suite, the writer inside the
//! application's transaction (commit, rollback, two writers of one aggregate), and relays sending from it.
//!
//! Postgres comes from `make local-aws` (`localstack/start-postgres.sh`: 127.0.0.1:55432, trust auth,
//! database `conveyor`); `CONVEYOR_TEST_POSTGRES_URL` points elsewhere. Without it the tests fail, they
//! never skip. Each test works in a schema of its own, dropped at its end.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::message::AttributeValue;
use conveyor_outbox::conformance::{self, Writer};
use conveyor_outbox::postgres::{
    PostgresOutbox, PostgresOutboxError, PostgresOutboxStore, PostgresTables, migrate_tables,
};
use conveyor_outbox::{OutboxStore, Parked, QueueSink, Relay, RelayOptions, StoreError, Unfenced, resend};
use conveyor_sqs::NewJob;
use conveyor_testing::memory_queue::MemoryQueue;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:55432/conveyor";
const QUEUE_URL: &str = "http://localhost/000000000000/outbox-postgres";

fn url() -> String {
    std::env::var("CONVEYOR_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

async fn pool(connections: u32) -> PgPool {
    let url = url();
    let unreachable = |error: &dyn std::fmt::Display| -> ! {
        panic!(
            "Postgres is not reachable at {url}: {error}. Run `make local-aws` (it starts Postgres on \
             127.0.0.1:55432 with localstack/start-postgres.sh), or set CONVEYOR_TEST_POSTGRES_URL"
        )
    };
    // One plain connection first: its error says why (refused, no such database), the pool's only that
    // it timed out.
    match tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url)).await {
        Ok(Ok(connection)) => drop(connection.close().await),
        Ok(Err(error)) => unreachable(&error),
        Err(elapsed) => unreachable(&elapsed),
    }
    PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|error| unreachable(&error))
}

/// A schema of the test's own with the outbox tables (migrated twice: the migration is idempotent).
struct Database {
    pool: PgPool,
    tables: PostgresTables,
}

impl Database {
    async fn new(test: &str) -> Self {
        let pool = pool(8).await;
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let tables = PostgresTables::in_schema(&format!("t_{test}_{}", &suffix[..8])).unwrap();
        migrate_tables(&pool, &tables).await.unwrap();
        migrate_tables(&pool, &tables).await.unwrap();
        Self { pool, tables }
    }

    fn schema(&self) -> &str {
        self.tables.schema().unwrap_or_default()
    }

    fn store(&self) -> PostgresOutboxStore {
        PostgresOutboxStore::with_tables(self.pool.clone(), self.tables.clone())
    }

    fn outbox(&self) -> PostgresOutbox {
        PostgresOutbox::with_tables(QUEUE_URL, self.tables.clone())
    }

    /// The application's own table.
    async fn create_orders(&self) {
        sqlx::query(&format!(
            "CREATE TABLE {}.orders (id bigint PRIMARY KEY)",
            self.schema()
        ))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn remove(self) {
        sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.schema()))
            .execute(&self.pool)
            .await
            .unwrap();
        self.pool.close().await;
    }
}

/// The conformance suite's writer: each job in a transaction of its own.
struct TransactionWriter {
    pool: PgPool,
    tables: PostgresTables,
}

#[async_trait]
impl Writer for TransactionWriter {
    async fn commit(&self, queue_url: &str, aggregate: &str, body: &str) {
        let outbox = PostgresOutbox::with_tables(queue_url, self.tables.clone());
        let payload: Value = serde_json::from_str(body).unwrap();
        let mut tx = self.pool.begin().await.unwrap();
        outbox
            .put(&mut tx, NewJob::new("conformance", payload), aggregate)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn the_store_passes_the_conformance_suite() {
    let database = Database::new("conformance").await;
    let writer = TransactionWriter {
        pool: database.pool.clone(),
        tables: database.tables.clone(),
    };
    conformance::run(Arc::new(database.store()), &writer, "pg-").await;
    database.remove().await;
}

#[tokio::test]
async fn the_job_commits_and_rolls_back_with_the_applications_rows() {
    let database = Database::new("rollback").await;
    database.create_orders().await;
    let outbox = database.outbox();
    let insert_order = format!("INSERT INTO {}.orders (id) VALUES ($1)", database.schema());
    for (order, commit) in [(1_i64, true), (2, false), (3, true)] {
        let mut tx = database.pool.begin().await.unwrap();
        sqlx::query(&insert_order)
            .bind(order)
            .execute(&mut *tx)
            .await
            .unwrap();
        let job = NewJob::new("invoice", json!({ "order": order }));
        let write = outbox.put(&mut tx, job, "customer-7").await.unwrap();
        assert!(write.idempotency_key.starts_with("outbox:"));
        outbox
            .put_unordered(&mut tx, NewJob::new("audit", json!({ "order": order })))
            .await
            .unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let orders: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT id FROM {}.orders ORDER BY id",
        database.schema()
    ))
    .fetch_all(&database.pool)
    .await
    .unwrap();
    assert_eq!(orders, [1, 3]);
    let store = database.store();
    let jobs = store.jobs("customer-7", 10).await.unwrap();
    let bodies: Vec<&str> = jobs.iter().map(|job| job.message.body.as_str()).collect();
    assert_eq!(
        bodies,
        [r#"{"order":1}"#, r#"{"order":3}"#],
        "the rolled-back job is gone"
    );
    let sequences: Vec<u64> = jobs.iter().map(|job| job.sequence).collect();
    assert_eq!(
        sequences,
        [1, 2],
        "the rollback gave its sequence number back: no gap"
    );
    let unordered: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE job_type = 'audit'",
        database.tables.jobs()
    ))
    .fetch_one(&database.pool)
    .await
    .unwrap();
    assert_eq!(
        unordered, 2,
        "unordered jobs commit and roll back with the rows too"
    );
    database.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_of_one_aggregate_come_back_in_commit_order() {
    let database = Database::new("commit_order").await;
    let outbox = database.outbox();
    // The second transaction begins first and writes before the first commits; it still comes second.
    let mut second = database.pool.begin().await.unwrap();
    let second_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *second)
        .await
        .unwrap();
    let mut first = database.pool.begin().await.unwrap();
    outbox
        .put(&mut first, NewJob::new("step", json!("first")), "account-1")
        .await
        .unwrap();
    let writer = outbox.clone();
    let blocked = tokio::spawn(async move {
        let write = writer
            .put(&mut second, NewJob::new("step", json!("second")), "account-1")
            .await
            .unwrap();
        second.commit().await.unwrap();
        write
    });
    // Until the first commits, the second waits on the aggregate's head row.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<String> =
            sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
                .bind(second_pid)
                .fetch_one(&database.pool)
                .await
                .unwrap();
        if waiting.as_deref() == Some("Lock") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second writer never waited for the first"
        );
        tokio::task::yield_now().await;
    }
    assert!(!blocked.is_finished());
    // Another aggregate does not wait.
    let mut other = database.pool.begin().await.unwrap();
    outbox
        .put(&mut other, NewJob::new("step", json!("other")), "account-2")
        .await
        .unwrap();
    other.commit().await.unwrap();
    first.commit().await.unwrap();
    let second_write = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second_write.sequence, 2);
    let jobs = database.store().jobs("account-1", 10).await.unwrap();
    let bodies: Vec<&str> = jobs.iter().map(|job| job.message.body.as_str()).collect();
    assert_eq!(bodies, [r#""first""#, r#""second""#], "commit order");
    database.remove().await;
}

#[tokio::test]
async fn messages_round_trip_with_their_attributes() {
    let database = Database::new("round_trip").await;
    let outbox = PostgresOutbox::with_tables(
        "http://localhost/000000000000/orders.fifo",
        database.tables.clone(),
    );
    let blob = AttributeValue {
        data_type: "Binary".to_owned(),
        string_value: None,
        binary_value: Some(vec![0, 1, 254, 255]),
    };
    let job = NewJob::new("invoice", json!({ "id": 9 }))
        .attribute("blob", blob.clone())
        .attribute("tenant", AttributeValue::string("acme"))
        .trace_header("Root=1-5759e988-bd862e3fe1be46a994272793");
    let mut conn = database.pool.acquire().await.unwrap();
    let write = outbox.put(&mut conn, job, "order-9").await.unwrap();
    drop(conn);
    let jobs = database.store().jobs("order-9", 10).await.unwrap();
    assert_eq!(jobs.len(), 1);
    let message = &jobs[0].message;
    assert_eq!(message.attributes.get("blob"), Some(&blob));
    assert_eq!(
        message.attributes.get("tenant"),
        Some(&AttributeValue::string("acme"))
    );
    assert_eq!(
        message.group_id.as_deref(),
        Some("order-9"),
        "the aggregate is the FIFO group"
    );
    assert_eq!(message.deduplication_id.as_deref(), Some(write.id.as_str()));
    assert_eq!(
        message.trace_header.as_deref(),
        Some("Root=1-5759e988-bd862e3fe1be46a994272793")
    );
    assert_eq!(jobs[0].job_type, "invoice");
    assert_eq!(jobs[0].id, write.id);
    database.remove().await;
}

/// A tenant needs no column of its own: on a standard queue it is the `MessageGroupId`, kept in the
/// `group_id` column (rows written before tenants have none and relay as they did); on a FIFO queue,
/// whose group is the aggregate, it is the `conveyor.tenant` attribute.
#[tokio::test]
async fn a_tenant_is_kept_as_the_message_group_or_its_attribute() {
    let database = Database::new("tenant").await;
    let mut conn = database.pool.acquire().await.unwrap();
    let job = NewJob::new("invoice", json!({ "id": 1 })).tenant("acme-42");
    database.outbox().put(&mut conn, job, "order-1").await.unwrap();
    let fifo = PostgresOutbox::with_tables(
        "http://localhost/000000000000/orders.fifo",
        database.tables.clone(),
    );
    let job = NewJob::new("invoice", json!({ "id": 2 })).tenant("acme-42");
    fifo.put(&mut conn, job, "order-2").await.unwrap();
    drop(conn);
    let standard = &database.store().jobs("order-1", 10).await.unwrap()[0].message;
    assert_eq!(standard.group_id.as_deref(), Some("acme-42"));
    assert_eq!(
        standard.deduplication_id, None,
        "SQS refuses one on a standard queue"
    );
    let fifo = &database.store().jobs("order-2", 10).await.unwrap()[0].message;
    assert_eq!(
        fifo.group_id.as_deref(),
        Some("order-2"),
        "the aggregate stays the FIFO group"
    );
    assert_eq!(
        fifo.attributes.get(conveyor_core::message::TENANT_ATTRIBUTE),
        Some(&AttributeValue::string("acme-42"))
    );
    database.remove().await;
}

#[tokio::test]
async fn a_newer_format_is_refused_not_skipped() {
    let database = Database::new("format").await;
    let mut conn = database.pool.acquire().await.unwrap();
    database
        .outbox()
        .put(&mut conn, NewJob::new("step", json!(1)), "agg")
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET format_version = 2",
        database.tables.jobs()
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    drop(conn);
    let error = database.store().jobs("agg", 10).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::Unreadable { aggregate, sequence: 1, message, .. }
            if aggregate == "agg" && message.contains("format version is 2")),
        "{error}"
    );
    database.remove().await;
}

#[tokio::test]
async fn missing_tables_name_the_migration() {
    let pool = pool(2).await;
    let tables = PostgresTables::in_schema("t_never_migrated").unwrap();
    let store = PostgresOutboxStore::with_tables(pool.clone(), tables.clone());
    let error = store.jobs("agg", 10).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::Misconfigured { message, .. } if message.contains("0001_outbox.sql")),
        "{error}"
    );
    assert!(!error.is_retryable());
    let mut conn = pool.acquire().await.unwrap();
    let error = PostgresOutbox::with_tables(QUEUE_URL, tables)
        .put(&mut conn, NewJob::new("step", json!(1)), "agg")
        .await
        .unwrap_err();
    assert!(
        matches!(error, PostgresOutboxError::Misconfigured { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("0001_outbox.sql"), "{error}");
    assert!(!error.is_retryable());
}

/// Commits `jobs` jobs spread over `aggregates` aggregates (payload `{"aggregate": a, "n": n}`, `n` from
/// 0 in each aggregate), from four writers at once.
async fn commit_jobs(database: &Database, jobs: usize, aggregates: usize) {
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let pool = database.pool.clone();
            let outbox = database.outbox();
            tokio::spawn(async move {
                // Each writer takes whole aggregates, so each aggregate's jobs are written in `n` order.
                for aggregate in (writer..aggregates).step_by(4) {
                    for n in 0..jobs / aggregates {
                        let name = format!("agg-{aggregate:02}");
                        let job = NewJob::new("step", json!({ "aggregate": name, "n": n }));
                        let mut tx = pool.begin().await.unwrap();
                        outbox.put(&mut tx, job, &name).await.unwrap();
                        tx.commit().await.unwrap();
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// Sweeps with `relay` until the store is empty (bounded).
async fn drain(relay: Relay, store: PostgresOutboxStore) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        relay.sweep(Duration::ZERO, 100, &Unfenced).await;
        let backlog = store.backlog(1).await.unwrap();
        if backlog.oldest_pending_millis.is_none() && backlog.parked.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not empty the outbox: {backlog:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Per aggregate, the `n`s in the order the queue received them (first occurrences only), and how many
/// messages it received.
fn sent_order(queue: &MemoryQueue) -> (BTreeMap<String, Vec<u64>>, usize) {
    let messages = queue.snapshot();
    let mut seen = BTreeSet::new();
    let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in &messages {
        let body: Value = serde_json::from_str(&message.body).unwrap();
        let aggregate = body["aggregate"].as_str().unwrap().to_owned();
        let n = body["n"].as_u64().unwrap();
        if seen.insert((aggregate.clone(), n)) {
            order.entry(aggregate).or_default().push(n);
        }
    }
    (order, messages.len())
}

fn relay(store: &PostgresOutboxStore, queue: &Arc<MemoryQueue>) -> Relay {
    let sink = QueueSink::new().with_queue(QUEUE_URL, queue.clone());
    Relay::new(Arc::new(store.clone()), Arc::new(sink))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_sends_every_aggregate_in_order() {
    let database = Database::new("relay").await;
    commit_jobs(&database, 200, 20).await;
    let store = database.store();
    let queue = Arc::new(MemoryQueue::standard("outbox-postgres"));
    drain(relay(&store, &queue), store.clone()).await;
    let (order, received) = sent_order(&queue);
    assert_eq!(received, 200, "each job sent once");
    assert_eq!(order.len(), 20);
    for (aggregate, ns) in &order {
        assert_eq!(ns, &(0..10).collect::<Vec<u64>>(), "{aggregate} in commit order");
    }
    database.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_at_once_keep_each_aggregates_order() {
    let database = Database::new("two_relays").await;
    let queue = Arc::new(MemoryQueue::standard("outbox-postgres"));
    // Each relay has a pool of its own, as two relay processes would.
    let first_store = PostgresOutboxStore::with_tables(pool(4).await, database.tables.clone());
    let second_store = PostgresOutboxStore::with_tables(pool(4).await, database.tables.clone());
    commit_jobs(&database, 200, 20).await;
    let first = tokio::spawn(drain(relay(&first_store, &queue), first_store.clone()));
    let second = tokio::spawn(drain(relay(&second_store, &queue), second_store.clone()));
    first.await.unwrap();
    second.await.unwrap();
    let (order, received) = sent_order(&queue);
    assert!(received >= 200, "every job sent at least once: {received}");
    assert_eq!(order.len(), 20);
    for (aggregate, ns) in &order {
        assert_eq!(
            ns,
            &(0..10).collect::<Vec<u64>>(),
            "{aggregate}: first sends in commit order"
        );
    }
    first_store.pool().close().await;
    second_store.pool().close().await;
    database.remove().await;
}

/// Commits, per aggregate `{prefix}{i}`, a job for each queue of `queues` in turn (`n` = its place).
async fn commit_users(database: &Database, prefix: &str, users: usize, queues: &[&str]) {
    for user in 0..users {
        let name = format!("{prefix}{user:03}");
        let mut tx = database.pool.begin().await.unwrap();
        for (n, queue) in queues.iter().enumerate() {
            let outbox = PostgresOutbox::with_tables(*queue, database.tables.clone());
            let job = NewJob::new("step", json!({ "aggregate": name, "n": n }));
            outbox.put(&mut tx, job, &name).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// A queue was deleted: 150 users whose first job was for it, each with a welcome email behind it,
/// park their aggregates. 50 users committed after are all sent by the next pass of 100 aggregates
/// (the parked ones, older, took every turn before). Once the queue exists again, one resend by its
/// name recovers the 150, each in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_aggregates_never_stop_fresh_ones_and_one_resend_by_queue_recovers_them() {
    const GONE: &str = "http://localhost/000000000000/deleted-queue";
    let database = Database::new("parked").await;
    let store = database.store();
    commit_users(&database, "parked-", 150, &[GONE, QUEUE_URL]).await;
    let queue = Arc::new(MemoryQueue::standard("outbox-postgres"));
    let mut options = RelayOptions::default();
    options.max_attempts = 1;
    // The relay's clock a second ahead: a sweep lists jobs committed before its now, and a job committed
    // in the sweep's own millisecond would wait for the next pass (it did, once, in CI).
    let ahead: conveyor_outbox::WallClock = Arc::new(|| {
        conveyor_core::runtime::epoch_millis(std::time::SystemTime::now() + Duration::from_secs(1))
    });
    let relay = relay(&store, &queue)
        .with_options(options.clone())
        .with_wall_clock(Arc::clone(&ahead));
    let mut parked = 0;
    for _ in 0..2 {
        parked += relay.sweep(Duration::ZERO, 100, &Unfenced).await.parked;
    }
    assert_eq!(parked, 150, "every first job refused and parked");

    commit_users(&database, "fresh-", 50, &[QUEUE_URL]).await;
    let pass = relay.sweep(Duration::ZERO, 100, &Unfenced).await;
    assert_eq!(
        (pass.sent, pass.failed),
        (50, 0),
        "one pass sends every fresh user: {pass:?}"
    );
    let (order, _) = sent_order(&queue);
    assert!(
        order.keys().all(|aggregate| aggregate.starts_with("fresh-")),
        "no welcome email went before its user's parked job: {order:?}"
    );

    let recreated = Arc::new(MemoryQueue::standard("deleted-queue"));
    let sink = QueueSink::new()
        .with_queue(QUEUE_URL, queue.clone())
        .with_queue(GONE, recreated.clone());
    let resent = resend(&store, &Parked::Queue("deleted-queue".to_owned()))
        .await
        .unwrap();
    assert_eq!((resent.aggregates.len(), resent.jobs), (150, 150));
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(sink))
        .with_options(options)
        .with_wall_clock(ahead);
    drain(relay, store.clone()).await;
    let (first_jobs, received) = sent_order(&recreated);
    assert_eq!((first_jobs.len(), received), (150, 150));
    let (order, _) = sent_order(&queue);
    let welcomed = order
        .iter()
        .filter(|(aggregate, ns)| aggregate.starts_with("parked-") && ns.as_slice() == [1])
        .count();
    assert_eq!(
        welcomed, 150,
        "each parked user's welcome email, after its first job"
    );
    database.remove().await;
}
