//! The fencing token protects a downstream effect, not only the idempotency record: a worker whose
//! lease lapsed and was taken over cannot land its write after the new holder's
//! (`examples/src/fenced_ledger.rs`), on DynamoDB Local with the real `DynamoStore`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use conveyor_core::{
    message::Message,
    port::IdempotencyStore,
    runtime::{AckReason, Budget, Lease, Outcome},
    {Context, Handler, HandlerError, Pipeline, Router},
};
use conveyor_dynamodb::DynamoStore;
use conveyor_examples::fenced_ledger::{FencedLedger, LedgerError};
use conveyor_testing::localstack::{self, dynamodb_client, ensure_local_aws, unique_name};
use conveyor_testing::wait_until;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What one run saw: its token and what its ledger write answered.
#[derive(Debug)]
struct Run {
    token: u64,
    write: Result<(), String>,
}

/// Writes the ledger under its claim's token; the first run (the one to go stale) waits at a gate
/// after it starts, before its write.
struct Charge {
    ledger: FencedLedger,
    runs: Arc<Mutex<Vec<Run>>>,
    started: Arc<Notify>,
    release: Arc<Notify>,
    holds: bool,
}

impl Handler for Charge {
    type Job = Value;
    type Output = ();
    const JOB_TYPE: &'static str = "charge";

    async fn handle(&self, _job: Value, ctx: Context) -> Result<(), HandlerError> {
        let (Some(key), Some(token)) = (ctx.idempotency_key(), ctx.fencing_token()) else {
            return Err(HandlerError::permanent(
                "the ledger write needs an idempotency claim",
            ));
        };
        if self.holds {
            self.started.notify_one();
            self.release.notified().await;
        }
        let write = self
            .ledger
            .write(key, token, &format!("charged by token {token}"))
            .await;
        self.runs.lock().unwrap().push(Run {
            token,
            write: write.as_ref().map(|_| ()).map_err(ToString::to_string),
        });
        match write {
            Ok(()) => Ok(()),
            Err(error @ LedgerError::Stale { .. }) => Err(HandlerError::retryable(error.to_string())),
            Err(error) => Err(HandlerError::retryable(error.to_string())),
        }
    }
}

#[tokio::test]
async fn a_stale_holders_write_is_refused_after_a_takeover() -> anyhow::Result<()> {
    ensure_local_aws()
        .await
        .context("DynamoDB Local is needed: run ./localstack/start.sh (make test does)")?;
    let client = dynamodb_client().await;
    let table = localstack::create_table(&client, "fenced-idem").await?;
    let ledger = FencedLedger::new(client.clone(), unique_name("fenced-ledger"));
    ledger.create_table().await?;
    let store = Arc::new(DynamoStore::new(client, &table));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let pipeline = |holds| {
        Pipeline::new(Router::new().default_route(Charge {
            ledger: ledger.clone(),
            runs: Arc::clone(&runs),
            started: Arc::clone(&started),
            release: Arc::clone(&release),
            holds,
        }))
        .with_store(store.clone())
    };
    let message = Message::new(unique_name("m"), r#"{"amount": 42}"#);
    let process = |pipeline: Pipeline, message: Message, lease: Duration| async move {
        let lease = Lease::new(Instant::now() + lease);
        pipeline
            .process(Arc::new(message), Arc::from("charges"), &lease, Budget::default())
            .await
    };

    // Worker A claims with a 1 s lease and stalls (no heartbeat): its lease lapses.
    let stale = tokio::spawn(process(pipeline(true), message.clone(), Duration::from_secs(1)));
    started.notified().await;
    let key = conveyor_core::KeyStyle::Conveyor.key("charge", &message)?;
    let lapses = store
        .get(&key)
        .await?
        .and_then(|record| record.lease_until)
        .context("worker A's in-progress record")?;
    // Past the lease by a margin: the takeover below must find it lapsed on DynamoDB Local's side too.
    let lapsed = lapses + Duration::from_millis(500);
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async move { SystemTime::now() > lapsed },
    )
    .await?;

    // Worker B takes the job over and charges.
    let fresh = process(pipeline(false), message.clone(), Duration::from_secs(60)).await;
    assert_eq!(fresh.outcome, Outcome::Ack(AckReason::Completed));

    // Worker A wakes up and tries to charge under its old token.
    release.notify_one();
    let stale = stale.await?;
    assert!(
        matches!(stale.outcome, Outcome::Retry { .. }),
        "the stale run failed its write: {:?}",
        stale.outcome
    );

    let runs: Vec<Run> = std::mem::take(&mut *runs.lock().unwrap());
    let [fresh_run, stale_run] = [&runs[0], &runs[1]];
    assert!(
        fresh_run.token > stale_run.token,
        "the takeover's token {} is above the stale holder's {}",
        fresh_run.token,
        stale_run.token
    );
    assert_eq!(fresh_run.write, Ok(()));
    let refusal = stale_run.write.as_ref().unwrap_err();
    assert!(refusal.contains("stale"), "{refusal}");
    let (token, entry) = ledger.read(&key).await?.context("the ledger entry")?;
    assert_eq!(
        token, fresh_run.token,
        "the ledger keeps the newer holder's write"
    );
    assert_eq!(entry, format!("charged by token {}", fresh_run.token));
    Ok(())
}
