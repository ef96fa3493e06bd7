//! Schedules under faults: the real [`Scheduler`] (its leader lease, cursor and pause handling) over the
//! in-memory [`MemoryScheduleStore`], on tokio's paused clock.
//!
//! A seed draws an interval schedule (in half the seeds starting at an instant finer than the store's
//! millisecond, as `Schedule::starting(now + 2 s)` does) and 2 to 5 workers whose wall clocks are skewed by up to
//! [`MAX_SKEW`]; workers killed (no release) and restarted later; a worker stalled in a send or a store
//! read for longer than the lease (a paused process); pauses and resumes by an operator, in a third of
//! the seeds several quick cycles of them between two looks of the leader; the schedule removed and
//! added again under its name (a run-time schedule, in a third of the seeds); a `max_runs`;
//! sends that fail, and sends that SQS accepted whose reply was lost; store outages. In a quarter of the
//! seeds the schedule migrates to EventBridge Scheduler: the exported `rate()` fires from the file's
//! `StartDate` (or its creation time, with none) while the workers still run, then the workers stop.
//!
//! Invariants after every run:
//! - no worker started a send while another owner held the lease (one leader);
//! - no tick was sent after the stored cursor had passed it (one clock, cursor only forward);
//! - no tick inside a pause (more than [`MAX_SKEW`] after the pause, up to the resume) was sent: a
//!   resume never replays the paused period, however many pauses came between two looks;
//! - a schedule removed and added again starts fresh: no tick of the gap is sent (beyond the first
//!   look's `missed_after` window), and it fires again up to its own `max_runs`;
//! - no two different ticks within one interval (one grid: in-process and EventBridge agree);
//! - every other tick was sent (policy `All`), unless `max_runs` was reached;
//! - `runs` counts sent ticks exactly once each (duplicates of one tick within the idempotency window,
//!   a lost reply or a failover, count once), and never passes `max_runs`; at `max_runs`, exactly that
//!   many ticks were sent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_schedule::{
    Advance, LeaseRecord, MemoryScheduleStore, MissedTicks, Schedule, ScheduleState, ScheduleStore,
    Scheduler, SchedulerClock, StoreError, TickSender,
};
use conveyor_sqs::NewJob;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The largest skew of a worker's wall clock, either way.
pub const MAX_SKEW: Duration = Duration::from_secs(3);
const LEASE: Duration = Duration::from_secs(3);
const NAME: &str = "sim";
/// The virtual wall clock's origin (2100-01-01), in seconds.
const EPOCH_SECS: u64 = 4_102_444_800;
/// Quiet time at the end: no fault, every worker up.
const SETTLE: Duration = Duration::from_secs(60);

/// One worker's plan.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Its wall clock's skew in milliseconds.
    pub skew_ms: i64,
    /// Killed (no release) at this time, restarted (a new process) after the second duration.
    pub kill: Option<(Duration, Duration)>,
    /// Stalls at this time for this long: in a send (else in a store read).
    pub stall: Option<(Duration, Duration, bool)>,
}

/// One seed's schedule scenario.
#[derive(Debug, Clone)]
pub struct ScheduleScenario {
    /// The seed.
    pub seed: u64,
    /// The schedule's interval.
    pub interval: Duration,
    /// The wall time at the start (a whole second plus a seed's offset).
    pub origin: SystemTime,
    /// The workers.
    pub workers: Vec<WorkerPlan>,
    /// Pauses: paused at, resumed at.
    pub pauses: Vec<(Duration, Duration)>,
    /// `max_runs`.
    pub max_runs: Option<u64>,
    /// The chance a send fails.
    pub send_failures: f64,
    /// The chance a send is accepted but its reply lost.
    pub lost_replies: f64,
    /// Store outages: from, length.
    pub store_outages: Vec<(Duration, Duration)>,
    /// EventBridge created at, workers stopped at.
    pub migration: Option<(Duration, Duration)>,
    /// How long faults last (then `SETTLE`).
    pub length: Duration,
    /// A start this long after the origin, finer than a millisecond (`Schedule::starting(now + ...)`).
    pub start_after: Option<Duration>,
    /// A run-time schedule removed at the first time and added again at the second.
    pub readd: Option<(Duration, Duration)>,
}

