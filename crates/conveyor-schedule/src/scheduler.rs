//! [`Scheduler`]: every worker runs one; the leader of the schedule set sends each tick once.
//!
//! # Design note: one leader, one clock, one cursor
//!
//! - **Leader.** The schedulers of a set share a lease (`lease.rs`). Followers only read the lease
//!   record, every third of the lease; they never read schedule state nor send. The leader renews the
//!   lease, reloads the run-time definitions at the same pace, and serves each schedule when its next
//!   tick is due.
//! - **One clock.** Ticks are decided on the leader's clock only, from the stored cursor
//!   (`last_tick`), which moves forward only (a write conditional on `last_tick < :tick`). A new leader
//!   resumes from that cursor whatever its own clock says: a leader whose clock is behind finds no due
//!   tick before the cursor, one ahead sends its ticks early, each once.
//! - **Serving a schedule** (one `GetItem`, then per tick one `SendMessage` and one conditional
//!   `UpdateItem`): read the state; take the ticks in `(cursor, now]`; ticks inside a recorded pause are
//!   skipped, ticks older than `missed_after` follow the missed-tick policy, the rest fire; ticks past
//!   `max_runs`, or while the previous tick's job still runs (`skip_while_running`), are skipped. In
//!   tick order: a run of skipped ticks moves the cursor in one write; a fired tick is sent, then the
//!   cursor moves to it *and* the run is counted in the same conditional write (so `max_runs` counts
//!   confirmed sends, once per tick, never attempts). A failed send moves nothing: the tick is tried
//!   again.
//! - **The one repeat.** A leader that sent a tick and lost its lease (died, stalled, store outage)
//!   before moving the cursor is followed by a second send of that tick by the next leader. Both carry
//!   the key `schedule:<name>@<tick>`: the consumer's idempotency record (kept 24 h by default) settles
//!   the second as a duplicate. Sent at most twice in that window, run once.
//!
//! - **What it serves, recorded.** Once per lease term the leader records the definitions of the
//!   schedules given in code (cron or interval, policies, run limit: [`crate::to_definition_json`])
//!   in the store, so `conveyor schedules list` and `trigger` read them there, default policies
//!   included, without an export from the application's binary.
//!
//! Requests per tick (any number of workers): the leader's `GetItem`, `SendMessage` and `UpdateItem`;
//! plus, per third of the lease (10 s by default), one lease write and one definitions read by the
//! leader and one lease read per follower; plus one `UpdateItem` per lease term (the recorded code
//! definitions).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::port::{IdempotencyStore, RecordStatus, idempotency_key};
use conveyor_sqs::{NewJob, Producer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::definition::{MAX_CATCH_UP, MissedTicks, Schedule, format_tick, tick_key};
use crate::lease::Lease;
use crate::store::{Advance, HISTORY_LENGTH, HistoryEntry, ScheduleState, ScheduleStore};

/// The default leader lease: a dead leader is replaced within this (plus a third of it).
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long to wait before retrying after the store or SQS failed.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);
/// The longest sleep between two looks at a schedule.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// The most ticks one look at a schedule handles (a long pause of a fast schedule takes several).
const MAX_TICKS_PER_LOOK: usize = 10_000;
/// The default schedule set.
pub const DEFAULT_SET: &str = "default";
/// Ticks the leader handled (labels `schedule`, `outcome`: `sent`, `send_failed`, `skipped`);
/// exported by the worker's Prometheus endpoint.
pub(crate) const TICKS: &str = "conveyor_schedule_ticks_total";

fn count_tick(schedule: &str, outcome: &'static str) {
    metrics::counter!(TICKS, "schedule" => schedule.to_owned(), "outcome" => outcome).increment(1);
}

/// Where a tick's job goes: SQS through a [`Producer`] (or a double in tests and the simulator).
#[async_trait]
pub trait TickSender: Send + Sync {
    /// Sends the job; SQS's message id, or why it failed.
    async fn send_tick(&self, job: &NewJob<serde_json::Value>) -> Result<String, String>;
}

#[async_trait]
impl TickSender for Producer {
    async fn send_tick(&self, job: &NewJob<serde_json::Value>) -> Result<String, String> {
        self.send(job).await.map_err(|error| error.to_string())
    }
}

