//! Flows under faults: the real workers, pipeline, [`FlowProducer`] and deadline sweep over
//! `MemoryQueue` (strict like SQS, with a DLQ by redrive), `MemoryFlows` and the idempotency store, on
//! tokio's paused clock.
//!
//! A seed draws a few flows of a few children each, with a failure policy each, and faults: workers
//! killed mid-run (their calls hang, their leases lapse); children that fail for good (rejected to the
//! DLQ by the pipeline) or that crash their process on every receive (moved to the DLQ by SQS's
//! redrive, unseen by any pipeline); a producer that stops half-way through a flow's children and
//! sends the flow again later, or never; a flow-store outage, and answers lost after the write was
//! made; a stray message that names a flow it is not a child of; a flow whose records expire while
//! its children run; and, after the deadline, an operator who fixes a failed child and redrives it.
//! In about a third of the flows the flow is nested one or two deep (each outer flow, `FailParent`,
//! has the inner flow's parent and one more child), and the operator also sends the DLQ copies of the
//! nested flows' failure notices again (a second, stale notice under a new message id); in a quarter
//! of the seeds one flow's parent goes to a queue that refuses every send (deleted, or not permitted),
//! the most overdue of several flows that only the deadline sweep can end. A generator of its own
//! adds, each in about a third of the seeds: a flow whose parent queue refuses every send although
//! all its children ran; a flow whose parent queue is down (an outage) for 20 minutes; a flow with a
//! child still running at its deadline; a flow whose first parent-sent mark is lost while its
//! deadline outlasts the parent's idempotency record; and in an eighth, a flow of 150 children.
//!
//! Invariants after every run: no message is left in the queue (nothing deferred without end); a
//! parent runs at most once (a second run only when the first one's process was killed before it
//! completed: the at-least-once window) and never before every child it waits for succeeded; a
//! `FailParent` flow with a failed child leaves one failure notice in the DLQ and runs its parent only
//! when redriven to success; every other flow runs its parent once; the parent sees every succeeded
//! child's output; an outer flow runs its parent exactly when its sub-flow's parent ran, and never
//! when the sub-flow failed, at every depth; the flows the sweep must end do end, whatever another
//! flow's parent queue answers; a flow whose parent queue refuses it ends as failed with the reason
//! and closed, while an outage of the parent's queue never fails a flow; the sweep never counts a
//! running child as failed; and what each parent saw of its children is what the flow says at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::port::{
    ChildEnd, Count, Created, FlowChild, FlowSender, FlowState, FlowStore, IdempotencyStore, OutgoingMessage,
    ParentMessage, Queue, QueueError, StoreError,
};
use conveyor_core::{
    ChildFailurePolicy, Context, Flows, Handler, HandlerError, Pipeline, Router, sweep_overdue_flows,
};
use conveyor_sqs::{Flow, FlowProducer, NewJob};
use conveyor_testing::{MemoryFlows, MemoryIdempotencyStore, MemoryQueue};
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{SkewedStore, VirtualStore};
use crate::io::{Instance, InstanceQueue, InstanceStore};
use crate::sink::Sink;
use crate::trace::Trace;

const URL: &str = "http://sim.invalid/flows";
const VISIBILITY: Duration = Duration::from_secs(30);
const MAX_RECEIVES: u32 = 3;
const DEADLINE: Duration = Duration::from_secs(2 * 3600);
const REDRIVE_AT: Duration = Duration::from_secs(3 * 3600);
const END_AT: Duration = Duration::from_secs(5 * 3600);
const STRAY_CHILD: &str = "99999";
/// A parent queue that refuses every send.
const REFUSED_URL: &str = "http://sim.invalid/refused";
/// A parent queue that is unavailable (an outage, not a refusal) for [`FLAKY_FOR`] from the start.
const FLAKY_URL: &str = "http://sim.invalid/flaky";
/// How long the flaky parent queue is down: longer than `PARENT_SEND_TRIES` tries take.
const FLAKY_FOR: Duration = Duration::from_secs(20 * 60);
/// How long a parent's idempotency record counts: shorter than the flows' deadline, as a flow with a
/// deadline past 24 hours outlasts the default record (and longer than the workers'
/// [`MAX_PROCESSING`], as the worker requires).
const PARENT_RECORD_TTL: Duration = Duration::from_secs(90 * 60);
/// The workers' `max_processing_time`.
const MAX_PROCESSING: Duration = Duration::from_secs(3600);
/// The deadline of a flow with a slow child.
const SLOW_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// When a slow child's run ends: past its flow's deadline.
const SLOW_UNTIL: Duration = Duration::from_secs(45 * 60);

/// What a child does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// Succeeds with its value.
    Ok,
    /// Fails for good: the pipeline rejects it to the DLQ.
    Permanent,
    /// Kills its process on every receive: SQS's redrive moves it to the DLQ.
    Crash,
    /// Runs until past the flow's deadline (heartbeats keep its message and claim), then succeeds.
    Slow,
}

/// One flow of a seed.
#[derive(Debug, Clone)]
pub struct FlowSpec {
    /// The policy.
    pub policy: ChildFailurePolicy,
    /// Each child's behavior until the redrive.
    pub children: Vec<Behavior>,
    /// The producer stops after sending this many children the first time.
    pub partial: Option<usize>,
    /// ... and sends the flow again at this time (else never).
    pub resend_at: Option<Duration>,
    /// At the redrive, failed children are fixed and moved back from the DLQ.
    pub redriven: bool,
    /// Outer flows around it (0: not nested).
    pub depth: usize,
    /// At the redrive, the DLQ copies of the nested flows' failure notices are sent again.
    pub resend_notices: bool,
    /// The parent's queue refuses every send.
    pub refused: bool,
    /// The parent's queue is unavailable for twenty minutes, then answers.
    pub flaky: bool,
    /// The first `mark_parent_sent` of the flow fails before it is written.
    pub mark_fails: bool,
}

/// One seed's flows scenario.
#[derive(Debug, Clone)]
pub struct FlowScenario {
    /// The seed.
    pub seed: u64,
    /// The flows.
    pub flows: Vec<FlowSpec>,
    /// Workers.
    pub workers: usize,
    /// Kills of a random live worker at these times.
    pub kills: Vec<Duration>,
    /// Flow-store outages: from, length.
    pub outages: Vec<(Duration, Duration)>,
    /// The chance that a flow-store write's answer is lost after it was made.
    pub lost_answers: f64,
    /// A message naming flow 0 with a child id it does not have.
    pub stray: bool,
    /// Flow 0's records are forgotten (expired) at this time.
    pub forget_at: Option<Duration>,
}

