//! [`Scheduler`]: the loop every worker runs; each due tick is sent by exactly one of them.
//!
//! # Design note: what each worker does
//!
//! Each worker keeps its own cursor per schedule and, at every tick time, tries to claim the tick in
//! the [`TickStore`] (one conditional write; see its design note). The winner sends the job through
//! the [`Producer`] with the key `schedule:<name>@<tick>`; the others learn the tick is taken and, if
//! it is still only claimed, look again when the claim's lease ends, so a winner that died before
//! sending is replaced. On start a worker looks back [`Schedule::missed_after`] (ticks a dead worker
//! may have claimed and not sent), and past that applies the schedule's [`MissedTicks`] policy to
//! the ticks since the last one sent by anyone.
//!
//! Costs per tick: one conditional `UpdateItem` per worker (the losers' fail their condition; DynamoDB bills a failed
//! conditional write as a write), one `GetItem` per worker (pause and run count), and for the winner
//! one `SendMessage` and two `UpdateItem`s.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_sqs::Producer;
use tokio_util::sync::CancellationToken;

use crate::definition::{MAX_CATCH_UP, MissedTicks, Schedule, format_tick, tick_key};
use crate::store::{Finished, ScheduleState, TickClaim, TickStore};

/// How long a won tick is held before another worker may take it over (the send must fit in it).
pub(crate) const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(30);
/// How long to wait before retrying after the store or SQS failed.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// The longest sleep between two looks at the schedules.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Ticks this worker sent, or failed to send (labels `schedule`, `outcome`: `sent`, `send_failed`,
/// `max_runs_reached`); exported by the worker's Prometheus endpoint.
pub(crate) const TICKS: &str = "conveyor_schedule_ticks_total";

fn count_tick(schedule: &str, outcome: &'static str) {
    metrics::counter!(TICKS, "schedule" => schedule.to_owned(), "outcome" => outcome).increment(1);
}

/// The scheduler's wall clock: the system's, or (tests) one running `speed` times faster.
#[derive(Debug, Clone)]
pub struct SchedulerClock {
    origin: SystemTime,
    started: std::time::Instant,
    speed: u32,
}

impl SchedulerClock {
    /// The system clock.
    pub fn system() -> Self {
        Self::fast(1)
    }