/// The scheduler's wall clock: the system's, or (tests) one running `speed` times faster, or (the
/// simulator) tokio's clock from a fixed origin, shifted by a skew.
#[derive(Debug, Clone)]
pub struct SchedulerClock {
    origin: SystemTime,
    started: Instant,
    speed: u32,
    skew_ms: i64,
    system: bool,
}

impl SchedulerClock {
    /// The system clock.
    pub fn system() -> Self {
        Self {
            system: true,
            ..Self::fast(1)
        }
    }

    /// A clock that starts now and runs `speed` times faster than the system's (tests).
    #[doc(hidden)] // a test hook: the tests run hours of time on a fast clock
    pub fn fast(speed: u32) -> Self {
        Self {
            origin: SystemTime::now(),
            started: Instant::now(),
            speed: speed.max(1),
            skew_ms: 0,
            system: false,
        }
    }

    /// A clock that read `origin` at the instant `started` (tokio's clock), shifted by `skew_ms` (the
    /// simulator).
    #[doc(hidden)] // a simulator hook
    pub fn simulated(origin: SystemTime, started: Instant, skew_ms: i64) -> Self {
        Self {
            origin,
            started,
            speed: 1,
            skew_ms,
            system: false,
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> SystemTime {
        if self.system {
            return SystemTime::now();
        }
        let now = self.origin + self.started.elapsed() * self.speed;
        let skew = Duration::from_millis(self.skew_ms.unsigned_abs());
        if self.skew_ms >= 0 {
            now + skew
        } else {
            now.checked_sub(skew).unwrap_or(now)
        }
    }

    /// How long until `time` on this clock, in real (tokio) time.
    fn until(&self, time: SystemTime) -> Duration {
        time.duration_since(self.now()).unwrap_or_default() / self.speed
    }
}

/// Why a scheduler could not be built, or a trigger failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Two schedules with one name.
    #[error("two schedules are named {0:?}; names must be unique (they name the tick keys)")]
    DuplicateName(String),
    /// A schedule without a job.
    #[error("schedule {0:?} has no job: call Schedule::job::<Handler>(&payload)")]
    NoJob(String),
    /// No schedule of that name.
    #[error("no schedule named {0:?}")]
    Unknown(String),
    /// `skip_while_running` without the job records to look at.
    #[error(
        "schedule {0:?} skips ticks while the previous job runs, but the scheduler has no job records: \
         call Scheduler::with_job_records(the consumers' idempotency store)"
    )]
    NoJobRecords(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The send failed.
    #[error("sending the job failed: {0}")]
    Send(String),
}

/// Checks names are unique and every schedule has a job.
pub(crate) fn check_schedules(schedules: &[Schedule]) -> Result<(), SchedulerError> {
    let mut seen = std::collections::HashSet::new();
    for schedule in schedules {
        if !seen.insert(schedule.name.as_str()) {
            return Err(SchedulerError::DuplicateName(schedule.name.clone()));
        }
        if schedule.job.job_type.is_empty() {
            return Err(SchedulerError::NoJob(schedule.name.clone()));
        }
    }
    Ok(())
}

