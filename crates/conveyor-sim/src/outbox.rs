//! The transactional outbox under faults: the real [`Relay`], [`Poller`] and [`conveyor_outbox::Lease`] over the
//! in-memory store, on tokio's paused clock.
//!
//! A seed draws writers committing jobs of a few aggregates, and one of two deployments:
//! - **Lambda**: every commit's stream record reaches an invocation on one of a few shards after a delay
//!   (invocations of different shards run at once); some invocations are lost, and in some seeds no relay
//!   runs for 25 hours, so the stream (24 hours) trims records. A sweep runs every minute.
//! - **Workers**: two pollers share the lease; one may be killed (its lease lapses) and one may stall in a
//!   send for longer than its lease (a paused process) while the other takes over.
//!
//! Faults in both: sends that fail (throttling), store outages, and a poison job whose queue does not
//! exist until an operator creates it and resends the parked aggregate. In a quarter of the seeds a
//! queue fails for many users at once: 110 to 200 aggregates each commit a job for it and then a job for
//! the good queue, more than a relay's pass of 100. The queue is missing (the jobs park) or unavailable
//! (they back off) until the operator's fix, which resends everything parked on it by queue.
//!
//! Invariants after every run: every committed job was sent at least once; no job was removed before
//! SQS accepted it; per aggregate, jobs were first accepted in commit order; no relay started a send
//! after its lease was taken over; with many aggregates blocked, every job of the others committed
//! well before the fix (250 s, past every other fault) was accepted before it, unless no relay ran.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::port::OutgoingMessage;
use conveyor_outbox::memory::MemoryOutboxStore;
use conveyor_outbox::{
    Backlog, JobRef, JobSink, LeaseRecord, OutboxStore, Poller, PollerOptions, Relay, RelayOptions,
    SendFailure, StoreError, StoredJob, Unfenced,
};
use conveyor_sqs::NewJob;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const GOOD_QUEUE: &str = "sim://queue/jobs";
const POISON_QUEUE: &str = "sim://queue/later";
const LEASE: Duration = Duration::from_secs(30);
/// The virtual wall clock's epoch (2100-01-01), in milliseconds.
const EPOCH_MILLIS: u64 = 4_102_444_800_000;

/// How the relay is deployed in a seed.
#[derive(Debug, Clone, PartialEq)]
pub enum Deployment {
    /// Stream-triggered invocations and a sweep every minute.
    Lambda {
        /// Shards records are spread over.
        shards: u64,
        /// The chance that an invocation is lost (its records never relayed by it).
        lost: f64,
        /// No relay runs from this time for 25 hours (the stream trims what is older than 24 hours).
        outage_at: Option<Duration>,
    },
    /// Two pollers sharing the lease.
    Workers {
        /// The first poller is killed (no release) at this time.
        kill_at: Option<Duration>,
        /// The first poller stalls at this time, for this long: in a send, or in a read before its sends.
        stall: Option<(Duration, Duration)>,
        /// The stall is in a read of the store (else in a send).
        stall_in_read: bool,
    },
}

