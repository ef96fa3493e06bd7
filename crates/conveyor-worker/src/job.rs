//! One received message's life in the worker: admission, the pipeline, the outcome; and FIFO groups.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use conveyor_core::limits::MAX_VISIBILITY_TIMEOUT;
use conveyor_core::runtime::{
    AckReason, DeferCause, NotRun, Origin, TenantAdmission, TenantSlot, UnrunJob, added_jitter, first_sent,
    not_run_at_the_last_receive, past_its_bound,
};
use conveyor_core::trace::Settlement;
use conveyor_core::{
    message::{DeferralRecord, Message},
    runtime::{Budget, Lease, Outcome, Processed},
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use crate::apply::{
    Applying, Settled, apply, defer, past_the_limit, record_retry_in_place, release_in_order, set_visibility,
};
use crate::protect::{Admission, Breaker, acquire_slot};
use crate::report::add;
use crate::runtime::{Held, Runtime};
use crate::telemetry::record_deferral;
use conveyor_core::runtime::{Ticket, Turn};

/// A received message with everything that keeps it in flight.
pub(crate) struct Received {
    pub(crate) message: Message,
    pub(crate) lease: Arc<Lease>,
    pub(crate) held: Held,
    /// When SQS's 12 hours of visibility end (counted from the first receive, see
    /// `receiver::visibility_cap`).
    pub(crate) visibility_cap: Instant,
}

/// Runs one message and applies its outcome.
pub(crate) async fn run_message(runtime: Arc<Runtime>, queue: usize, received: Received) -> Settled {
    let span = runtime
        .pipeline
        .message_span(&received.message, &runtime.names[queue]);
    let started = Instant::now();
    let settled = run_in_span(Arc::clone(&runtime), queue, received, span.clone())
        .instrument(span)
        .await;
    runtime.observe_slot(started.elapsed());
    settled
}

/// Why a message waits in flight instead of going back (FIFO: a copy would break the group's order).
enum Wait {
    /// Waited; try again.
    Again,
    /// Shutdown or the lease ended while waiting.
    Stop,
}

/// Waits `delay` holding the message in flight (the heartbeat keeps it invisible).
async fn wait_in_flight(runtime: &Runtime, lease: &Lease, delay: Duration) -> Wait {
    tokio::select! {
        biased;
        () = tokio::time::sleep(delay) => Wait::Again,
        () = runtime.stop_receiving.cancelled() => Wait::Stop,
        () = lease.cancellation().cancelled() => Wait::Stop,
    }
}

async fn run_in_span(
    runtime: Arc<Runtime>,
    queue: usize,
    received: Received,
    span: tracing::Span,
) -> Settled {
    let Received {
        message,
        lease,
        held,
        visibility_cap,
    } = received;
    let message = Arc::new(message);
    let target = Applying {
        queue,
        message: &message,
        lease: &lease,
        visibility_cap,
    };
    let job_type = runtime.pipeline.router().job_type_for(&message);
    if let Some(job_type) = job_type {
        conveyor_core::trace::record_job_type(&span, job_type);
    }
    let fifo = runtime.queues[queue].is_fifo();
    let counters = runtime.status.counters();
    if !fifo && no_room_to_extend(&runtime, queue, visibility_cap) {
        return renew_past_the_cap(&runtime, &target, held).await;
    }

    // Whether the pipeline saw the message at this receive (it may wait in flight and go again).
    let mut processed_once = false;
    loop {
        let deferrals = DeferralRecord::of(&message).map_or(0, |record| record.deferrals);
        let admitted = match admit(&runtime, job_type, message.tenant(), deferrals).await {
            Admit::Run(admitted) => admitted,
            Admit::Shutdown => {
                // At the last receive the redrive policy allows, a message put back would reach the DLQ
                // unrun: a standard one goes on as a deferred copy, a FIFO one to the DLQ with a reason.
                if !fifo && at_the_last_receive(&runtime, queue, &message) {
                    let reason = "the worker shut down before it started, at its last allowed receive";
                    runtime.pipeline.before_unrun_copy(&message).await;
                    return defer_unrun(&runtime, &target, reason, held).await;
                }
                let hold = Some(Hold {
                    lease: &lease,
                    visibility_cap,
                });
                if let Some(processed) =
                    unrun_at_the_last_receive(&runtime, queue, &message, &Reason::Shutdown, hold).await
                {
                    return apply(&runtime, target, processed, held).await;
                }
                add(&counters.released_at_shutdown, 1);
                tracing::info!("shutting down before the job started; the message is visible again");
                set_visibility(&runtime, &target, Duration::ZERO).await;
                conveyor_core::trace::record_settlement(&span, Settlement::Released);
                return Settled::Returned;
            }
            Admit::TenantLimit { delay, limit } => {
                let tenant = message.tenant().unwrap_or_default();
                runtime.tenant_metrics.deferred(Some(tenant), limit);
                if fifo {
                    tracing::debug!(
                        tenant,
                        limit,
                        ?delay,
                        "tenant at its limit; the FIFO message waits in flight"
                    );
                    if let Wait::Again = wait_in_flight(&runtime, &lease, delay).await {
                        continue;
                    }
                }
                tracing::debug!(
                    tenant,
                    limit,
                    ?delay,
                    "tenant at its limit; the message goes back unrun"
                );
                let reason = format!("tenant {tenant} at its {limit} limit");
                let cause = DeferCause::TenantLimit;
                let processed = Processed::not_run(Outcome::Defer { delay, reason, cause }, job_type);
                runtime.pipeline.before_unrun_copy(&message).await;
                return apply(&runtime, target, processed, held).await;
            }
            Admit::Defer { delay, downstream } => {
                add(&counters.circuit_deferred, 1);
                record_deferral(&downstream);
                if fifo {
                    tracing::info!(%downstream, ?delay, "circuit open; the FIFO message waits in flight");
                    if let Wait::Again = wait_in_flight(&runtime, &lease, delay).await {
                        continue;
                    }
                }
                tracing::info!(%downstream, ?delay, "circuit open; the message goes back unrun");
                let reason = format!("circuit of {downstream} open");
                let cause = DeferCause::CircuitOpen;
                let deferral = Outcome::Defer { delay, reason, cause };
                // Bounded as the pipeline's own deferrals are: a day of an open circuit ends in the DLQ.
                let origin = Origin {
                    queue: &runtime.names[queue],
                    handler: job_type.unwrap_or(""),
                    attempt: message.attempt(),
                    receive: message.receive_count.max(1),
                    max_attempts: runtime.queues[queue].max_receive_count(),
                };
                let outcome = past_its_bound(&message, deferral, origin, runtime.pipeline.now());
                let processed = Processed::not_run(outcome, job_type);
                runtime.pipeline.before_unrun_copy(&message).await;
                return apply(&runtime, target, processed, held).await;
            }
        };

        record_tenant_start(&runtime, &message);
        if lease.cancellation().is_cancelled() {
            // The lease ended (lost, or the processing limit passed) while the message waited to start.
            // The first time, on a FIFO queue, it waited behind its group (SQS's 12 hours from the first
            // receive may be spent, which leaves each receive one visibility timeout): at its last
            // receive it is dead-lettered with the reason, not left to the redrive.
            if fifo
                && !processed_once
                && let Some(processed) =
                    unrun_at_the_last_receive(&runtime, queue, &message, &Reason::GroupFailed, None).await
            {
                return apply(&runtime, target, processed, held).await;
            }
            add(&counters.retried, 1);
            tracing::info!("lease ended before the job started; not running it");
            set_visibility(&runtime, &target, Duration::ZERO).await;
            conveyor_core::trace::record_settlement(&span, Settlement::Released);
            return Settled::Returned;
        }
        // No invocation deadline here: each store call is bounded by the store client's own deadlines,
        // and the heartbeat keeps the message (and its claim) alive meanwhile.
        let budget = Budget::default().with_max_attempts(runtime.queues[queue].max_receive_count());
        let processed = runtime
            .pipeline
            .process(
                Arc::clone(&message),
                Arc::clone(&runtime.names[queue]),
                &lease,
                budget,
            )
            .await;
        processed_once = true;
        let Admitted {
            slot,
            breaker,
            tenant,
        } = admitted;
        drop(slot);
        drop(tenant);
        if let Some(ticket) = breaker {
            let verdict = (processed.ran() && !lease.cancellation().is_cancelled())
                .then_some(!matches!(processed.outcome, Outcome::Retry { .. }));
            ticket.finish(verdict);
        }
        if let (true, Outcome::Defer { delay, reason, .. }) = (fifo, &processed.outcome) {
            let room = target.room();
            if *delay < room {
                tracing::info!(%reason, ?delay, "the FIFO message waits in flight, then runs again");
                if let Wait::Again = wait_in_flight(&runtime, &lease, *delay).await {
                    continue;
                }
            }
        }
        // A failed FIFO run is retried in place, its group held: put back, it would send every message
        // received behind it in this batch back unrun, each spending a receive toward the redrive. Only
        // a claimed run is: the store counts its runs (`Processed::run`), so the budget holds across
        // these retries, a shutdown and another worker; unclaimed, the receive count is all there is.
        if let (true, Outcome::Retry { delay, reason }, Some(run)) = (fifo, &processed.outcome, processed.run)
        {
            let room = target.room();
            if *delay < room {
                tracing::info!(%reason, ?delay, run, "job will be retried in place; its FIFO group waits");
                record_retry_in_place(&runtime, queue, &processed);
                if let Wait::Again = wait_in_flight(&runtime, &lease, *delay).await {
                    continue;
                }
                // Shutting down, or the lease ended: the retry (already counted) is another delivery's.
                tracing::info!("stopped waiting to retry in place; the message is visible again");
                set_visibility(&runtime, &target, Duration::ZERO).await;
                conveyor_core::trace::record_settlement(&span, Settlement::Retried);
                return Settled::Returned;
            }
        }
        return apply(&runtime, target, processed, held).await;
    }
}

/// Whether SQS's 12 hours from the message's first receive leave it no extension beyond the
/// visibility timeout this receive gave it.
fn no_room_to_extend(runtime: &Runtime, queue: usize, visibility_cap: Instant) -> bool {
    visibility_cap.saturating_duration_since(Instant::now()) <= runtime.visibility[queue]
}

/// A message on a standard queue whose 12 hours from the first receive are spent (retried for half a
/// day, or redelivered after a run stopped at the limit) could be held no longer than this receive's
/// visibility timeout, however long its job takes: it goes on as a fresh copy with 12 hours of its
/// own, unrun (this receive does not count as a run; the copy carries the runs before it). On a FIFO
/// queue a copy would go behind the rest of its group, so there the message runs within what is left.
async fn renew_past_the_cap(runtime: &Runtime, target: &Applying<'_>, held: Held) -> Settled {
    tracing::info!(
        first_received_at = ?target.message.first_received_at,
        "SQS's 12 hours from the first receive are spent: the job goes on as a fresh copy, unrun"
    );
    let reason = "SQS's 12 hours from the first receive are spent";
    defer_unrun(runtime, target, reason, held).await
}

/// Defers a message that did not run with a copy due at once; its span says what settlement did.
async fn defer_unrun(runtime: &Runtime, target: &Applying<'_>, reason: &str, held: Held) -> Settled {
    let (settled, settlement) = defer(runtime, target, Duration::ZERO, reason, None, held).await;
    conveyor_core::trace::record_settlement(&tracing::Span::current(), settlement);
    settled
}

/// Runs a FIFO group's messages of one batch in order, one at a time. When one goes back to the
/// queue, the rest go back too, in order, after its outcome was applied; at shutdown the ones not
/// started yet go back at once (SQS holds the group while the running one is in flight).
pub(crate) async fn run_group(
    runtime: Arc<Runtime>,
    queue: usize,
    group: String,
    ticket: Ticket,
    members: Vec<Received>,
) {
    {
        let (_turn, turn) = ticket.wait().await;
        let returned = match turn {
            Turn::Run => run_members(&runtime, queue, members).await,
            _ => {
                tracing::info!(queue = %runtime.names[queue], group, "an earlier batch of the FIFO group went back; this one follows it, unrun");
                release_rest(&runtime, queue, members.into(), Reason::GroupFailed).await;
                true
            }
        };
        if returned {
            ticket.gate().returned();
        }
    }
    runtime.fifo_gates.done(&queue.to_string(), &group, ticket);
}

/// Runs the members of one batch of a group in order; true when any of them went back to the queue.
async fn run_members(runtime: &Arc<Runtime>, queue: usize, members: Vec<Received>) -> bool {
    let runtime = Arc::clone(runtime);
    let mut pending: VecDeque<Received> = members.into();
    while let Some(current) = pending.pop_front() {
        if runtime.stop_receiving.is_cancelled() {
            pending.push_front(current);
            release_rest(&runtime, queue, pending, Reason::Shutdown).await;
            return true;
        }
        let run = run_message(Arc::clone(&runtime), queue, current);
        tokio::pin!(run);
        let settled = if pending.is_empty() {
            run.await
        } else {
            tokio::select! {
                biased;
                settled = &mut run => settled,
                () = runtime.stop_receiving.cancelled() => {
                    release_rest(&runtime, queue, std::mem::take(&mut pending), Reason::Shutdown).await;
                    run.await
                }
            }
        };
        if settled == Settled::Returned {
            let reason = if runtime.stop_receiving.is_cancelled() {
                Reason::Shutdown
            } else {
                Reason::GroupFailed
            };
            release_rest(&runtime, queue, pending, reason).await;
            return true;
        }
    }
    false
}

enum Reason {
    Shutdown,
    GroupFailed,
}

async fn release_rest(runtime: &Runtime, queue: usize, rest: VecDeque<Received>, reason: Reason) {
    let rest = dead_letter_unrun_at_the_last_receive(runtime, queue, rest, &reason).await;
    if rest.is_empty() {
        return;
    }
    let messages: Vec<&Message> = rest
        .iter()
        .filter(|received| !past_the_limit(received.visibility_cap))
        .map(|received| &received.message)
        .collect();
    let deadline = rest
        .iter()
        .map(|received| received.lease.latest_visible_until().min(received.visibility_cap))
        .min()
        .unwrap_or_else(Instant::now);
    if !messages.is_empty() {
        release_in_order(runtime, queue, &messages, deadline).await;
    }
    let counters = runtime.status.counters();
    match reason {
        Reason::Shutdown => add(&counters.released_at_shutdown, rest.len() as u64),
        Reason::GroupFailed => add(&counters.fifo_requeued, rest.len() as u64),
    }
    tracing::info!(
        queue = %runtime.names[queue],
        group = rest.front().and_then(|received| received.message.group_id.as_deref()).unwrap_or(""),
        messages = rest.len(),
        "the rest of the FIFO group's batch goes back to the queue in order"
    );
    // Dropping `rest` here ends their heartbeats and frees their slots, after the change answered.
}

/// The messages of `rest` at the last receive the redrive policy allows would reach the DLQ by SQS's
/// redrive, unrun and without a reason, once put back: they are dead-lettered now instead, with one
/// (never run, and why). The others are returned, in order, to go back.
async fn dead_letter_unrun_at_the_last_receive(
    runtime: &Runtime,
    queue: usize,
    rest: VecDeque<Received>,
    reason: &Reason,
) -> VecDeque<Received> {
    let mut back = VecDeque::with_capacity(rest.len());
    for received in rest {
        let hold = Some(Hold {
            lease: &received.lease,
            visibility_cap: received.visibility_cap,
        });
        let Some(processed) =
            unrun_at_the_last_receive(runtime, queue, &received.message, reason, hold).await
        else {
            back.push_back(received);
            continue;
        };
        let Received {
            message,
            lease,
            held,
            visibility_cap,
        } = received;
        let target = Applying {
            queue,
            message: &message,
            lease: &lease,
            visibility_cap,
        };
        apply(runtime, target, processed, held).await;
    }
    back
}

/// True when `message` is at the last receive its queue's redrive policy allows.
fn at_the_last_receive(runtime: &Runtime, queue: usize, message: &Message) -> bool {
    runtime.queues[queue]
        .max_receive_count()
        .is_some_and(|max| message.receive_count.max(1) >= max)
}

/// A message this worker still holds: its heartbeat keeps it invisible until the lease ends, at the
/// latest by `visibility_cap`.
#[derive(Clone, Copy)]
struct Hold<'a> {
    lease: &'a Lease,
    visibility_cap: Instant,
}