impl ScheduleScenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x05c4_ed00);
        let migration = rng.f64() < 0.25;
        let length = Duration::from_secs(if migration { 900 } else { 240 });
        let interval = if migration {
            Duration::from_secs(60)
        } else {
            Duration::from_secs(rng.u64(1..8))
        };
        let origin = SystemTime::UNIX_EPOCH
            + Duration::from_secs(EPOCH_SECS + rng.u64(0..86_400))
            + Duration::from_millis(rng.u64(0..1000));
        let at =
            |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(0..length.as_millis() as u64 - 30_000));
        let workers = (0..rng.usize(2..6))
            .map(|_| WorkerPlan {
                skew_ms: rng.i64(-(MAX_SKEW.as_millis() as i64)..=MAX_SKEW.as_millis() as i64),
                kill: (rng.f64() < 0.4).then(|| (at(&mut rng), Duration::from_millis(rng.u64(0..40_000)))),
                stall: (rng.f64() < 0.3).then(|| {
                    (
                        at(&mut rng),
                        Duration::from_millis(rng.u64(2_000..15_000)),
                        rng.bool(),
                    )
                }),
            })
            .collect();
        let pauses = if migration {
            Vec::new()
        } else {
            let mut pauses: Vec<(Duration, Duration)> = Vec::new();
            let mut from = Duration::from_secs(5);
            for _ in 0..rng.usize(0..3) {
                let paused = from + Duration::from_millis(rng.u64(0..60_000));
                let resumed = paused + Duration::from_millis(rng.u64(3_000..50_000));
                if resumed + Duration::from_secs(10) < length {
                    pauses.push((paused, resumed));
                    from = resumed + Duration::from_secs(5);
                }
            }
            pauses
        };
        let store_outages = (0..rng.usize(0..3))
            .map(|_| (at(&mut rng), Duration::from_millis(rng.u64(500..8_000))))
            .collect();
        let migration = migration.then(|| {
            let created = Duration::from_millis(rng.u64(200_000..500_000));
            (created, created + Duration::from_millis(rng.u64(0..150_000)))
        });
        let mut scenario = Self {
            seed,
            interval,
            origin,
            workers,
            pauses,
            max_runs: (migration.is_none() && rng.f64() < 0.3).then(|| rng.u64(3..60)),
            send_failures: if rng.bool() { rng.f64() * 0.3 } else { 0.0 },
            lost_replies: if rng.bool() { rng.f64() * 0.1 } else { 0.0 },
            store_outages,
            start_after: (migration.is_none() && rng.bool())
                .then(|| Duration::from_nanos(rng.u64(1_000_000_000..5_000_000_000))),
            migration,
            length,
            readd: None,
        };
        if scenario.migration.is_none() {
            // A generator of its own: the draws above (and the seeds they found) stay as they were.
            scenario.add_bursts_and_readd(&mut fastrand::Rng::with_seed(seed ^ 0x0b0a_5e5b));
        }
        scenario
    }

    /// Several quick pause/resume cycles (each pause longer than the skew allowance plus a tick, the
    /// gaps shorter than an interval: the leader looks at most once between them), and a removal of
    /// the schedule followed by an add under the same name, each in about a third of the seeds.
    fn add_bursts_and_readd(&mut self, rng: &mut fastrand::Rng) {
        let interval_ms = self.interval.as_millis() as u64;
        if rng.f64() < 0.35 {
            let mut at = self.pauses.last().map_or(Duration::from_secs(5), |(_, resumed)| {
                *resumed + Duration::from_secs(5)
            }) + Duration::from_millis(rng.u64(0..20_000));
            for _ in 0..rng.usize(2..5) {
                let paused = at;
                let resumed = paused + Duration::from_millis(rng.u64(4_000..4_000 + 3 * interval_ms));
                if resumed + Duration::from_secs(10) >= self.length {
                    break;
                }
                self.pauses.push((paused, resumed));
                at = resumed + Duration::from_millis(rng.u64(100..interval_ms.max(200)));
            }
        }
        if rng.f64() < 0.35 {
            let removed = Duration::from_millis(rng.u64(40_000..120_000));
            let added = removed + Duration::from_millis(rng.u64(30_000..60_000));
            // Pauses end before the removal or begin after the add: a removal deletes them.
            self.pauses.retain(|(paused, resumed)| {
                *resumed + Duration::from_secs(5) < removed || *paused > added + Duration::from_secs(5)
            });
            // A run-time schedule's definition keeps its start to the second.
            self.start_after = None;
            self.readd = Some((removed, added));
        }
    }

    /// The schedule: every `interval`, missed ticks all sent. Without a start (anchored on the epoch),
    /// except that a migrating seed anchors it where the export asks (see [`Self::exported`]).
    fn schedule(&self) -> Schedule {
        let schedule = Schedule::every(NAME, self.interval)
            .and_then(|schedule| schedule.job_of("sim", 1, &serde_json::json!({})))
            .map(|schedule| {
                schedule
                    .missed_ticks(MissedTicks::All)
                    .missed_after(Duration::from_secs(10))
            });
        let Ok(mut schedule) = schedule else {
            unreachable_schedule()
        };
        if let Some(max) = self.max_runs {
            schedule = schedule.max_runs(max);
        }
        if let Some(after) = self.start_after {
            schedule = schedule.starting(self.origin + after);
        }
        if self.migration.is_some() {
            schedule = self.exported(schedule).0;
        }
        schedule
    }

    /// What a user does to export `schedule`: export it; when the export asks for an explicit start,
    /// give the whole minute before now. Returns the schedule and the file.
    fn exported(&self, schedule: Schedule) -> (Schedule, String) {
        match conveyor_schedule::export(std::slice::from_ref(&schedule)) {
            Ok(file) => (schedule, file),
            Err(_) => {
                let secs = self
                    .origin
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                let anchored =
                    schedule.starting(SystemTime::UNIX_EPOCH + Duration::from_secs(secs - secs % 60));
                let file = conveyor_schedule::export(std::slice::from_ref(&anchored)).unwrap_or_default();
                (anchored, file)
            }
        }
    }
}

