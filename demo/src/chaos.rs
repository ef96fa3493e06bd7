//! The chaos run: the example application's real binaries on the real emulators, while workers are
//! killed with SIGKILL and the emulators are slowed down at random; then every effect is checked.
//!
//! What runs: `workers` example `worker` processes and the local Lambda runner (`conveyor lambda run`
//! with the example `bootstrap`) on one queue with its DLQ, sharing one idempotency table in DynamoDB
//! Local. Every process reaches SQS and DynamoDB through a [`proxy::FaultProxy`]; the driver itself
//! (sending, checking) talks to the emulators directly.
//!
//! What it sends (all drawn from `seed`): welcome emails keyed by user, webhooks to a local receiver
//! (some answer 503 once), short reports; 5% reports longer than the visibility timeout; 10% of the
//! jobs sent a second time with the same key; 1% poison (a malformed body, an email without `@`, a
//! webhook the receiver refuses with 410).
//!
//! What it checks at the end: every job's effect exactly once (outbox lines, 200 answers of the webhook
//! receiver), the DLQ holds exactly the poison jobs, each with a `conveyor.failure` reason that says why,
//! the queue is empty. A second copy of an effect is accepted only when it is explained by a SIGKILL
//! that landed between the effect and the settling of its claim (an at-least-once window no consumer can
//! close without a transactional or deduplicating sink; the webhook carries its delivery id so receivers
//! can): the first copy's writer (for outbox effects: the very process, each process has its own outbox
//! file) was killed within [`KILL_WINDOW`] after it, and the copy came after the kill. Anything else
//! fails the run.

pub mod proxy;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::runtime::Failure;
use conveyor_examples::RETRY_BUDGET_ENV;
use conveyor_examples::webhook_receiver::WebhookReceiver;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec, TestQueue};
use tokio::process::Child;

use self::proxy::FaultProxy;
use crate::{Binaries, queue_is_empty};

/// The queue's visibility timeout: long jobs run longer than this.
pub const VISIBILITY_SECS: u32 = 10;
/// The redrive policy's `maxReceiveCount`. Generous on purpose: a SIGKILL spends the receive of every
/// job its worker held, and a long job that reaches the Lambda times out there, so a long job needs
/// several receives; 5 would dead-letter some long jobs for the kills alone (measured).
pub const MAX_RECEIVE_COUNT: u32 = 20;
/// The Lambda's function timeout (below the visibility timeout, as the runner requires).
pub const FUNCTION_TIMEOUT_SECS: u64 = 9;
/// A SIGKILL this soon after an effect may have landed before the claim was completed: completing
/// takes up to the DynamoDB client's operation timeout (15 s) when DynamoDB is slowed, and a worker
/// killed during it leaves the claim to lapse, so the message's next delivery runs the job again.
/// (Measured: 5 s was too short; seed 42 of the full run had repeats 6-12 s after the effect whose
/// writers were killed in that time and logged nothing.)
pub const KILL_WINDOW: Duration = Duration::from_secs(16);
/// The retry budget the application runs with (the default 15 minutes would make retried jobs wait).
pub const RETRY_BUDGET_SECS: u32 = 20;
/// How often the driver looks for new effects: the resolution of the send-to-effect times.
const OBSERVE_EVERY: Duration = Duration::from_millis(25);
/// How late the driver may see an effect after it was written: it looks every [`OBSERVE_EVERY`], but on
/// a loaded 2-core machine a pass can take much longer. (Measured: a full run whose writer was killed
/// before its effect was *seen* failed the older 25 ms bound, though a dead process writes nothing.)
const OBSERVE_LAG: Duration = Duration::from_secs(2);
const SECRET: &str = "chaos-signing-secret";

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Distinct jobs (duplicate sends come on top).
    pub jobs: u32,
    /// Sending rate, jobs per second.
    pub rate: u32,
    /// Mean time between SIGKILLs (each one 0.5x to 1.5x this).
    pub kill_every: Duration,
    /// Worker processes.
    pub workers: usize,
    /// Seed of everything random.
    pub seed: u64,
    /// Slow the emulators down at random.
    pub slowdowns: bool,
    /// Where the built binaries are.
    pub binaries: Binaries,
    /// A folder for outboxes and logs (created).
    pub work_dir: PathBuf,
    /// Give up when the jobs are not all accounted for this long after the last send.
    pub settle_timeout: Duration,
}