/// Runs a set of schedules: one per worker, any number of workers, one leader at a time.
pub struct Scheduler {
    schedules: Vec<Schedule>,
    store: Arc<dyn ScheduleStore>,
    sender: Arc<dyn TickSender>,
    jobs: Option<Arc<dyn IdempotencyStore>>,
    clock: SchedulerClock,
    owner: String,
    set: String,
    lease: Duration,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .schedules
            .iter()
            .map(|schedule| schedule.name.as_str())
            .collect();
        f.debug_struct("Scheduler")
            .field("schedules", &names)
            .field("set", &self.set)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// What to do with one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Fire,
    Skip(&'static str),
}

/// The ticks in `(cursor, now]` and what to do with each, oldest first (the pure part of serving a
/// schedule; `max_runs` and `skip_while_running` are applied while sending).
fn plan(schedule: &Schedule, state: &ScheduleState, now: SystemTime) -> Vec<(SystemTime, Decision)> {
    // A schedule that never fired does not fire its past: its first look starts `missed_after` back.
    let floor = now.checked_sub(schedule.missed_after).unwrap_or(now);
    // The store keeps the cursor in whole milliseconds: a tick with a finer part (a start such as
    // `now + 2 s`) is at the cursor when its millisecond is.
    let after = state
        .last_tick
        .map_or(floor, |cursor| cursor + Duration::from_nanos(999_999));
    let ticks = schedule.ticks_between(after, now, MAX_TICKS_PER_LOOK);
    let on_time_follows = ticks.iter().any(|tick| *tick >= floor && !state.in_pause(*tick));
    let latest_missed = ticks
        .iter()
        .rev()
        .find(|tick| **tick < floor && !state.in_pause(**tick))
        .copied();
    let mut missed_fired = 0;
    ticks
        .into_iter()
        .map(|tick| {
            let decision = if state.in_pause(tick) {
                Decision::Skip("paused")
            } else if tick >= floor {
                Decision::Fire
            } else {
                match schedule.missed {
                    MissedTicks::All if missed_fired < MAX_CATCH_UP => {
                        missed_fired += 1;
                        Decision::Fire
                    }
                    MissedTicks::LatestOnce if !on_time_follows && Some(tick) == latest_missed => {
                        Decision::Fire
                    }
                    _ => Decision::Skip("missed"),
                }
            };
            (tick, decision)
        })
        .collect()
}

/// `history` with `entry` appended, at most [`HISTORY_LENGTH`] long.
fn appended(history: &[HistoryEntry], entry: HistoryEntry) -> Vec<HistoryEntry> {
    let mut history = history.to_vec();
    history.push(entry);
    let excess = history.len().saturating_sub(HISTORY_LENGTH);
    history.drain(..excess);
    history
}

/// Skipped ticks not yet written: the last one and how many.
#[derive(Debug, Default)]
struct Skipped {
    last: Option<SystemTime>,
    count: usize,
    reason: &'static str,
}

impl Scheduler {
    /// A scheduler sending `schedules`' jobs through `sender` (a [`Producer`]), its lease and state in
    /// `store` (a [`crate::TickStore`] on the idempotency table).
    pub fn new(
        schedules: Vec<Schedule>,
        store: impl ScheduleStore + 'static,
        sender: Arc<dyn TickSender>,
    ) -> Result<Self, SchedulerError> {
        Self::with_shared_store(schedules, Arc::new(store), sender)
    }

    /// [`Scheduler::new`] with a store shared with other code.
    pub fn with_shared_store(
        schedules: Vec<Schedule>,
        store: Arc<dyn ScheduleStore>,
        sender: Arc<dyn TickSender>,
    ) -> Result<Self, SchedulerError> {
        check_schedules(&schedules)?;
        Ok(Self {
            schedules,
            store,
            sender,
            jobs: None,
            clock: SchedulerClock::system(),
            owner: uuid::Uuid::new_v4().to_string(),
            set: DEFAULT_SET.to_owned(),
            lease: DEFAULT_LEASE,
        })
    }

    /// Judges ticks by `clock` (tests: a fast one; the simulator: a skewed one).
    #[doc(hidden)] // a test hook
    pub fn with_clock(mut self, clock: SchedulerClock) -> Self {
        self.clock = clock;
        self
    }

    /// Names this scheduler on the lease (default: a random UUID), so the lease tells which process
    /// leads. It must be unique among the set's schedulers: add something random or the start time to
    /// a task id or a pid (every container's process may be pid 1).
    pub fn with_owner(mut self, owner: &str) -> Self {
        owner.clone_into(&mut self.owner);
        self
    }

    /// The leader lease's length (default 30 s): a dead leader is replaced within about 1⅓ of it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(300));
        self
    }

    /// The schedule set (default `default`): one leader per set; run-time schedules are added to a set.
    pub fn with_set(mut self, set: &str) -> Self {
        set.clone_into(&mut self.set);
        self
    }

    /// The consumers' idempotency store, where `skip_while_running` looks whether the previous tick's
    /// job completed.
    pub fn with_job_records(mut self, jobs: Arc<dyn IdempotencyStore>) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// This scheduler's owner id on the lease.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The schedules given in code.
    pub fn schedules(&self) -> &[Schedule] {
        &self.schedules
    }

