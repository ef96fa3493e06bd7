//! Long delays and cancel under faults: the real [`Worker`] and [`Pipeline`] over the in-memory queue
//! (SQS's receive counts, redrive and delays) and idempotency store, on tokio's paused clock.
//!
//! A seed draws delayed jobs (up to 50 minutes on a 1-minute hop: the proportions of 12 hours on SQS's 15-minute hop), some keys cancelled before they
//! are due and some of those sent again with the same key after the cancel, one of the two key styles
//! (Conveyor's, Powertools' on the producer key), and faults: `SendMessage` outages (hours long), and
//! deletes that are lost after the send succeeded (a crash between a hop's copy and its delete, which
//! forks the chain).
//!
//! Invariants after every run: a job sent before its key's cancel never runs, and a job sent after it
//! does; every other job runs; none runs before it is due; none runs twice; nothing reaches the DLQ
//! (no job here fails: a hop that spends receives would take it there); a cancelled job stops hopping
//! (no copy of it is sent more than one hop after the cancel). Half the jobs go through the claim
//! check, in a payload store whose objects expire a while after they were last written or touched
//! (the bucket's lifecycle rule): no copy of a job not yet done points at a gone object.
//!
//! Half the seeds run the jobs on Lambda instead of a worker: one or two functions behind the event
//! source mapping ([`crate::lambda::Function`], the real [`BatchProcessor`]), which deletes a completed
//! job's object before the mapping deletes its message (issue 27's point 10), and, in half of those, a
//! backlog of slow jobs that makes invocations reach their cutoff, so records are deferred unrun again
//! and again (`Pipeline::before_unrun_copy` must keep their objects alive). A few large jobs go to a
//! handler that is not idempotent: nothing answers for a second copy of such a job, so its object must
//! outlive every copy (no read of it ever finds it gone).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::message::{
    AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, Message, ReceiptHandle,
};
use conveyor_core::port::{
    DeadLetter, EntryFailure, IdempotencyStore, OutgoingMessage, PayloadError, PayloadPointer, PayloadStore,
    Queue, QueueDepth, QueueError, VisibilityChange, size_attribute,
};
use conveyor_core::runtime::{DUE_ATTRIBUTE, Failure, cancel_at, due_value};
use conveyor_core::{
    Context, Handler, HandlerError, HandlerSettings, KeySource, KeyStyle, Payloads, Pipeline,
    PowertoolsFlavor, PowertoolsKey, Router,
};
use conveyor_lambda::{BatchProcessor, FixedQueue};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::VirtualStore;
use crate::lambda::Function;
use crate::scenario::LambdaSpec;
use crate::sink::Sink;
use crate::trace::Trace;

/// The longest hop: SQS's is 15 minutes; the simulation shortens it (with the delays, in proportion)
/// through the pipeline's test hook, so a seed's virtual hours stay few while the hops stay many.
const HOP: Duration = Duration::from_secs(60);
/// How long an object lives after it was last written or touched (the lifecycle rule's 15 days): longer
/// than the longest send outage plus a touch period and a hop (a message held through an outage is not
/// touched), shorter than the longest delays, as 15 days are shorter than a delay plus a DLQ stay.
const OBJECT_LIFE: Duration = Duration::from_secs(45 * 60);
/// How often a hopping job touches its object (a day on SQS's scale).
const TOUCH_EVERY: Duration = Duration::from_secs(8 * 60);
/// The payload bucket.
const BUCKET: &str = "payloads";
/// The redrive policy's `maxReceiveCount`.
const MAX_RECEIVES: u32 = 5;
/// The job type.
const JOB_TYPE: &str = "delayed";
/// The job type of the handler that is not idempotent.
const NOTIFY_TYPE: &str = "notify";
/// The job type of the backlog's slow jobs.
const SLOW_TYPE: &str = "slow";

