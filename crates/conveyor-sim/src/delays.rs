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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, Message, ReceiptHandle};
use conveyor_core::port::{
    DeadLetter, EntryFailure, IdempotencyStore, OutgoingMessage, PayloadError, PayloadPointer, PayloadStore,
    Queue, QueueDepth, QueueError, VisibilityChange, size_attribute,
};
use conveyor_core::runtime::{DUE_ATTRIBUTE, Failure, cancel_at, due_value};
use conveyor_core::{
    Context, Handler, HandlerError, HandlerSettings, KeySource, KeyStyle, Payloads, Pipeline,
    PowertoolsFlavor, PowertoolsKey, Router,
};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest hop: SQS's is 15 minutes; the simulation shortens it (with the delays, in proportion)
/// through the pipeline's test hook, so a seed's virtual hours stay few while the hops stay many.
const HOP: Duration = Duration::from_secs(60);
/// How long an object lives after it was last written or touched (the lifecycle rule's 15 days): longer
/// than the longest send outage plus a touch period and a hop (a message held through an outage is not
/// touched), shorter than the longest delays, as 15 days are shorter than a delay plus a DLQ stay.
const OBJECT_LIFE: Duration = Duration::from_secs(36 * 60);
/// How often a hopping job touches its object (a day on SQS's scale).
const TOUCH_EVERY: Duration = Duration::from_secs(4 * 60);
/// The payload bucket.
const BUCKET: &str = "payloads";
/// The redrive policy's `maxReceiveCount`.
const MAX_RECEIVES: u32 = 5;
/// The job type.
const JOB_TYPE: &str = "delayed";

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
        Self {
            seed,
            jobs,
            cancels,
            send_outages,
            lost_deletes: if rng.bool() { rng.f64() * 0.04 } else { 0.0 },
            powertools_keys: rng.bool(),
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

    /// How long the run lasts: past every due time and outage, plus time to settle.
    fn length(&self) -> Duration {
        let last_due = self.jobs.iter().map(DelayedJob::due).max().unwrap_or_default();
        last_due.max(self.last_outage_end()) + Duration::from_secs(600)
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
struct Recorder {
    log: Arc<Mutex<Log>>,
    start: Instant,
    style: KeyStyle,
}

impl Handler for Recorder {
    type Job = Body;
    type Output = ();
    const JOB_TYPE: &'static str = JOB_TYPE;

    async fn handle(&self, job: Body, _ctx: Context) -> Result<(), HandlerError> {
        lock(&self.log).runs.push((job.job, self.start.elapsed()));
        Ok(())
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_key_style(self.style.clone())
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
        let id = self.inner.send(message).await?;
        let mut log = lock(&self.log);
        log.sent_at.insert(id.clone(), self.clock.now());
        if let Some(job) = job {
            log.sends.push((job, self.clock.start.elapsed()));
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return DelayReport {
                violations: vec![format!("could not build the runtime: {error}")],
                ..DelayReport::default()
            };
        }
    };
    fastrand::seed(seed);
    runtime.block_on(run(&scenario))
}

async fn run(scenario: &DelayScenario) -> DelayReport {
    let clock = WallClock {
        start: Instant::now(),
        epoch: SystemTime::now(),
    };
    let log = Arc::new(Mutex::new(Log::default()));
    let dlq = Arc::new(MemoryQueue::standard("delayed-dlq"));
    let memory =
        Arc::new(MemoryQueue::standard("delayed").with_dead_letter_queue(Arc::clone(&dlq), MAX_RECEIVES));
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
    let pipeline = Pipeline::new(Router::single(handler))
        .with_payloads(Payloads::new(Arc::clone(&payloads) as Arc<dyn PayloadStore>).touch_every(TOUCH_EVERY))
        .with_store(Arc::clone(&store))
        .with_clock(Arc::new(move || clock.now()))
        .with_max_delay_hop(HOP);
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new("http://sim.invalid/delayed")])
        .with_max_in_flight(20)
        .with_listen_addr(None);
    let worker = match Worker::new(config, pipeline, vec![Arc::clone(&queue) as Arc<dyn Queue>]) {
        Ok(worker) => worker,
        Err(error) => {
            return DelayReport {
                violations: vec![format!("could not build the worker: {error}")],
                ..DelayReport::default()
            };
        }
    };
    let graceful = CancellationToken::new();
    let immediate = CancellationToken::new();
    let running = tokio::spawn(worker.run_with(graceful.clone(), immediate.clone()));

    // The producer's sends and the cancels, in time order.
    let mut events: BTreeMap<(Duration, u8, usize), Event> = BTreeMap::new();
    for (index, job) in scenario.jobs.iter().enumerate() {
        events.insert((job.sent, 1, index), Event::Send(job.clone()));
    }
    for (index, (at, key)) in scenario.cancels.iter().enumerate() {
        events.insert((*at, 0, index), Event::Cancel(key.clone()));
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
    graceful.cancel();
    match running.await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => violations.push(format!("the worker failed: {error}")),
        Err(error) => violations.push(format!("the worker panicked: {error}")),
    }
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
    }
}

enum Event {
    Send(DelayedJob),
    Cancel(String),
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
    // No pointer to a gone object while its job is not done for good (not yet run, not cancelled).
    for (id, at) in &log.missing_objects {
        let Some(job) = scenario.jobs.iter().find(|job| job.id == *id) else {
            continue;
        };
        let ran_before = log.runs.iter().any(|(run, ran)| run == id && ran <= at);
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
                // (held through a send outage, one per forked chain), but none after one more hop
                // past the cancel and the outages.
                let stop = cancelled.max(scenario.last_outage_end()) + HOP + Duration::from_secs(120);
                if let Some((_, at)) = log.sends.iter().find(|(id, at)| *id == job.id && *at > stop) {
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
                if runs.len() > 1 {
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