    /// Runs until `shutdown` is cancelled, then releases the lease. Store and SQS failures are logged
    /// and retried; they never end the loop.
    pub async fn run(self, shutdown: CancellationToken) {
        if let Some(schedule) = self
            .schedules
            .iter()
            .find(|schedule| schedule.skip_while_running.is_some())
            && self.jobs.is_none()
        {
            tracing::error!(schedule = %schedule.name, "{}", SchedulerError::NoJobRecords(schedule.name.clone()));
        }
        let mut lease = Lease::new(Arc::clone(&self.store), &self.set, &self.owner, self.lease);
        tracing::info!(set = %self.set, owner = %self.owner, schedules = self.schedules.len(), "scheduler started");
        let mut schedules = self.schedules.clone();
        let mut next_look: HashMap<String, SystemTime> = HashMap::new();
        let mut next_lease = Instant::now();
        let mut recorded_term = None;
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if Instant::now() >= next_lease {
                let was = lease.epoch();
                if let Err(error) = lease.acquire().await {
                    tracing::warn!(set = %self.set, %error, "cannot reach the schedule lease");
                }
                next_lease = Instant::now() + lease.renew_every();
                if lease.epoch() != was {
                    // A new term: the stored cursors decide, nothing remembered from before.
                    next_look.clear();
                }
                if lease.holds() {
                    schedules = self.reload().await.unwrap_or(schedules);
                    if recorded_term != Some(lease.epoch()) && self.record_definitions().await {
                        recorded_term = Some(lease.epoch());
                    }
                }
            }
            let mut wake = Instant::now() + MAX_SLEEP;
            if lease.holds() {
                for schedule in &schedules {
                    if shutdown.is_cancelled() || !lease.holds() {
                        break;
                    }
                    let now = self.clock.now();
                    let due = next_look.get(&schedule.name).is_none_or(|at| *at <= now);
                    if due {
                        let at = self.serve(schedule, &lease).await;
                        next_look.insert(schedule.name.clone(), at);
                    }
                    if let Some(at) = next_look.get(&schedule.name) {
                        wake = wake.min(Instant::now() + self.clock.until(*at));
                    }
                }
            }
            wake = wake.min(next_lease);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        if let Err(error) = lease.release().await {
            tracing::warn!(set = %self.set, %error, "cannot release the schedule lease; it lapses by itself");
        }
    }