/// What a chaos run measured, and what went wrong.
#[derive(Debug, Default)]
pub struct ChaosReport {
    /// Distinct jobs sent.
    pub jobs: usize,
    /// Messages sent (with the duplicates).
    pub messages: usize,
    /// Poison jobs sent.
    pub poison: usize,
    /// Long jobs sent.
    pub long_jobs: usize,
    /// Seconds from the first send until every job was accounted for.
    pub busy_secs: f64,
    /// Messages handed out by SQS receives (workers and Lambda runner).
    pub receives: u64,
    /// SIGKILLs of worker processes.
    pub kills: usize,
    /// Slowdown episodes, by emulator.
    pub slowdowns: BTreeMap<&'static str, u64>,
    /// Requests delayed, by emulator.
    pub delayed_requests: BTreeMap<&'static str, u64>,
    /// Send-to-effect times of the jobs that had an effect, sorted.
    pub latencies: Vec<Duration>,
    /// Effects seen twice, each explained by a SIGKILL in the effect-to-settle window.
    pub kill_window_doubles: Vec<String>,
    /// The Lambda runner's summary line.
    pub lambda_summary: String,
    /// Everything that contradicts "each effect once, the poison in the DLQ with its reason, the queue
    /// empty". Empty means the run passed.
    pub problems: Vec<String>,
    /// Where the logs are.
    pub work_dir: PathBuf,
}

impl ChaosReport {
    fn percentile(&self, fraction: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let last = self.latencies.len() - 1;
        // Rounded index into a sorted list of at most a few million values.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let index = ((last as f64) * fraction).round() as usize;
        self.latencies[index.min(last)]
    }
}

impl std::fmt::Display for ChaosReport {
    #[allow(clippy::cast_precision_loss)]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_sec = self.jobs as f64 / self.busy_secs.max(0.001);
        writeln!(
            f,
            "jobs               {} distinct ({} messages with the duplicates; {} long, {} poison)",
            self.jobs, self.messages, self.long_jobs, self.poison
        )?;
        writeln!(
            f,
            "throughput         {per_sec:.1} jobs/s ({:.1} s from the first send until every job was accounted for)",
            self.busy_secs
        )?;
        writeln!(
            f,
            "receives per job   {:.2} ({} messages received by workers and the Lambda runner)",
            self.receives as f64 / self.jobs.max(1) as f64,
            self.receives
        )?;
        writeln!(
            f,
            "kills survived     {} (SIGKILL, restarted at once)",
            self.kills
        )?;
        let faults: Vec<String> = self
            .slowdowns
            .iter()
            .map(|(target, episodes)| {
                let delayed = self.delayed_requests.get(target).copied().unwrap_or(0);
                format!("{target}: {episodes} slowdowns, {delayed} requests delayed")
            })
            .collect();
        writeln!(f, "faults injected    {}", faults.join("; "))?;
        writeln!(
            f,
            "send to effect     p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} effects, observed every {} ms)",
            self.percentile(0.5).as_secs_f64() * 1000.0,
            self.percentile(0.99).as_secs_f64() * 1000.0,
            self.latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
            self.latencies.len(),
            OBSERVE_EVERY.as_millis()
        )?;
        writeln!(
            f,
            "kill-window copies {} (an effect repeated after its worker was SIGKILLed before settling)",
            self.kill_window_doubles.len()
        )?;
        for double in &self.kill_window_doubles {
            writeln!(f, "  {double}")?;
        }
        writeln!(f, "lambda runner      {}", self.lambda_summary)?;
        if self.problems.is_empty() {
            write!(
                f,
                "result             PASSED: every effect once (but for the {} kill-window copies above), the poison in the DLQ with its reasons, the queue empty",
                self.kill_window_doubles.len()
            )
        } else {
            writeln!(
                f,
                "result             FAILED, {} problem(s) (logs: {}):",
                self.problems.len(),
                self.work_dir.display()
            )?;
            for problem in self.problems.iter().take(30) {
                writeln!(f, "  {problem}")?;
            }
            Ok(())
        }
    }
}

