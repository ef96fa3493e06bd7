//! Large payloads (claim check) end to end, on a LocalStack of this file's own serving SQS and S3 (its
//! buckets and queues stay apart from the shared emulator's): 5 MiB jobs through the example `worker` binary and through
//! `conveyor lambda run` with the example `bootstrap`, the DLQ keeping the pointer and the object, a
//! missing object dead-lettered with its bucket and key, a dead-lettered job redriven after its object's
//! first lifetime (the lifecycle rule run by hand), and interop both ways with AWS's SQS Extended
//! Client Library for Python (pinned in `localstack/extended-client/requirements.txt`, installed into
//! `.local/` by `localstack/install-extended-client.sh` on first use).
//!
//! The binaries come from `cargo build -p conveyor-examples -p conveyor-cli --bins`, which `make test`
//! runs first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use aws_sdk_sqs::types::{Message as SqsMessage, MessageAttributeValue, MessageSystemAttributeName};
use conveyor_core::port::{PayloadError, PayloadStore, Queue};
use conveyor_core::port::{PayloadPointer, SIZE_ATTRIBUTE};
use conveyor_core::{Context, Handler, HandlerError, Payloads, Pipeline, Router};
use conveyor_dynamodb::DynamoStore;
use conveyor_examples::jobs::import_contacts::ContactImport;
use conveyor_s3::S3PayloadStore;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{
    self, OwnLocalStack, QueueSpec, Services, TestQueue, repo_root, unique_name,
};
use conveyor_testing::{wait_for, wait_until};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

/// The emulator every test of this file shares (started once; it dies with the test process).
static EMULATOR: OnceCell<OwnLocalStack> = OnceCell::const_new();
/// How long a job may take to show its effect (a 5 MiB fetch included).
const EFFECT_TIMEOUT: Duration = Duration::from_secs(60);

async fn emulator() -> &'static OwnLocalStack {
    EMULATOR
        .get_or_init(|| async { OwnLocalStack::start_with(Services::SQS_S3).await.unwrap() })
        .await
}

/// A fresh bucket and a queue with a DLQ (3 receives), and the clients, on the shared emulator.
struct Setup {
    endpoint: String,
    sqs: aws_sdk_sqs::Client,
    store: Arc<S3PayloadStore>,
    bucket: String,
    queue: TestQueue,
    outbox: PathBuf,
    /// The consumers' idempotency table: objects are deleted after success only for idempotent
    /// handlers with a store (a completed record answers for every other copy of the pointer).
    table: String,
}

async fn setup(name: &str) -> Setup {
    let emulator = emulator().await;
    let sqs = emulator.sqs_client();
    let s3 = emulator.s3_client();
    let bucket = unique_name(&format!("{name}-payloads"))
        .to_lowercase()
        .replace('_', "-");
    s3.create_bucket().bucket(&bucket).send().await.unwrap();
    let spec = QueueSpec::standard(name)
        .visibility_timeout_secs(30)
        .max_receive_count(3);
    let queue = localstack::create_queue(&sqs, &spec).await.unwrap();
    let outbox = std::env::temp_dir().join(format!("{}.jsonl", unique_name(&format!("{name}-outbox"))));
    localstack::ensure_local_aws().await.unwrap();
    let table = localstack::create_table(&localstack::dynamodb_client().await, name)
        .await
        .unwrap();
    Setup {
        table,
        endpoint: emulator.endpoint(),
        sqs,
        store: Arc::new(S3PayloadStore::new(s3)),
        bucket,
        queue,
        outbox,
    }
}

impl Setup {
    fn producer(&self) -> Producer {
        Producer::new(self.sqs.clone(), &self.queue.url).with_large_payloads(self.store.clone(), &self.bucket)
    }