impl FlowScenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xf10f);
        let policies = [
            ChildFailurePolicy::FailParent,
            ChildFailurePolicy::Ignore,
            ChildFailurePolicy::RemoveDependency,
            ChildFailurePolicy::ContinueParent,
        ];
        let flows = (0..rng.usize(1..4))
            .map(|_| {
                let count = rng.usize(2..7);
                let children = (0..count)
                    .map(|_| match rng.u8(0..20) {
                        0 | 1 => Behavior::Permanent,
                        2 => Behavior::Crash,
                        _ => Behavior::Ok,
                    })
                    .collect();
                let partial = (rng.u8(0..6) == 0).then(|| rng.usize(0..count));
                let resend_at = partial
                    .filter(|_| rng.bool())
                    .map(|_| Duration::from_secs(rng.u64(60..1800)));
                FlowSpec {
                    policy: policies[rng.usize(0..policies.len())],
                    children,
                    partial,
                    resend_at,
                    redriven: rng.bool(),
                    depth: 0,
                    resend_notices: false,
                    refused: false,
                    flaky: false,
                    mark_fails: false,
                }
            })
            .collect();
        let kills = (0..rng.usize(0..3))
            .map(|_| Duration::from_millis(rng.u64(0..600_000)))
            .collect();
        let outages = (0..rng.usize(0..3))
            .map(|_| {
                (
                    Duration::from_millis(rng.u64(0..900_000)),
                    Duration::from_millis(rng.u64(1_000..120_000)),
                )
            })
            .collect();
        let flows = nest_and_refuse(flows, &mut fastrand::Rng::with_seed(seed ^ 0x4e57_ed00));
        let flows = parents_at_risk(flows, &mut fastrand::Rng::with_seed(seed ^ 0x9a7e_0052));
        Self {
            seed,
            flows,
            workers: rng.usize(1..4),
            kills,
            outages,
            lost_answers: if rng.bool() { rng.f64() * 0.2 } else { 0.0 },
            stray: rng.u8(0..4) == 0,
            forget_at: (rng.u8(0..8) == 0).then(|| Duration::from_millis(rng.u64(0..300_000))),
        }
    }
}

/// Nests about a third of the flows one or two deep, and in a quarter of the seeds adds a flow whose
/// parent queue refuses sends, the first of several that only the sweep ends (a generator of its own:
/// the other draws, and the seeds they found, stay as they were).
fn nest_and_refuse(mut flows: Vec<FlowSpec>, rng: &mut fastrand::Rng) -> Vec<FlowSpec> {
    for spec in &mut flows {
        if rng.u8(0..3) == 0 {
            spec.depth = rng.usize(1..3);
            spec.resend_notices = rng.bool();
            // A nested flow's producer sends all of it (which leaves go first is the producer's).
            spec.partial = None;
            spec.resend_at = None;
        }
    }
    if rng.u8(0..4) == 0 {
        // A producer that stopped after the first child: the second is counted (failed) only by the
        // sweep. (A crashing child would not do: its last receive is dead-lettered by a pipeline,
        // which counts it.)
        let one_sent = |policy| FlowSpec {
            policy,
            children: vec![Behavior::Ok, Behavior::Ok],
            partial: Some(1),
            resend_at: None,
            redriven: false,
            depth: 0,
            resend_notices: false,
            refused: false,
            flaky: false,
            mark_fails: false,
        };
        let policies = [
            ChildFailurePolicy::FailParent,
            ChildFailurePolicy::Ignore,
            ChildFailurePolicy::RemoveDependency,
            ChildFailurePolicy::ContinueParent,
        ];
        // Its parent is due only at the sweep, then refused.
        flows.push(FlowSpec {
            refused: true,
            ..one_sent(policies[rng.usize(0..policies.len())])
        });
        flows.push(one_sent(ChildFailurePolicy::Ignore));
    }
    flows
}

/// Adds, each in about a third of the seeds (a generator of its own), a flow whose parent queue
/// refuses every send although every child was sent (its last child's count is what finds it), a
/// flow whose parent queue is down for longer than the refusals' tries take, a flow with a child
/// still running at the deadline, and a flow whose first parent-sent mark is lost (its deadline
/// outlasts the parent's record); in an eighth, a flow of 150 children.
fn parents_at_risk(mut flows: Vec<FlowSpec>, rng: &mut fastrand::Rng) -> Vec<FlowSpec> {
    let policies = [
        ChildFailurePolicy::FailParent,
        ChildFailurePolicy::Ignore,
        ChildFailurePolicy::RemoveDependency,
        ChildFailurePolicy::ContinueParent,
    ];
    let base = |policy, children| FlowSpec {
        policy,
        children,
        partial: None,
        resend_at: None,
        redriven: false,
        depth: 0,
        resend_notices: false,
        refused: false,
        flaky: false,
        mark_fails: false,
    };
    if rng.u8(0..3) == 0 {
        let policy = policies[rng.usize(0..policies.len())];
        flows.push(FlowSpec {
            refused: true,
            ..base(policy, vec![Behavior::Ok, Behavior::Ok])
        });
    }
    if rng.u8(0..3) == 0 {
        let policy = policies[rng.usize(0..policies.len())];
        flows.push(FlowSpec {
            flaky: true,
            ..base(policy, vec![Behavior::Ok; 3])
        });
    }
    if rng.u8(0..3) == 0 {
        let policy = policies[rng.usize(0..policies.len())];
        flows.push(base(policy, vec![Behavior::Ok, Behavior::Slow]));
    }
    if rng.u8(0..3) == 0 {
        let policy = policies[rng.usize(0..policies.len())];
        flows.push(FlowSpec {
            mark_fails: true,
            ..base(policy, vec![Behavior::Ok; 2])
        });
    }
    if rng.u8(0..8) == 0 {
        let policy = policies[rng.usize(0..policies.len())];
        let mut children = vec![Behavior::Ok; 150];
        if rng.bool() {
            children[rng.usize(0..150)] = Behavior::Permanent;
        }
        flows.push(FlowSpec {
            redriven: rng.bool(),
            ..base(policy, children)
        });
    }
    flows
}