/// What a job is, and what must become of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Email,
    Webhook { flaky: bool },
    Report { long: bool },
    MalformedBody,
    NoEmailAddress,
    GoneWebhook,
}

impl Kind {
    fn poison(self) -> bool {
        matches!(
            self,
            Self::MalformedBody | Self::NoEmailAddress | Self::GoneWebhook
        )
    }

    /// Text the DLQ reason must contain.
    fn reason(self) -> &'static str {
        match self {
            Self::MalformedBody => "welcome_email",
            Self::NoEmailAddress => "no valid email address",
            Self::GoneWebhook => "410",
            _ => "",
        }
    }
}

fn draw_kind(rng: &mut fastrand::Rng, index: u32) -> Kind {
    // 1% poison, 5% long reports, the rest emails, webhooks and short reports.
    let roll = rng.u32(0..1000);
    match roll {
        0..10 => match index % 3 {
            0 => Kind::MalformedBody,
            1 => Kind::NoEmailAddress,
            _ => Kind::GoneWebhook,
        },
        10..60 => Kind::Report { long: true },
        60..560 => Kind::Email,
        560..900 => Kind::Webhook {
            flaky: rng.u32(0..10) == 0,
        },
        _ => Kind::Report { long: false },
    }
}

fn job(kind: Kind, id: u32, receiver: &WebhookReceiver) -> NewJob<serde_json::Value> {
    let webhook = |path: &str| {
        serde_json::json!({
            "delivery_id": format!("wh-{id}"),
            "url": receiver.url(path),
            "event": "chaos.test",
            "payload": { "id": id },
        })
    };
    match kind {
        Kind::Email => NewJob::new(
            "welcome_email",
            serde_json::json!({ "user_id": id, "email": format!("user{id}@example.com"), "name": format!("user {id}") }),
        )
        .key(format!("welcome_email:user:{id}")),
        Kind::NoEmailAddress => NewJob::new(
            "welcome_email",
            serde_json::json!({ "user_id": id, "email": "nobody", "name": "no address" }),
        )
        .key(format!("welcome_email:user:{id}")),
        Kind::MalformedBody => NewJob::new("welcome_email", serde_json::json!({ "user_id": format!("poison-{id}") })),
        Kind::Webhook { flaky } => {
            NewJob::new("webhook", webhook(if flaky { "/flaky" } else { "/ok" })).key(format!("webhook:wh-{id}"))
        }
        Kind::GoneWebhook => NewJob::new("webhook", webhook("/gone")).key(format!("webhook:wh-{id}")),
        Kind::Report { long } => {
            // Long: 3 sections of 4 s, past the 10 s visibility timeout (the heartbeat must hold it).
            let (sections, section_millis) = if long { (3, 4_000) } else { (1, 20) };
            NewJob::new(
                "report",
                serde_json::json!({ "report_id": format!("r-{id}"), "sections": sections, "section_millis": section_millis }),
            )
            .key(format!("report:r-{id}"))
        }
    }
}

/// The job id a message body or an effect names (`user_id`, `delivery_id` `wh-N`, `report_id` `r-N`,
/// or a malformed body's `poison-N`).
fn job_id(value: &serde_json::Value) -> Option<u32> {
    let number = |text: &str, prefix: &str| text.strip_prefix(prefix)?.parse::<u32>().ok();
    if let Some(user) = value.get("user_id").or_else(|| value.get("to_user")) {
        if let Some(id) = user.as_u64() {
            return u32::try_from(id).ok();
        }
        return number(user.as_str()?, "poison-");
    }
    if let Some(delivery) = value.get("delivery_id").and_then(|v| v.as_str()) {
        return number(delivery, "wh-");
    }
    number(value.get("report_id")?.as_str()?, "r-")
}

/// One effect the driver saw, and when.
#[derive(Debug, Clone)]
struct Effect {
    job: u32,
    /// The process that wrote it (an outbox file's name), or `None` for webhook deliveries.
    writer: Option<String>,
    seen: Instant,
}

/// Watches the per-process outbox files and the webhook receiver, stamping each new effect with the
/// time it was first seen.
struct Observer {
    dir: PathBuf,
    offsets: HashMap<PathBuf, usize>,
    webhooks_seen: usize,
    effects: Vec<Effect>,
}

