//! Conveyor and the real Powertools for AWS Lambda (Python 3.37.0 and TypeScript 2.35.0, pinned in
//! `localstack/powertools/`) consume the same SQS records through one idempotency table on DynamoDB
//! Local, with Conveyor's Powertools key style: each job runs once across both, in both directions.
//!
//! The Powertools side runs `tests/powertools/{python_consumer.py,typescript_consumer.cjs}` (their
//! `idempotent_function` / `makeIdempotent` around a handler); the installer runs on first use. Each
//! test counts handler runs on both sides.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use conveyor_core::{
    message::Message,
    port::RecordStatus,
    runtime::{AckReason, Budget, Lease, Outcome, Processed},
    {
        Context, Handler, HandlerError, HandlerSettings, KeySource, KeyStyle, Pipeline, PowertoolsFlavor,
        PowertoolsKey, Router,
    },
};
use conveyor_dynamodb::{DataFormat, DynamoStore, SortKey, StoreOptions};
use conveyor_testing::localstack::{self, dynamodb_client, ensure_local_aws, unique_name};
use conveyor_testing::powertools::{self, Consumer, ConsumerSpec, Language, sqs_record};
use conveyor_testing::wait_until;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Lets a test hold a Conveyor handler in progress: it says when it started and waits to be released.
#[derive(Debug, Default)]
struct Gate {
    started: Notify,
    release: Notify,
}

/// Counts its runs and returns who ran it.
struct Recorder {
    runs: Arc<AtomicUsize>,
    settings: HandlerSettings,
    gate: Option<Arc<Gate>>,
}

impl Handler for Recorder {
    type Job = Value;
    type Output = Value;
    const JOB_TYPE: &'static str = "interop";

    async fn handle(&self, _job: Value, ctx: Context) -> Result<Value, HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.started.notify_one();
            gate.release.notified().await;
        }
        Ok(json!({"by": "conveyor", "messageId": ctx.message_id()}))
    }

    fn settings(&self) -> HandlerSettings {
        self.settings.clone()
    }
}

/// One table shared by a Powertools consumer of `language` and a Conveyor pipeline keyed like it.
struct Shared {
    language: Language,
    table: String,
    prefix: String,
    store: Arc<DynamoStore>,
    runs: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    sort_key: Option<SortKey>,
}

fn flavor(language: Language) -> PowertoolsFlavor {
    match language {
        Language::Python => PowertoolsFlavor::Python,
        Language::TypeScript => PowertoolsFlavor::TypeScript,
    }
}

async fn prerequisites() -> anyhow::Result<()> {
    ensure_local_aws().await.context(
        "DynamoDB Local is needed: run ./localstack/start.sh (make test does) and see .local/logs/",
    )?;
    powertools::ensure_installed()
        .context("Powertools for Python and TypeScript are needed: run ./localstack/install-powertools.sh")
}

impl Shared {
    async fn new(language: Language, name: &str) -> anyhow::Result<Self> {
        prerequisites().await?;
        let client = dynamodb_client().await;
        let table = localstack::create_table(&client, name).await?;
        Ok(Self::on(language, client, table, None))
    }

