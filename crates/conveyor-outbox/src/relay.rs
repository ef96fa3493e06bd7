//! [`Relay`]: sends committed jobs from an [`OutboxStore`] to SQS, each aggregate's in order. One
//! implementation behind every way the relay runs: the stream-triggered Lambda handler
//! (`conveyor_lambda::outbox`), the polling relay ([`crate::Poller`]: the worker's task and
//! `conveyor outbox relay`) and the sweep that finds what no trigger announced.
//!
//! # Design note: why each aggregate's order holds
//!
//! The store hands out an aggregate's unsent jobs lowest sequence first, and the writer's transaction
//! gives sequence `n + 1` only after `n` committed. The relay sends an aggregate's next job only after
//! SQS accepted the previous one **and** this relay's conditional removal of it succeeded
//! ([`OutboxStore::remove_sent`]). Whatever else happens, job `n + 1` is first sent after job `n` was
//! accepted:
//! - **Shards, splits, concurrent invocations, several relays**: the store, not a stream's order, is the
//!   truth. A stream record (or a sweep) only says "look at this aggregate"; the relay reads the
//!   aggregate from the store. Two relays on one aggregate both send its first job at worst; one removal
//!   wins and the loser stops on that aggregate. The duplicate is settled once by the consumer under the
//!   job's idempotency key (FIFO queues also deduplicate it by the item id within 5 minutes).
//! - **Takeovers** ([`crate::Poller`]): a relay checks its lease before every `SendMessageBatch`, and a taker
//!   waits a whole lease after it saw the lease unchanged, on its own clock (see `lease.rs`). A holder
//!   paused between its check and its send can still send once late: a duplicate of a job that was
//!   accepted already, as above, never a job out of order.
//! - **Retries**: a job not sent stays first in its aggregate; nothing after it is sent in the same pass,
//!   and nothing sent is sent again by the relay that sent it (it was removed).
//! - **Poison**: a job that SQS refuses for a reason that does not go away by itself (a missing queue,
//!   denied access, a message too large for the queue) is tried again with backoff and parked after
//!   [`RelayOptions::max_attempts`]; its aggregate's later jobs wait behind it (their order) until an
//!   operator fixes the cause and unparks it (`conveyor outbox resend`). Other aggregates keep moving:
//!   the stores never list an aggregate whose first job is parked as pending, and a sweep passes by the
//!   aggregates waiting out a backoff without giving them a turn, so no number of blocked aggregates
//!   stops the rest. A batch call SQS refuses whole is tried again job by job before any job is charged
//!   an attempt: only the job that fails alone counts toward parking.
//!   Throttling and outages never park a job: they only delay it, and the backlog's age says so.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use conveyor_core::limits::MAX_BATCH_ENTRIES;
use conveyor_core::runtime::epoch_millis;
use tokio::time::Instant;

use crate::sink::{JobSink, SendFailure};
use crate::store::{JobRef, OutboxStore, StoreError, StoredJob};

/// Settings of a [`Relay`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayOptions {
    /// Permanent send failures after which a job is parked. Default 8 (with the backoff, about 4 minutes
    /// of a queue that cannot take it).
    pub max_attempts: u32,
    /// An aggregate's jobs read per pass. Default 25.
    pub jobs_per_read: usize,
    /// The first pause before an aggregate whose job failed is tried again; doubled per failure up to
    /// [`RelayOptions::max_backoff`]. Default 1 s.
    pub backoff: Duration,
    /// The longest pause between tries. Default 60 s.
    pub max_backoff: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            jobs_per_read: 25,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What one pass of a [`Relay`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Aggregates looked at.
    pub aggregates: usize,
    /// Jobs SQS accepted and this relay removed.
    pub sent: usize,
    /// Jobs SQS accepted that another relay had removed already (a race; the duplicate is settled once).
    pub raced: usize,
    /// Send failures (each aggregate's first unsent job at most once per pass).
    pub failed: usize,
    /// Jobs parked by this pass.
    pub parked: usize,
    /// Aggregates not relayed: their first job is parked or unreadable, or they wait out a backoff.
    pub blocked: usize,
    /// Store calls that failed (the aggregates involved are retried by a later pass).
    pub store_errors: usize,
    /// False when the relay stopped because its lease was no longer held.
    pub lease_held: bool,
}