/// One job of a seed.
#[derive(Debug, Clone)]
pub struct DelayedJob {
    /// Its number (the body).
    pub id: u32,
    /// Its idempotency key.
    pub key: String,
    /// When it is sent (from the start).
    pub sent: Duration,
    /// How long after its send it is due.
    pub delay: Duration,
    /// Sent through the claim check: its body is an object in the payload store.
    pub large: bool,
    /// Handled by the idempotent handler (else by one that is not, which no cancel reaches).
    pub idempotent: bool,
}

impl DelayedJob {
    fn due(&self) -> Duration {
        self.sent + self.delay
    }
}

/// One seed's scenario.
#[derive(Debug, Clone)]
pub struct DelayScenario {
    /// The seed.
    pub seed: u64,
    /// The jobs, re-sends after a cancel included.
    pub jobs: Vec<DelayedJob>,
    /// Cancels: when, which key.
    pub cancels: Vec<(Duration, String)>,
    /// `SendMessage` outages: from, length.
    pub send_outages: Vec<(Duration, Duration)>,
    /// The chance that a delete is lost after it was asked for (a crash between a copy and its delete).
    pub lost_deletes: f64,
    /// Powertools' key style instead of Conveyor's.
    pub powertools_keys: bool,
    /// Run on Lambda functions instead of a worker.
    pub lambda: Option<LambdaSetup>,
    /// Slow jobs nobody checks, sent in a burst: when, and how long each works.
    pub backlog: Vec<(Duration, Duration)>,
}

/// The Lambda side of a seed.
#[derive(Debug, Clone, Copy)]
pub struct LambdaSetup {
    /// Functions (event source mapping pollers) at once.
    pub functions: usize,
    /// Each one's settings.
    pub spec: LambdaSpec,
}

