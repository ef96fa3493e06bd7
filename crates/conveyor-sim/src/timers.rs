//! The timer table under faults: the real [`Timers`] relay, cancel, reschedule and run-now
//! (`conveyor-core/src/timer.rs`) over the in-memory [`MemoryTimers`], in virtual seconds.
//!
//! A seed draws 10 to 60 timers (half with a producer's key, half without), each written at a random
//! time and due 20 s to 20 minutes later; for some of them an operator cancels, reschedules or runs the
//! timer now at a random moment (before, around or after its due time). One to four relays poll every
//! 20 s (jittered) with a 60 s lookahead, each on a wall clock skewed by up to [`MAX_SKEW`]. Faults,
//! until a quiet end: a relay crashes right after a claim (the claim stays until it lapses) or right
//! after a send (before the finish), then restarts up to two minutes later as a new process; sends fail;
//! sends are accepted but their reply is lost; the store is down for a pass.
//!
//! Invariants after every run:
//! - a timer whose cancel answered `Changed` is never sent;
//! - every other timer is sent at least once, and the store is empty at the end (nothing lost);
//! - no copy becomes visible before the timer's due time (its last accepted reschedule, or the run-now
//!   time) less the relay's skew;
//! - every copy carries the timer's idempotency key (the producer's, else `timer:<id>`), so an
//!   idempotent handler runs it once;
//! - a timer is sent more than once only when a fault touched it (a crash between its send and its
//!   finish, or a lost reply): the at-least-once window, and nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE};
use conveyor_core::port::{
    ClaimedTimer, FlowSender, NewTimer, OutgoingMessage, QueueError, StoreError, TIMER_CLAIM, Timer,
    TimerStore, timer_key,
};
use conveyor_core::{TimerChange, Timers};
use conveyor_testing::MemoryTimers;

/// The largest skew of a relay's wall clock, either way.
pub const MAX_SKEW: Duration = Duration::from_secs(3);
const QUEUE: &str = "http://sim/000000000000/jobs";
/// The virtual wall clock's origin (2100-01-01), in seconds.
const EPOCH_SECS: u64 = 4_102_444_800;
/// Relays poll every 10 to 20 s: passes of several relays often fall in the same second.
const INTERVAL: u64 = 20;
const LOOKAHEAD: Duration = Duration::from_secs(60);

/// What an operator does to one timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Cancel,
    /// To this many seconds after the operation.
    Reschedule(u64),
    RunNow,
}

/// One timer's plan.
#[derive(Debug, Clone)]
struct TimerPlan {
    written: u64,
    due: u64,
    keyed: bool,
    operation: Option<(u64, Operation)>,
}

/// One relay's plan.
#[derive(Debug, Clone)]
struct RelayPlan {
    skew_ms: i64,
}

/// One seed's scenario.
#[derive(Debug, Clone)]
struct TimerScenario {
    seed: u64,
    timers: Vec<TimerPlan>,
    relays: Vec<RelayPlan>,
    crash_after_claim: f64,
    crash_after_send: f64,
    send_failures: f64,
    lost_replies: f64,
    store_down: f64,
    /// Faults stop at this second.
    quiet_from: u64,
    /// The run ends at this second.
    end: u64,
}