/// What a seed did, and what it broke.
#[derive(Debug, Clone, Default)]
pub struct FlowReport {
    /// Broken invariants (empty: the run passed).
    pub violations: Vec<String>,
    /// Flows in the seed.
    pub flows: usize,
    /// Parent runs.
    pub parent_runs: usize,
    /// Flows swept past their deadline.
    pub overdue: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildJob {
    flow: usize,
    child: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ParentJob {
    flow: usize,
    /// 0: the flow's own parent; k: the parent of the k-th flow around it.
    #[serde(default)]
    level: usize,
}

/// One parent run, as its handler saw it.
#[derive(Debug, Clone)]
struct ParentRun {
    flow: usize,
    level: usize,
    at: Duration,
    instance: String,
    /// Child id → (output, failed, pending).
    seen: BTreeMap<String, (Option<u64>, bool, bool)>,
}

/// The ground truth the handlers write.
#[derive(Debug, Default)]
struct Truth {
    behaviors: HashMap<(usize, usize), Behavior>,
    /// (flow, child) → when it first succeeded.
    succeeded: HashMap<(usize, usize), Duration>,
    parents: Vec<ParentRun>,
    killed: BTreeSet<String>,
    /// Flow → how many flows are around it.
    depths: HashMap<usize, usize>,
}

type Shared = Arc<Mutex<Truth>>;

fn lock(truth: &Shared) -> std::sync::MutexGuard<'_, Truth> {
    truth.lock().unwrap_or_else(PoisonError::into_inner)
}

fn value(flow: usize, child: usize) -> u64 {
    (flow * 100 + child + 1) as u64
}

struct ChildHandler {
    instance: Arc<Instance>,
    truth: Shared,
    origin: Instant,
}

impl Handler for ChildHandler {
    type Job = ChildJob;
    type Output = u64;
    const JOB_TYPE: &'static str = "child";

    async fn handle(&self, job: ChildJob, _ctx: Context) -> Result<u64, HandlerError> {
        self.instance.alive().await;
        let behavior = lock(&self.truth)
            .behaviors
            .get(&(job.flow, job.child))
            .copied()
            .unwrap_or(Behavior::Ok);
        match behavior {
            Behavior::Ok => {
                let at = self.origin.elapsed();
                lock(&self.truth)
                    .succeeded
                    .entry((job.flow, job.child))
                    .or_insert(at);
                Ok(value(job.flow, job.child))
            }
            Behavior::Permanent => Err(HandlerError::permanent(format!(
                "child {} of flow {} fails for good",
                job.child, job.flow
            ))),
            Behavior::Crash => {
                self.instance.kill();
                lock(&self.truth).killed.insert(self.instance.name().to_owned());
                std::future::pending().await
            }
            Behavior::Slow => Err(HandlerError::permanent("a slow child sent as a child job")),
        }
    }
}

/// A child that runs until past its flow's deadline ([`SLOW_UNTIL`]), then succeeds.
struct SlowHandler {
    instance: Arc<Instance>,
    truth: Shared,
    origin: Instant,
}

impl Handler for SlowHandler {
    type Job = ChildJob;
    type Output = u64;
    const JOB_TYPE: &'static str = "slow";

    async fn handle(&self, job: ChildJob, _ctx: Context) -> Result<u64, HandlerError> {
        self.instance.alive().await;
        tokio::time::sleep_until(self.origin + SLOW_UNTIL).await;
        self.instance.alive().await;
        let at = self.origin.elapsed();
        lock(&self.truth)
            .succeeded
            .entry((job.flow, job.child))
            .or_insert(at);
        Ok(value(job.flow, job.child))
    }

    fn settings(&self) -> conveyor_core::HandlerSettings {
        let mut settings = conveyor_core::HandlerSettings::default();
        settings.timeout = 2 * SLOW_UNTIL;
        settings
    }
}

struct ParentHandler {
    instance: Arc<Instance>,
    truth: Shared,
    origin: Instant,
}

impl Handler for ParentHandler {
    type Job = ParentJob;
    type Output = u64;
    const JOB_TYPE: &'static str = "parent";

    async fn handle(&self, job: ParentJob, ctx: Context) -> Result<u64, HandlerError> {
        self.instance.alive().await;
        let seen = ctx
            .flow_children()
            .unwrap_or_default()
            .iter()
            .map(|child| {
                let output = child.output.as_deref().and_then(|output| output.parse().ok());
                (child.id.clone(), (output, child.error.is_some(), child.pending))
            })
            .collect();
        lock(&self.truth).parents.push(ParentRun {
            flow: job.flow,
            level: job.level,
            at: self.origin.elapsed(),
            instance: self.instance.name().to_owned(),
            seen,
        });
        Ok(0)
    }

    fn settings(&self) -> conveyor_core::HandlerSettings {
        let mut settings = conveyor_core::HandlerSettings::default();
        settings.record_ttl = PARENT_RECORD_TTL;
        settings
    }
}

/// The seed's flow-store faults over the shared store: outages refuse calls; a write's answer may be
/// lost after the write was made.
struct FaultyFlows {
    inner: Arc<MemoryFlows>,
    outages: Vec<(Duration, Duration)>,
    lost: f64,
    rng: Mutex<fastrand::Rng>,
    origin: Instant,
    /// Flow id → the notice message ids whose claim was granted.
    granted: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Flows whose first `mark_parent_sent` fails before it is written.
    mark_fails: Mutex<BTreeSet<String>>,
}

impl FaultyFlows {
    fn before(&self) -> Result<(), StoreError> {
        let now = self.origin.elapsed();
        if self
            .outages
            .iter()
            .any(|(from, length)| now >= *from && now < *from + *length)
        {
            return Err(StoreError::Unavailable {
                message: "sim: flow store outage".into(),
            });
        }
        Ok(())
    }

    fn after<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let lost = self.rng.lock().unwrap_or_else(PoisonError::into_inner).f64() < self.lost;
        if lost && result.is_ok() {
            return Err(StoreError::Unavailable {
                message: "sim: the answer was lost".into(),
            });
        }
        result
    }
}

/// The shared flow store as one process reaches it: a killed instance's calls hang (the producer and
/// the sweeper have none), then the seed's faults apply.
struct SimFlows {
    faults: Arc<FaultyFlows>,
    instance: Option<Arc<Instance>>,
}