impl RelayReport {
    /// Adds `other`'s counts to this report's (passes of one run; `lease_held` is the latest's).
    pub fn add(&mut self, other: &RelayReport) {
        self.aggregates += other.aggregates;
        self.sent += other.sent;
        self.raced += other.raced;
        self.failed += other.failed;
        self.parked += other.parked;
        self.blocked += other.blocked;
        self.store_errors += other.store_errors;
        self.lease_held = other.lease_held;
    }
}

/// Tells the relay whether it may still send: checked before every send round.
pub trait Fence: Send + Sync {
    /// True while sends are allowed.
    fn holds(&self) -> bool;
}

/// No lease: for relays whose safety rests on the store's conditional removals alone (the Lambda handler).
#[derive(Debug, Clone, Copy)]
pub struct Unfenced;

impl Fence for Unfenced {
    fn holds(&self) -> bool {
        true
    }
}

/// The wall clock the relay reads (epoch milliseconds); the simulator sets its own.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Sends outbox jobs to SQS in each aggregate's order. Clones share their backoff state.
#[derive(Clone)]
pub struct Relay {
    store: Arc<dyn OutboxStore>,
    sink: Arc<dyn JobSink>,
    options: RelayOptions,
    wall_clock: WallClock,
    /// Aggregates whose first job failed: when they may be tried again, and how many failures in a row.
    backoff: Arc<Mutex<HashMap<String, (Instant, u32)>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("store", &self.store.name())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One aggregate's jobs still to send in this pass.
struct Lineage {
    aggregate: String,
    jobs: VecDeque<StoredJob>,
    /// The sequence of the last job sent and removed in this pass.
    last_removed: Option<u64>,
    /// The read returned as many jobs as it asked for: there may be more.
    full: bool,
}

impl Relay {
    /// A relay from `store` to SQS through `sink`.
    pub fn new(store: Arc<dyn OutboxStore>, sink: Arc<dyn JobSink>) -> Self {
        Self {
            store,
            sink,
            options: RelayOptions::default(),
            wall_clock: Arc::new(|| epoch_millis(SystemTime::now())),
            backoff: Arc::default(),
        }
    }

    /// With `options`.
    pub fn with_options(mut self, options: RelayOptions) -> Self {
        self.options = options;
        self
    }