/// One seed's outbox scenario.
#[derive(Debug, Clone)]
pub struct OutboxScenario {
    /// The seed.
    pub seed: u64,
    /// Commits: when, which aggregate, which queue.
    pub commits: Vec<(Duration, String, &'static str)>,
    /// The deployment.
    pub deployment: Deployment,
    /// The chance that a send fails (throttling).
    pub send_failures: f64,
    /// Store outages: from, length.
    pub store_outages: Vec<(Duration, Duration)>,
    /// When the operator creates the poison job's queue (and resends parked aggregates after).
    pub poison_fixed_at: Duration,
    /// Many users blocked at once: this many aggregates commit a job for the poison queue, then one for
    /// the good queue, in the first five seconds.
    pub blocked_aggregates: usize,
    /// The poison queue is unavailable (retryable; the jobs back off) rather than missing (they park).
    pub poison_retryable: bool,
}

impl OutboxScenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0b0c_5000);
        let aggregates = rng.usize(2..10);
        let count = rng.usize(8..60);
        let poison = rng.f64() < 0.3;
        let poison_index = poison.then(|| rng.usize(0..count));
        let commits = (0..count)
            .map(|index| {
                let at = Duration::from_millis(rng.u64(0..120_000));
                let aggregate = format!("agg{}", rng.usize(0..aggregates));
                let queue = if Some(index) == poison_index {
                    POISON_QUEUE
                } else {
                    GOOD_QUEUE
                };
                (at, aggregate, queue)
            })
            .collect::<Vec<_>>();
        let mut commits = commits;
        commits.sort_by_key(|(at, _, _)| *at);
        let deployment = if rng.bool() {
            Deployment::Lambda {
                shards: rng.u64(1..5),
                lost: if rng.bool() { rng.f64() * 0.3 } else { 0.0 },
                outage_at: (rng.f64() < 0.2).then(|| Duration::from_millis(rng.u64(0..100_000))),
            }
        } else {
            Deployment::Workers {
                kill_at: (rng.f64() < 0.4).then(|| Duration::from_millis(rng.u64(0..150_000))),
                stall: (rng.f64() < 0.4).then(|| {
                    (
                        Duration::from_millis(rng.u64(0..120_000)),
                        Duration::from_millis(rng.u64(20_000..120_000)),
                    )
                }),
                stall_in_read: rng.bool(),
            }
        };
        let store_outages = (0..rng.usize(0..3))
            .map(|_| {
                (
                    Duration::from_millis(rng.u64(0..200_000)),
                    Duration::from_millis(rng.u64(1_000..60_000)),
                )
            })
            .collect();
        let send_failures = if rng.bool() { rng.f64() * 0.25 } else { 0.0 };
        let mut poison_fixed_at = Duration::from_millis(rng.u64(150_000..400_000));
        // Drawn after everything else, so earlier seeds keep their scenarios.
        let blocked_aggregates = if rng.f64() < 0.25 { rng.usize(110..200) } else { 0 };
        let poison_retryable = blocked_aggregates > 0 && rng.bool();
        if blocked_aggregates > 0 {
            poison_fixed_at = Duration::from_millis(rng.u64(400_000..600_000));
            for user in 0..blocked_aggregates {
                let at = Duration::from_millis(rng.u64(0..5_000));
                let aggregate = format!("blocked{user}");
                commits.push((at, aggregate.clone(), POISON_QUEUE));
                commits.push((at + Duration::from_millis(1), aggregate, GOOD_QUEUE));
            }
            commits.sort_by_key(|(at, _, _)| *at);
        }
        Self {
            seed,
            commits,
            deployment,
            send_failures,
            store_outages,
            poison_fixed_at,
            blocked_aggregates,
            poison_retryable,
        }
    }

    /// Whether some window has no relay running (the Lambda deployment's 25-hour outage).
    fn relay_outage(&self) -> bool {
        matches!(
            self.deployment,
            Deployment::Lambda {
                outage_at: Some(_),
                ..
            }
        )
    }

    /// How long the run lasts: past every fault, the fix and the stream's 24 hours where an outage
    /// needs them, plus time to settle ([`AFTER_THE_OUTAGE`] after a relay outage).
    fn length(&self) -> Duration {
        let base = self.poison_fixed_at + Duration::from_secs(600);
        match self.deployment {
            Deployment::Lambda {
                outage_at: Some(at), ..
            } => base.max(at + Duration::from_secs(25 * 3600) + AFTER_THE_OUTAGE),
            _ => base,
        }
    }
}

/// How long the sweep runs after a relay outage before the end is judged. Everything the outage left
/// is swept then, one aggregate's failed send waiting for the next sweep (a minute later) each time:
/// with a quarter of the sends failing, ten minutes left one aggregate a send short (seed 5759).
const AFTER_THE_OUTAGE: Duration = Duration::from_secs(30 * 60);