    /// Records the code's schedules in the store (once per term, see the design note); false when the
    /// store failed (tried again at the next lease renewal; serving goes on).
    async fn record_definitions(&self) -> bool {
        let definitions: HashMap<String, String> = self
            .schedules
            .iter()
            .map(|schedule| (schedule.name.clone(), crate::export::to_definition_json(schedule)))
            .collect();
        match self
            .store
            .record_code_definitions(&self.set, &definitions, &self.owner, self.clock.now())
            .await
        {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(set = %self.set, %error, "cannot record the code's schedules for `conveyor schedules list`; trying again at the next renewal");
                false
            }
        }
    }

    /// The code's schedules plus the set's run-time ones (a run-time definition replaces a code one of
    /// the same name). `None` when the store cannot be read (the caller keeps what it has).
    async fn reload(&self) -> Option<Vec<Schedule>> {
        let stored = match self.store.definitions(&self.set).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(set = %self.set, %error, "cannot read the run-time schedules");
                return None;
            }
        };
        let mut schedules: Vec<Schedule> = self
            .schedules
            .iter()
            .filter(|schedule| !stored.contains_key(&schedule.name))
            .cloned()
            .collect();
        let mut names: Vec<&String> = stored.keys().collect();
        names.sort();
        for name in names {
            match crate::export::from_definition_json(name, &stored[name]) {
                Ok(schedule) => schedules.push(schedule),
                Err(error) => {
                    tracing::warn!(schedule = %name, %error, "a run-time schedule does not load; ignored")
                }
            }
        }
        Some(schedules)
    }

    /// Whether `name` is still one of this set's schedules: a run-time definition, or one of the
    /// code's. `Err` when the definitions cannot be read (the caller retries).
    async fn still_defined(&self, name: &str) -> Result<bool, ()> {
        let stored = self.store.definitions(&self.set).await.map_err(|error| {
            tracing::warn!(set = %self.set, %error, "cannot read the run-time schedules; retrying");
        })?;
        Ok(stored.contains_key(name) || self.schedules.iter().any(|schedule| schedule.name == name))
    }

    /// Serves one schedule as the leader; returns when to look at it again (this clock).
    async fn serve(&self, schedule: &Schedule, lease: &Lease) -> SystemTime {
        let name = schedule.name.as_str();
        let retry = self.clock.now() + RETRY_AFTER_ERROR;
        let mut state = match self.store.state(name).await {
            Ok(state) => state,
            Err(error) => {
                tracing::warn!(schedule = name, %error, "cannot read the schedule's state; retrying");
                return retry;
            }
        };
        let now = self.clock.now();
        let next = |after: SystemTime| schedule.next_tick(after).unwrap_or(after + MAX_SLEEP);
        if state.paused {
            return next(now);
        }
        if state.last_tick.is_none() {
            // A state with no cursor is a new schedule, or a run-time one just removed (its state
            // deleted) that this leader has not reloaded yet: served as new, it would send the
            // removed schedule's recent ticks again. So a first look confirms the definition.
            match self.still_defined(name).await {
                Ok(true) => {}
                Ok(false) => {
                    // Looked at again soon: it may be added back before this leader reloads.
                    tracing::info!(schedule = name, "removed from the set: not served");
                    return retry;
                }
                Err(()) => return retry,
            }
            // The first look: record where this schedule starts (`missed_after` back), so a failed
            // first send is retried rather than left behind by a window that slides with the clock.
            let start = now.checked_sub(schedule.missed_after).unwrap_or(now);
            let first = Advance {
                tick: start,
                count_run: false,
                fired_at: None,
                outcome: "scheduled".to_owned(),
                history: Vec::new(),
            };
            match self.store.advance(name, &first, None).await {
                Ok(_) => return self.clock.now(),
                Err(error) => {
                    tracing::warn!(schedule = name, %error, "cannot record the schedule's start; retrying");
                    return retry;
                }
            }
        }
        let plan = plan(schedule, &state, now);
        let full = plan.len() >= MAX_TICKS_PER_LOOK;
        let mut skipped = Skipped::default();
        for (tick, decision) in plan {
            let decision = match decision {
                Decision::Fire => self.may_fire(schedule, &state, tick).await,
                skip => skip,
            };
            let Decision::Skip(reason) = decision else {
                if !self.flush(schedule, &mut state, &mut skipped).await {
                    return retry;
                }
                if !lease.holds() {
                    return now;
                }
                match self.fire(schedule, &mut state, tick, lease).await {
                    Ok(()) => continue,
                    Err(()) => return retry,
                }
            };
            if skipped.count > 0
                && skipped.reason != reason
                && !self.flush(schedule, &mut state, &mut skipped).await
            {
                return retry;
            }
            skipped.last = Some(tick);
            skipped.count += 1;
            skipped.reason = reason;
        }
        if !self.flush(schedule, &mut state, &mut skipped).await {
            return retry;
        }
        if full {
            return self.clock.now();
        }
        next(state.last_tick.unwrap_or(now).max(now))
    }

    /// `Fire`, unless `max_runs` is spent or the previous tick's job still runs.
    async fn may_fire(&self, schedule: &Schedule, state: &ScheduleState, tick: SystemTime) -> Decision {
        if schedule.max_runs.is_some_and(|max| state.runs >= max) {
            return Decision::Skip("max runs reached");
        }
        let (Some(window), Some(previous), Some(jobs)) =
            (schedule.skip_while_running, state.last_sent, self.jobs.as_ref())
        else {
            return Decision::Fire;
        };
        if state.last_fire.is_some_and(|fired| fired + window < tick) {
            return Decision::Fire;
        }
        let key = idempotency_key(
            &schedule.job.job_type,
            Some(&tick_key(&schedule.name, previous)),
            "",
        );
        match jobs.get(&key).await {
            Ok(Some(record)) if record.status == RecordStatus::Completed => Decision::Fire,
            Ok(_) => Decision::Skip("previous run still going"),
            Err(error) => {
                tracing::warn!(schedule = %schedule.name, %error, "cannot read the previous job's record; firing");
                Decision::Fire
            }
        }
    }

    /// Writes the pending run of skipped ticks (one write); false when the store failed.
    async fn flush(&self, schedule: &Schedule, state: &mut ScheduleState, skipped: &mut Skipped) -> bool {
        let Some(last) = skipped.last else {
            return true;
        };
        let name = schedule.name.as_str();
        let detail = format!("{} tick(s) skipped: {}", skipped.count, skipped.reason);
        let advance = Advance {
            tick: last,
            count_run: false,
            fired_at: None,
            outcome: format!("skipped: {detail}"),
            history: appended(
                &state.history,
                HistoryEntry {
                    tick: last,
                    at: self.clock.now(),
                    outcome: "skipped".to_owned(),
                    detail: detail.clone(),
                },
            ),
        };
        match self.store.advance(name, &advance, None).await {
            Ok(moved) => {
                if moved {
                    state.last_tick = Some(last);
                    state.history = advance.history;
                }
                tracing::info!(schedule = name, tick = %format_tick(last), count = skipped.count, reason = skipped.reason, "ticks skipped");
                count_tick(name, "skipped");
                *skipped = Skipped::default();
                true
            }
            Err(error) => {
                tracing::warn!(schedule = name, %error, "cannot move the cursor past skipped ticks; retrying");
                false
            }
        }
    }

    /// Sends one tick, then moves the cursor to it and counts the run in one conditional write.
    async fn fire(
        &self,
        schedule: &Schedule,
        state: &mut ScheduleState,
        tick: SystemTime,
        lease: &Lease,
    ) -> Result<(), ()> {
        let name = schedule.name.as_str();
        let key = tick_key(name, tick);
        let message_id = match self.sender.send_tick(&schedule.job.job(key.clone())).await {
            Ok(message_id) => message_id,
            Err(error) => {
                tracing::warn!(schedule = name, tick = %format_tick(tick), %error, "sending the tick failed; retrying");
                count_tick(name, "send_failed");
                let _ = self.store.note(name, &format!("send failed: {error}")).await;
                return Err(());
            }
        };
        tracing::info!(schedule = name, tick = %format_tick(tick), %key, %message_id, "schedule fired");
        count_tick(name, "sent");
        let fired_at = self.clock.now();
        let advance = Advance {
            tick,
            count_run: true,
            fired_at: Some(fired_at),
            outcome: format!("sent {message_id}"),
            history: appended(
                &state.history,
                HistoryEntry {
                    tick,
                    at: fired_at,
                    outcome: "sent".to_owned(),
                    detail: message_id,
                },
            ),
        };
        // Sent: only the cursor may be retried now (a second send would be a duplicate), for as long
        // as this scheduler leads. After that the next leader sends the tick again, with the same key.
        loop {
            match self.store.advance(name, &advance, schedule.max_runs).await {
                Ok(true) => {
                    state.last_tick = Some(tick);
                    state.last_sent = Some(tick);
                    state.last_fire = Some(fired_at);
                    state.runs += 1;
                    state.history = advance.history;
                    return Ok(());
                }
                Ok(false) => {
                    tracing::warn!(schedule = name, tick = %format_tick(tick), "the cursor had moved past the sent tick (another leader): the send was a duplicate");
                    return Err(());
                }
                Err(error) => {
                    tracing::warn!(schedule = name, %error, "sent, but the cursor did not move; retrying the write");
                    if !lease.holds() {
                        return Err(());
                    }
                    tokio::time::sleep(RETRY_AFTER_ERROR).await;
                }
            }
        }
    }
}