impl DelayScenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xde1a_7000);
        let count = rng.u32(3..10);
        let mut jobs = Vec::new();
        let mut cancels = Vec::new();
        for id in 0..count {
            let sent = Duration::from_secs(rng.u64(0..600));
            let delay = Duration::from_secs(rng.u64(5..50 * 60));
            let key = format!("report:{id}");
            let job = DelayedJob {
                id,
                key: key.clone(),
                sent,
                delay,
                large: rng.bool(),
                idempotent: true,
            };
            // A third of the keys are cancelled a while before they are due; half of those are sent
            // again after the cancel, with the same key.
            if rng.f64() < 0.35 && delay > Duration::from_secs(300) {
                let at = sent + Duration::from_secs(rng.u64(1..delay.as_secs() - 120));
                cancels.push((at, key.clone()));
                if rng.bool() {
                    jobs.push(DelayedJob {
                        id: count + id,
                        key: key.clone(),
                        sent: at + Duration::from_secs(rng.u64(1..600)),
                        delay: Duration::from_secs(rng.u64(5..30 * 60)),
                        large: rng.bool(),
                        idempotent: true,
                    });
                }
            }
            jobs.push(job);
        }
        let send_outages = (0..rng.usize(0..2))
            .map(|_| {
                (
                    Duration::from_secs(rng.u64(0..30 * 60)),
                    Duration::from_secs(rng.u64(60..30 * 60)),
                )
            })
            .collect();
        let lost_deletes = if rng.bool() { rng.f64() * 0.04 } else { 0.0 };
        let powertools_keys = rng.bool();
        for id in 1000..1000 + rng.u32(0..3) {
            jobs.push(DelayedJob {
                id,
                key: format!("notify:{id}"),
                sent: Duration::from_secs(rng.u64(0..600)),
                delay: Duration::from_secs(rng.u64(5..20 * 60)),
                large: true,
                idempotent: false,
            });
        }
        let mut lambda = rng.bool().then(|| LambdaSetup {
            functions: rng.usize(1..=2),
            spec: LambdaSpec {
                function_timeout: Duration::from_secs(rng.u64(20..=60)),
                batch_size: rng.usize(1..=10),
                batch_concurrency: rng.usize(1..=3),
                invocations: 1,
                process_concurrency: None,
                invoke_delay: Duration::ZERO,
            },
        });
        // Half the Lambda seeds get a backlog of slow jobs that keeps one function at its cutoff for up
        // to an hour, with batches big enough that a record comes round again well within the object's
        // life (a message never waits unreceived longer than SQS's retention, which is shorter).
        let mut backlog = Vec::new();
        if lambda.is_some() && rng.bool() {
            lambda = Some(LambdaSetup {
                functions: 1,
                spec: LambdaSpec {
                    function_timeout: Duration::from_secs(rng.u64(20..=40)),
                    batch_size: rng.usize(6..=10),
                    batch_concurrency: 1,
                    invocations: 1,
                    process_concurrency: None,
                    invoke_delay: Duration::ZERO,
                },
            });
            let at = Duration::from_secs(rng.u64(0..20 * 60));
            for _ in 0..rng.u32(100..300) {
                backlog.push((
                    at + Duration::from_millis(rng.u64(0..10_000)),
                    Duration::from_secs(rng.u64(8..25)),
                ));
            }
        }
        Self {
            seed,
            jobs,
            cancels,
            send_outages,
            lost_deletes,
            powertools_keys,
            lambda,
            backlog,
        }
    }

    fn key_style(&self) -> KeyStyle {
        if self.powertools_keys {
            KeyStyle::Powertools(PowertoolsKey {
                flavor: PowertoolsFlavor::Python,
                prefix: "reports-fn.app.handle".to_owned(),
                source: KeySource::ProducerKey,
            })
        } else {
            KeyStyle::Conveyor
        }
    }

    /// The time when the key of `job` was cancelled, if a cancel came after the job was sent.
    fn cancelled_at(&self, job: &DelayedJob) -> Option<Duration> {
        self.cancels
            .iter()
            .filter(|(at, key)| *key == job.key && *at > job.sent)
            .map(|(at, _)| *at)
            .min()
    }

    /// When the last send outage ends.
    fn last_outage_end(&self) -> Duration {
        self.send_outages
            .iter()
            .map(|(from, length)| *from + *length)
            .max()
            .unwrap_or_default()
    }

    /// How long the run lasts: past every due time and outage, and past the longest the backlog can
    /// hold the functions' slots, plus time to settle. A slow job holds a slot for at most a function
    /// timeout per receive, and it is received at most `MAX_RECEIVES` times (one that does not fit
    /// before the cutoff is stopped there and retried until the DLQ takes it). Its work alone was not
    /// a bound: with the handler's time shortened by the grace before the settle reserve, more slow
    /// jobs stop at the cutoff and the backlog outlasted the run (seed 183: a job still deferred at
    /// the end, "never ran: lost").
    fn length(&self) -> Duration {
        let last_due = self.jobs.iter().map(DelayedJob::due).max().unwrap_or_default();
        let backlog_end = self.lambda.map_or(Duration::ZERO, |lambda| {
            let slots = (lambda.functions * lambda.spec.batch_concurrency).max(1) as u32;
            let jobs = u32::try_from(self.backlog.len()).unwrap_or(u32::MAX);
            let longest = lambda.spec.function_timeout * MAX_RECEIVES * jobs;
            let start = self.backlog.first().map_or(Duration::ZERO, |(at, _)| *at);
            start + longest / slots
        });
        last_due.max(self.last_outage_end()).max(backlog_end) + Duration::from_secs(600)
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default)]
pub struct DelayReport {
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Jobs in the scenario.
    pub jobs: usize,
    /// Messages sent (hops included).
    pub sends: usize,
    /// Handler runs.
    pub runs: usize,
    /// Jobs cancelled.
    pub cancelled: usize,
    /// Ran on Lambda.
    pub lambda: bool,
}

/// The virtual wall clock: the run's start (real time) plus the virtual time since.
#[derive(Debug, Clone, Copy)]
struct WallClock {
    start: Instant,
    epoch: SystemTime,
}

impl WallClock {
    fn now(&self) -> SystemTime {
        self.epoch + self.start.elapsed()
    }
}