    /// On a table with partition key `id` and sort key `sk`, as Powertools' `sort_key_attr` lays it out.
    async fn with_sort_key(language: Language, name: &str) -> anyhow::Result<Self> {
        prerequisites().await?;
        let client = dynamodb_client().await;
        let table = unique_name(name);
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name: &str, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        client
            .create_table()
            .table_name(&table)
            .attribute_definitions(attribute("id")?)
            .attribute_definitions(attribute("sk")?)
            .key_schema(key("id", KeyType::Hash)?)
            .key_schema(key("sk", KeyType::Range)?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await?;
        let sort_key = SortKey {
            attribute: "sk".into(),
            partition_value: format!("idempotency#{name}"),
        };
        Ok(Self::on(language, client, table, Some(sort_key)))
    }

    fn on(
        language: Language,
        client: aws_sdk_dynamodb::Client,
        table: String,
        sort_key: Option<SortKey>,
    ) -> Self {
        let data_format = match language {
            Language::Python => DataFormat::JsonString,
            Language::TypeScript => DataFormat::Native,
        };
        let store = DynamoStore::new(client, &table).with_options(
            StoreOptions::default()
                .with_data_format(data_format)
                .with_sort_key(sort_key.clone()),
        );
        Self {
            language,
            prefix: format!("orders-fn.app.{}", language.name()),
            table,
            store: Arc::new(store),
            runs: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(Gate::default()),
            sort_key,
        }
    }

    fn key_style(&self) -> KeyStyle {
        KeyStyle::Powertools(PowertoolsKey {
            flavor: flavor(self.language),
            prefix: self.prefix.clone(),
            source: KeySource::MessageId,
        })
    }

    fn pipeline(&self, settings: HandlerSettings, hold: bool) -> Pipeline {
        let handler = Recorder {
            runs: Arc::clone(&self.runs),
            settings: settings.with_key_style(self.key_style()),
            gate: hold.then(|| Arc::clone(&self.gate)),
        };
        Pipeline::new(Router::new().default_route(handler)).with_store(self.store.clone())
    }

    /// The Powertools consumer's spec for `message`.
    fn spec(&self, message: &Message) -> ConsumerSpec {
        let mut spec = ConsumerSpec::new(
            &self.table,
            &self.prefix,
            vec![sqs_record(&message.id, &message.body)],
        );
        spec.sort_key = self
            .sort_key
            .as_ref()
            .map(|key| (key.attribute.clone(), key.partition_value.clone()));
        spec
    }

    fn conveyor_runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// The record id both sides build for `message`.
    /// Waits until the in-progress lease on `message`'s record (written by `whose` consumer) lapsed.
    async fn wait_lease_lapsed(&self, message: &Message, whose: &str) -> anyhow::Result<()> {
        let id = self.record_id(message);
        let record = conveyor_core::port::IdempotencyStore::get(self.store.as_ref(), &id)
            .await?
            .with_context(|| format!("{whose} in-progress record"))?;
        let lapses = record
            .lease_until
            .with_context(|| format!("{whose} record has no in_progress_expiration"))?;
        wait_past(lapses + Duration::from_millis(10)).await
    }

    fn record_id(&self, message: &Message) -> String {
        self.key_style().key("interop", message).unwrap()
    }
}

fn message(id_hint: &str) -> Message {
    Message::new(unique_name(id_hint), r#"{"order_id": 7}"#)
}

async fn process(pipeline: &Pipeline, message: &Message, lease: Duration) -> Processed {
    let lease = Lease::new(Instant::now() + lease);
    pipeline
        .process(
            Arc::new(message.clone()),
            Arc::from("interop-queue"),
            &lease,
            Budget::default(),
        )
        .await
}

fn output(processed: &Processed) -> Value {
    serde_json::from_str(processed.output.as_deref().unwrap_or("null")).unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);

/// Waits (bounded) until the wall clock is past `time`: the condition a lapsed lease or an expired
/// record depends on.
async fn wait_past(time: SystemTime) -> anyhow::Result<()> {
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async move { SystemTime::now() > time },
    )
    .await
}

#[tokio::test]
async fn the_other_side_completes_and_conveyor_acks_the_duplicate_with_its_output() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-other-completes").await?;
        let message = message("m");
        let events = Consumer::run(language, &shared.spec(&message)).await?;
        assert_eq!(powertools::runs(&events), 1, "{language:?}: {events:?}");

        let processed = process(
            &shared.pipeline(HandlerSettings::default(), false),
            &message,
            MINUTE,
        )
        .await;

        assert_eq!(
            processed.outcome,
            Outcome::Ack(AckReason::Duplicate),
            "{language:?}"
        );
        assert_eq!(
            shared.conveyor_runs(),
            0,
            "{language:?}: Conveyor ran a job Powertools had done"
        );
        assert_eq!(
            output(&processed),
            json!({"by": language.name(), "messageId": message.id}),
            "{language:?}: the duplicate carries Powertools' stored output"
        );
    }
    Ok(())
}

#[tokio::test]
async fn conveyor_completes_and_the_other_side_skips_with_conveyors_output() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-conveyor-completes").await?;
        let message = message("m");
        let processed = process(
            &shared.pipeline(HandlerSettings::default(), false),
            &message,
            MINUTE,
        )
        .await;
        assert_eq!(
            processed.outcome,
            Outcome::Ack(AckReason::Completed),
            "{language:?}"
        );

        let events = Consumer::run(language, &shared.spec(&message)).await?;

        assert_eq!(
            powertools::runs(&events),
            0,
            "{language:?}: Powertools re-ran it: {events:?}"
        );
        assert_eq!(
            powertools::results(&events),
            [json!({"by": "conveyor", "messageId": message.id})],
            "{language:?}: Powertools returns Conveyor's stored output"
        );
        assert_eq!(shared.conveyor_runs(), 1);
    }
    Ok(())
}