/// The outcome for `message` when this is the last receive the redrive policy allows and it goes back
/// unrun for `reason`: put back, SQS's redrive would move it unrun and without a reason, so it is
/// dead-lettered with one (a tracked job's status says so), or deleted when its job had completed
/// (see `conveyor-core/src/unrun.rs`). `None` before the last receive. While `hold` lasts, a store
/// outage is waited out so that the status is written (a lease that ended: the store is asked once).
async fn unrun_at_the_last_receive(
    runtime: &Runtime,
    queue: usize,
    message: &Message,
    reason: &Reason,
    hold: Option<Hold<'_>>,
) -> Option<Processed> {
    let max = runtime.queues[queue].max_receive_count()?;
    let attempt = message.attempt();
    if message.receive_count.max(1) < max {
        return None;
    }
    let (cause, why) = match reason {
        Reason::Shutdown => (
            NotRun::ShutDown,
            "the worker shut down before it started, and each receive counted; redrive it when a worker runs",
        ),
        Reason::GroupFailed => (
            NotRun::BehindItsGroup,
            "a message ahead of it in its FIFO group had not finished, and each receive behind its group \
             counted; redrive it once the group's earlier messages are settled",
        ),
    };
    let job_type = runtime.pipeline.router().job_type_for(message);
    let failure = not_run_at_the_last_receive(
        cause,
        why,
        attempt,
        max,
        &runtime.names[queue],
        job_type.unwrap_or(""),
    );
    let asked = match hold {
        Some(hold) => {
            let asking =
                runtime
                    .pipeline
                    .unrun_at_the_last_receive(message, &failure, Some(hold.visibility_cap));
            tokio::select! {
                biased;
                asked = asking => asked,
                () = hold.lease.cancellation().cancelled() => UnrunJob::DeadLetter,
                () = hold.lease.process_stop().cancelled() => UnrunJob::DeadLetter,
            }
        }
        None => {
            runtime
                .pipeline
                .unrun_at_the_last_receive(message, &failure, None)
                .await
        }
    };
    let outcome = match asked {
        UnrunJob::Completed => Outcome::Ack(AckReason::Duplicate),
        _ => Outcome::Reject(failure),
    };
    Some(Processed::not_run(outcome, job_type))
}