    /// With another wall clock (the simulator's).
    #[doc(hidden)]
    pub fn with_wall_clock(mut self, wall_clock: WallClock) -> Self {
        self.wall_clock = wall_clock;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn OutboxStore> {
        &self.store
    }

    /// Requests the sink made so far (sends).
    pub fn send_requests(&self) -> u64 {
        self.sink.requests()
    }

    /// Relays the aggregates whose jobs were committed before `min_age` ago (up to `limit` aggregates,
    /// oldest first): the sweep, and the polling relay's pass with `min_age` zero.
    pub async fn sweep(&self, min_age: Duration, limit: usize, fence: &dyn Fence) -> RelayReport {
        let now = (self.wall_clock)();
        let before = now.saturating_sub(u64::try_from(min_age.as_millis()).unwrap_or(u64::MAX));
        let mut report = RelayReport {
            lease_held: true,
            ..RelayReport::default()
        };
        // A turn that went to an aggregate whose send failed (its queue refuses or is unavailable) is
        // given again to the next ones: the failed aggregates now wait out a backoff, so the next look
        // passes them by. Bounded: at most SWEEP_LOOKS looks per sweep. A store error is no reason to
        // look again (the store would only be asked more while it struggles).
        for _ in 0..SWEEP_LOOKS {
            let (pass, more) = self.sweep_once(before.max(1), limit, fence).await;
            report.add(&pass);
            if !more || pass.failed == 0 || pass.store_errors > 0 || !pass.lease_held {
                break;
            }
        }
        report
    }

    /// One look at the store and one pass over the aggregates it listed; also whether the store may
    /// list more (its answer was full).
    async fn sweep_once(&self, before: u64, limit: usize, fence: &dyn Fence) -> (RelayReport, bool) {
        // Aggregates waiting out a backoff are passed by without a turn: the store is asked for as many
        // more (up to ten passes' worth), so a pass's worth of them never stops the others' jobs.
        let waiting = self.backing_off().min(limit.saturating_mul(10));
        let asked = limit.saturating_add(waiting);
        match self.store.pending(asked, before).await {
            Ok(aggregates) => {
                let more = aggregates.len() >= asked;
                let (turns, passed): (Vec<String>, Vec<String>) = dedup(&aggregates)
                    .into_iter()
                    .partition(|aggregate| !self.waiting_out_backoff(aggregate));
                let turns: Vec<String> = turns.into_iter().take(limit).collect();
                let mut report = self.relay(&turns, fence).await;
                report.blocked += passed.len();
                (report, more)
            }
            Err(error) => {
                log_store_error(
                    self.store.name(),
                    None,
                    &error,
                    "listing pending aggregates failed",
                );
                let report = RelayReport {
                    store_errors: 1,
                    lease_held: fence.holds(),
                    ..RelayReport::default()
                };
                (report, false)
            }
        }
    }

    /// Relays the unsent jobs of `aggregates` (each aggregate's in order), until each is empty, blocked
    /// or failed, or the fence no longer holds.
    pub async fn relay(&self, aggregates: &[String], fence: &dyn Fence) -> RelayReport {
        let mut report = RelayReport {
            aggregates: aggregates.len(),
            lease_held: true,
            ..RelayReport::default()
        };
        let mut lineages = Vec::new();
        for aggregate in dedup(aggregates) {
            if self.waiting_out_backoff(&aggregate) {
                report.blocked += 1;
                continue;
            }
            if let Some(lineage) = self.read(&aggregate, &mut report).await {
                lineages.push(lineage);
            }
        }
        while !lineages.is_empty() {
            if !fence.holds() {
                report.lease_held = false;
                return report;
            }
            let round: Vec<StoredJob> = lineages
                .iter_mut()
                .filter_map(|lineage| lineage.jobs.pop_front())
                .collect();
            let accepted = self.send_round(round, fence, &mut report).await;
            let removed = self.remove(&accepted, &mut report).await;
            lineages.retain(|lineage| removed.contains(&lineage.aggregate));
            for lineage in &mut lineages {
                lineage.last_removed = accepted
                    .iter()
                    .find(|job| job.aggregate == lineage.aggregate)
                    .map(|job| job.sequence);
            }
            // An aggregate whose read was full may have more: read it again. (Jobs committed after a
            // short read are announced by their own trigger, or found by the next sweep.)
            let mut next = Vec::new();
            for lineage in lineages {
                if !lineage.jobs.is_empty() {
                    next.push(lineage);
                    continue;
                }
                if !lineage.full {
                    self.drained(&lineage).await;
                    continue;
                }
                if let Some(more) = self.read(&lineage.aggregate, &mut report).await {
                    next.push(more);
                }
            }
            lineages = next;
        }
        report
    }

    /// Tells the store an aggregate was drained in this pass (its index entry can go).
    async fn drained(&self, lineage: &Lineage) {
        let Some(last) = lineage.last_removed else {
            return;
        };
        if let Err(error) = self.store.drained(&lineage.aggregate, last).await {
            log_store_error(
                self.store.name(),
                Some(&lineage.aggregate),
                &error,
                "marking a drained aggregate failed",
            );
        }
    }

    /// The aggregate's jobs to send, or `None` when it has none, or its first is parked or unreadable.
    async fn read(&self, aggregate: &str, report: &mut RelayReport) -> Option<Lineage> {
        let jobs = match self.store.jobs(aggregate, self.options.jobs_per_read).await {
            Ok(jobs) => jobs,
            Err(error) => {
                // An unreadable job stops its aggregate alone; a store that cannot be read at all is
                // reported, so the caller can retry (an outage) or fail loudly (a misconfiguration).
                if matches!(error, StoreError::Unreadable { .. }) {
                    report.blocked += 1;
                    self.back_off(aggregate);
                } else {
                    report.store_errors += 1;
                }
                log_store_error(
                    self.store.name(),
                    Some(aggregate),
                    &error,
                    "reading the aggregate's jobs failed",
                );
                return None;
            }
        };
        let full = jobs.len() >= self.options.jobs_per_read;
        let first = jobs.first()?;
        if first.parked_at_millis.is_some() {
            // Looked at again after a backoff, not at every pass, until an operator unparks it.
            report.blocked += 1;
            self.back_off(aggregate);
            return None;
        }
        // Parked jobs further on are sent up to (not including) the first of them.
        let jobs: VecDeque<StoredJob> = jobs
            .into_iter()
            .take_while(|job| job.parked_at_millis.is_none())
            .collect();
        Some(Lineage {
            aggregate: aggregate.to_owned(),
            last_removed: None,
            full: full && jobs.len() >= self.options.jobs_per_read,
            jobs,
        })
    }

    /// Sends one job per aggregate, batched per queue; returns the accepted ones. The fence is checked
    /// before every batch: a relay paused in one batch past its lease sends no further batch (the jobs
    /// not sent stay first in their aggregates).
    async fn send_round(
        &self,
        round: Vec<StoredJob>,
        fence: &dyn Fence,
        report: &mut RelayReport,
    ) -> Vec<StoredJob> {
        let mut by_queue: BTreeMap<String, Vec<StoredJob>> = BTreeMap::new();
        for job in round {
            by_queue.entry(job.queue_url.clone()).or_default().push(job);
        }
        let mut accepted = Vec::new();
        for (queue_url, jobs) in by_queue {
            for chunk in chunks(jobs, MAX_BATCH_ENTRIES) {
                if !fence.holds() {
                    report.lease_held = false;
                    return accepted;
                }
                let messages = chunk.iter().map(|job| job.message.clone()).collect();
                let mut results = self.sink.send(&queue_url, messages).await;
                if chunk.len() > 1
                    && results
                        .iter()
                        .all(|result| matches!(result, Err(failure) if !failure.retryable))
                {
                    // SQS refuses a whole batch call for one bad entry (a body it will not take, an
                    // attribute it rejects): each job is tried alone before any is charged an attempt, so
                    // a healthy batch-mate is never parked for another's fault.
                    results = self.send_each_alone(&queue_url, &chunk, fence, report).await;
                }
                for (job, result) in chunk.into_iter().zip(results) {
                    match result {
                        Ok(message_id) => {
                            tracing::debug!(
                                outbox_id = %job.id,
                                aggregate = %job.aggregate,
                                sequence = job.sequence,
                                job_type = %job.job_type,
                                %message_id,
                                "outbox job sent"
                            );
                            accepted.push(job);
                        }
                        Err(failure) => self.failed(&job, &failure, report).await,
                    }
                }
            }
        }
        accepted
    }

    /// Sends each of `jobs` in a call of its own; one result per job sent, in order. Stops when the fence
    /// no longer holds (the jobs not sent stay first in their aggregates, with no attempt charged).
    async fn send_each_alone(
        &self,
        queue_url: &str,
        jobs: &[StoredJob],
        fence: &dyn Fence,
        report: &mut RelayReport,
    ) -> Vec<Result<String, SendFailure>> {
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            if !fence.holds() {
                report.lease_held = false;
                break;
            }
            let mut alone = self.sink.send(queue_url, vec![job.message.clone()]).await;
            results.push(alone.pop().unwrap_or_else(|| {
                Err(SendFailure {
                    message: "the sink gave no result for the job".to_owned(),
                    retryable: true,
                })
            }));
        }
        results
    }

