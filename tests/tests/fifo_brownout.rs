//! A two-minute DynamoDB outage under a FIFO queue, with the real processes (issue 34): the example
//! `worker`, and the example `bootstrap` under `conveyor lambda run`.
//!
//! What it proves, for each runtime: while the idempotency store cannot be reached, no job runs
//! unclaimed and no job runs twice; within each message group the effects happen in send order; the
//! queue drains once DynamoDB is back; every job runs exactly once and nothing reaches the DLQ. The
//! worker holds a FIFO message in flight through the outage. A Lambda invocation cannot wait longer than
//! its function timeout, so each invocation during the outage spends a receive; the adapter saves the
//! group's last allowed receive for after the outage (`LambdaConfig::fifo_last_receive_wait`, 2.5 to 5
//! minutes), so a two-minute outage with `maxReceiveCount` 3 dead-letters nothing. Should a job still
//! reach the DLQ, the test says whether it carried Conveyor's reason (not run at its last allowed
//! receive, and why) or was moved silently by SQS's redrive.
//!
//! How: a FIFO queue with a FIFO DLQ, redrive `maxReceiveCount` 3, 60 s visibility timeout (AWS's
//! advice for a Lambda function: six times its timeout, `conveyor lambda run`'s default 10 s), and a
//! fresh idempotency table in DynamoDB Local. The consumer reaches DynamoDB through the demo's
//! [`FaultProxy`] (the fault layer `conveyor_testing::faults` wraps SDK clients inside one process; these
//! are separate binaries), which first slows each request by 100 ms, so jobs are in flight when the
//! outage starts, then cuts every connection for two minutes once [`RAN_BEFORE_OUTAGE`] jobs ran, then
//! recovers. 40 welcome emails in 4 groups of 10 (one user each, keyed `welcome_email:user:<id>`); the
//! effects are the lines of the outbox file the handler appends to, in the order they happened.
//!
//! The worker runs with a 180 s visibility timeout (`CONVEYOR_VISIBILITY_TIMEOUT_SECS`), longer than it
//! holds a message here, because LocalStack 4.8.1 refuses to delete a FIFO message once the time since
//! its receive exceeds the last visibility timeout set ("The receipt handle has expired"), however
//! often the heartbeat extended it (`conveyor-testing`'s README, "Where the double and SQS differ"); SQS
//! deletes it. With the queue's own timeout, every group's head held through the outage loses its
//! delete after it ran, its followers go back, and LocalStack's early unlocking of the group spends
//! their receives until they are dead-lettered (measured with 30 s: 14 of 40, each with its reason).
//!
//! Real binaries against LocalStack and DynamoDB Local (`localstack/start.sh`, started on first use).
//! Build them first, then run (the two runtimes side by side):
//! `cargo build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins` and
//! `cargo test -p conveyor-e2e --test fifo_brownout -- --nocapture` (the summary of each run is printed;
//! the Lambda run takes up to 8 minutes, most of it the saved last receive).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::runtime::Failure;
use conveyor_demo::chaos::proxy::FaultProxy;
use conveyor_demo::{queue_is_empty, signal_and_wait};
use conveyor_e2e::{SECRET, binaries, field_of, log_lines, log_path, message_of, outbox_path, receive_count};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, TestQueue};
use conveyor_testing::wait_until;
use tokio::process::Child;
use tokio::time::Instant;

/// Message groups.
const GROUPS: u64 = 4;
/// Jobs per group, sent in order.
const JOBS_PER_GROUP: u64 = 10;
/// The redrive policy's `maxReceiveCount`.
const MAX_RECEIVE_COUNT: u32 = 3;
/// The queue's visibility timeout: six times `conveyor lambda run`'s default 10 s function timeout.
const VISIBILITY_SECS: u32 = 60;
/// The worker's visibility timeout: longer than it holds a message here (see the module note).
const WORKER_VISIBILITY_SECS: u32 = 180;
/// How long DynamoDB is unreachable.
const OUTAGE: Duration = Duration::from_secs(120);
/// The outage starts once this many jobs ran.
const RAN_BEFORE_OUTAGE: usize = 8;
/// Each request to DynamoDB waits this long before the outage, so jobs are in flight when it starts.
const SLOW_DYNAMODB: Duration = Duration::from_millis(100);
/// How long the queue may take to drain once DynamoDB is back: a deferred job waits up to 30 s, a
/// message left in flight by a Lambda invocation comes back after the visibility timeout, and a Lambda
/// FIFO group's last receive waits up to `fifo_last_receive_wait` (5 minutes) after the one before.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(420);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Worker,
    Lambda,
}