impl SimFlows {
    async fn enter(&self) -> Result<(), StoreError> {
        if let Some(instance) = &self.instance {
            instance.alive().await;
        }
        self.faults.before()
    }
}

#[async_trait]
impl FlowStore for SimFlows {
    async fn create_flow(&self, flow: &conveyor_core::port::NewFlow) -> Result<Created, StoreError> {
        self.enter().await?;
        self.faults.inner.create_flow(flow).await
    }
    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Count, StoreError> {
        self.enter().await?;
        let result = self.faults.inner.child_finished(flow_id, child_id, end).await;
        self.faults.after(result)
    }
    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.enter().await?;
        let fails = self
            .faults
            .mark_fails
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(flow_id);
        if fails {
            return Err(StoreError::Unavailable {
                message: "sim: the parent-sent mark failed before it was written".into(),
            });
        }
        let result = self.faults.inner.mark_parent_sent(flow_id, at).await;
        self.faults.after(result)
    }
    async fn mark_failure_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.enter().await?;
        let result = self.faults.inner.mark_failure_sent(flow_id, at).await;
        self.faults.after(result)
    }
    async fn mark_parent_ran(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.enter().await?;
        let result = self.faults.inner.mark_parent_ran(flow_id, at).await;
        self.faults.after(result)
    }
    async fn parent_refused(&self, flow_id: &str, reason: &str) -> Result<Option<u64>, StoreError> {
        self.enter().await?;
        let result = self.faults.inner.parent_refused(flow_id, reason).await;
        self.faults.after(result)
    }
    async fn mark_parent_failed(
        &self,
        flow_id: &str,
        reason: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.enter().await?;
        let result = self.faults.inner.mark_parent_failed(flow_id, reason, at).await;
        self.faults.after(result)
    }
    async fn claim_failure_notice(&self, flow_id: &str, message_id: &str) -> Result<bool, StoreError> {
        self.enter().await?;
        let result = self.faults.inner.claim_failure_notice(flow_id, message_id).await;
        if let Ok(true) = result {
            let mut granted = self.faults.granted.lock().unwrap_or_else(PoisonError::into_inner);
            granted
                .entry(flow_id.to_owned())
                .or_default()
                .insert(message_id.to_owned());
        }
        self.faults.after(result)
    }
    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        self.enter().await?;
        self.faults.inner.flow(flow_id).await
    }
    async fn parent(&self, flow_id: &str) -> Result<Option<ParentMessage>, StoreError> {
        self.enter().await?;
        self.faults.inner.parent(flow_id).await
    }
    async fn children(&self, flow_id: &str) -> Result<Vec<FlowChild>, StoreError> {
        self.enter().await?;
        self.faults.inner.children(flow_id).await
    }
    async fn overdue(&self, now: SystemTime, limit: usize) -> Result<Vec<String>, StoreError> {
        self.enter().await?;
        self.faults.inner.overdue(now, limit).await
    }
    async fn close(&self, flow_id: &str) -> Result<(), StoreError> {
        self.enter().await?;
        self.faults.inner.close(flow_id).await
    }
}

/// The records as the sweep reads them: on its clock (`wall` + virtual time), the one the flows'
/// deadlines are compared on, where a consumer's records are on its real wall clock.
struct SweepRecords {
    inner: SkewedStore,
    wall: SystemTime,
    origin: Instant,
}

impl SweepRecords {
    fn shift(&self, time: SystemTime) -> SystemTime {
        let virtual_now = self.wall + self.origin.elapsed();
        match time.duration_since(SystemTime::now()) {
            Ok(ahead) => virtual_now + ahead,
            Err(behind) => virtual_now - behind.duration(),
        }
    }
}

#[async_trait]
impl IdempotencyStore for SweepRecords {
    async fn claim(
        &self,
        request: &conveyor_core::port::ClaimRequest,
    ) -> Result<conveyor_core::port::ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(
        &self,
        claim: &conveyor_core::port::Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.complete(claim, output, expires_at).await
    }
    async fn release(&self, claim: &conveyor_core::port::Claim) -> Result<(), StoreError> {
        self.inner.release(claim).await
    }
    async fn extend_lease(
        &self,
        claim: &conveyor_core::port::Claim,
        lease_until: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.extend_lease(claim, lease_until).await
    }
    async fn get(&self, key: &str) -> Result<Option<conveyor_core::port::IdempotencyRecord>, StoreError> {
        let record = self.inner.get(key).await?;
        Ok(record.map(|mut record| {
            record.expires_at = self.shift(record.expires_at);
            record.lease_until = record.lease_until.map(|lease| self.shift(lease));
            record
        }))
    }
}

/// Sends through one instance's queue (its calls hang once it is killed); optionally fails after a
/// number of sends (a producer that stops half-way).
struct SimSender {
    queue: Arc<dyn Queue>,
    left: Option<AtomicUsize>,
    origin: Instant,
}

#[async_trait]
impl FlowSender for SimSender {
    async fn send_to(&self, queue_url: &str, message: OutgoingMessage) -> Result<String, QueueError> {
        if queue_url == REFUSED_URL {
            return Err(QueueError::AccessDenied {
                queue: queue_url.to_owned(),
                message: "sim: not authorized to perform sqs:SendMessage".into(),
            });
        }
        if queue_url == FLAKY_URL && self.origin.elapsed() < FLAKY_FOR {
            return Err(QueueError::Unavailable {
                message: "sim: the parent's queue is down".into(),
            });
        }
        if let Some(left) = &self.left
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
                .is_err()
        {
            return Err(QueueError::Unavailable {
                message: "sim: the producer stopped".into(),
            });
        }
        self.queue.send(message).await
    }
}

struct World {
    scenario: FlowScenario,
    queue: Arc<MemoryQueue>,
    dlq: Arc<MemoryQueue>,
    flows: Arc<MemoryFlows>,
    faulty: Arc<FaultyFlows>,
    records: Arc<VirtualStore>,
    sink: Arc<Sink>,
    truth: Shared,
    origin: Instant,
}

struct Running {
    instance: Arc<Instance>,
    graceful: CancellationToken,
    handle: JoinHandle<Result<conveyor_worker::WorkerReport, conveyor_worker::WorkerError>>,
}