impl TimerScenario {
    fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x7153_e700);
        let timers = (0..rng.usize(10..=60))
            .map(|_| {
                let written = rng.u64(0..600);
                let due = written + rng.u64(20..1200);
                let at = rng.u64(written..due + 120);
                let operation = match rng.u32(0..10) {
                    0..=2 => Some((at, Operation::Cancel)),
                    3..=4 => Some((at, Operation::Reschedule(rng.u64(0..900)))),
                    5 => Some((at, Operation::RunNow)),
                    _ => None,
                };
                TimerPlan {
                    written,
                    due,
                    keyed: rng.bool(),
                    operation,
                }
            })
            .collect();
        let skew = i64::try_from(MAX_SKEW.as_millis()).unwrap_or(0);
        let relays = (0..rng.usize(1..=4))
            .map(|_| RelayPlan {
                skew_ms: rng.i64(-skew..=skew),
            })
            .collect();
        let chance = |rng: &mut fastrand::Rng, most: f64| if rng.bool() { rng.f64() * most } else { 0.0 };
        let quiet_from = 2_700;
        Self {
            seed,
            timers,
            relays,
            crash_after_claim: chance(&mut rng, 0.1),
            crash_after_send: chance(&mut rng, 0.1),
            send_failures: chance(&mut rng, 0.2),
            lost_replies: chance(&mut rng, 0.1),
            store_down: chance(&mut rng, 0.1),
            quiet_from,
            end: quiet_from + TIMER_CLAIM.as_secs() + 600,
        }
    }
}

/// One copy a relay handed to the queue.
#[derive(Debug, Clone)]
struct Copy {
    key: Option<String>,
    /// When it becomes visible (true seconds, rounded up as SQS rounds `DelaySeconds`).
    visible_ms: u64,
}

/// What the fault wrappers share.
#[derive(Debug, Default)]
struct Shared {
    copies: Mutex<Vec<Copy>>,
    /// Timer ids and keys a fault touched in a way that may duplicate a send.
    touched: Mutex<BTreeSet<String>>,
    /// True time in milliseconds since the origin.
    now_ms: AtomicU64,
    faults_on: AtomicBool,
    trace: Mutex<Vec<String>>,
}

impl Shared {
    fn note(&self, line: String) {
        self.trace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn touch(&self, what: &str) {
        self.touched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(what.to_owned());
    }
}

/// The store as one relay sees it: crashes after a claim or before a finish, outages.
struct FaultyStore {
    inner: Arc<MemoryTimers>,
    shared: Arc<Shared>,
    rng: Mutex<fastrand::Rng>,
    scenario: Arc<TimerScenario>,
}

impl FaultyStore {
    fn draw(&self, chance: f64) -> bool {
        self.shared.faults_on.load(Ordering::Relaxed)
            && self.rng.lock().unwrap_or_else(PoisonError::into_inner).f64() < chance
    }
}

fn crash(what: &str) -> StoreError {
    StoreError::Unavailable {
        message: format!("simulated crash {what}"),
    }
}

#[async_trait]
impl TimerStore for FaultyStore {
    async fn put_timer(&self, timer: &NewTimer, now: SystemTime) -> Result<bool, StoreError> {
        self.inner.put_timer(timer, now).await
    }

    async fn timers(
        &self,
        queue_url: &str,
        before: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        if self.draw(self.scenario.store_down) {
            return Err(crash("(store down)"));
        }
        let listed = self.inner.timers(queue_url, before, limit).await;
        tokio::task::yield_now().await;
        listed
    }

    async fn timer(&self, queue_url: &str, id: &str) -> Result<Option<Timer>, StoreError> {
        self.inner.timer(queue_url, id).await
    }

    async fn reschedule_timer(
        &self,
        queue_url: &str,
        id: &str,
        due: SystemTime,
    ) -> Result<TimerChange, StoreError> {
        self.inner.reschedule_timer(queue_url, id, due).await
    }

    async fn cancel_timer(&self, queue_url: &str, id: &str) -> Result<TimerChange, StoreError> {
        self.inner.cancel_timer(queue_url, id).await
    }

    async fn claim_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
        until: SystemTime,
    ) -> Result<Option<ClaimedTimer>, StoreError> {
        tokio::task::yield_now().await;
        let claimed = self.inner.claim_timer(queue_url, id, token, now, until).await?;
        tokio::task::yield_now().await;
        if claimed.is_some() && self.draw(self.scenario.crash_after_claim) {
            self.shared.note(format!("crash after claiming {id}"));
            return Err(crash("after a claim"));
        }
        Ok(claimed)
    }