    /// The variables a consumer process runs with: this emulator for SQS and S3, the bucket, the app's.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL_SQS", self.endpoint.clone()),
            ("AWS_ENDPOINT_URL_S3", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", localstack::DUMMY_CREDENTIAL.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", localstack::DUMMY_CREDENTIAL.to_owned()),
            ("AWS_REGION", localstack::REGION.to_owned()),
            ("AWS_DEFAULT_REGION", localstack::REGION.to_owned()),
            ("CONVEYOR_PAYLOAD_BUCKET", self.bucket.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", localstack::dynamodb_endpoint()),
            ("CONVEYOR_IDEMPOTENCY_TABLE", self.table.clone()),
            ("WEBHOOK_SIGNING_SECRET", "large-payloads".to_owned()),
            ("CONVEYOR_DEMO_OUTBOX", self.outbox.display().to_string()),
        ]
    }

    /// The outbox's `contacts_imported` effects.
    fn imports(&self) -> Vec<Value> {
        let Ok(text) = std::fs::read_to_string(&self.outbox) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|effect| effect["effect"] == "contacts_imported")
            .collect()
    }

    async fn wait_for_import(&self, list_id: &str) -> Value {
        wait_for(EFFECT_TIMEOUT, Duration::from_millis(200), async || {
            self.imports()
                .into_iter()
                .find(|effect| effect["list_id"] == list_id)
        })
        .await
        .with_context(|| format!("no import of {list_id} in {}", self.outbox.display()))
        .unwrap()
    }

    async fn object_exists(&self, key: &str) -> bool {
        match self.store.get(&self.bucket, key).await {
            Ok(_) => true,
            Err(PayloadError::NotFound { .. }) => false,
            Err(error) => panic!("S3 failed: {error}"),
        }
    }

    /// Receives `count` messages from the DLQ (with every attribute).
    async fn dead_letters(&self, count: usize) -> Vec<SqsMessage> {
        let url = self.queue.dlq_url.clone().unwrap();
        let mut found: Vec<SqsMessage> = Vec::new();
        wait_for(EFFECT_TIMEOUT, Duration::from_millis(100), async || {
            let output = self
                .sqs
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .visibility_timeout(300)
                .send()
                .await
                .ok()?;
            found.extend(output.messages.unwrap_or_default());
            (found.len() >= count).then_some(())
        })
        .await
        .with_context(|| format!("expected {count} DLQ messages, found {}", found.len()))
        .unwrap();
        // Visible again, for `conveyor dlq peek`.
        for message in &found {
            self.sqs
                .change_message_visibility()
                .queue_url(&url)
                .receipt_handle(message.receipt_handle().unwrap())
                .visibility_timeout(0)
                .send()
                .await
                .unwrap();
        }
        found
    }
}

fn contacts(list_id: &str, bytes: usize, header: &str) -> (ContactImport, usize) {
    conveyor_e2e::contact_list(list_id, bytes, header)
}

fn sha256(text: &str) -> String {
    conveyor_e2e::sha256_hex(text)
}

fn attribute<'a>(message: &'a SqsMessage, name: &str) -> Option<&'a str> {
    message.message_attributes.as_ref()?.get(name)?.string_value()
}