    /// A clock that starts now and runs `speed` times faster than the system's (tests).
    #[doc(hidden)] // a test hook: the tests run hours of time on a fast clock
    pub fn fast(speed: u32) -> Self {
        Self {
            origin: SystemTime::now(),
            started: std::time::Instant::now(),
            speed: speed.max(1),
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> SystemTime {
        if self.speed == 1 {
            return SystemTime::now();
        }
        self.origin + self.started.elapsed() * self.speed
    }

    /// Sleeps until `time` on this clock.
    pub async fn sleep_until(&self, time: SystemTime) {
        let wait = time.duration_since(self.now()).unwrap_or_default() / self.speed;
        tokio::time::sleep(wait).await;
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
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The send failed.
    #[error(transparent)]
    Send(#[from] conveyor_sqs::ProduceError),
}

/// Runs schedules: one per worker, any number of workers.
pub struct Scheduler {
    schedules: Vec<Schedule>,
    store: TickStore,
    producer: Arc<Producer>,
    clock: SchedulerClock,
    owner: String,
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
            .field("table", &self.store.table())
            .field("queue", &self.producer.name())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// A tick to look at again.
#[derive(Debug, Clone, Copy)]
struct Pending {
    schedule: usize,
    tick: SystemTime,
    at: SystemTime,
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

impl Scheduler {
    /// A scheduler sending `schedules`' jobs through `producer`, claiming ticks in `store`.
    pub fn new(
        schedules: Vec<Schedule>,
        store: TickStore,
        producer: Arc<Producer>,
    ) -> Result<Self, SchedulerError> {
        check_schedules(&schedules)?;
        Ok(Self {
            schedules,
            store,
            producer,
            clock: SchedulerClock::system(),
            owner: uuid::Uuid::new_v4().to_string(),
            lease: DEFAULT_CLAIM_LEASE,
        })
    }

    /// Judges ticks by `clock` (tests: a fast one).
    #[doc(hidden)] // a test hook: the tests run hours of time on a fast clock
    pub fn with_clock(mut self, clock: SchedulerClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long a won tick is held before another worker may take it over (default 30 s).
    pub fn with_claim_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The schedules.
    pub fn schedules(&self) -> &[Schedule] {
        &self.schedules
    }

    /// This scheduler's owner id on the claims it writes.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Runs until `shutdown` is cancelled. Store and SQS failures are logged and retried; they never
    /// end the loop.
    pub async fn run(self, shutdown: CancellationToken) {
        if self.schedules.is_empty() {
            return;
        }
        let start = self.clock.now();
        let mut cursors: Vec<SystemTime> = Vec::with_capacity(self.schedules.len());
        let mut pending: Vec<Pending> = Vec::new();
        for (index, schedule) in self.schedules.iter().enumerate() {
            let window = start.checked_sub(schedule.missed_after).unwrap_or(start);
            cursors.push(window);
            match self.store.state(&schedule.name).await {
                Ok(state) => {
                    for tick in catch_up(schedule, &state, window) {
                        pending.push(Pending {
                            schedule: index,
                            tick,
                            at: start,
                        });
                    }
                }
                Err(error) => {
                    tracing::warn!(schedule = %schedule.name, %error, "cannot read the schedule's state; no catch-up")
                }
            }
        }
        tracing::info!(schedules = self.schedules.len(), owner = %self.owner, "scheduler started");
        loop {
            let now = self.clock.now();
            let mut due: Vec<(usize, SystemTime)> = Vec::new();
            for (index, schedule) in self.schedules.iter().enumerate() {
                let ticks = schedule.ticks_between(cursors[index], now, MAX_CATCH_UP);
                if let Some(last) = ticks.last() {
                    cursors[index] = *last;
                }
                due.extend(fire(schedule, ticks, now).into_iter().map(|tick| (index, tick)));
            }
            pending.retain(|retry| {
                let ready = retry.at <= now;
                if ready {
                    due.push((retry.schedule, retry.tick));
                }
                !ready
            });
            for (index, tick) in due {
                if shutdown.is_cancelled() {
                    return;
                }
                if let Some(retry) = self.attempt(index, tick).await {
                    pending.push(retry);
                }
            }
            let mut next = self.clock.now() + MAX_SLEEP;
            for (index, schedule) in self.schedules.iter().enumerate() {
                if let Some(tick) = schedule.next_tick(cursors[index]) {
                    next = next.min(tick);
                }
            }
            for retry in &pending {
                next = next.min(retry.at);
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.clock.sleep_until(next) => {}
            }
        }
    }

    /// Claims and, when won, sends one tick; returns when to look at it again, if ever.
    async fn attempt(&self, index: usize, tick: SystemTime) -> Option<Pending> {
        let schedule = &self.schedules[index];
        let name = schedule.name.as_str();
        let retry = |at: SystemTime| {
            Some(Pending {
                schedule: index,
                tick,
                at,
            })
        };
        let state = match self.store.state(name).await {
            Ok(state) => state,
            Err(error) => {
                tracing::warn!(schedule = name, %error, "cannot read the schedule's state; retrying");
                return retry(self.clock.now() + RETRY_AFTER_ERROR);
            }
        };
        if state.paused {
            tracing::debug!(schedule = name, tick = %format_tick(tick), "paused; tick passes");
            return None;
        }
        if schedule.max_runs.is_some_and(|max| state.runs >= max) {
            return None;
        }
        let now = self.clock.now();
        let claim = self
            .store
            .claim_tick(name, tick, &self.owner, now, now + self.lease)
            .await;
        match claim {
            Err(error) => {
                tracing::warn!(schedule = name, %error, "cannot claim the tick; retrying");
                retry(now + RETRY_AFTER_ERROR)
            }
            Ok(TickClaim::Done) => None,
            Ok(TickClaim::Held { until }) => retry(until + Duration::from_millis(100)),
            Ok(TickClaim::Won) if self.send(schedule, tick).await => None,
            Ok(TickClaim::Won) => retry(now + self.lease + Duration::from_millis(100)),
        }
    }

    /// Sends a won tick; `false` when it must be tried again after the lease.
    async fn send(&self, schedule: &Schedule, tick: SystemTime) -> bool {
        let name = schedule.name.as_str();
        if let Some(max) = schedule.max_runs {
            match self.store.count_run(name, max).await {
                Ok(true) => {}
                Ok(false) => {
                    let done = Finished::Skipped {
                        reason: "max runs reached",
                    };
                    let _ = self.store.finish_tick(name, tick, &self.owner, done).await;
                    count_tick(name, "max_runs_reached");
                    return true;
                }
                Err(error) => {
                    tracing::warn!(schedule = name, %error, "cannot count the run; retrying after the lease");
                    return false;
                }
            }
        }
        let key = tick_key(name, tick);
        match self.producer.send(&schedule.job.job(key.clone())).await {
            Ok(message_id) => {
                tracing::info!(schedule = name, tick = %format_tick(tick), %key, %message_id, "schedule fired");
                count_tick(name, "sent");
                let done = Finished::Sent {
                    message_id: &message_id,
                };
                if let Err(error) = self.store.finish_tick(name, tick, &self.owner, done).await {
                    tracing::warn!(schedule = name, %error, "sent, but the outcome was not recorded");
                }
                true
            }
            Err(error) => {
                tracing::warn!(schedule = name, %error, "sending the tick failed; retrying after the lease");
                count_tick(name, "send_failed");
                let _ = self
                    .store
                    .record(name, None, &format!("send failed: {error}"))
                    .await;
                false
            }
        }
    }
}

/// Which of `ticks` (just seen, oldest first) fire: all of them, except that ticks older than
/// `missed_after` follow the schedule's missed-tick policy.
fn fire(schedule: &Schedule, ticks: Vec<SystemTime>, now: SystemTime) -> Vec<SystemTime> {
    let threshold = now.checked_sub(schedule.missed_after).unwrap_or(now);
    let (missed, on_time): (Vec<SystemTime>, Vec<SystemTime>) =
        ticks.into_iter().partition(|tick| *tick < threshold);
    let mut firing = apply_policy(schedule.missed, missed, !on_time.is_empty());
    firing.extend(on_time);
    firing
}

/// The missed ticks that fire under `policy`; `newer` is true when a tick on time follows them.
fn apply_policy(policy: MissedTicks, missed: Vec<SystemTime>, newer: bool) -> Vec<SystemTime> {
    match policy {
        MissedTicks::All => missed,
        MissedTicks::Skip => Vec::new(),
        MissedTicks::LatestOnce if newer => Vec::new(),
        MissedTicks::LatestOnce => missed.last().copied().into_iter().collect(),
    }
}

/// At start: the ticks between the last one sent by anyone and the look-back window, by policy.
fn catch_up(schedule: &Schedule, state: &ScheduleState, window: SystemTime) -> Vec<SystemTime> {
    let Some(last) = state.last_tick else {
        return Vec::new();
    };
    let missed = schedule.ticks_between(last, window, MAX_CATCH_UP);
    apply_policy(schedule.missed, missed, false)
}

/// Sends `schedule`'s job now, once (`conveyor schedules trigger`): keyed
/// `schedule:<name>@manual-<now>`, recorded as the last outcome. Returns the message id.
pub async fn trigger(
    schedule: &Schedule,
    store: &TickStore,
    producer: &Producer,
) -> Result<String, SchedulerError> {
    let now = SystemTime::now();
    let key = format!("schedule:{}@manual-{}", schedule.name, format_tick(now));
    let message_id = producer.send(&schedule.job.job(key)).await?;
    store
        .record(
            &schedule.name,
            None,
            &format!("triggered by hand: sent {message_id}"),
        )
        .await?;
    Ok(message_id)
}

impl conveyor_core::BackgroundTask for Scheduler {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    /// Stops at once when the drain begins: a worker that is shutting down sends no new tick (a tick
    /// claimed and not yet sent lapses, and another worker sends it).
    fn run(self: Box<Self>, drain: CancellationToken) -> conveyor_core::BoxFuture<()> {
        Box::pin(async move {
            tokio::select! {
                () = Scheduler::run(*self, drain.clone()) => {}
                () = drain.cancelled() => {}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn every_minute(policy: MissedTicks) -> Schedule {
        Schedule::every("minutely", Duration::from_secs(60))
            .unwrap()
            .missed_ticks(policy)
            .missed_after(Duration::from_secs(90))
    }

    #[test]
    fn ticks_on_time_all_fire_and_missed_ones_follow_the_policy() {
        let now = at(600);
        let ticks = every_minute(MissedTicks::All).ticks_between(at(0), now, 100);
        assert_eq!(ticks.len(), 10);
        assert_eq!(
            fire(&every_minute(MissedTicks::All), ticks.clone(), now).len(),
            10
        );
        // On time: the two within 90 s (at 540 and 600). Missed: 60..480.
        assert_eq!(
            fire(&every_minute(MissedTicks::Skip), ticks.clone(), now),
            vec![at(540), at(600)]
        );
        assert_eq!(
            fire(&every_minute(MissedTicks::LatestOnce), ticks.clone(), now),
            vec![at(540), at(600)],
            "a newer tick on time stands for the missed ones"
        );
        let only_missed: Vec<SystemTime> = ticks.into_iter().take(5).collect();
        assert_eq!(
            fire(&every_minute(MissedTicks::LatestOnce), only_missed, now),
            vec![at(300)]
        );
    }

    #[test]
    fn catch_up_starts_at_the_last_tick_sent_by_anyone() {
        let state = ScheduleState {
            last_tick: Some(at(60)),
            ..ScheduleState::default()
        };
        assert_eq!(
            catch_up(&every_minute(MissedTicks::LatestOnce), &state, at(400)),
            vec![at(360)]
        );
        assert_eq!(
            catch_up(&every_minute(MissedTicks::All), &state, at(400)).len(),
            5
        );
        assert!(catch_up(&every_minute(MissedTicks::Skip), &state, at(400)).is_empty());
        assert!(
            catch_up(
                &every_minute(MissedTicks::All),
                &ScheduleState::default(),
                at(400)
            )
            .is_empty(),
            "a schedule that never fired does not fire its past"
        );
    }
}