impl World {
    fn instance(&self, name: String) -> Arc<Instance> {
        Instance::new(
            name,
            self.scenario.seed,
            Duration::from_millis(20),
            Duration::from_millis(10),
            Duration::ZERO,
        )
    }

    fn queue_of(&self, instance: &Arc<Instance>) -> Arc<dyn Queue> {
        Arc::new(InstanceQueue::new(
            Arc::clone(&self.queue) as Arc<dyn Queue>,
            Arc::clone(instance),
            Arc::clone(&self.sink),
        ))
    }

    fn flows_of(&self, instance: &Arc<Instance>) -> Flows {
        Flows {
            store: Arc::new(SimFlows {
                faults: Arc::clone(&self.faulty),
                instance: Some(Arc::clone(instance)),
            }),
            sender: Arc::new(SimSender {
                queue: self.queue_of(instance),
                left: None,
                origin: self.origin,
            }),
        }
    }

    fn start_worker(&self, index: usize) -> Option<Running> {
        let instance = self.instance(format!("worker-{index}"));
        let store: Arc<dyn IdempotencyStore> = Arc::new(InstanceStore::new(
            Arc::new(SkewedStore::new(Arc::clone(&self.records), instance.skew())),
            Arc::clone(&instance),
        ));
        let router = Router::new()
            .route(ChildHandler {
                instance: Arc::clone(&instance),
                truth: Arc::clone(&self.truth),
                origin: self.origin,
            })
            .route(ParentHandler {
                instance: Arc::clone(&instance),
                truth: Arc::clone(&self.truth),
                origin: self.origin,
            })
            .route(SlowHandler {
                instance: Arc::clone(&instance),
                truth: Arc::clone(&self.truth),
                origin: self.origin,
            });
        let pipeline = Pipeline::new(router)
            .with_store(store)
            .with_flows(self.flows_of(&instance));
        let config = WorkerConfig::default()
            .with_queues(vec![QueueConfig::new(URL)])
            .with_max_in_flight(4)
            .with_max_processing_time(MAX_PROCESSING)
            .with_listen_addr(None);
        let worker = Worker::new(config, pipeline, vec![self.queue_of(&instance)]).ok()?;
        let graceful = CancellationToken::new();
        let handle = tokio::spawn(worker.run_with(graceful.clone(), CancellationToken::new()));
        Some(Running {
            instance,
            graceful,
            handle,
        })
    }

    fn flow_of(&self, index: usize) -> Flow {
        let spec = &self.scenario.flows[index];
        let slow = spec.children.contains(&Behavior::Slow);
        let (parent_url, deadline) = match (spec.refused, spec.flaky) {
            // The most overdue: first in every listing of the sweep.
            (true, _) => (REFUSED_URL, DEADLINE - Duration::from_secs(600)),
            (false, true) => (FLAKY_URL, DEADLINE),
            (false, false) if slow => (URL, SLOW_DEADLINE),
            (false, false) => (URL, DEADLINE),
        };
        let mut flow = Flow::new(
            flow_id(index),
            NewJob::new(
                "parent",
                ParentJob {
                    flow: index,
                    level: 0,
                },
            ),
            parent_url,
        )
        .on_child_failure(spec.policy)
        .deadline(deadline);
        for (child, behavior) in spec.children.iter().enumerate() {
            let job_type = match behavior {
                Behavior::Slow => "slow",
                _ => "child",
            };
            flow = flow.child(NewJob::new(job_type, ChildJob { flow: index, child }), URL);
        }
        for level in 1..=spec.depth {
            let parent = NewJob::new("parent", ParentJob { flow: index, level });
            let extra = ChildJob {
                flow: index,
                child: OUTER_CHILD + level,
            };
            flow = Flow::new(outer_id(index, level), parent, URL)
                .on_child_failure(ChildFailurePolicy::FailParent)
                .deadline(DEADLINE)
                .child_flow(flow)
                .child(NewJob::new("child", extra), URL);
        }
        flow
    }

    async fn produce(&self, index: usize, stop_after: Option<usize>) {
        let instance = self.instance(format!("producer-{index}"));
        let sender = Arc::new(SimSender {
            queue: self.queue_of(&instance),
            left: stop_after.map(AtomicUsize::new),
            origin: self.origin,
        });
        let producer = FlowProducer::with_sender(
            sender,
            Arc::new(SimFlows {
                faults: Arc::clone(&self.faulty),
                instance: None,
            }),
        );
        let flow = self.flow_of(index);
        // A producer retries its own outage-failed sends (the same flow id); a deliberate stop is final.
        for _ in 0..60 {
            match producer.send(&flow).await {
                Ok(_) => return,
                Err(conveyor_sqs::FlowError::Send { .. }) if stop_after.is_some() => return,
                Err(_) => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        }
    }
}

fn flow_id(index: usize) -> String {
    format!("flow-{index}")
}

/// The flow `level` deep around flow `index`.
fn outer_id(index: usize, level: usize) -> String {
    format!("flow-{index}.outer-{level}")
}

/// Outer flows' own children: `OUTER_CHILD + level`.
const OUTER_CHILD: usize = 1000;

/// Runs the flows seed `seed` and checks its invariants.
pub fn simulate_flows(seed: u64) -> FlowReport {
    simulate_flow_scenario(&FlowScenario::generate(seed))
}

/// Runs `scenario` on a fresh paused runtime and checks its invariants.
pub fn simulate_flow_scenario(scenario: &FlowScenario) -> FlowReport {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return FlowReport {
                violations: vec![format!("no runtime: {error}")],
                ..FlowReport::default()
            };
        }
    };
    fastrand::seed(scenario.seed);
    let filter = "conveyor_core=debug,conveyor_worker=info";
    crate::with_debug_logs("FLOW_DEBUG", filter, || runtime.block_on(run(scenario.clone())))
}