impl Observer {
    fn poll(&mut self, receiver: &WebhookReceiver) {
        let now = Instant::now();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "jsonl") {
                continue;
            }
            let offset = self.offsets.entry(path.clone()).or_insert(0);
            let Some(text) = read_from(&path, *offset) else {
                continue;
            };
            // Only whole lines: a line being appended right now is read next time.
            let Some(end) = text.rfind('\n').map(|at| at + 1) else {
                continue;
            };
            let writer = path.file_stem().map(|stem| stem.to_string_lossy().into_owned());
            for line in text[..end].lines() {
                if let Some(job) = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .as_ref()
                    .and_then(job_id)
                {
                    self.effects.push(Effect {
                        job,
                        writer: writer.clone(),
                        seen: now,
                    });
                }
            }
            *offset += end;
        }
        let received = receiver.received();
        for request in &received[self.webhooks_seen.min(received.len())..] {
            if request.status == 200
                && let Some(job) = request
                    .delivery_id
                    .strip_prefix("wh-")
                    .and_then(|id| id.parse().ok())
            {
                self.effects.push(Effect {
                    job,
                    writer: None,
                    seen: now,
                });
            }
        }
        self.webhooks_seen = received.len();
    }
}

/// The file's bytes from `offset` on, as text.
fn read_from(path: &Path, offset: usize) -> Option<String> {
    use std::io::{Read as _, Seek as _};
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(std::io::SeekFrom::Start(u64::try_from(offset).ok()?))
        .ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    Some(text)
}

/// One worker slot: the running process and its name (`worker-<slot>-<incarnation>`).
struct Slot {
    child: Child,
    name: String,
}

struct Fleet {
    binaries: Binaries,
    queue_url: String,
    env: Vec<(String, String)>,
    dir: PathBuf,
    slots: Vec<Slot>,
    spawned: usize,
    /// (process name, when it was killed)
    kills: Vec<(String, Instant)>,
}

impl Fleet {
    fn spawn(&mut self, slot: usize) -> anyhow::Result<Slot> {
        self.spawned += 1;
        let name = format!("worker-{slot}-{}", self.spawned);
        let mut env = self.env.clone();
        env.push((
            conveyor_examples::OUTBOX_ENV.to_owned(),
            self.dir.join(format!("{name}.jsonl")).display().to_string(),
        ));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = self
            .binaries
            .spawn_worker(&self.queue_url, None, &env, Some(log))?;
        Ok(Slot { child, name })
    }

    async fn kill_one(&mut self, rng: &mut fastrand::Rng) -> anyhow::Result<()> {
        let slot = rng.usize(0..self.slots.len());
        let fresh = self.spawn(slot)?;
        let old = std::mem::replace(&mut self.slots[slot], fresh);
        let Slot { mut child, name } = old;
        child.start_kill().context("SIGKILL")?;
        let killed_at = Instant::now();
        let _ = child.wait().await;
        self.kills.push((name, killed_at));
        Ok(())
    }
}