/// What happened, in order.
#[derive(Debug, Default)]
struct Log {
    committed: Vec<JobRef>,
    /// When each committed job was committed (from the run's start), in the same order.
    committed_at: Vec<Duration>,
    /// Accepted sends: the job and the relay that sent it, in order.
    accepted: Vec<(JobRef, String)>,
    /// How many sends had been accepted when the operator fixed the poison queue.
    accepted_before_fix: Option<usize>,
    /// Removals that found the job: the job and whether it had been accepted before.
    removed_unsent: Vec<JobRef>,
    /// Send calls started after the relay's lease was taken over.
    fenced_out_sends: Vec<String>,
    lines: Vec<String>,
}

type SharedLog = Arc<Mutex<Log>>;

fn with_log<T>(log: &SharedLog, f: impl FnOnce(&mut Log) -> T) -> T {
    let mut guard = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

fn wall_millis(origin: Instant) -> u64 {
    EPOCH_MILLIS + u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The store, watched: removals of jobs not yet accepted are recorded.
#[derive(Debug, Clone)]
struct WatchedStore {
    inner: MemoryOutboxStore,
    log: SharedLog,
    /// A stall in the first read at or after the instant (a paused process).
    stall: Option<(Instant, Duration)>,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl OutboxStore for WatchedStore {
    fn name(&self) -> &str {
        "sim"
    }

    async fn jobs(&self, aggregate: &str, limit: usize) -> Result<Vec<StoredJob>, StoreError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        let jobs = self.inner.jobs(aggregate, limit).await;
        if let Some((at, length)) = self.stall
            && Instant::now() >= at
            && !self.stalled.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tokio::time::sleep(length).await;
        }
        jobs
    }

    async fn pending(&self, limit: usize, before: u64) -> Result<Vec<String>, StoreError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.inner.pending(limit, before).await
    }

    async fn remove_sent(&self, jobs: &[JobRef]) -> Result<Vec<bool>, StoreError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let removed = self.inner.remove_sent(jobs).await?;
        with_log(&self.log, |log| {
            for (job, removed) in jobs.iter().zip(&removed) {
                if *removed && !log.accepted.iter().any(|(accepted, _)| accepted == job) {
                    log.removed_unsent.push(job.clone());
                }
            }
        });
        Ok(removed)
    }

    async fn record_failure(
        &self,
        job: &JobRef,
        reason: &str,
        parked: Option<u64>,
    ) -> Result<(), StoreError> {
        self.inner.record_failure(job, reason, parked).await
    }

    async fn unpark(&self, aggregate: &str) -> Result<usize, StoreError> {
        self.inner.unpark(aggregate).await
    }

    async fn backlog(&self, limit: usize) -> Result<Backlog, StoreError> {
        self.inner.backlog(limit).await
    }

    async fn read_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.inner.read_lease(name).await
    }

    async fn write_lease(
        &self,
        name: &str,
        expected: Option<&LeaseRecord>,
        lease: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.inner.write_lease(name, expected, lease).await
    }
}