    /// Records a failed send: a permanent one counts toward parking.
    async fn failed(&self, job: &StoredJob, failure: &SendFailure, report: &mut RelayReport) {
        report.failed += 1;
        let failures = self.back_off(&job.aggregate);
        if failure.retryable {
            tracing::warn!(
                outbox_id = %job.id,
                aggregate = %job.aggregate,
                sequence = job.sequence,
                job_type = %job.job_type,
                error = %failure.message,
                failures,
                "outbox job not sent (SQS unavailable); its aggregate waits and is tried again"
            );
            return;
        }
        let attempts = job.attempts + 1;
        let park = attempts >= self.options.max_attempts;
        let parked_at = park.then(|| (self.wall_clock)());
        if park {
            report.parked += 1;
            tracing::error!(
                outbox_id = %job.id,
                aggregate = %job.aggregate,
                sequence = job.sequence,
                job_type = %job.job_type,
                queue_url = %job.queue_url,
                error = %failure.message,
                attempts,
                "outbox job parked: SQS refused it {attempts} times; its aggregate's later jobs wait \
                 behind it. Fix the cause, then `conveyor outbox resend --aggregate <aggregate>`"
            );
        } else {
            tracing::warn!(
                outbox_id = %job.id,
                aggregate = %job.aggregate,
                sequence = job.sequence,
                job_type = %job.job_type,
                queue_url = %job.queue_url,
                error = %failure.message,
                attempts,
                max_attempts = self.options.max_attempts,
                "outbox job refused by SQS; tried again after a pause, parked after max_attempts"
            );
        }
        if let Err(error) = self
            .store
            .record_failure(&job.reference(), &failure.message, parked_at)
            .await
        {
            report.store_errors += 1;
            log_store_error(
                self.store.name(),
                Some(&job.aggregate),
                &error,
                "recording a failed send failed",
            );
        }
    }