/// The user of job `index` of `group`: `group * 100 + index`.
fn user_id(group: u64, index: u64) -> u64 {
    group * 100 + index
}

/// The group and index of a user id (see [`user_id`]).
fn job_of(user_id: u64) -> (u64, u64) {
    (user_id / 100, user_id % 100)
}

/// One job of the run: one user's welcome email in its group.
fn job(group: u64, index: u64) -> NewJob<WelcomeEmail> {
    let user = user_id(group, index);
    let email = WelcomeEmail {
        user_id: user,
        email: format!("user{user}@example.com"),
        name: format!("user {user}"),
    };
    let key = email.idempotency_key();
    NewJob::new("welcome_email", email)
        .key(key)
        .group_id(format!("group-{group}"))
}

/// Starts the consumer with `env`; its logs (JSON) go to `log`.
async fn spawn_consumer(
    runtime: Runtime,
    queue_url: &str,
    env: &[(String, String)],
    log: &Path,
) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log)?;
    match runtime {
        Runtime::Worker => {
            let mut env = env.to_vec();
            env.push(("CONVEYOR_LOG_FORMAT".to_owned(), "json".to_owned()));
            env.push((
                "CONVEYOR_VISIBILITY_TIMEOUT_SECS".to_owned(),
                WORKER_VISIBILITY_SECS.to_string(),
            ));
            let child = binaries().spawn_worker(queue_url, None, &env, Some(file))?;
            wait_until(Duration::from_secs(60), Duration::from_millis(200), async || {
                log_lines(log)
                    .is_ok_and(|lines| lines.iter().any(|line| message_of(line) == "worker started"))
            })
            .await
            .with_context(|| format!("the worker did not start; its log: {}", log.display()))?;
            Ok(child)
        }
        // The runner's defaults: 10 s function timeout, batches of 10, two invocations at once.
        Runtime::Lambda => binaries()
            .lambda_runner(queue_url, env)?
            .args(["--env", "AWS_LAMBDA_LOG_FORMAT=json"])
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .context("starting conveyor lambda run"),
    }
}

/// Stops the consumer as its platform does (the worker: SIGTERM; the runner handles SIGINT).
async fn stop_consumer(runtime: Runtime, child: &mut Child) -> anyhow::Result<()> {
    let signal = match runtime {
        Runtime::Worker => "TERM",
        Runtime::Lambda => "INT",
    };
    signal_and_wait(child, signal).await.map(drop)
}

/// Every message in the DLQ: the user of its body, and its failure record when it has one.
async fn dead_letters(
    sqs: &aws_sdk_sqs::Client,
    queue: &TestQueue,
) -> anyhow::Result<Vec<(Option<u64>, Option<Failure>)>> {
    let dlq = queue.dlq_url.as_deref().context("the queue has no DLQ")?;
    Ok(conveyor_demo::read_dlq(sqs, dlq)
        .await?
        .into_iter()
        .map(|dead_letter| {
            let user = serde_json::from_str::<serde_json::Value>(&dead_letter.body)
                .ok()
                .and_then(|body| body["user_id"].as_u64());
            (user, dead_letter.failure)
        })
        .collect())
}

/// Users in the order their effects were recorded.
fn effects_in_order(outbox: &Path) -> anyhow::Result<Vec<u64>> {
    Ok(conveyor_examples::outbox::Outbox::read_all(outbox)?
        .iter()
        .filter_map(|effect| effect["to_user"].as_u64())
        .collect())
}

/// What one run measured.
#[derive(Debug)]
struct Measured {
    runtime: Runtime,
    /// Users in effect order.
    effects: Vec<u64>,
    /// Effects recorded when the outage started.
    effects_before_outage: usize,
    /// DLQ messages: user and failure record.
    dlq: Vec<(Option<u64>, Option<Failure>)>,
    /// The receive count of each effect's delivery, by user (from the consumer's log).
    receive_at_effect: BTreeMap<u64, Vec<u64>>,
    /// The highest receive count any log line of the consumer carries.
    highest_receive: u64,
    /// Connections and requests the proxy cut during the outage.
    cut: u64,
    /// From the first send until the queue was empty.
    elapsed: Duration,
    /// The consumer's log.
    log: PathBuf,
}