/// SQS as one relay sees it: sends that fail now and then, a queue that exists only once fixed, an
/// optional stall; every call checks that the relay (when it holds a lease) still holds it.
struct SimSink {
    relay: String,
    store: MemoryOutboxStore,
    log: SharedLog,
    rng: Mutex<fastrand::Rng>,
    failures: f64,
    poison_fixed: Arc<std::sync::atomic::AtomicBool>,
    /// Until fixed, the poison queue is unavailable (retryable) rather than missing.
    poison_retryable: bool,
    /// Lease-holding relays: the owner name in the lease.
    lease_owner: Option<String>,
    stall: Option<(Instant, Duration)>,
    stalled: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl JobSink for SimSink {
    async fn send(
        &self,
        queue_url: &str,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<String, SendFailure>> {
        if let Some(owner) = &self.lease_owner {
            let current = self
                .store
                .read_lease(conveyor_outbox_lease_name())
                .await
                .ok()
                .flatten();
            if current.is_some_and(|lease| lease.owner != *owner) {
                with_log(&self.log, |log| {
                    log.fenced_out_sends.push(format!(
                        "{} started a send after its lease was taken over",
                        self.relay
                    ))
                });
            }
        }
        if let Some((at, length)) = self.stall
            && Instant::now() >= at
            && !self.stalled.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tokio::time::sleep(length).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let fails = self
                .rng
                .lock()
                .map(|mut rng| rng.f64() < self.failures)
                .unwrap_or(false);
            if queue_url == POISON_QUEUE && !self.poison_fixed.load(std::sync::atomic::Ordering::Relaxed) {
                results.push(Err(if self.poison_retryable {
                    SendFailure {
                        message: format!("queue {queue_url} unavailable"),
                        retryable: true,
                    }
                } else {
                    SendFailure {
                        message: format!("queue {queue_url} does not exist"),
                        retryable: false,
                    }
                }));
                continue;
            }
            if fails {
                results.push(Err(SendFailure {
                    message: "throttled".to_owned(),
                    retryable: true,
                }));
                continue;
            }
            let Some(job) = job_of(&message.body) else {
                results.push(Err(SendFailure {
                    message: "not a sim job".to_owned(),
                    retryable: false,
                }));
                continue;
            };
            with_log(&self.log, |log| log.accepted.push((job, self.relay.clone())));
            results.push(Ok(format!("m-{}", message.body)));
        }
        results
    }

    fn requests(&self) -> u64 {
        0
    }
}

/// The lease name the poller uses.
fn conveyor_outbox_lease_name() -> &'static str {
    "relay"
}

/// The job a body names: `"<aggregate>/<sequence>"`.
fn job_of(body: &str) -> Option<JobRef> {
    let (aggregate, sequence) = body.trim_matches('"').rsplit_once('/')?;
    Some(JobRef {
        aggregate: aggregate.to_owned(),
        sequence: sequence.parse().ok()?,
    })
}

/// What one outbox seed broke (empty: it passed), and its trace.
#[derive(Debug, Default)]
pub struct OutboxReport {
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Jobs committed.
    pub committed: usize,
    /// Sends accepted (duplicates included).
    pub accepted: usize,
    /// What happened, when traced.
    pub trace: Vec<String>,
}

/// Runs `seed`'s outbox scenario and checks its invariants.
pub fn simulate_outbox(seed: u64) -> OutboxReport {
    let scenario = OutboxScenario::generate(seed);
    let runtime = match crate::seeded_paused_runtime(seed) {
        Ok(runtime) => runtime,
        Err(error) => {
            return OutboxReport {
                violations: vec![error],
                ..OutboxReport::default()
            };
        }
    };
    let log = runtime.block_on(run(&scenario));
    check(&scenario, &log)
}

struct World {
    origin: Instant,
    store: MemoryOutboxStore,
    log: SharedLog,
    poison_fixed: Arc<std::sync::atomic::AtomicBool>,
}

