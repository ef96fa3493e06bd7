//! Crash test: a worker killed with SIGKILL mid-job; the job completes exactly once on another worker
//! after the visibility timeout.
//!
//! This target has its own `main` (`harness = false`): it re-runs its own executable with
//! `CONVEYOR_CRASH_CHILD` set to act as the worker process, so no extra binary has to be built or
//! shipped. It prints libtest's summary line itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail, ensure};
use conveyor_core::message::JOB_TYPE_ATTRIBUTE;
use conveyor_core::port::idempotency_key;
use conveyor_core::{
    message::AttributeValue,
    port::{IdempotencyStore, OutgoingMessage, Queue},
    {Context, Handler, HandlerError, Pipeline, Router},
};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{
    QueueSpec, create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client,
};
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};

const TEST: &str = "a_worker_killed_mid_job_leaves_it_to_another_worker_exactly_once";
const CHILD: &str = "CONVEYOR_CRASH_CHILD";
const QUEUE_URL: &str = "CONVEYOR_CRASH_QUEUE_URL";
const TABLE: &str = "CONVEYOR_CRASH_TABLE";
const RECORD: &str = "CONVEYOR_CRASH_RECORD";
const VISIBILITY_SECS: u32 = 10;
const JOB_MS: u64 = 6_000;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if std::env::var_os(CHILD).is_some() {
        return runtime.block_on(child());
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--list") {
        println!("{TEST}: test");
        return Ok(());
    }
    let filters: Vec<&String> = args.iter().filter(|arg| !arg.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|filter| TEST.contains(filter.as_str())) {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out\n"
        );
        return Ok(());
    }
    println!("\nrunning 1 test");
    match runtime.block_on(parent()) {
        Ok(()) => {
            println!(
                "test {TEST} ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n"
            );
            Ok(())
        }
        Err(error) => {
            println!(
                "test {TEST} ... FAILED\n\n{error:?}\n\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n"
            );
            Err(error)
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct CrashJob {
    id: u64,
    ms: u64,
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis())
}

/// The child's handler: records `start` and `done` lines (id, pid, time) in the record file.
struct Slow {
    record: PathBuf,
}

impl Slow {
    fn write(&self, what: &str, id: u64) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.record)?;
        writeln!(file, "{what} {id} {} {}", std::process::id(), epoch_ms())?;
        file.sync_all()
    }
}

impl Handler for Slow {
    type Job = CrashJob;
    type Output = ();
    const JOB_TYPE: &'static str = "crash";

    async fn handle(&self, job: CrashJob, _ctx: Context) -> Result<(), HandlerError> {
        self.write("start", job.id)?;
        tokio::time::sleep(Duration::from_millis(job.ms)).await;
        self.write("done", job.id)?;
        Ok(())
    }
}

/// The worker process: consumes the queue until killed.
async fn child() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::var(QUEUE_URL)?;
    let table = std::env::var(TABLE)?;
    let record = PathBuf::from(std::env::var(RECORD)?);
    let queue = SqsQueue::connect(sqs_client().await, url.clone()).await?;
    let store = DynamoStore::new(dynamodb_client().await, table);
    let pipeline = Pipeline::new(Router::new().route(Slow { record })).with_store(Arc::new(store));
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(url).with_weight(1)])
        .with_listen_addr(None);
    conveyor_worker::Worker::new(config, pipeline, vec![Arc::new(queue) as Arc<dyn Queue>])?
        .run_until_signal()
        .await?;
    Ok(())
}

struct Line {
    what: String,
    pid: u32,
    at_ms: u128,
}