/// Sends `schedule`'s job now, once (`conveyor schedules trigger`): keyed
/// `schedule:<name>@manual-<now>`, recorded as the last outcome. Returns the message id.
pub async fn trigger(
    schedule: &Schedule,
    store: &dyn ScheduleStore,
    sender: &dyn TickSender,
) -> Result<String, SchedulerError> {
    let now = SystemTime::now();
    let key = format!("schedule:{}@manual-{}", schedule.name, format_tick(now));
    let message_id = sender
        .send_tick(&schedule.job.job(key))
        .await
        .map_err(SchedulerError::Send)?;
    store
        .note(&schedule.name, &format!("triggered by hand: sent {message_id}"))
        .await?;
    Ok(message_id)
}

impl conveyor_core::BackgroundTask for Scheduler {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    /// Stops when the drain begins and releases the lease, so a follower leads at once. A tick being
    /// sent is finished first (its cursor written), bounded by the drain.
    fn run(self: Box<Self>, drain: CancellationToken) -> conveyor_core::BoxFuture<()> {
        Box::pin(Scheduler::run(*self, drain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn every_minute(policy: MissedTicks) -> Schedule {
        Schedule::every("m", Duration::from_secs(60))
            .unwrap()
            .job_of("t", 1, &1)
            .unwrap()
            .missed_ticks(policy)
    }

    fn fired(plan: &[(SystemTime, Decision)]) -> Vec<SystemTime> {
        plan.iter()
            .filter(|(_, decision)| *decision == Decision::Fire)
            .map(|(tick, _)| *tick)
            .collect()
    }

    #[test]
    fn missed_ticks_follow_the_policy_and_on_time_ticks_fire() {
        let state = ScheduleState {
            last_tick: Some(at(0)),
            ..ScheduleState::default()
        };
        let now = at(600);
        // Ticks 60..=600; on time (within 60 s): 540 and 600.
        assert_eq!(plan(&every_minute(MissedTicks::All), &state, now).len(), 10);
        assert_eq!(
            fired(&plan(&every_minute(MissedTicks::All), &state, now)).len(),
            10
        );
        assert_eq!(
            fired(&plan(&every_minute(MissedTicks::Skip), &state, now)),
            vec![at(540), at(600)]
        );
        assert_eq!(
            fired(&plan(&every_minute(MissedTicks::LatestOnce), &state, now)),
            vec![at(540), at(600)],
            "a tick on time stands for the missed ones"
        );
        let late = ScheduleState {
            last_tick: Some(at(0)),
            ..ScheduleState::default()
        };
        assert_eq!(
            fired(&plan(&every_minute(MissedTicks::LatestOnce), &late, at(330))),
            vec![at(300)],
            "only missed ticks: the latest fires once"
        );
    }

    #[test]
    fn a_paused_period_is_skipped_never_replayed() {
        // Paused at 100 s, resumed at 400 s, every worker down meanwhile; policy All.
        let state = ScheduleState {
            last_tick: Some(at(60)),
            paused_at: Some(at(100)),
            resumed_at: Some(at(400)),
            ..ScheduleState::default()
        };
        let plan = plan(&every_minute(MissedTicks::All), &state, at(480));
        assert_eq!(fired(&plan), vec![at(420), at(480)]);
        assert!(
            plan.iter()
                .filter(|(tick, _)| *tick <= at(400))
                .all(|(_, decision)| *decision == Decision::Skip("paused"))
        );
    }

    #[test]
    fn two_pauses_between_two_looks_skip_both_paused_periods() {
        // Every minute; cursor at 60 s; paused 70..140, resumed, paused 150..160 with no look between
        // (the store keeps both pauses); the leader looks again at 200 s. The 120 s tick lies in the
        // first pause and must never fire; 180 s fires.
        let mut state = ScheduleState {
            last_tick: Some(at(60)),
            paused: true,
            paused_at: Some(at(70)),
            ..ScheduleState::default()
        };
        state.pauses = state.pauses_after_resume(at(140));
        state.paused_at = Some(at(150));
        state.pauses = state.pauses_after_resume(at(160));
        state.paused = false;
        state.resumed_at = Some(at(160));
        let plan = plan(&every_minute(MissedTicks::All), &state, at(200));
        assert_eq!(fired(&plan), vec![at(180)], "{plan:?}");
    }

    #[test]
    fn a_schedule_that_never_fired_does_not_fire_its_past() {
        let plan = plan(
            &every_minute(MissedTicks::All),
            &ScheduleState::default(),
            at(600),
        );
        assert_eq!(
            fired(&plan),
            vec![at(600)],
            "only what is due within missed_after"
        );
    }

    #[test]
    fn a_tick_finer_than_the_stored_millisecond_is_not_sent_again() {
        // A start of `now + 2 s` puts ticks at sub-millisecond instants; the store keeps milliseconds.
        let start = at(0) + Duration::from_nanos(269_123_456);
        let schedule = every_minute(MissedTicks::All).starting(start);
        let stored = crate::store::from_millis(crate::store::millis(start));
        let state = ScheduleState {
            last_tick: Some(stored),
            ..ScheduleState::default()
        };
        assert_eq!(
            fired(&plan(&schedule, &state, start + Duration::from_secs(61))),
            vec![start + Duration::from_secs(60)]
        );
    }

    #[test]
    fn the_history_keeps_the_newest_entries() {
        let entry = |secs| HistoryEntry {
            tick: at(secs),
            at: at(secs),
            outcome: "sent".into(),
            detail: String::new(),
        };
        let mut history = Vec::new();
        for secs in 0..30 {
            history = appended(&history, entry(secs));
        }
        assert_eq!(history.len(), HISTORY_LENGTH);
        assert_eq!(history.last().map(|entry| entry.tick), Some(at(29)));
    }
}