    /// Removes accepted jobs; returns the aggregates whose removal this relay won (they may go on).
    async fn remove(&self, accepted: &[StoredJob], report: &mut RelayReport) -> HashSet<String> {
        if accepted.is_empty() {
            return HashSet::new();
        }
        let references: Vec<JobRef> = accepted.iter().map(StoredJob::reference).collect();
        let removed = match self.store.remove_sent(&references).await {
            Ok(removed) => removed,
            Err(error) => {
                // Sent but not removed: a later pass sends them again (a duplicate, settled once). Their
                // aggregates stop here so nothing after them is sent before they are removed.
                report.store_errors += 1;
                log_store_error(
                    self.store.name(),
                    None,
                    &error,
                    "removing sent outbox jobs failed",
                );
                return HashSet::new();
            }
        };
        let mut winners = HashSet::new();
        for (job, removed) in accepted.iter().zip(removed) {
            if removed {
                report.sent += 1;
                self.clear_backoff(&job.aggregate);
                winners.insert(job.aggregate.clone());
            } else {
                report.raced += 1;
                tracing::debug!(
                    outbox_id = %job.id,
                    aggregate = %job.aggregate,
                    sequence = job.sequence,
                    "outbox job was removed by another relay: this relay stops on its aggregate"
                );
            }
        }
        winners
    }

    /// How many aggregates wait out a backoff now.
    fn backing_off(&self) -> usize {
        let Ok(backoff) = self.backoff.lock() else {
            return 0;
        };
        let now = Instant::now();
        backoff.values().filter(|(until, _)| now < *until).count()
    }

    fn waiting_out_backoff(&self, aggregate: &str) -> bool {
        let Ok(backoff) = self.backoff.lock() else {
            return false;
        };
        backoff
            .get(aggregate)
            .is_some_and(|(until, _)| Instant::now() < *until)
    }

    /// Starts or lengthens the aggregate's pause; returns its failures in a row.
    fn back_off(&self, aggregate: &str) -> u32 {
        let Ok(mut backoff) = self.backoff.lock() else {
            return 1;
        };
        let entry = backoff.entry(aggregate.to_owned()).or_insert((Instant::now(), 0));
        entry.1 += 1;
        let factor = 1u32 << (entry.1 - 1).min(16);
        let pause = self
            .options
            .backoff
            .saturating_mul(factor)
            .min(self.options.max_backoff);
        entry.0 = Instant::now() + pause;
        entry.1
    }

    fn clear_backoff(&self, aggregate: &str) {
        if let Ok(mut backoff) = self.backoff.lock() {
            backoff.remove(aggregate);
        }
    }
}

/// How many times one sweep looks at the store when its turns went to aggregates that failed.
const SWEEP_LOOKS: usize = 4;

/// The aggregates once each, in their first order.
fn dedup(aggregates: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    aggregates
        .iter()
        .filter(|aggregate| seen.insert(aggregate.as_str()))
        .cloned()
        .collect()
}

fn chunks(jobs: Vec<StoredJob>, size: usize) -> Vec<Vec<StoredJob>> {
    let mut chunks = Vec::new();
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        chunks.push(jobs.by_ref().take(size).collect());
    }
    chunks
}

fn log_store_error(store: &str, aggregate: Option<&str>, error: &StoreError, what: &str) {
    if error.is_retryable() {
        tracing::warn!(store, aggregate, %error, "{what}; tried again later");
    } else {
        tracing::error!(store, aggregate, %error, "{what}; the aggregate waits until this is fixed");
    }
}