/// Runs the chaos run as `config` says and returns its report (check `problems`). Every process it
/// starts is stopped before it returns (and killed if this future is dropped).
pub async fn run(config: &ChaosConfig) -> anyhow::Result<ChaosReport> {
    std::fs::create_dir_all(&config.work_dir)?;
    let mut rng = fastrand::Rng::with_seed(config.seed);
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let spec = QueueSpec {
        name_prefix: "chaos".to_owned(),
        fifo: false,
        visibility_timeout_secs: VISIBILITY_SECS,
        max_receive_count: Some(MAX_RECEIVE_COUNT),
    };
    let queue = localstack::create_queue(&sqs, &spec).await?;
    let table = localstack::create_table(&dynamodb, "chaos").await?;
    let receiver = WebhookReceiver::start(SECRET.as_bytes().to_vec()).await?;

    let sqs_proxy = FaultProxy::in_front_of(&localstack::sqs_endpoint()).await?;
    let dynamodb_proxy = FaultProxy::in_front_of(&localstack::dynamodb_endpoint()).await?;
    let mut env = crate::local_app_env(&table, &config.work_dir.join("unused.jsonl"), SECRET, "warn");
    env.retain(|(key, _)| key != conveyor_examples::OUTBOX_ENV);
    env.push(("AWS_ENDPOINT_URL_SQS".to_owned(), sqs_proxy.endpoint()));
    env.push(("AWS_ENDPOINT_URL_DYNAMODB".to_owned(), dynamodb_proxy.endpoint()));
    env.push((RETRY_BUDGET_ENV.to_owned(), RETRY_BUDGET_SECS.to_string()));

    // The jobs, and when each message goes out: duplicates 0-3 s after their first send.
    let mut kinds = Vec::new();
    let mut schedule: Vec<(Duration, u32)> = Vec::new();
    let interval = 1.0 / f64::from(config.rate.max(1));
    for id in 0..config.jobs {
        let kind = draw_kind(&mut rng, id);
        kinds.push(kind);
        let at = Duration::from_secs_f64(f64::from(id) * interval);
        schedule.push((at, id));
        if !kind.poison() && rng.u32(0..10) == 0 {
            schedule.push((at + Duration::from_millis(rng.u64(0..3_000)), id));
        }
    }
    schedule.sort_by_key(|(at, _)| *at);

    let mut fleet = Fleet {
        binaries: config.binaries.clone(),
        queue_url: queue.url.clone(),
        env: env.clone(),
        dir: config.work_dir.clone(),
        slots: Vec::new(),
        spawned: 0,
        kills: Vec::new(),
    };
    for slot in 0..config.workers {
        let spawned = fleet.spawn(slot)?;
        fleet.slots.push(spawned);
    }
    let mut lambda = spawn_lambda(config, &queue.url, &env, &sqs_proxy)?;

    let slowdowns: Arc<Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let faults = config.slowdowns.then(|| {
        let targets = [
            ("sqs", Arc::clone(sqs_proxy.state())),
            ("dynamodb", Arc::clone(dynamodb_proxy.state())),
        ];
        let counts = Arc::clone(&slowdowns);
        let mut rng = fastrand::Rng::with_seed(config.seed ^ 0x5eed);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(rng.u64(500..3_000))).await;
                let (name, state) = &targets[rng.usize(0..targets.len())];
                // Below the clients' 4-5 s attempt timeouts most of the time; now and then past one.
                let delay = if rng.u32(0..10) == 0 {
                    rng.u64(1_500..4_500)
                } else {
                    rng.u64(20..1_200)
                };
                state.set_delay(Duration::from_millis(delay));
                *counts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(name)
                    .or_insert(0) += 1;
                tokio::time::sleep(Duration::from_millis(rng.u64(500..3_000))).await;
                state.set_delay(Duration::ZERO);
            }
        })
    });

    let mut observer = Observer {
        dir: config.work_dir.clone(),
        offsets: HashMap::new(),
        webhooks_seen: 0,
        effects: Vec::new(),
    };
    let producer = Producer::new(sqs.clone(), &queue.url);
    let started = Instant::now();
    let mut sent_at: HashMap<u32, Instant> = HashMap::new();
    let mut next_kill = started + jitter(&mut rng, config.kill_every);
    let mut next_message = 0;
    let expected_effects: HashSet<u32> = (0..config.jobs)
        .filter(|id| !kinds[*id as usize].poison())
        .collect();
    let poison: HashSet<u32> = (0..config.jobs)
        .filter(|id| kinds[*id as usize].poison())
        .collect();
    let mut last_send = started;
    let mut settled_at = None;
    let mut next_progress = started + Duration::from_secs(5);

    // Send on schedule, kill on schedule, observe; until every job is accounted for.
    loop {
        let now = Instant::now();
        let mut batch = Vec::new();
        while next_message < schedule.len() && started + schedule[next_message].0 <= now && batch.len() < 10 {
            let id = schedule[next_message].1;
            batch.push(job(kinds[id as usize], id, &receiver));
            sent_at.entry(id).or_insert(now);
            next_message += 1;
        }
        if !batch.is_empty() {
            let report = producer.send_batch(&batch).await;
            if !report.all_sent() {
                bail!("only {} of {} messages sent", report.sent(), batch.len());
            }
            last_send = Instant::now();
            continue;
        }
        // The chaos lasts while the jobs go out and a little after; then the system heals and the
        // rest must settle (Jepsen's shape: faults, heal, final reads).
        let chaos_on = next_message < schedule.len() || now < last_send + config.kill_every * 2;
        if !chaos_on && faults.as_ref().is_some_and(|faults| !faults.is_finished()) {
            if let Some(faults) = &faults {
                faults.abort();
            }
            sqs_proxy.state().set_delay(Duration::ZERO);
            dynamodb_proxy.state().set_delay(Duration::ZERO);
        }
        if chaos_on && now >= next_kill {
            fleet.kill_one(&mut rng).await?;
            next_kill = Instant::now() + jitter(&mut rng, config.kill_every);
        }
        observer.poll(&receiver);
        if next_message == schedule.len() || now >= next_progress {
            let done: HashSet<u32> = observer.effects.iter().map(|effect| effect.job).collect();
            let missing = expected_effects.difference(&done).count();
            let dead = dlq_depth(&sqs, &queue).await?;
            if now >= next_progress {
                next_progress = now + Duration::from_secs(5);
                let mut sample: Vec<(&u32, Kind)> = expected_effects
                    .difference(&done)
                    .take(5)
                    .map(|id| (id, kinds[*id as usize]))
                    .collect();
                sample.sort_by_key(|(id, _)| **id);
                eprintln!(
                    "chaos: +{:.0} s, {next_message}/{} messages sent, {missing} jobs without an effect (e.g. {sample:?}), {dead}/{} in the DLQ, {} kills",
                    started.elapsed().as_secs_f64(),
                    schedule.len(),
                    poison.len(),
                    fleet.kills.len()
                );
            }
            if next_message == schedule.len() && missing == 0 && dead >= poison.len() {
                settled_at = Some(Instant::now());
                break;
            }
        }
        if next_message == schedule.len() && last_send.elapsed() > config.settle_timeout {
            break;
        }
        if let Some(status) = lambda.try_wait()? {
            bail!(
                "the Lambda runner exited with {status}; see {}",
                config.work_dir.join("lambda.log").display()
            );
        }
        tokio::time::sleep(OBSERVE_EVERY).await;
    }
    let busy_secs = settled_at
        .unwrap_or_else(Instant::now)
        .duration_since(started)
        .as_secs_f64();

    // Calm: no more kills or slowdowns; wait for the deferred copies and duplicates to drain.
    if let Some(faults) = &faults {
        faults.abort();
    }
    sqs_proxy.state().set_delay(Duration::ZERO);
    dynamodb_proxy.state().set_delay(Duration::ZERO);
    let main_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let drained = localstack::wait_until(Duration::from_secs(90), Duration::from_millis(250), async || {
        observer.poll(&receiver);
        queue_is_empty(&main_queue).await
    })
    .await;

    // Stop everything: the workers with SIGTERM, the runner with SIGINT (what it handles).
    let mut stops = Vec::new();
    for slot in &mut fleet.slots {
        stops.push(stop(&mut slot.child, "TERM"));
    }
    stops.push(stop(&mut lambda, "INT"));
    let stopped = futures_util::future::join_all(stops).await;
    observer.poll(&receiver);

    let mut report = ChaosReport {
        jobs: kinds.len(),
        messages: schedule.len(),
        poison: poison.len(),
        long_jobs: kinds
            .iter()
            .filter(|kind| matches!(kind, Kind::Report { long: true }))
            .count(),
        busy_secs,
        receives: sqs_proxy.state().receipts(),
        kills: fleet.kills.len(),
        slowdowns: slowdowns.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        delayed_requests: BTreeMap::from([
            ("sqs", sqs_proxy.state().delayed_chunks()),
            ("dynamodb", dynamodb_proxy.state().delayed_chunks()),
        ]),
        work_dir: config.work_dir.clone(),
        lambda_summary: std::fs::read_to_string(config.work_dir.join("lambda.log"))
            .unwrap_or_default()
            .lines()
            .rfind(|line| line.starts_with("summary"))
            .unwrap_or("(no summary)")
            .to_owned(),
        ..ChaosReport::default()
    };
    if settled_at.is_none() {
        report.problems.push(format!(
            "not every job was accounted for within {:?} of the last send",
            config.settle_timeout
        ));
    }
    if drained.is_err() {
        report.problems.push(format!(
            "the queue is not empty: {:?}",
            main_queue_depth(&main_queue).await
        ));
    }
    for (what, result) in stopped {
        if let Err(error) = result {
            report
                .problems
                .push(format!("{what} did not stop cleanly: {error:#}"));
        }
    }
    check_effects(
        &mut report,
        &observer.effects,
        &expected_effects,
        &poison,
        &sent_at,
        &fleet.kills,
    );
    check_dlq(&mut report, &sqs, &queue, &kinds, &fleet.kills).await?;
    report.latencies.sort_unstable();
    Ok(report)
}