impl World {
    fn relay(
        &self,
        name: &str,
        lease_owner: Option<String>,
        stall: Option<(Duration, Duration, bool)>,
        scenario: &OutboxScenario,
        salt: u64,
    ) -> Relay {
        let in_read = stall.is_some_and(|(_, _, in_read)| in_read);
        let stall = stall.map(|(at, length, _)| (self.origin + at, length));
        let sink = SimSink {
            relay: name.to_owned(),
            store: self.store.clone(),
            log: Arc::clone(&self.log),
            rng: Mutex::new(fastrand::Rng::with_seed(scenario.seed ^ salt)),
            failures: scenario.send_failures,
            poison_fixed: Arc::clone(&self.poison_fixed),
            poison_retryable: scenario.poison_retryable,
            lease_owner,
            stall: stall.filter(|_| !in_read),
            stalled: std::sync::atomic::AtomicBool::new(false),
        };
        let store = WatchedStore {
            inner: self.store.clone(),
            log: Arc::clone(&self.log),
            stall: stall.filter(|_| in_read),
            stalled: Arc::default(),
        };
        let origin = self.origin;
        let mut options = RelayOptions::default();
        options.max_attempts = 3;
        Relay::new(Arc::new(store), Arc::new(sink))
            .with_options(options)
            .with_wall_clock(Arc::new(move || wall_millis(origin)))
    }
}

async fn run(scenario: &OutboxScenario) -> Log {
    let world = World {
        origin: Instant::now(),
        store: MemoryOutboxStore::new(),
        log: Arc::default(),
        poison_fixed: Arc::default(),
    };
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let (records, receiver) = tokio::sync::mpsc::unbounded_channel::<(Duration, String)>();

    // Store outages.
    for (at, length) in scenario.store_outages.clone() {
        let store = world.store.clone();
        tasks.spawn(async move {
            tokio::time::sleep(at).await;
            store.set_unavailable(true);
            tokio::time::sleep(length).await;
            store.set_unavailable(false);
        });
    }
    // The operator: creates the poison queue, then resends what is parked on it every 30 s.
    {
        let store = world.store.clone();
        let fixed = Arc::clone(&world.poison_fixed);
        let at = scenario.poison_fixed_at;
        let log = Arc::clone(&world.log);
        tasks.spawn(async move {
            tokio::time::sleep(at).await;
            with_log(&log, |log| log.accepted_before_fix = Some(log.accepted.len()));
            fixed.store(true, std::sync::atomic::Ordering::Relaxed);
            let poison = conveyor_outbox::Parked::Queue(POISON_QUEUE.to_owned());
            loop {
                if let Ok(resent) = conveyor_outbox::resend(&store, &poison).await {
                    for aggregate in resent.aggregates {
                        with_log(&log, |log| log.lines.push(format!("operator resent {aggregate}")));
                    }
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        });
    }
    // Writers: each commit at its time; its stream record goes to the trigger channel.
    {
        let store = world.store.clone();
        let log = Arc::clone(&world.log);
        let origin = world.origin;
        let commits = scenario.commits.clone();
        tasks.spawn(async move {
            for (at, aggregate, queue) in commits {
                tokio::time::sleep_until(origin + at).await;
                // The body names the job; the store allocates the sequence (the next after the head).
                let next = next_sequence(&log, &aggregate);
                let body = format!("{aggregate}/{next}");
                match store.put(NewJob::new("sim", body), queue, &aggregate, wall_millis(origin)) {
                    Ok(job) => {
                        with_log(&log, |log| {
                            log.committed.push(job.clone());
                            log.committed_at.push(at);
                        });
                        let _ = records.send((origin.elapsed(), aggregate));
                    }
                    Err(error) => with_log(&log, |log| log.lines.push(format!("commit refused: {error}"))),
                }
            }
        });
    }
    match &scenario.deployment {
        Deployment::Lambda {
            shards,
            lost,
            outage_at,
        } => {
            let relay = world.relay("lambda", None, None, scenario, 11);
            lambda(
                &mut tasks,
                &relay,
                scenario,
                receiver,
                *shards,
                *lost,
                *outage_at,
                world.origin,
            );
            let sweeper = world.relay("sweep", None, None, scenario, 13);
            let outage = outage_at.map(|at| {
                (
                    world.origin + at,
                    world.origin + at + Duration::from_secs(25 * 3600),
                )
            });
            tasks.spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    if outage.is_some_and(|(from, to)| Instant::now() >= from && Instant::now() < to) {
                        continue;
                    }
                    loop {
                        let report = sweeper.sweep(Duration::from_secs(30), 100, &Unfenced).await;
                        if report.sent == 0 {
                            break;
                        }
                    }
                }
            });
        }
        Deployment::Workers {
            kill_at,
            stall,
            stall_in_read,
        } => {
            drop(receiver);
            for index in 0..2u64 {
                let owner = format!("worker{index}");
                let first = index == 0;
                let relay = world.relay(
                    &owner,
                    Some(owner.clone()),
                    stall
                        .filter(|_| first)
                        .map(|(at, length)| (at, length, *stall_in_read)),
                    scenario,
                    17 + index,
                );
                let mut options = PollerOptions::default();
                options.lease = LEASE;
                let poller = Poller::new(relay, &owner, options);
                let drain = stop.clone();
                let handle = tokio::spawn(poller.run(drain));
                if first && let Some(at) = *kill_at {
                    tasks.spawn(async move {
                        tokio::time::sleep(at).await;
                        handle.abort();
                    });
                }
            }
        }
    }
    tokio::time::sleep(scenario.length()).await;
    stop.cancel();
    tasks.abort_all();
    let log = Arc::clone(&world.log);
    let mut taken = with_log(&log, std::mem::take);
    taken.lines.push(format!(
        "unsent at the end: {:?}",
        world
            .store
            .unsent()
            .iter()
            .map(StoredJob::reference)
            .collect::<Vec<_>>()
    ));
    taken
}

