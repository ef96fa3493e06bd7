//! 1 MiB messages end to end on LocalStack: a queue (and its DLQ) whose `MaximumMessageSize` is 1 MiB, as
//! `infra/modules/queue` creates them, takes a 900 KiB job whole. A producer with large payloads on
//! (`Producer::with_large_payloads`) sends it inline, because the claim check offloads only above the
//! queue's own limit; the example `worker` and, through `conveyor lambda run`, the example `bootstrap`
//! run it; a 900 KiB job that fails permanently lands in the DLQ inline, with its failure record.
//!
//! The queues' limit is set explicitly: LocalStack 4.8.1 creates queues at 1 MiB already (as SQS does
//! since August 2025), where Terraform's AWS provider defaults to 262,144 bytes. At 262,144 the same
//! jobs go through S3 and this test fails at the send.
//!
//! The binaries come from `cargo build -p conveyor-examples -p conveyor-cli --bins`, which `make test`
//! runs first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_sqs::types::{Message as SqsMessage, MessageSystemAttributeName, QueueAttributeName};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::port::{LEGACY_SIZE_ATTRIBUTE, SIZE_ATTRIBUTE};
use conveyor_examples::jobs::import_contacts::ContactImport;
use conveyor_s3::S3PayloadStore;
use conveyor_sqs::{NewJob, Producer};
use conveyor_testing::localstack::{self, QueueSpec, TestQueue, unique_name};
use conveyor_testing::wait_for;
use serde_json::Value;

/// The size of the jobs' CSV: past the 256 KiB queues had before August 2025, under 1 MiB.
const JOB_BYTES: usize = 900 * 1024;
/// SQS's largest `MaximumMessageSize` since August 2025, what `infra/modules/queue` sets by default.
const ONE_MIB: usize = 1024 * 1024;
/// How long a job may take to show its effect.
const EFFECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A queue and its DLQ at 1 MiB, an empty bucket for large payloads, a table and an outbox, on the
/// shared emulators.
struct Setup {
    sqs: aws_sdk_sqs::Client,
    s3: aws_sdk_s3::Client,
    bucket: String,
    queue: TestQueue,
    table: String,
    outbox: PathBuf,
}

async fn setup(name: &str) -> anyhow::Result<Setup> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let s3 = localstack::s3_client();
    let bucket = unique_name(&format!("{name}-payloads"))
        .to_lowercase()
        .replace('_', "-");
    s3.create_bucket().bucket(&bucket).send().await?;
    let spec = QueueSpec::standard(name)
        .visibility_timeout_secs(30)
        .max_receive_count(3);
    let queue = localstack::create_queue(&sqs, &spec).await?;
    for url in [Some(&queue.url), queue.dlq_url.as_ref()].into_iter().flatten() {
        sqs.set_queue_attributes()
            .queue_url(url)
            .attributes(QueueAttributeName::MaximumMessageSize, ONE_MIB.to_string())
            .send()
            .await?;
    }
    let table = localstack::create_table(&localstack::dynamodb_client().await, name).await?;
    let outbox = conveyor_e2e::outbox_path(&format!("{name}-outbox"));
    Ok(Setup {
        sqs,
        s3,
        bucket,
        queue,
        table,
        outbox,
    })
}

impl Setup {
    /// A producer as a user builds one with large payloads on: S3 in this bucket above the queue's limit.
    fn producer(&self) -> Producer {
        let store = Arc::new(S3PayloadStore::new(self.s3.clone()));
        Producer::new(self.sqs.clone(), &self.queue.url).with_large_payloads(store, &self.bucket)
    }