#[tokio::test]
async fn a_claim_held_by_the_other_side_is_not_run_by_conveyor() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-other-holds").await?;
        let message = message("m");
        let mut spec = shared.spec(&message);
        spec.lease = Some(MINUTE);
        let mut holder = Consumer::start(language, &spec, "hold")?;
        holder.wait_started().await?;

        let processed = process(
            &shared.pipeline(HandlerSettings::default(), false),
            &message,
            MINUTE,
        )
        .await;

        let Outcome::Defer { delay, .. } = processed.outcome else {
            panic!("{language:?}: expected a deferral, got {:?}", processed.outcome);
        };
        assert!(
            delay > Duration::from_secs(30),
            "{language:?}: deferred until the other lease ends: {delay:?}"
        );
        assert_eq!(shared.conveyor_runs(), 0, "{language:?}");
        let events = holder.finish().await?;
        assert_eq!(powertools::runs(&events), 1);
        let after = process(
            &shared.pipeline(HandlerSettings::default(), false),
            &message,
            MINUTE,
        )
        .await;
        assert_eq!(after.outcome, Outcome::Ack(AckReason::Duplicate), "{language:?}");
        assert_eq!(shared.conveyor_runs(), 0, "{language:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_claim_held_by_conveyor_is_not_run_by_the_other_side() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-conveyor-holds").await?;
        let message = message("m");
        let pipeline = shared.pipeline(HandlerSettings::default(), true);
        let running = {
            let message = message.clone();
            tokio::spawn(async move { process(&pipeline, &message, MINUTE).await })
        };
        shared.gate.started.notified().await;

        let events = Consumer::run(language, &shared.spec(&message)).await?;

        assert_eq!(powertools::runs(&events), 0, "{language:?}: {events:?}");
        assert_eq!(
            powertools::errors(&events),
            ["IdempotencyAlreadyInProgressError"],
            "{language:?}"
        );
        shared.gate.release.notify_one();
        assert_eq!(running.await?.outcome, Outcome::Ack(AckReason::Completed));
        assert_eq!(shared.conveyor_runs(), 1);
    }
    Ok(())
}

#[tokio::test]
async fn a_lapsed_claim_of_the_other_side_is_taken_over_by_conveyor() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-other-lapses").await?;
        let message = message("m");
        let mut spec = shared.spec(&message);
        spec.lease = Some(Duration::from_secs(1));
        // A Lambda that dies mid-job: its claim stays in progress until its lease lapses.
        let mut holder = Consumer::start(language, &spec, "hold")?;
        holder.wait_started().await?;
        holder.kill().await?;
        shared
            .wait_lease_lapsed(&message, "the killed consumer's")
            .await?;

        let processed = process(
            &shared.pipeline(HandlerSettings::default(), false),
            &message,
            MINUTE,
        )
        .await;

        assert_eq!(
            processed.outcome,
            Outcome::Ack(AckReason::Completed),
            "{language:?}"
        );
        assert_eq!(shared.conveyor_runs(), 1, "{language:?}");
        let events = Consumer::run(language, &shared.spec(&message)).await?;
        assert_eq!(powertools::runs(&events), 0, "{language:?}: {events:?}");
        assert_eq!(
            powertools::results(&events),
            [json!({"by": "conveyor", "messageId": message.id})]
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_lapsed_conveyor_claim_is_taken_over_by_the_other_side() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-conveyor-lapses").await?;
        let message = message("m");
        let pipeline = shared.pipeline(HandlerSettings::default(), true);
        let running = {
            let message = message.clone();
            // No heartbeat here: the claim's lease is the 1 s "visibility deadline" and lapses.
            tokio::spawn(async move { process(&pipeline, &message, Duration::from_secs(1)).await })
        };
        shared.gate.started.notified().await;
        shared.wait_lease_lapsed(&message, "Conveyor's").await?;
        let id = shared.record_id(&message);

        let events = Consumer::run(language, &shared.spec(&message)).await?;

        assert_eq!(powertools::runs(&events), 1, "{language:?}: {events:?}");
        shared.gate.release.notify_one();
        // The stale Conveyor run finishes after the takeover: its complete is fenced, the record stays
        // what Powertools wrote.
        running.await?;
        let record = conveyor_core::port::IdempotencyStore::get(shared.store.as_ref(), &id)
            .await?
            .context("the record")?;
        assert_eq!(record.status, RecordStatus::Completed);
        let stored: Value = serde_json::from_str(record.output.as_deref().unwrap_or("null"))?;
        assert_eq!(stored["by"], language.name(), "{language:?}: {record:?}");
    }
    Ok(())
}