/// The next sequence of `aggregate` (the writer's head): one more than its last commit.
fn next_sequence(log: &SharedLog, aggregate: &str) -> u64 {
    with_log(log, |log| {
        log.committed
            .iter()
            .filter(|job| job.aggregate == aggregate)
            .count() as u64
            + 1
    })
}

/// Stream-triggered invocations: each record reaches its shard after a delay; a shard's invocations run
/// one after another, shards at once.
#[allow(clippy::too_many_arguments)]
fn lambda(
    tasks: &mut tokio::task::JoinSet<()>,
    relay: &Relay,
    scenario: &OutboxScenario,
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<(Duration, String)>,
    shards: u64,
    lost: f64,
    outage_at: Option<Duration>,
    origin: Instant,
) {
    let mut senders = Vec::new();
    for shard in 0..shards {
        let (sender, mut shard_records) = tokio::sync::mpsc::unbounded_channel::<(Duration, String)>();
        senders.push(sender);
        let relay = relay.clone();
        let mut rng = fastrand::Rng::with_seed(scenario.seed ^ (shard + 100));
        tasks.spawn(async move {
            while let Some((committed_at, aggregate)) = shard_records.recv().await {
                let delay = Duration::from_millis(rng.u64(0..5_000));
                tokio::time::sleep_until((origin + committed_at + delay).max(Instant::now())).await;
                if let Some(at) = outage_at {
                    let (from, to) = (origin + at, origin + at + Duration::from_secs(25 * 3600));
                    if Instant::now() >= from && Instant::now() < to {
                        tokio::time::sleep_until(to).await;
                    }
                }
                // The stream keeps records 24 hours; an invocation may be lost (retries exhausted).
                let age = origin.elapsed().saturating_sub(committed_at);
                if age > Duration::from_secs(24 * 3600) || rng.f64() < lost {
                    continue;
                }
                relay.relay(&[aggregate], &Unfenced).await;
            }
        });
    }
    let mut rng = fastrand::Rng::with_seed(scenario.seed ^ 7);
    tasks.spawn(async move {
        while let Some(record) = receiver.recv().await {
            let shard = rng.usize(0..senders.len());
            let _ = senders[shard].send(record);
        }
    });
}