fn jitter(rng: &mut fastrand::Rng, mean: Duration) -> Duration {
    mean.mul_f64(0.5 + rng.f64())
}

fn spawn_lambda(
    config: &ChaosConfig,
    queue_url: &str,
    env: &[(String, String)],
    sqs_proxy: &FaultProxy,
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(config.work_dir.join("lambda.log"))?;
    let outbox = config.work_dir.join("lambda.jsonl");
    // The runner and its bootstrap get the same environment as the workers (proxies included).
    config
        .binaries
        .lambda_runner(queue_url, env)?
        .args(["--function-timeout-secs", &FUNCTION_TIMEOUT_SECS.to_string()])
        .args([
            "--env",
            &format!("{}={}", conveyor_examples::OUTBOX_ENV, outbox.display()),
        ])
        .env("AWS_ENDPOINT_URL_SQS", sqs_proxy.endpoint())
        .stdout(std::process::Stdio::from(log.try_clone()?))
        .stderr(std::process::Stdio::from(log))
        .spawn()
        .context("starting conveyor lambda run")
}

/// Sends `signal` and waits up to 40 s for an exit; a clean exit is `Ok`.
async fn stop(child: &mut Child, signal: &'static str) -> (String, anyhow::Result<()>) {
    let what = format!("pid {} (SIG{signal})", child.id().unwrap_or(0));
    let result = crate::signal_and_wait(child, signal).await.map(drop);
    if result.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    (what, result)
}