/// What the run saw.
#[derive(Debug, Default)]
struct Log {
    /// Runs: job, virtual time since start.
    runs: Vec<(u32, Duration)>,
    /// Sends: job, virtual time since start.
    sends: Vec<(u32, Duration)>,
    /// Hops (copies of a job not due yet, sent with a delay), among the sends: job, virtual time.
    hops: Vec<(u32, Duration)>,
    /// Virtual send time (wall clock) by message id, for `SentTimestamp`.
    sent_at: HashMap<String, SystemTime>,
    /// Reads of a payload object that was gone (expired or deleted): job, virtual time.
    missing_objects: Vec<(u32, Duration)>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Deserialize)]
struct Body {
    job: u32,
}

fn job_of(body: &str) -> Option<u32> {
    if let Ok(pointer) = PayloadPointer::from_body(body) {
        return pointer.key.strip_prefix("job-")?.parse().ok();
    }
    serde_json::from_str::<Body>(body).ok().map(|body| body.job)
}

/// Records its runs.
#[derive(Clone)]
struct Recorder {
    log: Arc<Mutex<Log>>,
    start: Instant,
    style: KeyStyle,
}

impl Recorder {
    fn record(&self, job: &Body) {
        lock(&self.log).runs.push((job.job, self.start.elapsed()));
    }
}

impl Handler for Recorder {
    type Job = Body;
    type Output = ();
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, job: Body, _ctx: Context) -> Result<(), HandlerError> {
        self.record(&job);
        Ok(())
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_key_style(self.style.clone())
    }
}

/// Records its runs, and is not idempotent: every copy runs.
struct Notifier(Recorder);

impl Handler for Notifier {
    type Job = Body;
    type Output = ();
    const JOB_TYPE: &'static str = NOTIFY_TYPE;

    async fn handle(&self, job: Body, _ctx: Context) -> Result<(), HandlerError> {
        self.0.record(&job);
        Ok(())
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_idempotent(false)
    }
}

/// A slow job of the backlog.
#[derive(Debug, Deserialize)]
struct SlowBody {
    ms: u64,
}

/// Works its time, or stops when told to (the invocation's cutoff).
struct Slow;

impl Handler for Slow {
    type Job = SlowBody;
    type Output = ();
    const JOB_TYPE: &'static str = SLOW_TYPE;

    async fn handle(&self, job: SlowBody, ctx: Context) -> Result<(), HandlerError> {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(job.ms)) => Ok(()),
            () = ctx.cancelled() => Err(HandlerError::retryable("stopped at the cutoff")),
        }
    }
}

/// The memory queue with `SendMessage` outages, lost deletes, and virtual `SentTimestamp`s.
struct FaultyQueue {
    inner: Arc<MemoryQueue>,
    log: Arc<Mutex<Log>>,
    clock: WallClock,
    outages: Vec<(Duration, Duration)>,
    lost_deletes: f64,
    rng: Mutex<fastrand::Rng>,
}

impl FaultyQueue {
    fn in_outage(&self) -> bool {
        let now = self.clock.start.elapsed();
        self.outages
            .iter()
            .any(|(from, length)| now >= *from && now < *from + *length)
    }
}