    /// The variables a consumer process runs with.
    fn env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = localstack::aws_env()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        env.extend(
            [
                ("AWS_ENDPOINT_URL_S3", localstack::sqs_endpoint()),
                ("CONVEYOR_PAYLOAD_BUCKET", self.bucket.clone()),
                ("CONVEYOR_IDEMPOTENCY_TABLE", self.table.clone()),
                ("WEBHOOK_SIGNING_SECRET", "mib-messages".to_owned()),
                ("CONVEYOR_DEMO_OUTBOX", self.outbox.display().to_string()),
            ]
            .map(|(name, value)| (name.to_owned(), value)),
        );
        env
    }

    /// Sends a job that runs and one whose CSV has no email column (a permanent failure), 900 KiB each;
    /// checks that neither went through S3. Returns the good one.
    async fn send_two(&self, prefix: &str) -> anyhow::Result<ContactImport> {
        let good = contacts(&format!("{prefix}-good"), "email,name");
        let bad = contacts(&format!("{prefix}-bad"), "address,name");
        let producer = self.producer();
        producer
            .send(&NewJob::new("import_contacts", good.clone()))
            .await?;
        producer.send(&NewJob::new("import_contacts", bad)).await?;
        let objects = self
            .s3
            .list_objects_v2()
            .bucket(&self.bucket)
            .send()
            .await?
            .key_count
            .unwrap_or_default();
        anyhow::ensure!(
            objects == 0,
            "a 900 KiB job went through S3 ({objects} objects) although the queue takes 1 MiB"
        );
        Ok(good)
    }

    /// Waits for the outbox's import of `job` and checks the handler got the whole CSV.
    async fn expect_imported(&self, job: &ContactImport) -> anyhow::Result<()> {
        let imported = wait_for(EFFECT_TIMEOUT, Duration::from_millis(200), async || {
            let text = std::fs::read_to_string(&self.outbox).ok()?;
            text.lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|effect| effect["effect"] == "contacts_imported" && effect["list_id"] == job.list_id)
        })
        .await
        .with_context(|| format!("no import of {} in {}", job.list_id, self.outbox.display()))?;
        anyhow::ensure!(
            imported["csv_bytes"].as_u64() == Some(job.csv.len() as u64)
                && imported["csv_sha256"] == conveyor_e2e::sha256_hex(&job.csv),
            "the handler did not get the 900 KiB CSV whole: {imported}"
        );
        Ok(())
    }

    /// Receives the one dead-lettered copy and checks it: the 900 KiB job inline (no pointer), and the
    /// failure record of a permanent failure on its first run.
    async fn expect_dead_letter(&self, list_id: &str) -> anyhow::Result<()> {
        let url = self.queue.dlq_url.clone().context("the queue has a DLQ")?;
        let copy: SqsMessage = wait_for(EFFECT_TIMEOUT, Duration::from_millis(100), async || {
            let output = self
                .sqs
                .receive_message()
                .queue_url(&url)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .ok()?;
            output.messages?.into_iter().next()
        })
        .await
        .context("no copy of the failed job in the DLQ")?;
        let body = copy.body().unwrap_or_default();
        let job: ContactImport = serde_json::from_str(body).with_context(|| {
            format!(
                "the DLQ copy's body is not the job itself: {}",
                &body[..body.len().min(200)]
            )
        })?;
        anyhow::ensure!(
            job.list_id == list_id,
            "the DLQ holds {}, not {list_id}",
            job.list_id
        );
        anyhow::ensure!(
            job.csv.len() >= JOB_BYTES,
            "the DLQ copy's CSV is {} bytes",
            job.csv.len()
        );
        let attributes = copy.message_attributes.clone().unwrap_or_default();
        anyhow::ensure!(
            !attributes.contains_key(SIZE_ATTRIBUTE) && !attributes.contains_key(LEGACY_SIZE_ATTRIBUTE),
            "the DLQ copy is marked as a pointer: {:?}",
            attributes.keys()
        );
        let failure = attributes
            .get(FAILURE_ATTRIBUTE)
            .and_then(|value| value.string_value())
            .with_context(|| format!("the DLQ copy has no {FAILURE_ATTRIBUTE}: {:?}", attributes.keys()))?;
        let failure: Value = serde_json::from_str(failure)?;
        anyhow::ensure!(
            failure["error"]
                .as_str()
                .is_some_and(|error| error.contains("no email column"))
                && failure["handler"] == "import_contacts"
                && failure["receive_count"] == 1
                && failure["source_queue"]
                    .as_str()
                    .is_some_and(|source| source.contains(&self.queue.name))
                && failure["failed_at_ms"].as_u64().is_some_and(|at| at > 0),
            "the failure record is not the permanent failure's: {failure}"
        );
        Ok(())
    }
}

/// A contact list of [`JOB_BYTES`]: a header, then rows.
fn contacts(list_id: &str, header: &str) -> ContactImport {
    conveyor_e2e::contact_list(list_id, JOB_BYTES, header).0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_and_dead_letters_900_kib_jobs_sent_inline() -> anyhow::Result<()> {
    let setup = setup("mib-worker").await?;
    let good = setup.send_two("worker").await?;
    let mut worker = tokio::process::Command::new(conveyor_e2e::binaries().path("worker")?);
    for name in conveyor_e2e::INHERITED {
        worker.env_remove(name);
    }
    let mut worker = worker
        .envs(setup.env())
        .env("CONVEYOR_QUEUE_URL", &setup.queue.url)
        .env("CONVEYOR_LISTEN_ADDR", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the worker")?;
    let outcome = async {
        setup.expect_imported(&good).await?;
        setup.expect_dead_letter("worker-bad").await
    }
    .await;
    worker.kill().await?;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_function_runs_and_dead_letters_900_kib_jobs_sent_inline() -> anyhow::Result<()> {
    let setup = setup("mib-lambda").await?;
    let good = setup.send_two("lambda").await?;
    let output =
        conveyor_e2e::lambda_run_until_empty(&setup.queue.url, &setup.env(), Duration::from_secs(120))
            .await?;
    setup.expect_imported(&good).await.with_context(|| {
        format!(
            "conveyor lambda run printed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    setup.expect_dead_letter("lambda-bad").await
}