    async fn release_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.release_timer(queue_url, id, token, now).await
    }

    async fn finish_timer(&self, queue_url: &str, id: &str, token: &str) -> Result<(), StoreError> {
        if self.draw(self.scenario.crash_after_send) {
            self.shared
                .note(format!("crash after sending {id}, before its finish"));
            self.shared.touch(id);
            return Err(crash("after a send"));
        }
        tokio::task::yield_now().await;
        self.inner.finish_timer(queue_url, id, token).await
    }
}

/// The queue as one relay sees it: failed sends, lost replies.
struct FaultySender {
    shared: Arc<Shared>,
    rng: Mutex<fastrand::Rng>,
    scenario: Arc<TimerScenario>,
}

#[async_trait]
impl FlowSender for FaultySender {
    async fn send_to(&self, queue_url: &str, message: OutgoingMessage) -> Result<String, QueueError> {
        tokio::task::yield_now().await;
        let faults = self.shared.faults_on.load(Ordering::Relaxed);
        let (fail, lose) = {
            let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
            (rng.f64(), rng.f64())
        };
        if faults && fail < self.scenario.send_failures {
            return Err(QueueError::Unavailable {
                message: format!("simulated SendMessage failure on {queue_url}"),
            });
        }
        let key = message
            .attributes
            .get(IDEMPOTENCY_KEY_ATTRIBUTE)
            .and_then(|value| value.string_value.clone());
        let delay_ms = message.delay.map_or(0, |delay| {
            delay.as_secs() * 1000 + if delay.subsec_nanos() > 0 { 1000 } else { 0 }
        });
        let copy = Copy {
            key: key.clone(),
            visible_ms: self.shared.now_ms.load(Ordering::Relaxed) + delay_ms,
        };
        self.shared
            .copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(copy);
        if faults && lose < self.scenario.lost_replies {
            self.shared.touch(key.as_deref().unwrap_or_default());
            return Err(QueueError::Unavailable {
                message: format!("simulated lost reply from {queue_url} (the message was sent)"),
            });
        }
        Ok(format!("m-{}", self.shared.now_ms.load(Ordering::Relaxed)))
    }
}

/// What one seed broke (empty: it passed).
#[derive(Debug, Default)]
pub struct TimerReport {
    /// Broken invariants.
    pub violations: Vec<String>,
    /// Timers written.
    pub timers: usize,
    /// Copies sent (duplicates included).
    pub copies: usize,
    /// Timers cancelled in time.
    pub cancelled: usize,
    /// Store calls.
    pub store_requests: u64,
    /// What happened.
    pub trace: Vec<String>,
}

/// One timer as the run left it.
#[derive(Debug, Clone, Default)]
struct Outcome {
    id: String,
    key: String,
    /// The due time the job must not start before (ms since the origin).
    due_ms: u64,
    cancelled: bool,
}

/// Runs `seed`'s timer scenario and checks its invariants.
pub fn simulate_timers(seed: u64) -> TimerReport {
    let scenario = Arc::new(TimerScenario::generate(seed));
    // Timer ids come from the thread's generator: seeded, a seed replays exactly.
    fastrand::seed(seed);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return TimerReport {
                violations: vec![format!("could not build the runtime: {error}")],
                ..TimerReport::default()
            };
        }
    };
    runtime.block_on(run(scenario))
}

fn origin() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS)
}

/// A clock reading the shared true time plus `skew_ms`.
fn clock(shared: &Arc<Shared>, skew_ms: i64) -> conveyor_core::runtime::Clock {
    let shared = Arc::clone(shared);
    Arc::new(move || {
        let true_ms = shared.now_ms.load(Ordering::Relaxed);
        let ms = true_ms.saturating_add_signed(skew_ms);
        origin() + Duration::from_millis(ms)
    })
}