enum Admit {
    Run(Admitted),
    Shutdown,
    Defer {
        delay: Duration,
        downstream: Arc<str>,
    },
    /// The tenant is at its concurrency or rate `limit`.
    TenantLimit {
        delay: Duration,
        limit: &'static str,
    },
}

struct Admitted {
    slot: Option<OwnedSemaphorePermit>,
    breaker: Option<BreakerTicket>,
    tenant: TenantSlot,
}

/// Asks the tenant's limits (which never wait: an over-limit tenant is deferred), then waits for the
/// job type's slot and rate token, then asks its downstream's breaker.
async fn admit(
    runtime: &Runtime,
    job_type: Option<&'static str>,
    tenant: Option<&str>,
    deferrals: u32,
) -> Admit {
    let stop = &runtime.stop_receiving;
    if stop.is_cancelled() {
        return Admit::Shutdown;
    }
    let tenant_slot = match runtime.tenants.admit_after(tenant, deferrals) {
        TenantAdmission::Run(slot) => slot,
        TenantAdmission::Defer { delay, limit } => return Admit::TenantLimit { delay, limit },
    };
    let Some(job_type) = job_type.filter(|_| !runtime.guards.is_empty()) else {
        return Admit::Run(Admitted {
            slot: None,
            breaker: None,
            tenant: tenant_slot,
        });
    };
    let slot = match runtime.guards.concurrency(job_type) {
        None => None,
        Some(semaphore) => tokio::select! {
            biased;
            slot = acquire_slot(semaphore) => slot,
            () = stop.cancelled() => return Admit::Shutdown,
        },
    };
    if let Some(bucket) = runtime.guards.rate(job_type) {
        let wait = bucket.reserve();
        if !wait.is_zero() {
            tokio::select! {
                biased;
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => {
                    bucket.give_back();
                    return Admit::Shutdown;
                }
            }
        }
    }
    let breaker = match runtime.guards.breaker(job_type) {
        None => None,
        Some(breaker) => match breaker.admit() {
            Admission::Run => Some(BreakerTicket::new(breaker, false)),
            Admission::Probe => Some(BreakerTicket::new(breaker, true)),
            Admission::Defer(delay) => {
                return Admit::Defer {
                    delay: with_jitter(delay),
                    downstream: Arc::clone(breaker.downstream()),
                };
            }
        },
    };
    Admit::Run(Admitted {
        slot,
        breaker,
        tenant: tenant_slot,
    })
}