async fn dlq_depth(sqs: &aws_sdk_sqs::Client, queue: &TestQueue) -> anyhow::Result<usize> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let Some(dlq) = &queue.dlq_url else { return Ok(0) };
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(dlq)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await?
        .attributes
        .unwrap_or_default();
    Ok(attributes
        .get(&QueueAttributeName::ApproximateNumberOfMessages)
        .and_then(|value| value.parse().ok())
        .unwrap_or(0))
}

async fn main_queue_depth(queue: &SqsQueue) -> String {
    use conveyor_core::port::Queue as _;
    match queue.depth().await {
        Ok(depth) => format!("{depth:?}"),
        Err(error) => error.to_string(),
    }
}

/// True when `kills` holds a SIGKILL of `writer` (any worker when `None`) within [`KILL_WINDOW`] after
/// `effect`, and `later` came after that kill.
fn killed_in_window(
    kills: &[(String, Instant)],
    writer: Option<&str>,
    effect: Instant,
    later: Instant,
) -> bool {
    kills.iter().any(|(name, at)| {
        writer.is_none_or(|writer| writer == name)
            && *at + OBSERVE_LAG >= effect
            && *at <= effect + KILL_WINDOW
            && later >= *at
    })
}

fn check_effects(
    report: &mut ChaosReport,
    effects: &[Effect],
    expected: &HashSet<u32>,
    poison: &HashSet<u32>,
    sent_at: &HashMap<u32, Instant>,
    kills: &[(String, Instant)],
) {
    let mut by_job: BTreeMap<u32, Vec<&Effect>> = BTreeMap::new();
    for effect in effects {
        by_job.entry(effect.job).or_default().push(effect);
    }
    let missing: Vec<&u32> = expected.iter().filter(|id| !by_job.contains_key(id)).collect();
    if !missing.is_empty() {
        let mut sample: Vec<&&u32> = missing.iter().take(10).collect();
        sample.sort();
        report.problems.push(format!(
            "{} job(s) without an effect, e.g. {sample:?}",
            missing.len()
        ));
    }
    for (job, copies) in &by_job {
        if poison.contains(job) {
            report.problems.push(format!("poison job {job} had an effect"));
            continue;
        }
        let first = copies[0];
        if let Some(sent) = sent_at.get(job) {
            report.latencies.push(first.seen.saturating_duration_since(*sent));
        }
        for later in &copies[1..] {
            let place = |effect: &Effect| {
                format!(
                    "{} at +{:.2} s",
                    effect.writer.as_deref().unwrap_or("webhook receiver"),
                    effect
                        .seen
                        .saturating_duration_since(sent_at.get(job).copied().unwrap_or(effect.seen))
                        .as_secs_f64()
                )
            };
            let mut line = format!("job {job}: first by {}, again by {}", place(first), place(later));
            if let Some(writer) = &first.writer
                && let Some((_, killed)) = kills.iter().find(|(name, _)| name == writer)
            {
                let after = killed.saturating_duration_since(first.seen).as_secs_f64();
                line.push_str(&format!(" ({writer} SIGKILLed {after:.1} s after the effect)"));
            }
            if killed_in_window(kills, first.writer.as_deref(), first.seen, later.seen) {
                report.kill_window_doubles.push(line);
            } else {
                report.problems.push(format!("{line}, not explained by a kill"));
            }
        }
    }
}