fn relay(
    scenario: &Arc<TimerScenario>,
    store: &Arc<MemoryTimers>,
    shared: &Arc<Shared>,
    index: usize,
    generation: u64,
) -> Timers {
    let salt = scenario.seed ^ (index as u64 * 7919 + generation * 104_729);
    let faulty = FaultyStore {
        inner: Arc::clone(store),
        shared: Arc::clone(shared),
        rng: Mutex::new(fastrand::Rng::with_seed(salt)),
        scenario: Arc::clone(scenario),
    };
    let sender = FaultySender {
        shared: Arc::clone(shared),
        rng: Mutex::new(fastrand::Rng::with_seed(salt ^ 0x5e4d)),
        scenario: Arc::clone(scenario),
    };
    Timers::new(Arc::new(faulty), Arc::new(sender), QUEUE).with_clock(
        &format!("r{index}.{generation}"),
        clock(shared, scenario.relays[index].skew_ms),
    )
}

async fn run(scenario: Arc<TimerScenario>) -> TimerReport {
    let store = Arc::new(MemoryTimers::new());
    let shared = Arc::new(Shared::default());
    shared.faults_on.store(true, Ordering::Relaxed);
    // The producer and the operator: no faults, the true clock (a sender that never fails).
    let operator = {
        let sender = FaultySender {
            shared: Arc::clone(&shared),
            rng: Mutex::new(fastrand::Rng::with_seed(0)),
            scenario: Arc::new(TimerScenario {
                send_failures: 0.0,
                lost_replies: 0.0,
                ..(*scenario).clone()
            }),
        };
        Timers::new(Arc::clone(&store) as Arc<dyn TimerStore>, Arc::new(sender), QUEUE)
            .with_clock("operator", clock(&shared, 0))
    };
    let mut rng = fastrand::Rng::with_seed(scenario.seed ^ 0x0e1a);
    let mut relays: Vec<(Timers, u64, u64, Option<u64>)> = (0..scenario.relays.len())
        .map(|index| {
            (
                relay(&scenario, &store, &shared, index, 0),
                0,
                rng.u64(0..INTERVAL),
                None,
            )
        })
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; scenario.timers.len()];
    let mut report = TimerReport {
        timers: scenario.timers.len(),
        ..TimerReport::default()
    };
    for second in 0..scenario.end {
        shared.now_ms.store(second * 1000, Ordering::Relaxed);
        if second == scenario.quiet_from {
            shared.faults_on.store(false, Ordering::Relaxed);
        }
        for (index, plan) in scenario.timers.iter().enumerate() {
            if plan.written == second {
                outcomes[index] = write(&operator, plan, index).await;
                if outcomes[index].is_none() {
                    report.violations.push(format!("timer {index}: the write failed"));
                }
            }
            let Some(outcome) = outcomes[index].as_mut() else {
                continue;
            };
            if let Some((at, operation)) = plan.operation
                && at == second
            {
                operate(&operator, &shared, outcome, operation, second).await;
            }
        }
        // The relays due this second run their passes at once, interleaved at every store call.
        let mut passes = tokio::task::JoinSet::new();
        for (index, (timers, generation, next, down_until)) in relays.iter_mut().enumerate() {
            if down_until.is_some_and(|until| second < until) {
                continue;
            }
            if down_until.take().is_some() {
                *generation += 1;
                *timers = relay(&scenario, &store, &shared, index, *generation);
                shared.note(format!(
                    "{second}s: relay {index} restarted as r{index}.{generation}"
                ));
            }
            if second < *next {
                continue;
            }
            *next = second + INTERVAL / 2 + rng.u64(0..=INTERVAL / 2);
            let timers = timers.clone();
            passes.spawn(async move { (index, timers.relay(LOOKAHEAD).await) });
        }
        while let Some(pass) = passes.join_next().await {
            let Ok((index, Err(error))) = pass else {
                continue;
            };
            let restart = second + rng.u64(1..=120);
            shared.note(format!(
                "{second}s: relay {index} stopped ({error}); back at {restart}s"
            ));
            relays[index].3 = Some(restart);
        }
    }
    report.store_requests = store.requests();
    check(&scenario, &shared, &store, outcomes, report)
}