impl Measured {
    /// Everything that contradicts "each job once, in order, nothing in the DLQ" (and for a DLQ entry, whether it came with its reason).
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.dlq.is_empty() {
            problems.push(format!(
                "{} messages are in the DLQ after a two-minute store outage (the {:?} runtime must run every \
                 job once)",
                self.dlq.len(),
                self.runtime
            ));
        }
        let mut effects: BTreeMap<u64, usize> = BTreeMap::new();
        for user in &self.effects {
            *effects.entry(*user).or_default() += 1;
        }
        let mut dead_lettered: BTreeMap<u64, Vec<&Failure>> = BTreeMap::new();
        for (user, failure) in &self.dlq {
            match (user, failure) {
                (Some(user), Some(failure)) => dead_lettered.entry(*user).or_default().push(failure),
                (user, None) => problems.push(format!(
                    "user {user:?}: in the DLQ without a {FAILURE_ATTRIBUTE} record (SQS's redrive after \
                     {MAX_RECEIVE_COUNT} receives?)"
                )),
                (None, Some(failure)) => {
                    problems.push(format!("a DLQ message with an unknown body: {failure:?}"))
                }
            }
        }
        for (user, failures) in &dead_lettered {
            for failure in failures {
                let why = failure
                    .error
                    .strip_prefix("not run at its last allowed receive (")
                    .and_then(|rest| rest.split_once("): "))
                    .map(|(_, why)| why.trim());
                if why.is_none_or(str::is_empty) {
                    problems.push(format!(
                        "user {user}: dead-lettered with a reason that does not say it was not run and why: {:?}",
                        failure.error
                    ));
                }
            }
            if failures.len() > 1 {
                problems.push(format!("user {user}: {} copies in the DLQ", failures.len()));
            }
            if effects.contains_key(user) {
                problems.push(format!(
                    "user {user}: in the DLQ ({:?}) although the job ran",
                    failures[0].error
                ));
            }
        }
        for group in 0..GROUPS {
            for index in 0..JOBS_PER_GROUP {
                let user = user_id(group, index);
                match effects.get(&user).copied().unwrap_or(0) {
                    0 if !dead_lettered.contains_key(&user) => {
                        problems.push(format!("user {user}: never ran and is not in the DLQ (lost)"));
                    }
                    0 | 1 => {}
                    runs => problems.push(format!(
                        "user {user}: ran {runs} times (receive counts {:?})",
                        self.receive_at_effect.get(&user)
                    )),
                }
            }
            let order: Vec<u64> = self
                .effects
                .iter()
                .filter(|user| job_of(**user).0 == group)
                .map(|user| job_of(*user).1)
                .collect();
            if order.windows(2).any(|pair| pair[0] >= pair[1]) {
                problems.push(format!(
                    "group {group}: effects out of send order: jobs {order:?}"
                ));
            }
        }
        problems
    }

    fn summary(&self) -> String {
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for (_, failure) in &self.dlq {
            let reason = failure.as_ref().map_or_else(
                || "(no failure record)".to_owned(),
                |failure| format!("{} [receive {}]", failure.error, failure.receive_count),
            );
            *reasons.entry(reason).or_default() += 1;
        }
        let mut receives: BTreeMap<u64, usize> = BTreeMap::new();
        for count in self.receive_at_effect.values().flatten() {
            *receives.entry(*count).or_default() += 1;
        }
        let mut text = format!(
            "{:?}: {} jobs, {} effects ({} before the outage), {} in the DLQ; receive count at the \
             effect: {receives:?}; highest receive count logged: {}; {} connections/requests cut; {:.0} s \
             from the first send to an empty queue; log: {}",
            self.runtime,
            GROUPS * JOBS_PER_GROUP,
            self.effects.len(),
            self.effects_before_outage,
            self.dlq.len(),
            self.highest_receive,
            self.cut,
            self.elapsed.as_secs_f64(),
            self.log.display(),
        );
        let mut dead_lettered: Vec<u64> = self.dlq.iter().filter_map(|(user, _)| *user).collect();
        dead_lettered.sort_unstable();
        if !dead_lettered.is_empty() {
            let _ = write!(text, "\n  DLQ users: {dead_lettered:?}");
        }
        for (reason, count) in reasons {
            let _ = write!(text, "\n  DLQ x{count}: {reason}");
        }
        text
    }
}