fn check(scenario: &OutboxScenario, log: &Log) -> OutboxReport {
    let mut violations = Vec::new();
    let accepted: HashSet<&JobRef> = log.accepted.iter().map(|(job, _)| job).collect();
    for job in &log.committed {
        if !accepted.contains(job) {
            violations.push(format!(
                "outbox: committed job {}#{} was never sent",
                job.aggregate, job.sequence
            ));
        }
    }
    for job in &log.removed_unsent {
        violations.push(format!(
            "outbox: job {}#{} was removed before SQS accepted it",
            job.aggregate, job.sequence
        ));
    }
    let mut first: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut seen: HashSet<&JobRef> = HashSet::new();
    for (job, _) in &log.accepted {
        if seen.insert(job) {
            first
                .entry(job.aggregate.as_str())
                .or_default()
                .push(job.sequence);
        }
    }
    for (aggregate, order) in first {
        if order.windows(2).any(|pair| pair[0] > pair[1]) {
            violations.push(format!(
                "outbox: aggregate {aggregate}'s jobs were first accepted out of order: {order:?}"
            ));
        }
    }
    violations.extend(log.fenced_out_sends.iter().map(|line| format!("outbox: {line}")));
    violations.extend(starved_by_blocked_aggregates(scenario, log));
    let mut trace: Vec<String> = vec![format!("{scenario:?}")];
    trace.extend(log.lines.iter().cloned());
    trace.extend(
        log.accepted
            .iter()
            .map(|(job, relay)| format!("accepted {}#{} from {relay}", job.aggregate, job.sequence)),
    );
    let per_relay: std::collections::BTreeMap<&str, usize> =
        log.accepted
            .iter()
            .fold(std::collections::BTreeMap::new(), |mut counts, (_, relay)| {
                *counts.entry(relay.as_str()).or_default() += 1;
                counts
            });
    trace.push(format!("accepted per relay: {per_relay:?}"));
    OutboxReport {
        violations,
        committed: log.committed.len(),
        accepted: log.accepted.len(),
        trace,
    }
}

/// With many aggregates blocked on the poison queue, the jobs of every other aggregate committed at
/// least [`UNBLOCKED_WITHIN`] before the fix must have been accepted before it: a pass's worth of
/// blocked aggregates must never take the others' turns. Seeds where no relay runs for a while are
/// not judged.
fn starved_by_blocked_aggregates(scenario: &OutboxScenario, log: &Log) -> Vec<String> {
    if scenario.blocked_aggregates == 0 || scenario.relay_outage() {
        return Vec::new();
    }
    let Some(before_fix) = log.accepted_before_fix else {
        return Vec::new();
    };
    let blocked: HashSet<&str> = scenario
        .commits
        .iter()
        .filter(|(_, _, queue)| *queue == POISON_QUEUE)
        .map(|(_, aggregate, _)| aggregate.as_str())
        .collect();
    let accepted: HashSet<&JobRef> = log.accepted[..before_fix.min(log.accepted.len())]
        .iter()
        .map(|(job, _)| job)
        .collect();
    log.committed
        .iter()
        .zip(&log.committed_at)
        .filter(|(job, at)| {
            !blocked.contains(job.aggregate.as_str())
                && **at + UNBLOCKED_WITHIN <= scenario.poison_fixed_at
                && !accepted.contains(job)
        })
        .map(|(job, at)| {
            format!(
                "outbox: {}#{} (committed at {at:?}, no blocked job before it) was not sent by the fix at \
                 {:?}: {} blocked aggregates ({}) took the relay's turns",
                job.aggregate,
                job.sequence,
                scenario.poison_fixed_at,
                scenario.blocked_aggregates,
                if scenario.poison_retryable {
                    "backing off"
                } else {
                    "parked"
                }
            )
        })
        .collect()
}

/// How long before the fix an unblocked job must have been committed to be judged: past every other
/// fault a seed draws (store outages end by 260 s, stalls by 240 s, a killed relay's lease lapses in
/// 30 s) and a throttled job's backoff (at most 60 s).
const UNBLOCKED_WITHIN: Duration = Duration::from_secs(250);