async fn write(operator: &Timers, plan: &TimerPlan, index: usize) -> Option<Outcome> {
    let mut message = OutgoingMessage {
        body: format!("{{\"n\":{index}}}"),
        ..OutgoingMessage::default()
    };
    let producer_key = format!("job-{index}");
    if plan.keyed {
        message.attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            AttributeValue::string(&producer_key),
        );
    }
    let due = origin() + Duration::from_secs(plan.due);
    let id = operator.put("sim", due, message.clone()).await.ok()?;
    Some(Outcome {
        key: timer_key(&message, &id),
        id,
        due_ms: plan.due * 1000,
        cancelled: false,
    })
}

async fn operate(
    operator: &Timers,
    shared: &Shared,
    outcome: &mut Outcome,
    operation: Operation,
    second: u64,
) {
    let answer = match operation {
        Operation::Cancel => operator.cancel(&outcome.id).await.map(|answer| {
            outcome.cancelled = answer == TimerChange::Changed;
            format!("{answer:?}")
        }),
        Operation::Reschedule(after) => {
            let due = second + after;
            operator
                .reschedule(&outcome.id, origin() + Duration::from_secs(due))
                .await
                .map(|answer| {
                    if answer == TimerChange::Changed {
                        outcome.due_ms = due * 1000;
                    }
                    format!("{answer:?}")
                })
        }
        Operation::RunNow => match operator.run_now(&outcome.id).await {
            Ok(sent) => {
                if sent.is_some() {
                    outcome.due_ms = outcome.due_ms.min(second * 1000);
                }
                Ok(format!("{sent:?}"))
            }
            Err(error) => Ok(format!("failed: {error}")),
        },
    };
    shared.note(format!(
        "{second}s: {operation:?} on {} answered {answer:?}",
        outcome.id
    ));
}

fn check(
    scenario: &TimerScenario,
    shared: &Shared,
    store: &MemoryTimers,
    outcomes: Vec<Option<Outcome>>,
    mut report: TimerReport,
) -> TimerReport {
    let copies = shared
        .copies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let touched = shared
        .touched
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    report.copies = copies.len();
    let mut by_key: BTreeMap<String, Vec<&Copy>> = BTreeMap::new();
    for copy in &copies {
        match &copy.key {
            Some(key) => by_key.entry(key.clone()).or_default().push(copy),
            None => report
                .violations
                .push("a copy carries no idempotency key: a duplicate would run twice".to_owned()),
        }
    }
    let skew_ms = u64::try_from(MAX_SKEW.as_millis()).unwrap_or(0);
    for outcome in outcomes.into_iter().flatten() {
        let sent = by_key.get(&outcome.key).map_or(&[][..], Vec::as_slice);
        if outcome.cancelled {
            report.cancelled += 1;
            if !sent.is_empty() {
                report.violations.push(format!(
                    "timer {}: cancelled (Changed) but sent {} time(s)",
                    outcome.id,
                    sent.len()
                ));
            }
            continue;
        }
        if sent.is_empty() {
            report
                .violations
                .push(format!("timer {}: never sent (lost)", outcome.id));
        }
        for copy in sent {
            if copy.visible_ms + skew_ms < outcome.due_ms {
                report.violations.push(format!(
                    "timer {}: a copy visible at {} ms, before its due time {} ms",
                    outcome.id, copy.visible_ms, outcome.due_ms
                ));
            }
        }
        if sent.len() > 1 && !touched.contains(&outcome.id) && !touched.contains(&outcome.key) {
            report.violations.push(format!(
                "timer {}: sent {} times with no fault on it",
                outcome.id,
                sent.len()
            ));
        }
    }
    if !store.is_empty() {
        report
            .violations
            .push(format!("{} timer(s) left in the store at the end", store.len()));
    }
    report.trace = shared
        .trace
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if !report.violations.is_empty() {
        report.trace.insert(0, format!("scenario: {scenario:?}"));
    }
    report
}