/// Reads the whole DLQ (each message once: a visibility timeout longer than the read) and compares it
/// with the poison jobs.
async fn check_dlq(
    report: &mut ChaosReport,
    sqs: &aws_sdk_sqs::Client,
    queue: &TestQueue,
    kinds: &[Kind],
    kills: &[(String, Instant)],
) -> anyhow::Result<()> {
    let Some(dlq) = &queue.dlq_url else {
        bail!("the chaos queue has no DLQ")
    };
    let mut seen: BTreeMap<u32, Vec<Failure>> = BTreeMap::new();
    for dead_letter in crate::read_dlq(sqs, dlq).await? {
        let body = &dead_letter.body;
        let Some(id) = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .as_ref()
            .and_then(job_id)
        else {
            report
                .problems
                .push(format!("DLQ message with an unknown body: {body}"));
            continue;
        };
        match dead_letter.failure {
            Some(failure) => seen.entry(id).or_default().push(failure),
            None => report.problems.push(format!(
                "job {id} ({:?}) is in the DLQ without a {FAILURE_ATTRIBUTE} reason (SQS redrive after {MAX_RECEIVE_COUNT} receives?)",
                kinds.get(id as usize)
            )),
        }
    }
    let mut poison_left: HashSet<u32> = (0..u32::try_from(kinds.len())?)
        .filter(|id| kinds[*id as usize].poison())
        .collect();
    for (id, failures) in &seen {
        let kind = kinds.get(*id as usize).copied();
        let Some(kind) = kind.filter(|kind| kind.poison()) else {
            report.problems.push(format!(
                "job {id} ({kind:?}) is in the DLQ: {}",
                failures.first().map_or("", |failure| failure.error.as_str())
            ));
            continue;
        };
        poison_left.remove(id);
        let first = &failures[0];
        if !first.error.contains(kind.reason()) {
            report.problems.push(format!(
                "poison job {id} ({kind:?}) is in the DLQ with the reason {:?}, which does not say {:?}",
                first.error,
                kind.reason()
            ));
        }
        for again in &failures[1..] {
            // A second DLQ copy: the first DLQ send happened, the worker was killed before the delete.
            let at = |failure: &Failure| {
                Instant::now()
                    .checked_sub(Duration::from_millis(
                        epoch_millis().saturating_sub(failure.failed_at_ms),
                    ))
                    .unwrap_or_else(Instant::now)
            };
            let line = format!(
                "poison job {id} dead-lettered twice (runs {} and {})",
                first.receive_count, again.receive_count
            );
            if killed_in_window(kills, None, at(first), at(again)) {
                report.kill_window_doubles.push(line);
            } else {
                report.problems.push(format!("{line}, not explained by a kill"));
            }
        }
    }
    if !poison_left.is_empty() {
        let mut missing: Vec<u32> = poison_left.into_iter().collect();
        missing.sort_unstable();
        report
            .problems
            .push(format!("poison job(s) missing from the DLQ: {missing:?}"));
    }
    Ok(())
}

fn epoch_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// A fresh work folder for a chaos run under `base`.
pub fn work_dir(base: &Path, seed: u64) -> PathBuf {
    base.join(format!("chaos-{seed}-{}", std::process::id()))
}