async fn run(scenario: FlowScenario) -> FlowReport {
    let origin = Instant::now();
    let wall = SystemTime::now();
    let dlq = Arc::new(MemoryQueue::standard("flows-dlq"));
    let queue = Arc::new(
        MemoryQueue::standard("flows")
            .with_visibility_timeout(VISIBILITY)
            .with_dead_letter_queue(Arc::clone(&dlq), MAX_RECEIVES),
    );
    let records = Arc::new(VirtualStore::new(Arc::new(MemoryIdempotencyStore::new())));
    let flows = Arc::new(MemoryFlows::new());
    let faulty = Arc::new(FaultyFlows {
        inner: Arc::clone(&flows),
        outages: scenario.outages.clone(),
        lost: scenario.lost_answers,
        rng: Mutex::new(fastrand::Rng::with_seed(scenario.seed ^ 0x1057)),
        origin,
        granted: Mutex::default(),
        mark_fails: Mutex::new(
            scenario
                .flows
                .iter()
                .enumerate()
                .filter(|(_, spec)| spec.mark_fails)
                .map(|(index, _)| flow_id(index))
                .collect(),
        ),
    });
    let truth: Shared = Arc::default();
    {
        let mut truth = lock(&truth);
        for (flow, spec) in scenario.flows.iter().enumerate() {
            for (child, behavior) in spec.children.iter().enumerate() {
                truth.behaviors.insert((flow, child), *behavior);
            }
            if spec.depth > 0 {
                truth.depths.insert(flow, spec.depth);
            }
        }
    }
    let world = Arc::new(World {
        sink: Arc::new(Sink::new(Arc::clone(&records), Trace::new(false))),
        scenario,
        queue,
        dlq,
        flows,
        faulty,
        records,
        truth,
        origin,
    });
    let mut workers: Vec<Running> = (0..world.scenario.workers)
        .filter_map(|index| world.start_worker(index))
        .collect();
    let mut started = workers.len();

    for index in 0..world.scenario.flows.len() {
        let world = Arc::clone(&world);
        let spec = world.scenario.flows[index].clone();
        tokio::spawn(async move {
            world.produce(index, spec.partial).await;
            if let Some(at) = spec.resend_at {
                tokio::time::sleep_until(world.origin + at).await;
                world.produce(index, None).await;
            }
        });
    }
    if world.scenario.stray {
        let message = NewJob::new("child", ChildJob { flow: 0, child: 99 })
            .key(format!("stray:{}", world.scenario.seed))
            .to_message("flows");
        if let Ok(mut message) = message {
            message.attributes.insert(
                conveyor_core::port::FLOW_CHILD_ATTRIBUTE.to_owned(),
                conveyor_core::message::AttributeValue::string(format!("{}/{STRAY_CHILD}", flow_id(0))),
            );
            let _ = world.queue.send(message).await;
        }
    }

    let mut kills = world.scenario.kills.clone();
    kills.sort();
    let mut forgotten = false;
    let mut redriven = false;
    let mut overdue = 0;
    let sweep_records = SweepRecords {
        inner: SkewedStore::new(Arc::clone(&world.records), crate::clock::Skew::default()),
        wall,
        origin,
    };
    let sweeper = Flows {
        store: Arc::new(SimFlows {
            faults: Arc::clone(&world.faulty),
            instance: None,
        }),
        sender: Arc::new(SimSender {
            queue: Arc::clone(&world.queue) as Arc<dyn Queue>,
            left: None,
            origin,
        }),
    };
    let mut last_sweep = Duration::ZERO;
    while origin.elapsed() < END_AT {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = origin.elapsed();
        while kills.first().is_some_and(|at| *at <= now) {
            kills.remove(0);
            let live: Vec<usize> = (0..workers.len())
                .filter(|index| !workers[*index].instance.is_dead())
                .collect();
            if let Some(index) = live.get((now.as_millis() as usize) % live.len().max(1)) {
                let worker = &workers[*index];
                worker.instance.kill();
                worker.handle.abort();
                lock(&world.truth)
                    .killed
                    .insert(worker.instance.name().to_owned());
            }
        }
        // A dead process is replaced, as ECS replaces a task.
        let dead = workers.iter().filter(|worker| worker.instance.is_dead()).count();
        let live = workers.len() - dead;
        for _ in live..world.scenario.workers {
            if let Some(worker) = world.start_worker(started) {
                workers.push(worker);
            }
            started += 1;
        }
        workers.retain(|worker| !worker.instance.is_dead());
        if let Some(at) = world.scenario.forget_at
            && now >= at
            && !forgotten
        {
            world.flows.forget(&flow_id(0));
            forgotten = true;
        }
        if now >= last_sweep + Duration::from_secs(60) {
            last_sweep = now;
            let virtual_now = wall + now;
            if let Ok(report) = sweep_overdue_flows(&sweeper, &sweep_records, virtual_now).await {
                overdue += report.overdue;
            }
        }
        if now >= REDRIVE_AT && !redriven {
            redriven = true;
            redrive(&world).await;
        }
    }
    for worker in &workers {
        worker.graceful.cancel();
    }
    for worker in workers {
        let _ = worker.handle.await;
    }
    let mut finals = Finals::new();
    for index in 0..world.scenario.flows.len() {
        let id = flow_id(index);
        let head = world.flows.flow(&id).await.ok().flatten();
        let children = world.flows.children(&id).await.unwrap_or_default();
        finals.insert(index, (head, children));
    }
    let far = wall + END_AT + Duration::from_secs(24 * 3600);
    let open = world.flows.overdue(far, 10_000).await.unwrap_or_default();
    let mut report = check(&world, forgotten, overdue, &finals, &open);
    if !report.violations.is_empty() && std::env::var_os("FLOW_DEBUG").is_some() {
        for index in 0..world.scenario.flows.len() {
            let head = world.flows.flow(&flow_id(index)).await;
            let children = world.flows.children(&flow_id(index)).await;
            report.violations.push(format!(
                "flow {index}: {:?} {head:?} {children:?}",
                world.scenario.flows[index]
            ));
        }
        report.violations.push(format!(
            "dlq: {:?}",
            world
                .dlq
                .snapshot()
                .iter()
                .map(|m| (&m.body, &m.attributes))
                .collect::<Vec<_>>()
        ));
    }
    report
}