/// A binary `make test` builds next to this test's executable (`target/debug/<name>`).
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p conveyor-examples -p conveyor-cli --bins` (make test does)",
        path.display()
    );
    path
}

fn command(program: &Path, env: &[(&'static str, String)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    for name in conveyor_e2e::INHERITED {
        command.env_remove(name);
    }
    command
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The Python extended client: `interop.py <args>`; returns the JSON line it printed.
async fn python(setup: &Setup, args: &[&str]) -> Value {
    let root = repo_root();
    let install = std::process::Command::new(root.join("localstack").join("install-extended-client.sh"))
        .output()
        .unwrap();
    assert!(
        install.status.success(),
        "localstack/install-extended-client.sh failed (needs python3 with venv and PyPI); run it by hand:\n{}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    let python = root
        .join(".local")
        .join("extended-client")
        .join("venv")
        .join("bin")
        .join("python");
    let output = command(&python, &setup.env())
        .arg(root.join("tests").join("extended_client").join("interop.py"))
        .args(args)
        .env("AWS_ENDPOINT_URL", &setup.endpoint)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "interop.py {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

/// One worker run: a 5 MiB job succeeds and its object goes; a 5 MiB job that fails permanently reaches
/// the DLQ as its pointer and keeps its object; a pointer to a missing object reaches the DLQ naming
/// bucket and key; a Python extended-client producer's large job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_large_jobs_and_dead_letters_their_pointers() -> anyhow::Result<()> {
    let setup = setup("large-worker").await;
    let producer = setup.producer();
    let (good, rows) = contacts("list-good", 5 * 1024 * 1024, "email,name");
    let (bad, _) = contacts("list-bad", 5 * 1024 * 1024, "address,name");
    producer
        .send(&NewJob::new("import_contacts", good.clone()))
        .await?;
    producer.send(&NewJob::new("import_contacts", bad)).await?;
    // A pointer to an object nobody wrote (or the lifecycle rule expired).
    let missing = PayloadPointer::new(&setup.bucket, "never-written");
    setup
        .sqs
        .send_message()
        .queue_url(&setup.queue.url)
        .message_body(missing.to_body())
        .message_attributes(
            SIZE_ATTRIBUTE,
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value("100")
                .build()?,
        )
        .message_attributes(
            "conveyor.type",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("import_contacts")
                .build()?,
        )
        .send()
        .await?;
    // The Python library's producer: a 2 MB list, through S3 (always_through_s3).
    let python_sent = python(
        &setup,
        &[
            "send",
            &setup.queue.url,
            &setup.bucket,
            "list-python",
            "60000",
            "import_contacts",
        ],
    )
    .await;
    let keys_before = list_keys(&setup).await;
    assert_eq!(
        keys_before.len(),
        3,
        "three objects: two from Conveyor, one from Python: {keys_before:?}"
    );

    let mut env = setup.env();
    env.push(("CONVEYOR_QUEUE_URL", setup.queue.url.clone()));
    env.push(("CONVEYOR_LISTEN_ADDR", "off".to_owned()));
    env.push(("RUST_LOG", "info".to_owned()));
    let mut worker = command(&binary("worker"), &env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the worker")?;

    let imported = setup.wait_for_import("list-good").await;
    assert_eq!(imported["rows"], rows);
    assert_eq!(
        imported["csv_sha256"],
        sha256(&good.csv),
        "the handler got the 5 MiB CSV intact"
    );
    let from_python = setup.wait_for_import("list-python").await;
    assert_eq!(from_python["rows"], 60000);
    assert_eq!(imported["csv_bytes"].as_u64().unwrap() as usize, good.csv.len());

    let dead = setup.dead_letters(2).await;
    worker.kill().await?;
    let failure_of = |message: &SqsMessage| -> Value {
        serde_json::from_str(attribute(message, "conveyor.failure").unwrap()).unwrap()
    };
    let bad_copy = dead
        .iter()
        .find(|message| {
            failure_of(message)["error"]
                .as_str()
                .unwrap()
                .contains("no email column")
        })
        .context("the permanent failure's DLQ copy")?;
    let pointer = PayloadPointer::from_body(bad_copy.body().unwrap()).unwrap();
    assert_eq!(pointer.bucket, setup.bucket, "the DLQ copy carries the pointer");
    assert!(attribute(bad_copy, SIZE_ATTRIBUTE).is_some(), "and the marker");
    assert!(
        setup.object_exists(&pointer.key).await,
        "a dead-lettered job keeps its object"
    );

    let missing_copy = dead
        .iter()
        .find(|message| message.body() == Some(missing.to_body().as_str()))
        .context("the missing object's DLQ copy")?;
    let reason = failure_of(missing_copy)["error"].as_str().unwrap().to_owned();
    assert!(
        reason.contains(&format!("s3://{}/never-written", setup.bucket)),
        "the reason names bucket and key: {reason}"
    );

    // `conveyor dlq peek` shows the pointers and, on request, the payload from S3 (which stays).
    let peek = command(&binary("conveyor"), &setup.env())
        .args([
            "dlq",
            "peek",
            "--queue-url",
            &setup.queue.url,
            "--show-body",
            "--fetch-payloads",
            // The contact list is 5 MB: past the 1 MiB a peek reads by default.
            "--max-payload-bytes",
            "8388608",
        ])
        .output()
        .await?;
    let peeked = String::from_utf8_lossy(&peek.stdout);
    assert!(
        peek.status.success(),
        "{peeked}{}",
        String::from_utf8_lossy(&peek.stderr)
    );
    let size = attribute(bad_copy, SIZE_ATTRIBUTE).unwrap();
    assert!(
        peeked.contains(&format!(
            "pointer → s3://{}/{} ({size} bytes)",
            setup.bucket, pointer.key
        )),
        "{}",
        &peeked[..peeked.len().min(3000)]
    );
    assert!(
        peeked.contains("(payload from S3): {\"list_id\":\"list-bad\""),
        "{}",
        &peeked[..peeked.len().min(3000)]
    );
    assert!(
        peeked.contains("never-written") && peeked.contains("does not exist"),
        "the missing one says so"
    );

    // `conveyor dlq redrive` moves the pointers, marker included; the object is still there. (To a queue
    // of its own: LocalStack keeps serving the killed worker's long poll for a while, which would take
    // messages redriven to the source queue.)
    let target = localstack::create_queue(&setup.sqs, &QueueSpec::standard("large-redriven")).await?;
    let redrive = command(&binary("conveyor"), &setup.env())
        .args(["dlq", "redrive", "--queue-url", &setup.queue.url])
        .args(["--job-type", "import_contacts", "--to-queue-url", &target.url])
        .output()
        .await?;
    assert!(
        redrive.status.success(),
        "{}{}",
        String::from_utf8_lossy(&redrive.stdout),
        String::from_utf8_lossy(&redrive.stderr)
    );
    let redriven = setup
        .sqs
        .receive_message()
        .queue_url(&target.url)
        .max_number_of_messages(10)
        .wait_time_seconds(5)
        .message_attribute_names("All")
        .send()
        .await?
        .messages
        .unwrap_or_default();
    let back = redriven
        .iter()
        .find(|message| message.body() == bad_copy.body())
        .with_context(|| {
            format!(
                "the dead-lettered job back in its queue, as its pointer; redrive said {}; received {redriven:?}",
                String::from_utf8_lossy(&redrive.stdout)
            )
        })?;
    assert!(attribute(back, SIZE_ATTRIBUTE).is_some(), "with its marker");
    assert!(attribute(back, "conveyor.failure").is_none());

    // Only the dead-lettered job's object is left: the two that succeeded were deleted after success.
    let left = list_keys(&setup).await;
    assert_eq!(left, vec![pointer.key.clone()], "python sent {python_sent}");
    Ok(())
}

/// The same 5 MiB job through `conveyor lambda run` and the example `bootstrap`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_function_runs_a_large_job_and_deletes_its_object() -> anyhow::Result<()> {
    let setup = setup("large-lambda").await;
    let (job, rows) = contacts("list-lambda", 5 * 1024 * 1024, "email");
    let (small, small_rows) = contacts("list-lambda-small", 10 * 1024, "email");
    // A batch: the large job goes through S3, the small one inline.
    let report = setup
        .producer()
        .send_batch(&[
            NewJob::new("import_contacts", job.clone()),
            NewJob::new("import_contacts", small),
        ])
        .await;
    assert!(report.all_sent(), "{report:?}");
    assert_eq!(
        list_keys(&setup).await.len(),
        1,
        "only the large job's body is in S3"
    );

    let env: Vec<(String, String)> = setup
        .env()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    let output =
        conveyor_e2e::lambda_run_until_empty(&setup.queue.url, &env, Duration::from_secs(120)).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let imported = setup.wait_for_import("list-lambda").await;
    assert_eq!(imported["rows"], rows);
    assert_eq!(imported["csv_sha256"], sha256(&job.csv));
    assert_eq!(
        setup.wait_for_import("list-lambda-small").await["rows"],
        small_rows
    );
    assert!(
        list_keys(&setup).await.is_empty(),
        "the object goes after success:\n{stdout}"
    );
    Ok(())
}

/// A Conveyor producer's large job, received by the Python extended client: it fetches the payload
/// through our pointer and deletes the object through its decorated receipt handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_extended_client_reads_a_conveyor_producers_large_job() -> anyhow::Result<()> {
    let setup = setup("large-python").await;
    let (job, _) = contacts("list-to-python", 3 * 1024 * 1024, "email");
    let body = serde_json::to_string(&job)?;
    setup
        .producer()
        .send(&NewJob::new("import_contacts", job))
        .await?;
    assert_eq!(list_keys(&setup).await.len(), 1);

    let received = python(&setup, &["receive", &setup.queue.url, &setup.bucket]).await;
    assert_eq!(received["sha256"], sha256(&body), "{received}");
    assert_eq!(received["length"], body.len());
    assert_eq!(received["attributes"]["conveyor.type"], "import_contacts");
    assert!(
        received["attributes"].get(SIZE_ATTRIBUTE).is_none(),
        "the library removes its marker"
    );
    assert_eq!(
        received["decorated_receipt"], true,
        "the library recognised our pointer"
    );
    assert!(
        list_keys(&setup).await.is_empty(),
        "the library deleted the object with the message"
    );
    Ok(())
}

/// A ledger export, about 1.5 MB: over SQS's 1 MiB, so through the claim check.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LedgerExport {
    ledger: String,
}

/// Exports ledgers to a downstream service that refuses them for good while `refusing` is set (a
/// revoked credential, say: a permanent failure, dead-lettered at once), and records the SHA-256 of
/// every ledger it exported.
struct ExportLedgers {
    refusing: Arc<AtomicBool>,
    exported: Arc<Mutex<Vec<String>>>,
}

impl Handler for ExportLedgers {
    type Job = LedgerExport;
    type Output = ();
    const JOB_TYPE: &'static str = "export_ledger";

    async fn handle(&self, job: LedgerExport, _ctx: Context) -> Result<(), HandlerError> {
        if self.refusing.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent(
                "the ledger service refuses the credential",
            ));
        }
        self.exported.lock().unwrap().push(sha256(&job.ledger));
        Ok(())
    }
}

/// The payload bucket's lifecycle rule (`infra/modules/payload-bucket`: expire objects some days after
/// they were last written), run by hand because LocalStack runs none: deletes every object whose
/// `LastModified` is before `cutoff` (a touch, a copy onto itself, writes it anew) and returns their keys.
async fn expire_objects_written_before(setup: &Setup, cutoff: SystemTime) -> Vec<String> {
    let s3 = emulator().await.s3_client();
    let listed = s3.list_objects_v2().bucket(&setup.bucket).send().await.unwrap();
    let mut expired = Vec::new();
    for object in listed.contents.unwrap_or_default() {
        let written = SystemTime::try_from(*object.last_modified.as_ref().unwrap()).unwrap();
        if written < cutoff {
            let key = object.key.unwrap();
            s3.delete_object()
                .bucket(&setup.bucket)
                .key(&key)
                .send()
                .await
                .unwrap();
            expired.push(key);
        }
    }
    expired
}

/// Issue 27's day-16 story on a shortened clock: a large job is dead-lettered, its object's first
/// lifetime runs out while it waits in the DLQ, and it is redriven after that. The worker touched the
/// object when it made the DLQ copy, so the lifecycle rule (run by hand at the moment the first lifetime
/// ends) expires an object written at the same time and left alone, not this one; the redriven job runs
/// with its payload intact, and its object goes after that success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_job_redriven_after_its_objects_first_lifetime_still_runs() -> anyhow::Result<()> {
    let setup = setup("large-expiry").await;
    let ledger: String = (0..55_000)
        .map(|line| format!("2026-12-04,acct-{line},{line}.00\n"))
        .collect();
    setup
        .producer()
        .send(&NewJob::new(
            "export_ledger",
            LedgerExport {
                ledger: ledger.clone(),
            },
        ))
        .await?;
    // Written with the job's object, referenced by nothing: what expiry does to an untouched object.
    setup
        .store
        .put(&setup.bucket, "written-with-the-job", b"left alone".to_vec())
        .await?;
    let keys = list_keys(&setup).await;
    assert_eq!(keys.len(), 2, "the job's object and the control: {keys:?}");
    // The first lifetime ends one whole second after both were written (S3 keeps whole seconds).
    let s3 = emulator().await.s3_client();
    let mut written = SystemTime::UNIX_EPOCH;
    for object in s3
        .list_objects_v2()
        .bucket(&setup.bucket)
        .send()
        .await?
        .contents()
    {
        written = written.max(SystemTime::try_from(*object.last_modified().unwrap())?);
    }
    let first_lifetime_ends = written + Duration::from_secs(1);
    wait_until(Duration::from_secs(5), Duration::from_millis(50), async || {
        SystemTime::now() >= first_lifetime_ends
    })
    .await?;

    let refusing = Arc::new(AtomicBool::new(true));
    let exported = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::new(DynamoStore::new(
        localstack::dynamodb_client().await,
        &setup.table,
    ));
    let pipeline = Pipeline::new(Router::single(ExportLedgers {
        refusing: Arc::clone(&refusing),
        exported: Arc::clone(&exported),
    }))
    .with_store(store)
    .with_payloads(Payloads::new(setup.store.clone() as Arc<dyn PayloadStore>));
    let queue = Arc::new(SqsQueue::connect(setup.sqs.clone(), &setup.queue.url).await?);
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(&setup.queue.url)])
        .with_listen_addr(None)
        .with_drain_deadline(Some(Duration::from_secs(10)));
    let worker = Worker::new(config, pipeline, vec![queue as Arc<dyn Queue>])?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    let dead = setup.dead_letters(1).await;
    let pointer = PayloadPointer::from_body(dead[0].body().unwrap()).unwrap();
    let expired = expire_objects_written_before(&setup, first_lifetime_ends).await;
    assert_eq!(
        expired,
        vec!["written-with-the-job".to_owned()],
        "the untouched object expires; the dead-lettered job's ({}) was touched with its DLQ copy",
        pointer.key
    );

    refusing.store(false, Ordering::SeqCst);
    let redrive = command(&binary("conveyor"), &setup.env())
        .args(["dlq", "redrive", "--queue-url", &setup.queue.url])
        .args(["--job-type", "export_ledger"])
        .output()
        .await?;
    assert!(
        redrive.status.success(),
        "{}{}",
        String::from_utf8_lossy(&redrive.stdout),
        String::from_utf8_lossy(&redrive.stderr)
    );
    wait_until(EFFECT_TIMEOUT, Duration::from_millis(200), async || {
        !exported.lock().unwrap().is_empty()
    })
    .await
    .context("the redriven job never ran")?;
    assert_eq!(
        *exported.lock().unwrap(),
        vec![sha256(&ledger)],
        "it ran once, with the ledger intact"
    );
    wait_until(EFFECT_TIMEOUT, Duration::from_millis(200), async || {
        list_keys(&setup).await.is_empty()
    })
    .await
    .context("the object outlived the job's success")?;
    shutdown.cancel();
    running.await??;
    Ok(())
}

async fn list_keys(setup: &Setup) -> Vec<String> {
    let s3 = emulator().await.s3_client();
    let output = s3.list_objects_v2().bucket(&setup.bucket).send().await.unwrap();
    output
        .contents
        .unwrap_or_default()
        .into_iter()
        .filter_map(|object| object.key)
        .collect()
}