#[async_trait]
impl Queue for FaultyQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn visibility_timeout(&self) -> Duration {
        self.inner.visibility_timeout()
    }

    fn max_receive_count(&self) -> Option<u32> {
        self.inner.max_receive_count()
    }

    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility_timeout: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        let mut messages = self
            .inner
            .receive_with_visibility(max_messages, wait, visibility_timeout)
            .await?;
        let log = lock(&self.log);
        for message in &mut messages {
            message.sent_at = log.sent_at.get(&message.id).copied();
        }
        Ok(messages)
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        let kept: Vec<ReceiptHandle> = {
            let mut rng = lock(&self.rng);
            receipts
                .iter()
                .filter(|_| rng.f64() >= self.lost_deletes)
                .cloned()
                .collect()
        };
        // A lost delete answers as if it had been made: the process died before it.
        self.inner.delete_batch(&kept).await?;
        Ok(Vec::new())
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        self.inner.change_visibility_batch(changes).await
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        if self.in_outage() {
            return Err(QueueError::Unavailable {
                message: "sim: SendMessage outage".to_owned(),
            });
        }
        let job = job_of(&message.body);
        // A copy sent without a delay is one the function had no time to start, not a hop.
        let hop = message.delay.is_some_and(|delay| !delay.is_zero());
        let id = self.inner.send(message).await?;
        let mut log = lock(&self.log);
        log.sent_at.insert(id.clone(), self.clock.now());
        if let Some(job) = job {
            let at = self.clock.start.elapsed();
            log.sends.push((job, at));
            if hop {
                log.hops.push((job, at));
            }
        }
        Ok(id)
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        self.inner.dead_letter(message, failure).await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        self.inner.depth().await
    }
}

/// The payload store with the lifecycle rule: an object expires [`OBJECT_LIFE`] after it was last
/// written or touched (on the virtual clock); a delete removes it.
struct ExpiringPayloads {
    objects: Mutex<HashMap<String, (Vec<u8>, Duration)>>,
    start: Instant,
    log: Arc<Mutex<Log>>,
}

impl ExpiringPayloads {
    fn live(&self, key: &str) -> bool {
        lock(&self.objects)
            .get(key)
            .is_some_and(|(_, written)| self.start.elapsed() < *written + OBJECT_LIFE)
    }
}