/// The operator fixes the failed children of the flows to redrive and moves their messages back.
async fn redrive(world: &World) {
    let chosen: BTreeSet<usize> = world
        .scenario
        .flows
        .iter()
        .enumerate()
        .filter(|(_, spec)| spec.redriven)
        .map(|(index, _)| index)
        .collect();
    {
        let mut truth = lock(&world.truth);
        for ((flow, _), behavior) in truth.behaviors.iter_mut() {
            if chosen.contains(flow) {
                *behavior = Behavior::Ok;
            }
        }
    }
    let Ok(messages) = world
        .dlq
        .receive_with_visibility(10, Duration::ZERO, Duration::from_secs(3600))
        .await
    else {
        return;
    };
    let mut all = messages;
    while let Ok(more) = world
        .dlq
        .receive_with_visibility(10, Duration::ZERO, Duration::from_secs(3600))
        .await
    {
        if more.is_empty() {
            break;
        }
        all.extend(more);
    }
    let mut moved = Vec::new();
    let mut kept = Vec::new();
    for message in all {
        let child: Option<ChildJob> = serde_json::from_str(&message.body).ok();
        let is_child = message
            .string_attribute(conveyor_core::port::FLOW_CHILD_ATTRIBUTE)
            .is_some();
        let notice: Option<ParentJob> = serde_json::from_str(&message.body).ok();
        if let Some(notice) = notice
            && is_child
            && message.attributes.contains_key("conveyor.flow.failed")
            && world
                .scenario
                .flows
                .get(notice.flow)
                .is_some_and(|spec| spec.resend_notices)
        {
            // The operator sends the DLQ copy of a nested flow's failure notice again (a new message
            // id; the copy stays in the DLQ).
            let outgoing = OutgoingMessage {
                body: message.body.clone(),
                attributes: message.attributes.clone(),
                delay: None,
                group_id: None,
                deduplication_id: None,
                trace_header: None,
            };
            let _ = world.queue.send(outgoing).await;
        }
        match child {
            Some(child) if is_child && chosen.contains(&child.flow) => {
                let outgoing = OutgoingMessage {
                    body: message.body.clone(),
                    // StartMessageMoveTask keeps every attribute, the failure's included.
                    attributes: message.attributes.clone(),
                    delay: None,
                    group_id: None,
                    deduplication_id: None,
                    trace_header: None,
                };
                let _ = world.queue.send(outgoing).await;
                moved.push(message.receipt_handle.clone());
            }
            _ => kept.push(message.receipt_handle.clone()),
        }
    }
    let _ = world.dlq.delete_batch(&moved).await;
    let kept: Vec<conveyor_core::port::VisibilityChange> = kept
        .into_iter()
        .map(|receipt_handle| conveyor_core::port::VisibilityChange {
            receipt_handle,
            timeout: Duration::ZERO,
        })
        .collect();
    let _ = world.dlq.change_visibility_batch(&kept).await;
}

/// The flows around flow `index`: each runs its parent exactly when the flow inside it ran its own
/// (`expect_run`), after it, at most once (but for a killed process), and leaves a failure notice in
/// the DLQ when it does not.
fn check_outer(
    truth: &Truth,
    notices: &[String],
    index: usize,
    expect_run: bool,
    violations: &mut Vec<String>,
) {
    let Some(depth) = truth.depths.get(&index).copied() else {
        return;
    };
    for level in 1..=depth {
        let runs: Vec<&ParentRun> = truth
            .parents
            .iter()
            .filter(|run| run.flow == index && run.level == level)
            .collect();
        let excused = runs
            .iter()
            .take(runs.len().saturating_sub(1))
            .all(|run| truth.killed.contains(&run.instance));
        if runs.len() > 1 && !excused {
            violations.push(format!(
                "flow {index}, level {level}: the outer parent ran {} times",
                runs.len()
            ));
        }
        if expect_run && runs.is_empty() {
            violations.push(format!(
                "flow {index}, level {level}: its sub-flow's parent ran, the outer parent never did"
            ));
        }
        if !expect_run && !runs.is_empty() {
            violations.push(format!(
                "flow {index}, level {level}: the outer parent ran although its sub-flow failed"
            ));
        }
        let id = outer_id(index, level);
        if !expect_run && !notices.contains(&id) {
            violations.push(format!(
                "flow {index}, level {level}: a failed outer flow left no failure notice in the DLQ"
            ));
        }
        let inner_first = truth
            .parents
            .iter()
            .filter(|run| run.flow == index && run.level + 1 == level)
            .map(|run| run.at)
            .min();
        if let Some(run) = runs.first()
            && inner_first.is_none_or(|inner| inner > run.at)
        {
            violations.push(format!(
                "flow {index}, level {level}: the outer parent ran at {:?} before its sub-flow's parent",
                run.at
            ));
        }
    }
}

/// Each flow's head and children as the store holds them at the end.
type Finals = HashMap<usize, (Option<FlowState>, Vec<FlowChild>)>;

/// A flow whose parent queue refuses every send ends as failed, with the reason, and closed.
fn check_refused(index: usize, head: Option<&FlowState>, open: &[String], violations: &mut Vec<String>) {
    let ended = head.is_some_and(|head| {
        head.parent_failed_at.is_some()
            && head
                .parent_error
                .as_deref()
                .is_some_and(|error| error.contains("not authorized"))
    });
    if !ended {
        violations.push(format!(
            "flow {index}: its parent queue refuses every send, and the flow did not end as failed with the \
             reason: {head:?}"
        ));
    }
    if open.contains(&flow_id(index)) {
        violations.push(format!(
            "flow {index}: its parent cannot be sent and the flow is still open"
        ));
    }
}

/// What each parent run saw is what the flow's records say at the end: a child it saw failed is
/// failed, one it saw succeed succeeded; a child running at the deadline (slow) was seen succeeded.
fn check_agreement(
    index: usize,
    spec: &FlowSpec,
    runs: &[&ParentRun],
    children: &[FlowChild],
    violations: &mut Vec<String>,
) {
    for run in runs {
        for child in children {
            let Some((output, failed, pending)) = run.seen.get(&child.id) else {
                continue;
            };
            let agrees = match &child.end {
                _ if *pending => true,
                Some(ChildEnd::Succeeded { .. }) => !*failed,
                Some(ChildEnd::Failed(_)) => output.is_none(),
                None => false,
            };
            if !agrees {
                violations.push(format!(
                    "flow {index}: the parent saw child {} as {:?} (output, failed, pending), the flow says {:?}",
                    child.id,
                    (output, failed, pending),
                    child.end
                ));
            }
        }
        for (child, behavior) in spec.children.iter().enumerate() {
            let key = format!("{child:05}");
            let end = children
                .iter()
                .find(|final_child| final_child.id == key)
                .and_then(|c| c.end.as_ref());
            let succeeded = matches!(end, Some(ChildEnd::Succeeded { .. }));
            if *behavior == Behavior::Slow
                && succeeded
                && run.seen.get(&key).and_then(|seen| seen.0) != Some(value(index, child))
            {
                violations.push(format!(
                    "flow {index}: child {child} still ran at the deadline and succeeded, the parent saw {:?}",
                    run.seen.get(&key)
                ));
            }
        }
    }
    for (child, behavior) in spec.children.iter().enumerate() {
        let key = format!("{child:05}");
        let end = children
            .iter()
            .find(|final_child| final_child.id == key)
            .and_then(|c| c.end.as_ref());
        if *behavior == Behavior::Slow
            && let Some(ChildEnd::Failed(reason)) = end
            && reason.contains(SWEEP_REASON)
        {
            violations.push(format!(
                "flow {index}: child {child} ran at the deadline and the sweep counted it failed: {reason}"
            ));
        }
    }
}