fn read_record(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            Some(Line {
                what: (*parts.first()?).to_owned(),
                pid: parts.get(2)?.parse().ok()?,
                at_ms: parts.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

async fn wait_for_line(path: &Path, what: &str, timeout: Duration) -> anyhow::Result<Line> {
    conveyor_testing::wait_for(timeout, Duration::from_millis(50), async || {
        read_record(path).into_iter().find(|line| line.what == what)
    })
    .await
    .with_context(|| format!("no {what:?} line in {} within {timeout:?}", path.display()))
}

fn spawn_worker(name: &str, env: &[(&str, String)], dir: &Path) -> anyhow::Result<tokio::process::Child> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command
        .env(CHILD, "1")
        .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
        .envs(conveyor_testing::localstack::aws_env())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    Ok(command.spawn()?)
}

/// The claim's lease end for `key`, once it exists and (when `after` is given) has moved past `after`.
async fn lease_until(
    store: &DynamoStore,
    key: &str,
    after: Option<SystemTime>,
) -> anyhow::Result<SystemTime> {
    conveyor_testing::wait_for(Duration::from_secs(30), Duration::from_millis(100), async || {
        let record = store.get(key).await.ok().flatten()?;
        record
            .lease_until
            .filter(|lease| after.is_none_or(|after| *lease > after))
    })
    .await
    .with_context(|| format!("the claim on {key} never showed a lease (extended past {after:?})"))
}

async fn parent() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let sqs = sqs_client().await;
    let created = create_queue(
        &sqs,
        &QueueSpec::standard("crash").visibility_timeout_secs(VISIBILITY_SECS),
    )
    .await?;
    let table = create_table(&dynamodb_client().await, "crash").await?;
    let store = DynamoStore::new(dynamodb_client().await, table.clone());
    let dir = std::env::temp_dir().join(conveyor_testing::localstack::unique_name("conveyor-crash"));
    std::fs::create_dir_all(&dir)?;
    let record = dir.join("record.txt");
    let env = [
        (QUEUE_URL, created.url.clone()),
        (TABLE, table),
        (RECORD, record.display().to_string()),
    ];

    let queue = SqsQueue::connect(sqs, created.url.clone()).await?;
    let mut message = OutgoingMessage {
        body: serde_json::to_string(&CrashJob { id: 1, ms: JOB_MS })?,
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("crash"));
    let message_id = queue.send(message).await?;
    let key = idempotency_key("crash", None, &message_id);

    let mut first = spawn_worker("first", &env, &dir)?;
    let started = wait_for_line(&record, "start", Duration::from_secs(60)).await?;
    // Wait until the heartbeat has extended the 3 s visibility (and with it the claim's lease) once,
    // so the kill happens mid-job with a lease that follows the heartbeat.
    let first_lease = lease_until(&store, &key, None).await?;
    let extended_lease = lease_until(&store, &key, Some(first_lease)).await?;
    first.kill().await?; // SIGKILL: no drain, no release, no delete.
    let killed_at = epoch_ms();
    ensure!(
        started.pid == first.id().unwrap_or(started.pid),
        "the first worker did not start the job"
    );

    let mut second = spawn_worker("second", &env, &dir)?;
    let done = wait_for_line(&record, "done", Duration::from_secs(60)).await;
    let done = match done {
        Ok(done) => done,
        Err(error) => {
            let logs = std::fs::read_to_string(dir.join("second.log")).unwrap_or_default();
            bail!("{error}\nsecond worker's log:\n{logs}");
        }
    };
    // Once the message is deleted no further delivery can happen: wait for that, not for a time.
    conveyor_testing::wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        queue
            .depth()
            .await
            .is_ok_and(|depth| depth.visible + depth.in_flight + depth.delayed == 0)
    })
    .await?;
    second.kill().await?;

    let lines = read_record(&record);
    let starts: Vec<&Line> = lines.iter().filter(|line| line.what == "start").collect();
    let dones: Vec<&Line> = lines.iter().filter(|line| line.what == "done").collect();
    ensure!(
        dones.len() == 1,
        "the job completed {} times: {:?}",
        dones.len(),
        dones.iter().map(|l| l.pid).collect::<Vec<_>>()
    );
    ensure!(
        starts.len() == 2,
        "expected one start per worker, got {}",
        starts.len()
    );
    ensure!(
        done.pid != started.pid,
        "the killed worker cannot have finished it"
    );
    let restarted = starts[1];
    let lease_end_ms = extended_lease.duration_since(UNIX_EPOCH)?.as_millis();
    ensure!(
        restarted.at_ms >= lease_end_ms,
        "the second worker started {} ms before the killed worker's lease ended: not before, not never",
        lease_end_ms - restarted.at_ms
    );
    ensure!(
        restarted.at_ms >= killed_at + 500,
        "the second worker started {} ms after the kill: before the visibility timeout could pass",
        restarted.at_ms.saturating_sub(killed_at)
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