#[expect(clippy::panic, reason = "the simulator's fixed schedule is valid")]
fn unreachable_schedule() -> ! {
    panic!("the simulator's schedule does not build")
}

/// One send call.
#[derive(Debug, Clone)]
struct SendCall {
    tick: SystemTime,
    owner: String,
    started: Duration,
    accepted: bool,
    confirmed: bool,
}

#[derive(Debug, Default)]
struct Log {
    sends: Vec<SendCall>,
    /// Cursor moves: the new cursor and when.
    advances: Vec<(SystemTime, Duration)>,
    violations: Vec<String>,
    lines: Vec<String>,
}

type SharedLog = Arc<Mutex<Log>>;

fn with_log<T>(log: &SharedLog, f: impl FnOnce(&mut Log) -> T) -> T {
    let mut guard = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

/// The store as one worker sees it: latency, shared outages, an optional stall in a state read.
#[derive(Debug)]
struct SimStore {
    inner: Arc<MemoryScheduleStore>,
    down: Arc<AtomicBool>,
    log: SharedLog,
    origin: Instant,
    stall: Option<(Instant, Duration)>,
    stalled: AtomicBool,
}

impl SimStore {
    async fn call(&self) -> Result<(), StoreError> {
        tokio::time::sleep(Duration::from_millis(3)).await;
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError {
                table: "sim".to_owned(),
                message: "unavailable".to_owned(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ScheduleStore for SimStore {
    async fn read_lease(&self, set: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.call().await?;
        self.inner.read_lease(set).await
    }

    async fn write_lease(
        &self,
        set: &str,
        expected: Option<&LeaseRecord>,
        record: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        self.call().await?;
        self.inner.write_lease(set, expected, record).await
    }

    async fn state(&self, name: &str) -> Result<ScheduleState, StoreError> {
        self.call().await?;
        let state = self.inner.state(name).await;
        if let Some((at, length)) = self.stall
            && Instant::now() >= at
            && !self.stalled.swap(true, Ordering::Relaxed)
        {
            tokio::time::sleep(length).await;
        }
        state
    }

    async fn advance(
        &self,
        name: &str,
        advance: &Advance,
        max_runs: Option<u64>,
    ) -> Result<bool, StoreError> {
        self.call().await?;
        let moved = self.inner.advance(name, advance, max_runs).await?;
        if moved {
            with_log(&self.log, |log| {
                log.lines.push(format!(
                    "{:?} cursor -> {} ({})",
                    self.origin.elapsed(),
                    format_secs(advance.tick),
                    advance.outcome
                ));
                log.advances.push((advance.tick, self.origin.elapsed()));
            });
        }
        Ok(moved)
    }

    async fn note(&self, name: &str, outcome: &str) -> Result<(), StoreError> {
        self.call().await?;
        self.inner.note(name, outcome).await
    }

    async fn pause(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        self.call().await?;
        self.inner.pause(name, at).await
    }

    async fn resume(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        self.call().await?;
        self.inner.resume(name, at).await
    }

    async fn definitions(&self, set: &str) -> Result<std::collections::HashMap<String, String>, StoreError> {
        self.call().await?;
        self.inner.definitions(set).await
    }

    async fn put_definition(&self, set: &str, name: &str, definition: &str) -> Result<(), StoreError> {
        self.call().await?;
        self.inner.put_definition(set, name, definition).await
    }

    async fn remove_definition(&self, set: &str, name: &str) -> Result<(), StoreError> {
        self.call().await?;
        self.inner.remove_definition(set, name).await
    }

    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

/// SQS as one worker sees it; every send checks that the sender holds the lease.
struct SimSender {
    owner: String,
    store: Arc<MemoryScheduleStore>,
    log: SharedLog,
    origin: Instant,
    rng: Mutex<fastrand::Rng>,
    failures: f64,
    lost: f64,
    faults_until: Duration,
    stall: Option<(Instant, Duration)>,
    stalled: AtomicBool,
}

#[async_trait]
impl TickSender for SimSender {
    async fn send_tick(&self, job: &NewJob<serde_json::Value>) -> Result<String, String> {
        let tick = job.producer_key().and_then(tick_of).ok_or("no tick key")?;
        let started = self.origin.elapsed();
        let holder = self.store.peek_lease(conveyor_schedule::DEFAULT_SET);
        if holder.as_ref().is_none_or(|lease| lease.owner != self.owner) {
            with_log(&self.log, |log| {
                log.violations.push(format!(
                    "{} started a send of {} at {started:?} while {:?} held the lease",
                    self.owner,
                    format_secs(tick),
                    holder.map(|lease| lease.owner)
                ))
            });
        }
        if let Some((at, length)) = self.stall
            && Instant::now() >= at
            && !self.stalled.swap(true, Ordering::Relaxed)
        {
            tokio::time::sleep(length).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (fails, lost) = self
            .rng
            .lock()
            .map(|mut rng| (rng.f64() < self.failures, rng.f64() < self.lost))
            .unwrap_or((false, false));
        // The settling time is free of faults.
        let (fails, lost) = if started < self.faults_until {
            (fails, lost)
        } else {
            (false, false)
        };
        let call = SendCall {
            tick,
            owner: self.owner.clone(),
            started,
            accepted: !fails,
            confirmed: !fails && !lost,
        };
        with_log(&self.log, |log| {
            log.lines.push(format!(
                "{started:?} {} sends {} accepted={} confirmed={}",
                self.owner,
                format_secs(tick),
                call.accepted,
                call.confirmed
            ));
            log.sends.push(call);
        });
        if fails {
            return Err("throttled".to_owned());
        }
        if lost {
            return Err("timed out (accepted)".to_owned());
        }
        Ok(format!("m-{}", format_secs(tick)))
    }
}

fn format_secs(time: SystemTime) -> String {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or_else(
        |_| "?".to_owned(),
        |since| format!("{}.{:03}", since.as_secs(), since.subsec_millis()),
    )
}

/// `time` to the whole second below, as a tick's key says it.
fn whole_second(time: SystemTime) -> SystemTime {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The tick of a key `schedule:<name>@YYYY-MM-DDTHH:MM:SSZ`.
fn tick_of(key: &str) -> Option<SystemTime> {
    let (_, time) = key.rsplit_once('@')?;
    let number = |range: std::ops::Range<usize>| -> Option<i64> { time.get(range)?.parse().ok() };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// What one seed broke (empty: it passed).
#[derive(Debug, Default)]
pub struct ScheduleReport {
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Distinct ticks sent.
    pub ticks: usize,
    /// Send calls accepted by SQS (duplicates included).
    pub accepted: usize,
    /// Store requests.
    pub store_requests: u64,
    /// What happened.
    pub trace: Vec<String>,
}

/// Runs `seed`'s schedule scenario and checks its invariants.
pub fn simulate_schedule(seed: u64) -> ScheduleReport {
    let scenario = ScheduleScenario::generate(seed);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return ScheduleReport {
                violations: vec![format!("could not build the runtime: {error}")],
                ..ScheduleReport::default()
            };
        }
    };
    let (log, state, requests) = runtime.block_on(run(&scenario));
    check(&scenario, log, &state, requests)
}

struct World {
    origin: Instant,
    store: Arc<MemoryScheduleStore>,
    down: Arc<AtomicBool>,
    log: SharedLog,
}

impl World {
    fn scheduler(
        &self,
        scenario: &ScheduleScenario,
        plan: &WorkerPlan,
        index: usize,
        generation: u64,
    ) -> Scheduler {
        let owner = format!("w{index}.{generation}");
        let stall = plan
            .stall
            .filter(|_| generation == 0)
            .map(|(at, length, in_send)| (self.origin + at, length, in_send));
        let store = SimStore {
            inner: Arc::clone(&self.store),
            down: Arc::clone(&self.down),
            log: Arc::clone(&self.log),
            origin: self.origin,
            stall: stall
                .filter(|(_, _, in_send)| !in_send)
                .map(|(at, length, _)| (at, length)),
            stalled: AtomicBool::new(false),
        };
        let sender = SimSender {
            owner: owner.clone(),
            store: Arc::clone(&self.store),
            log: Arc::clone(&self.log),
            origin: self.origin,
            rng: Mutex::new(fastrand::Rng::with_seed(
                scenario.seed ^ (index as u64 * 7919 + generation),
            )),
            failures: scenario.send_failures,
            lost: scenario.lost_replies,
            faults_until: scenario.length,
            stall: stall
                .filter(|(_, _, in_send)| *in_send)
                .map(|(at, length, _)| (at, length)),
            stalled: AtomicBool::new(false),
        };
        let clock = SchedulerClock::simulated(scenario.origin, self.origin, plan.skew_ms);
        // A schedule that is removed and added again is a run-time one, in the store's definitions.
        let code = match scenario.readd {
            Some(_) => Vec::new(),
            None => vec![scenario.schedule()],
        };
        match Scheduler::with_shared_store(code, Arc::new(store), Arc::new(sender)) {
            Ok(scheduler) => scheduler.with_clock(clock).with_lease(LEASE).with_owner(&owner),
            Err(_) => unreachable_schedule(),
        }
    }
}

async fn run(scenario: &ScheduleScenario) -> (Log, ScheduleState, u64) {
    let world = Arc::new(World {
        origin: Instant::now(),
        store: Arc::new(MemoryScheduleStore::new()),
        down: Arc::default(),
        log: Arc::default(),
    });
    let wall = |at: Duration| scenario.origin + at;
    let mut tasks = tokio::task::JoinSet::new();
    for (at, length) in scenario.store_outages.clone() {
        let down = Arc::clone(&world.down);
        tasks.spawn(async move {
            tokio::time::sleep(at).await;
            down.store(true, Ordering::Relaxed);
            tokio::time::sleep(length).await;
            down.store(false, Ordering::Relaxed);
        });
    }
    // The operator removes the run-time schedule and adds it again (the CLI's `schedules remove|add`).
    if let Some((removed, added)) = scenario.readd {
        let definition = conveyor_schedule::to_definition_json(&scenario.schedule());
        let set = conveyor_schedule::DEFAULT_SET;
        let _ = world.store.put_definition(set, NAME, &definition).await;
        let store = Arc::clone(&world.store);
        let log = Arc::clone(&world.log);
        tasks.spawn(async move {
            tokio::time::sleep(removed).await;
            let _ = store.remove_definition(set, NAME).await;
            with_log(&log, |log| {
                log.lines.push(format!("{removed:?} operator removes"))
            });
            tokio::time::sleep(added - removed).await;
            let _ = store.put_definition(set, NAME, &definition).await;
            with_log(&log, |log| {
                log.lines.push(format!("{added:?} operator adds it again"))
            });
        });
    }
    // The operator pauses and resumes on the true clock (the CLI's).
    for (paused, resumed) in scenario.pauses.clone() {
        let store = Arc::clone(&world.store);
        let log = Arc::clone(&world.log);
        let (paused_wall, resumed_wall) = (wall(paused), wall(resumed));
        tasks.spawn(async move {
            tokio::time::sleep(paused).await;
            let _ = store.pause(NAME, paused_wall).await;
            with_log(&log, |log| log.lines.push(format!("{paused:?} operator pauses")));
            tokio::time::sleep(resumed - paused).await;
            let _ = store.resume(NAME, resumed_wall).await;
            with_log(&log, |log| {
                log.lines.push(format!("{resumed:?} operator resumes"))
            });
        });
    }
    let stop_workers = CancellationToken::new();
    for (index, plan) in scenario.workers.iter().enumerate() {
        let world = Arc::clone(&world);
        let plan = plan.clone();
        let scenario_copy = scenario.clone();
        let stop = stop_workers.clone();
        tasks.spawn(async move {
            let first = world.scheduler(&scenario_copy, &plan, index, 0);
            let mut running = tokio::spawn(first.run(stop.child_token()));
            let Some((kill_at, restart_after)) = plan.kill else {
                let _ = running.await;
                return;
            };
            tokio::select! {
                _ = &mut running => return,
                () = tokio::time::sleep(kill_at) => {}
            }
            // SIGKILL: stopped wherever it is, no release.
            running.abort();
            with_log(&world.log, |log| {
                log.lines.push(format!("{kill_at:?} w{index}.0 killed"))
            });
            tokio::time::sleep(restart_after).await;
            if stop.is_cancelled() {
                return;
            }
            let second = world.scheduler(&scenario_copy, &plan, index, 1);
            second.run(stop.child_token()).await;
        });
    }
    if let Some((created, workers_stop)) = scenario.migration {
        let (_, file) = scenario.exported(scenario.schedule());
        let log = Arc::clone(&world.log);
        let origin = world.origin;
        let interval = scenario.interval;
        let created_wall = wall(created);
        let stop = stop_workers.clone();
        tasks.spawn(async move {
            tokio::time::sleep(created).await;
            with_log(&log, |log| {
                log.lines
                    .push(format!("{created:?} EventBridge schedule created"))
            });
            let anchor = serde_json::from_str::<serde_json::Value>(&file)
                .ok()
                .and_then(|file| {
                    file["schedules"][0]["start_date"]
                        .as_str()
                        .and_then(|date| tick_of(&format!("@{date}")))
                })
                .unwrap_or(created_wall);
            let mut tick = anchor;
            while tick < created_wall {
                tick += interval;
            }
            loop {
                let wait = tick.duration_since(created_wall).unwrap_or_default();
                tokio::time::sleep_until(origin + created + wait).await;
                with_log(&log, |log| {
                    log.sends.push(SendCall {
                        tick,
                        owner: "eventbridge".to_owned(),
                        started: origin.elapsed(),
                        accepted: true,
                        confirmed: true,
                    })
                });
                tick += interval;
            }
        });
        tasks.spawn(async move {
            tokio::time::sleep(workers_stop).await;
            stop.cancel();
        });
    }
    tokio::time::sleep(scenario.length + SETTLE).await;
    stop_workers.cancel();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let state = world.store.peek_state(NAME);
    let requests = world.store.requests();
    let log = std::mem::take(
        &mut *world
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    (log, state, requests)
}

/// The earliest tick whose send was not confirmed (failed, or its reply lost) before the removal at
/// `removed`, and never confirmed before it: the leader was still retrying it when the schedule was
/// removed.
fn stuck_at_removal(log: &Log, removed: Duration) -> Option<SystemTime> {
    let confirmed_before = |tick: SystemTime| {
        log.sends
            .iter()
            .any(|send| send.tick == tick && send.confirmed && send.started < removed)
    };
    log.sends
        .iter()
        .filter(|send| !send.confirmed && send.started < removed && !confirmed_before(send.tick))
        .map(|send| send.tick)
        .min()
}

/// After a removal, how long a leader that had not reloaded its definitions yet may still send the
/// removed schedule's ticks (its reload every third of the lease, a stall, the skew).
const REMOVAL_LAG: Duration = Duration::from_secs(6);

/// A span of ticks that must all be sent (unless `max_runs` was reached in it): one life of the
/// schedule, between its add and its removal.
struct Life {
    /// Every tick in `[from, to]` is sent.
    from: SystemTime,
    to: SystemTime,
    /// Ticks sent in it: instants in `(after, until]`.
    after: SystemTime,
    until: SystemTime,
}

fn lives(scenario: &ScheduleScenario) -> Vec<Life> {
    let wall = |at: Duration| scenario.origin + at;
    let first = scenario.origin + Duration::from_secs(1);
    let last = wall(scenario.length + SETTLE - Duration::from_secs(20));
    let (start, end) = (SystemTime::UNIX_EPOCH, wall(scenario.length + SETTLE * 2));
    match scenario.readd {
        None => vec![Life {
            from: first,
            to: last,
            after: start,
            until: end,
        }],
        Some((removed, added)) => vec![
            Life {
                from: first,
                to: wall(removed) - MAX_SKEW - Duration::from_secs(1),
                after: start,
                until: wall(removed) + REMOVAL_LAG,
            },
            Life {
                from: wall(added) + Duration::from_secs(1),
                to: last,
                after: wall(removed) + REMOVAL_LAG,
                until: end,
            },
        ],
    }
}

fn check(scenario: &ScheduleScenario, log: Log, state: &ScheduleState, requests: u64) -> ScheduleReport {
    let mut violations = log.violations.clone();
    let wall = |at: Duration| scenario.origin + at;
    let schedule = scenario.schedule();
    // Ticks by their keys' second, to their instants.
    let grid: BTreeMap<SystemTime, SystemTime> = schedule
        .ticks_between(
            scenario.origin - Duration::from_secs(120),
            wall(scenario.length + SETTLE),
            1_000_000,
        )
        .into_iter()
        .map(|tick| (whole_second(tick), tick))
        .collect();
    let instant = |tick: SystemTime| grid.get(&tick).copied().unwrap_or(tick);
    // A removal deletes the cursor: a send after it is judged by the cursor's moves after it only.
    let removed_at = scenario.readd.map(|(removed, _)| removed);
    let life_began = |at: Duration| removed_at.filter(|removed| at >= *removed).unwrap_or_default();
    // No send of a tick after the cursor passed it.
    for send in log.sends.iter().filter(|send| send.owner != "eventbridge") {
        let since = life_began(send.started);
        if let Some((cursor, at)) = log
            .advances
            .iter()
            .find(|(cursor, at)| *cursor >= instant(send.tick) && *at < send.started && *at >= since)
        {
            violations.push(format!(
                "{} sent tick {} at {:?}, after the cursor moved to {} at {at:?}",
                send.owner,
                format_secs(send.tick),
                send.started,
                format_secs(*cursor)
            ));
        }
    }
    let accepted: BTreeMap<SystemTime, usize> =
        log.sends
            .iter()
            .filter(|send| send.accepted)
            .fold(BTreeMap::new(), |mut ticks, send| {
                *ticks.entry(send.tick).or_default() += 1;
                ticks
            });
    let in_pause = |tick: SystemTime, margin: Duration| {
        scenario
            .pauses
            .iter()
            .any(|(paused, resumed)| tick > wall(*paused) + margin && tick <= wall(*resumed))
    };
    // No paused tick (judged on the tick's instant, which its key gives to the second).
    for tick in accepted.keys() {
        if in_pause(instant(*tick), MAX_SKEW) {
            violations.push(format!("tick {} inside a pause was sent", format_secs(*tick)));
        }
    }
    // A schedule added again starts fresh: nothing of the gap, beyond the first look's window.
    if let Some((removed, added)) = scenario.readd {
        let gap_from = wall(removed) + REMOVAL_LAG;
        let gap_to = wall(added) - Duration::from_secs(10) - MAX_SKEW - Duration::from_secs(1);
        if let Some(tick) = accepted
            .keys()
            .map(|tick| instant(*tick))
            .find(|tick| *tick > gap_from && *tick <= gap_to)
        {
            violations.push(format!(
                "tick {} between the removal and the add again was sent (the old cursor replayed)",
                format_secs(tick)
            ));
        }
    }
    // One grid.
    let ticks: Vec<SystemTime> = accepted.keys().copied().collect();
    for pair in ticks.windows(2) {
        if pair[1].duration_since(pair[0]).unwrap_or_default() < scenario.interval {
            violations.push(format!(
                "two ticks within one interval: {} and {} (two anchors)",
                format_secs(pair[0]),
                format_secs(pair[1])
            ));
            break;
        }
    }
    let worker_ticks: BTreeSet<SystemTime> = log
        .sends
        .iter()
        .filter(|send| send.accepted && send.owner != "eventbridge")
        .map(|send| instant(send.tick))
        .collect();
    let lives = lives(scenario);
    for (index, life) in lives.iter().enumerate() {
        let in_life = |tick: &SystemTime| *tick > life.after && *tick <= life.until;
        let sent = worker_ticks.iter().filter(|tick| in_life(tick)).count() as u64;
        // Runs counted once per tick, in the state of the last life.
        if index + 1 == lives.len() {
            let ambiguous = worker_ticks
                .iter()
                .filter(|tick| in_life(tick))
                .filter(|tick| in_pause(**tick, Duration::ZERO) && !in_pause(**tick, MAX_SKEW))
                .count() as u64;
            if state.runs > sent || state.runs + ambiguous < sent {
                violations.push(format!(
                    "runs = {} but {sent} distinct ticks were sent",
                    state.runs
                ));
            }
        }
        let mut max_reached = false;
        if let Some(max) = scenario.max_runs {
            if sent > max {
                violations.push(format!("{sent} ticks sent with max_runs {max}"));
            }
            max_reached = sent >= max || (index + 1 == lives.len() && state.runs >= max);
            if index + 1 == lives.len() && state.runs >= max && sent != max {
                violations.push(format!("max_runs {max} reached with {sent} ticks sent"));
            }
        }
        // Every other tick sent, up to the removal that ends this life, unless a send was still
        // failing then: the leader sends in order, so the ticks from the one it was retrying on are
        // the removed schedule's, never sent (and must not be: its state is gone).
        let to = match (index + 1 < lives.len(), scenario.readd) {
            (true, Some((removed, _))) => stuck_at_removal(&log, removed)
                .map_or(life.to, |stuck| life.to.min(stuck - Duration::from_millis(1))),
            _ => life.to,
        };
        if max_reached || to <= life.from {
            continue;
        }
        let missing: Vec<String> = schedule
            .ticks_between(life.from, to, 100_000)
            .into_iter()
            .filter(|tick| !in_pause(*tick, Duration::ZERO) && !accepted.contains_key(&whole_second(*tick)))
            .map(format_secs)
            .collect();
        if !missing.is_empty() {
            violations.push(format!(
                "{} ticks never sent, the first {}{}",
                missing.len(),
                missing[0],
                if lives.len() > 1 {
                    format!(" (life {} of the schedule)", index + 1)
                } else {
                    String::new()
                }
            ));
        }
    }
    ScheduleReport {
        violations,
        ticks: accepted.len(),
        accepted: accepted.values().sum(),
        store_requests: requests,
        trace: log.lines,
    }
}