/// The receive count of each effect's delivery, by user, and the highest receive count logged.
fn receive_counts(log: &Path) -> anyhow::Result<(BTreeMap<u64, Vec<u64>>, u64)> {
    let lines = log_lines(log)?;
    let mut at_effect: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in &lines {
        if message_of(line) == "welcome email sent"
            && let (Some(user), Some(count)) = (field_of(line, "user_id").as_u64(), receive_count(line))
        {
            at_effect.entry(user).or_default().push(count);
        }
    }
    let highest = lines.iter().filter_map(receive_count).max().unwrap_or(0);
    Ok((at_effect, highest))
}

async fn brownout(runtime: Runtime) -> anyhow::Result<Measured> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let name = format!("e2e-brownout-{runtime:?}").to_lowercase();
    let table = localstack::create_table(&localstack::dynamodb_client().await, &name).await?;
    let spec = QueueSpec::fifo(&name)
        .visibility_timeout_secs(VISIBILITY_SECS)
        .max_receive_count(MAX_RECEIVE_COUNT);
    let queue = localstack::create_queue(&sqs, &spec).await?;

    let proxy = FaultProxy::in_front_of(&localstack::dynamodb_endpoint()).await?;
    proxy.state().set_delay(SLOW_DYNAMODB);
    let outbox = outbox_path(&name);
    let mut env = conveyor_demo::local_app_env(&table, &outbox, SECRET, "info");
    env.push(("AWS_ENDPOINT_URL_DYNAMODB".to_owned(), proxy.endpoint()));
    let log = log_path(&name);
    let mut consumer = spawn_consumer(runtime, &queue.url, &env, &log).await?;

    let started = Instant::now();
    let producer = Producer::new(sqs.clone(), &queue.url);
    for index in 0..JOBS_PER_GROUP {
        for group in 0..GROUPS {
            producer.send(&job(group, index)).await?;
        }
    }
    wait_until(Duration::from_secs(60), Duration::from_millis(20), async || {
        effects_in_order(&outbox).is_ok_and(|effects| effects.len() >= RAN_BEFORE_OUTAGE)
    })
    .await
    .with_context(|| format!("{RAN_BEFORE_OUTAGE} jobs did not run; log: {}", log.display()))?;

    // The fault itself is timed: DynamoDB is unreachable for two minutes, then answers at full speed.
    proxy.state().set_down(true);
    proxy.state().set_delay(Duration::ZERO);
    let effects_before_outage = effects_in_order(&outbox)?.len();
    tokio::time::sleep(OUTAGE).await;
    proxy.state().set_down(false);

    let main_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let drained = wait_until(DRAIN_TIMEOUT, Duration::from_millis(500), async || {
        queue_is_empty(&main_queue).await
    })
    .await;
    let elapsed = started.elapsed();
    let stopped = stop_consumer(runtime, &mut consumer).await;
    drained.with_context(|| format!("the queue did not drain after the outage; log: {}", log.display()))?;
    stopped.with_context(|| format!("the consumer did not stop cleanly; log: {}", log.display()))?;

    let (receive_at_effect, highest_receive) = receive_counts(&log)?;
    Ok(Measured {
        runtime,
        effects: effects_in_order(&outbox)?,
        effects_before_outage,
        dlq: dead_letters(&sqs, &queue).await?,
        receive_at_effect,
        highest_receive,
        cut: proxy.state().cut(),
        elapsed,
        log,
    })
}

async fn check(runtime: Runtime) -> anyhow::Result<()> {
    let measured = brownout(runtime).await?;
    println!("{}", measured.summary());
    let problems = measured.problems();
    assert!(
        problems.is_empty(),
        "{runtime:?} under a DynamoDB outage:\n{}\n{}",
        problems.join("\n"),
        measured.summary()
    );
    assert!(measured.cut > 0, "the outage cut no connection");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_keeps_fifo_order_and_runs_each_job_once_through_a_two_minute_dynamodb_outage()
-> anyhow::Result<()> {
    check(Runtime::Worker).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_keeps_fifo_order_and_runs_each_job_once_through_a_two_minute_dynamodb_outage()
-> anyhow::Result<()> {
    check(Runtime::Lambda).await
}