/// The start of the reason the deadline sweep counts a child failed with.
const SWEEP_REASON: &str = "not finished by the flow's deadline";

fn check(world: &World, forgotten: bool, overdue: usize, finals: &Finals, open: &[String]) -> FlowReport {
    let truth = lock(&world.truth);
    let mut violations = Vec::new();
    if !world.queue.is_empty() {
        violations.push(format!(
            "{} messages left in the queue (deferred without end?)",
            world.queue.len()
        ));
    }
    let notices: Vec<String> = world
        .dlq
        .snapshot()
        .iter()
        .filter(|message| message.attributes.contains_key("conveyor.flow.failed"))
        .filter_map(|message| {
            let parent = message.attributes.get("conveyor.flow.parent")?;
            parent.string_value.clone()
        })
        .collect();
    for (index, spec) in world.scenario.flows.iter().enumerate() {
        if forgotten && index == 0 {
            continue;
        }
        let id = flow_id(index);
        let runs: Vec<&ParentRun> = truth
            .parents
            .iter()
            .filter(|run| run.flow == index && run.level == 0)
            .collect();
        let excused = runs
            .iter()
            .take(runs.len().saturating_sub(1))
            .all(|run| truth.killed.contains(&run.instance));
        if runs.len() > 1 && !excused {
            violations.push(format!("flow {index}: the parent ran {} times", runs.len()));
        }
        let unsent = spec.partial.is_some() && spec.resend_at.is_none();
        let sent_children = match (spec.partial, unsent) {
            (Some(count), true) => count,
            _ => spec.children.len(),
        };
        let (head, children) = match finals.get(&index) {
            Some((head, children)) => (head.as_ref(), children.as_slice()),
            None => (None, &[][..]),
        };
        // A slow child fails only when a pipeline dead-lettered it (its runs spent by crashes of the
        // processes it ran on), never by the sweep while it ran.
        let dead_lettered = |child: usize| {
            children.iter().any(|final_child| {
                final_child.id == format!("{child:05}")
                    && matches!(&final_child.end, Some(ChildEnd::Failed(reason)) if !reason.contains(SWEEP_REASON))
            })
        };
        let failing = spec
            .children
            .iter()
            .enumerate()
            .any(|(child, behavior)| match behavior {
                Behavior::Ok => child >= sent_children,
                Behavior::Slow => dead_lettered(child),
                Behavior::Permanent | Behavior::Crash => true,
            });
        let resumed = spec.redriven && !unsent;
        let notice_count = notices.iter().filter(|notice| **notice == id).count();
        // A notice's DLQ copy may land twice (a process killed between the copy and the delete, the
        // runtime's at-least-once window), but only one notice message may be granted.
        let granted = world
            .faulty
            .granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .map_or(0, BTreeSet::len);
        if granted > 1 {
            violations.push(format!("flow {index}: {granted} failure notices went to the DLQ"));
        }
        if notice_count > 1 && truth.killed.is_empty() {
            violations.push(format!(
                "flow {index}: {notice_count} failure notices in the DLQ and no process killed"
            ));
        }
        let expect_run = !failing || spec.policy != ChildFailurePolicy::FailParent || resumed;
        if spec.refused {
            // Its parent can never be sent: nothing to run; the others' checks show the sweep went on.
            check_refused(index, head, open, &mut violations);
            continue;
        }
        check_agreement(index, spec, &runs, children, &mut violations);
        check_outer(&truth, &notices, index, expect_run, &mut violations);
        if expect_run && runs.is_empty() {
            violations.push(format!(
                "flow {index} ({}; failing {failing}, unsent {unsent}, redriven {}) never ran its parent",
                spec.policy.as_str(),
                spec.redriven
            ));
        }
        if !expect_run && !runs.is_empty() {
            violations.push(format!("flow {index}: a failed FailParent flow ran its parent"));
        }
        if !expect_run && notice_count == 0 {
            violations.push(format!(
                "flow {index}: a failed FailParent flow left no failure notice in the DLQ"
            ));
        }
        for run in &runs {
            if spec.policy == ChildFailurePolicy::ContinueParent || run.at >= DEADLINE {
                continue;
            }
            for child in 0..spec.children.len() {
                let succeeded = truth.succeeded.get(&(index, child)).copied();
                let key = format!("{child:05}");
                let seen = run.seen.get(&key);
                let waited =
                    seen.is_some_and(|(output, failed, pending)| output.is_some() || *failed && !*pending);
                let removed = spec.policy == ChildFailurePolicy::RemoveDependency && seen.is_none();
                match succeeded {
                    Some(at) if at <= run.at && seen.and_then(|seen| seen.0) != Some(value(index, child)) => {
                        violations.push(format!(
                            "flow {index}: the parent did not see child {child}'s output: {:?}",
                            run.seen
                        ));
                    }
                    Some(at) if at <= run.at => {}
                    _ if spec.policy == ChildFailurePolicy::FailParent => violations.push(format!(
                        "flow {index}: the parent ran at {:?} before child {child} succeeded",
                        run.at
                    )),
                    _ if !(waited || removed) => violations.push(format!(
                        "flow {index}: the parent ran at {:?} with child {child} unfinished",
                        run.at
                    )),
                    _ => {}
                }
            }
        }
    }
    if let Some(run) = truth
        .parents
        .iter()
        .find(|run| run.seen.contains_key(STRAY_CHILD))
    {
        violations.push(format!("flow {}: a stray child was counted in it", run.flow));
    }
    FlowReport {
        violations,
        flows: world.scenario.flows.len(),
        parent_runs: truth.parents.len(),
        overdue,
    }
}