#[async_trait]
impl PayloadStore for ExpiringPayloads {
    async fn put(&self, _bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PayloadError> {
        lock(&self.objects).insert(key.to_owned(), (body, self.start.elapsed()));
        Ok(())
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, PayloadError> {
        if self.live(key)
            && let Some((body, _)) = lock(&self.objects).get(key)
        {
            return Ok(body.clone());
        }
        if let Some(job) = key.strip_prefix("job-").and_then(|id| id.parse().ok()) {
            lock(&self.log).missing_objects.push((job, self.start.elapsed()));
        }
        Err(PayloadError::NotFound {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    async fn delete(&self, _bucket: &str, key: &str) -> Result<(), PayloadError> {
        lock(&self.objects).remove(key);
        Ok(())
    }

    async fn touch(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        if !self.live(key) {
            return Err(PayloadError::NotFound {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            });
        }
        if let Some((_, written)) = lock(&self.objects).get_mut(key) {
            *written = self.start.elapsed();
        }
        Ok(())
    }
}

/// Runs `seed`'s scenario and checks its invariants.
pub fn simulate_delays(seed: u64) -> DelayReport {
    let scenario = DelayScenario::generate(seed);
    let runtime = match crate::seeded_paused_runtime(seed) {
        Ok(runtime) => runtime,
        Err(error) => {
            return DelayReport {
                violations: vec![error],
                ..DelayReport::default()
            };
        }
    };
    let filter = "conveyor_core=debug,conveyor_lambda=debug,conveyor_worker=info";
    crate::with_debug_logs("DELAY_DEBUG", filter, || runtime.block_on(run(&scenario)))
}

async fn run(scenario: &DelayScenario) -> DelayReport {
    let clock = WallClock {
        start: Instant::now(),
        epoch: SystemTime::now(),
    };
    let log = Arc::new(Mutex::new(Log::default()));
    let dlq = Arc::new(MemoryQueue::standard("delayed-dlq"));
    // Behind an event source mapping the queue's visibility timeout is six times the function timeout,
    // as AWS advises (and the adapter insists).
    let visibility = scenario
        .lambda
        .map_or(Duration::from_secs(30), |lambda| lambda.spec.function_timeout * 6);
    let memory = Arc::new(
        MemoryQueue::standard("delayed")
            .with_visibility_timeout(visibility)
            .with_dead_letter_queue(Arc::clone(&dlq), MAX_RECEIVES),
    );
    let queue = Arc::new(FaultyQueue {
        inner: Arc::clone(&memory),
        log: Arc::clone(&log),
        clock,
        outages: scenario.send_outages.clone(),
        lost_deletes: scenario.lost_deletes,
        rng: Mutex::new(fastrand::Rng::with_seed(scenario.seed ^ 0x5eed)),
    });
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotencyStore::new());
    let style = scenario.key_style();
    let handler = Recorder {
        log: Arc::clone(&log),
        start: clock.start,
        style: style.clone(),
    };
    let payloads = Arc::new(ExpiringPayloads {
        objects: Mutex::new(HashMap::new()),
        start: clock.start,
        log: Arc::clone(&log),
    });
    let pipeline = || {
        let router = Router::new()
            .route(handler.clone())
            .route(Notifier(handler.clone()))
            .route(Slow);
        Pipeline::new(router)
            .with_payloads(
                Payloads::new(Arc::clone(&payloads) as Arc<dyn PayloadStore>).touch_every(TOUCH_EVERY),
            )
            .with_store(Arc::clone(&store))
            .with_clock(Arc::new(move || clock.now()))
            .with_max_delay_hop(HOP)
    };
    let consumers = match start_consumers(scenario, pipeline, &queue) {
        Ok(consumers) => consumers,
        Err(error) => {
            return DelayReport {
                violations: vec![error],
                ..DelayReport::default()
            };
        }
    };

    // The producer's sends and the cancels, in time order.
    let mut events: BTreeMap<(Duration, u8, usize), Event> = BTreeMap::new();
    for (index, job) in scenario.jobs.iter().enumerate() {
        events.insert((job.sent, 1, index), Event::Send(job.clone()));
    }
    for (index, (at, key)) in scenario.cancels.iter().enumerate() {
        events.insert((*at, 0, index), Event::Cancel(key.clone()));
    }
    for (index, (at, work)) in scenario.backlog.iter().enumerate() {
        events.insert((*at, 2, index), Event::Slow(*work));
    }
    let mut violations = Vec::new();
    for ((at, _, _), event) in events {
        tokio::time::sleep_until(clock.start + at).await;
        match event {
            Event::Send(job) => {
                if let Err(error) = send_job(&queue, payloads.as_ref(), &job, clock).await {
                    violations.push(format!("job {}: the producer's send failed: {error}", job.id));
                }
            }
            Event::Slow(work) => send_slow(&queue, work).await,
            Event::Cancel(key) => {
                // The canceller retries like an operator would.
                let mut tries = 0;
                while let Err(error) = cancel_at(store.as_ref(), &style, JOB_TYPE, &key, clock.now()).await {
                    tries += 1;
                    if tries > 10 {
                        violations.push(format!("cancel of {key} failed: {error}"));
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
    tokio::time::sleep_until(clock.start + scenario.length()).await;
    violations.extend(consumers.stop().await);
    let log = lock(&log);
    let dead: Vec<u32> = dlq
        .snapshot()
        .iter()
        .filter_map(|message| job_of(&message.body))
        .collect();
    violations.extend(check(scenario, &log, &dead));
    DelayReport {
        violations,
        jobs: scenario.jobs.len(),
        sends: log.sends.len(),
        runs: log.runs.len(),
        cancelled: scenario
            .jobs
            .iter()
            .filter(|job| scenario.cancelled_at(job).is_some())
            .count(),
        lambda: scenario.lambda.is_some(),
    }
}

enum Event {
    Send(DelayedJob),
    Cancel(String),
    /// A slow job of the backlog, working this long.
    Slow(Duration),
}

/// What consumes the queue: a worker, or functions behind an event source mapping.
enum Consumers {
    Worker {
        graceful: CancellationToken,
        running: tokio::task::JoinHandle<Result<conveyor_worker::WorkerReport, conveyor_worker::WorkerError>>,
    },
    Lambda {
        stop: CancellationToken,
        functions: Vec<tokio::task::JoinHandle<()>>,
    },
}

/// Starts the seed's consumers, each with a pipeline of its own from `pipeline`.
fn start_consumers(
    scenario: &DelayScenario,
    pipeline: impl Fn() -> Pipeline,
    queue: &Arc<FaultyQueue>,
) -> Result<Consumers, String> {
    let Some(lambda) = scenario.lambda else {
        let config = WorkerConfig::default()
            .with_queues(vec![QueueConfig::new("http://sim.invalid/delayed")])
            .with_max_in_flight(20)
            .with_listen_addr(None);
        let worker = Worker::new(config, pipeline(), vec![Arc::clone(queue) as Arc<dyn Queue>])
            .map_err(|error| format!("could not build the worker: {error}"))?;
        let graceful = CancellationToken::new();
        let running = tokio::spawn(worker.run_with(graceful.clone(), CancellationToken::new()));
        return Ok(Consumers::Worker { graceful, running });
    };
    // The trace and the claim fencing of the main simulation are not used here: only the poll loop.
    let sink = Arc::new(Sink::new(
        Arc::new(VirtualStore::new(Arc::new(MemoryIdempotencyStore::new()))),
        Trace::new(std::env::var_os("DELAY_TRACE").is_some()),
    ));
    let stop = CancellationToken::new();
    let functions = (0..lambda.functions)
        .map(|index| {
            let processor = BatchProcessor::new(
                pipeline(),
                crate::lambda::config(&lambda.spec),
                Arc::new(FixedQueue(Arc::clone(queue) as Arc<dyn Queue>)),
            )
            .without_metrics();
            let function = Function {
                name: format!("function-{index}"),
                spec: lambda.spec,
                queue: Arc::clone(queue) as Arc<dyn Queue>,
                processor: Arc::new(processor),
                sink: Arc::clone(&sink),
            };
            tokio::spawn(function.run(stop.clone()))
        })
        .collect();
    Ok(Consumers::Lambda { stop, functions })
}

impl Consumers {
    /// Stops them (a worker gracefully) and says what went wrong.
    async fn stop(self) -> Vec<String> {
        match self {
            Self::Worker { graceful, running } => {
                graceful.cancel();
                match running.await {
                    Ok(Ok(_)) => Vec::new(),
                    Ok(Err(error)) => vec![format!("the worker failed: {error}")],
                    Err(error) => vec![format!("the worker panicked: {error}")],
                }
            }
            Self::Lambda { stop, functions } => {
                stop.cancel();
                let mut problems = Vec::new();
                for function in functions {
                    if let Err(error) = function.await {
                        problems.push(format!("a function panicked: {error}"));
                    }
                }
                problems
            }
        }
    }
}

/// Sends one slow job of the backlog (unchecked: it only keeps the functions busy).
async fn send_slow(queue: &FaultyQueue, work: Duration) {
    let mut message = OutgoingMessage {
        body: format!("{{\"ms\":{}}}", work.as_millis()),
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(SLOW_TYPE));
    while let Err(error) = queue.inner.send(message.clone()).await {
        if !error.is_retryable() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn send_job(
    queue: &FaultyQueue,
    payloads: &ExpiringPayloads,
    job: &DelayedJob,
    clock: WallClock,
) -> Result<String, QueueError> {
    let body = format!("{{\"job\":{}}}", job.id);
    let mut message = OutgoingMessage {
        body: body.clone(),
        delay: Some(job.delay.min(HOP)),
        ..OutgoingMessage::default()
    };
    if job.large {
        // The claim check, as the producer writes it: the object first, then the pointer.
        let key = format!("job-{}", job.id);
        let _ = payloads.put(BUCKET, &key, body.clone().into_bytes()).await;
        message.body = PayloadPointer::new(BUCKET, key).to_body();
        let (name, value) = size_attribute(body.len());
        message.attributes.insert(name, value);
    }
    message.attributes.insert(
        IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
        AttributeValue::string(&job.key),
    );
    let job_type = if job.idempotent { JOB_TYPE } else { NOTIFY_TYPE };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
    message.attributes.insert(
        DUE_ATTRIBUTE.to_owned(),
        AttributeValue::number(due_value(clock.now() + job.delay)),
    );
    // The producer retries through an outage (it is not the path under test).
    loop {
        match queue.inner.send(message.clone()).await {
            Ok(id) => {
                let mut log = lock(&queue.log);
                log.sent_at.insert(id.clone(), clock.now());
                log.sends.push((job.id, clock.start.elapsed()));
                return Ok(id);
            }
            Err(error) if error.is_retryable() => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(error) => return Err(error),
        }
    }
}

/// The invariants of one run.
fn check(scenario: &DelayScenario, log: &Log, dead_lettered: &[u32]) -> Vec<String> {
    let mut violations = Vec::new();
    // Without lost deletes nothing may reach the DLQ (no job here fails: only spent receives take one
    // there). With them, a message whose deletes were lost again and again may, while a forked copy of
    // it runs the job: only a job that never ran is lost (checked below).
    if scenario.lost_deletes == 0.0 && !dead_lettered.is_empty() {
        violations.push(format!(
            "jobs {dead_lettered:?} reached the DLQ without running (a hop spent their receives)"
        ));
    }
    // No pointer to a gone object while its job is not done for good (not yet run, not cancelled). A job
    // whose handler is not idempotent is never done for good while a copy lives: every copy runs.
    for (id, at) in &log.missing_objects {
        let Some(job) = scenario.jobs.iter().find(|job| job.id == *id) else {
            continue;
        };
        let ran_before = log.runs.iter().any(|(run, ran)| run == id && ran <= at);
        if !job.idempotent {
            violations.push(format!(
                "job {id} (not idempotent): a copy found its payload object gone at {at:?} (ran before: \
                 {ran_before}); every copy of such a job runs, so its object must outlive them all"
            ));
            continue;
        }
        if !ran_before && scenario.cancelled_at(job).is_none() {
            violations.push(format!(
                "job {id}: a copy pointed at its payload object after the object was gone (at {at:?}, sent \
                 {:?}, due {:?})",
                job.sent,
                job.due()
            ));
        }
    }
    for job in &scenario.jobs {
        let runs: Vec<Duration> = log
            .runs
            .iter()
            .filter(|(id, _)| *id == job.id)
            .map(|(_, at)| *at)
            .collect();
        match scenario.cancelled_at(job) {
            Some(cancelled) => {
                if !runs.is_empty() {
                    violations.push(format!(
                        "job {} (key {}) ran after its cancel at {cancelled:?}",
                        job.id, job.key
                    ));
                }
                // It stops at its next receive: a copy decided before the cancel may still go out
                // (held through a send outage, one per forked chain), but no hop after one more hop
                // past the cancel and the outages. (A record a function had no time to start is
                // copied unread, as any other; it is dropped at its first run after the cancel.)
                let stop = cancelled.max(scenario.last_outage_end()) + HOP + Duration::from_secs(120);
                if let Some((_, at)) = log.hops.iter().find(|(id, at)| *id == job.id && *at > stop) {
                    violations.push(format!(
                        "job {} kept hopping after its cancel at {cancelled:?} (a copy sent at {at:?})",
                        job.id
                    ));
                }
            }
            None => {
                if runs.is_empty() {
                    violations.push(format!("job {} (key {}) never ran: lost", job.id, job.key));
                }
                // A handler that is not idempotent runs again when a delete was lost (at least once).
                if runs.len() > 1 && (job.idempotent || scenario.lost_deletes == 0.0) {
                    violations.push(format!("job {} ran {} times", job.id, runs.len()));
                }
                // The due time is in whole milliseconds of the wall clock; 500 ms of tolerance.
                if let Some(early) = runs
                    .iter()
                    .find(|at| **at + Duration::from_millis(501) < job.due())
                {
                    violations.push(format!(
                        "job {} ran at {early:?}, before it was due at {:?}",
                        job.id,
                        job.due()
                    ));
                }
            }
        }
    }
    violations
}