#[tokio::test]
async fn sort_key_tables_are_shared_both_ways() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::with_sort_key(language, &format!("pt-sk-{}", language.name())).await?;
        let theirs = message("theirs");
        let ours = message("ours");
        let pipeline = shared.pipeline(HandlerSettings::default(), false);
        let events = Consumer::run(language, &shared.spec(&theirs)).await?;
        assert_eq!(powertools::runs(&events), 1);
        let duplicate = process(&pipeline, &theirs, MINUTE).await;
        assert_eq!(
            duplicate.outcome,
            Outcome::Ack(AckReason::Duplicate),
            "{language:?}"
        );
        assert_eq!(output(&duplicate)["by"], language.name());

        process(&pipeline, &ours, MINUTE).await;
        let events = Consumer::run(language, &shared.spec(&ours)).await?;
        assert_eq!(powertools::runs(&events), 0, "{language:?}: {events:?}");
        assert_eq!(powertools::results(&events)[0]["by"], "conveyor");
        assert_eq!(shared.conveyor_runs(), 1);
    }
    Ok(())
}

#[tokio::test]
async fn expired_status_records_are_read_and_claimable() -> anyhow::Result<()> {
    // Powertools writes status EXPIRED when a record's expiry is already past as it saves it.
    let shared = Shared::new(Language::Python, "pt-expired").await?;
    let message = message("m");
    let mut spec = shared.spec(&message);
    spec.expires_after_seconds = Some(-10);
    let events = Consumer::run(Language::Python, &spec).await?;
    assert_eq!(powertools::runs(&events), 1, "{events:?}");
    let record =
        conveyor_core::port::IdempotencyStore::get(shared.store.as_ref(), &shared.record_id(&message))
            .await?
            .context("Powertools' record")?;
    assert_eq!(record.status, RecordStatus::Expired, "{record:?}");

    let processed = process(
        &shared.pipeline(HandlerSettings::default(), false),
        &message,
        MINUTE,
    )
    .await;

    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(shared.conveyor_runs(), 1);
    Ok(())
}

#[tokio::test]
async fn payload_validation_hashes_match_each_side() -> anyhow::Result<()> {
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-validation").await?;
        let validating = HandlerSettings::default().with_validate_payload(true);
        let message = message("m");
        let mut spec = shared.spec(&message);
        spec.validation_jmespath = Some("powertools_json(body)".into());
        Consumer::run(language, &spec).await?;

        let same = process(&shared.pipeline(validating.clone(), false), &message, MINUTE).await;
        assert_eq!(same.outcome, Outcome::Ack(AckReason::Duplicate), "{language:?}");

        let mut changed = message.clone();
        changed.body = r#"{"order_id": 8}"#.into();
        let refused = process(&shared.pipeline(validating, false), &changed, MINUTE).await;
        let Outcome::Reject(failure) = refused.outcome else {
            panic!("{language:?}: expected a reject, got {:?}", refused.outcome);
        };
        assert!(failure.error.contains("different payload"), "{failure:?}");
        assert_eq!(shared.conveyor_runs(), 0);
    }
    Ok(())
}

#[tokio::test]
async fn an_in_progress_record_shorter_lived_than_its_job_stays_claimed() -> anyhow::Result<()> {
    // record_ttl (1 s) far below the job's length: the in-progress record must still outlive the run,
    // or Powertools (whose claim condition takes any expired record) would run the job a second time.
    for language in Language::ALL {
        let shared = Shared::new(language, "pt-short-record").await?;
        let message = message("m");
        let settings = HandlerSettings::default().with_record_ttl(Duration::from_secs(1));
        let pipeline = shared.pipeline(settings, true);
        let claimed_at = SystemTime::now();
        let running = {
            let message = message.clone();
            tokio::spawn(async move { process(&pipeline, &message, MINUTE).await })
        };
        shared.gate.started.notified().await;
        wait_past(claimed_at + Duration::from_secs(3)).await?;

        let events = Consumer::run(language, &shared.spec(&message)).await?;

        assert_eq!(powertools::runs(&events), 0, "{language:?}: {events:?}");
        shared.gate.release.notify_one();
        assert_eq!(running.await?.outcome, Outcome::Ack(AckReason::Completed));
    }
    Ok(())
}

#[test]
fn conveyor_builds_the_ids_the_real_libraries_wrote() {
    // The ids Powertools 3.37.0 (Python) and 2.35.0 (TypeScript) wrote for this message id with
    // keyPrefix "orders-fn.app.handle" against DynamoDB Local (2026-11-30).
    let message = Message::new("f03c5386-ffaa-4261-84fe-68fdd7caeb19", "{}");
    let key = |flavor| {
        KeyStyle::Powertools(PowertoolsKey {
            flavor,
            prefix: "orders-fn.app.handle".into(),
            source: KeySource::MessageId,
        })
        .key("interop", &message)
        .unwrap()
    };
    assert_eq!(
        key(PowertoolsFlavor::Python),
        "orders-fn.app.handle#3511ac31c0c52af1547a237943ec42a9"
    );
    assert_eq!(
        key(PowertoolsFlavor::TypeScript),
        "orders-fn.app.handle#NRGsMcDFKvFUeiN5Q+xCqQ=="
    );
}