/// Counts a job of a tenant starting, with its dwell time since it was first sent.
fn record_tenant_start(runtime: &Runtime, message: &Message) {
    let Some(tenant) = message.tenant() else {
        return;
    };
    let dwell =
        first_sent(message).and_then(|sent| conveyor_core::wall_clock::now().duration_since(sent).ok());
    runtime.tenant_metrics.started(Some(tenant), dwell);
}

/// Spreads deferred messages so they do not all come back in the same second.
fn with_jitter(delay: Duration) -> Duration {
    added_jitter(delay, (delay / 5).max(Duration::from_secs(1))).min(MAX_VISIBILITY_TIMEOUT)
}

/// A run admitted by a breaker; a probe that ends without a verdict (or is dropped) frees the probe slot.
struct BreakerTicket {
    breaker: Arc<Breaker>,
    probe: bool,
    finished: bool,
}

impl BreakerTicket {
    fn new(breaker: Arc<Breaker>, probe: bool) -> Self {
        Self {
            breaker,
            probe,
            finished: false,
        }
    }

    /// `Some(success)` when the handler ran to a verdict.
    fn finish(mut self, verdict: Option<bool>) {
        self.finished = true;
        match verdict {
            Some(success) => self.breaker.record(self.probe, success),
            None if self.probe => self.breaker.abandon_probe(),
            None => {}
        }
    }
}

impl Drop for BreakerTicket {
    fn drop(&mut self) {
        if !self.finished && self.probe {
            self.breaker.abandon_probe();
        }
    }
}
