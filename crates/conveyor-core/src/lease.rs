//! The state one in-flight message shares between the pipeline and the runtime's heartbeat.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::SystemTime;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::defaults::CLOCK_SKEW_ALLOWANCE;
use crate::idempotency::Claim;

/// One message's lease: its visibility deadline, the idempotency claim held for it, and the token that
/// cancels its handler.
///
/// Ordering (see the pipeline's design note): the pipeline stores the claim here right after acquiring
/// it and takes it back before settling it; the heartbeat extends the claim's lease only while it is
/// here, so it never extends a record that was already completed or released.
#[derive(Debug)]
pub struct Lease {
    cancel: CancellationToken,
    /// The process's own stop (the worker's hard stop), when the runtime gives one: work that may
    /// outlive the message's hold (a completion tried again after the lease was lost) ends with it.
    process_stop: Option<CancellationToken>,
    visible_until: Mutex<Instant>,
    latest_visible_until: Mutex<Option<Instant>>,
    claim: Mutex<Option<Claim>>,
    /// The claim's lease end as the store last accepted it (at the claim, then at each extension):
    /// when another consumer may take the claim over, whatever the message's visibility says.
    claim_held_until: Mutex<Option<Instant>>,
    /// Why the lease was cancelled, when a runtime said so ([`Lease::cancel`]); the handler's
    /// [`Context::cancel_reason`](crate::Context::cancel_reason) reads it.
    reason: Arc<OnceLock<CancelReason>>,
    /// A claim was held under this lease before (a run repeated in place: a FIFO head's retry).
    claimed_before: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lease {
    /// A lease whose message stays invisible until `visible_until`.
    pub fn new(visible_until: Instant) -> Self {
        Self::with_token(visible_until, CancellationToken::new())
    }

    /// Sets the process's own stop (see [`Lease::process_stop`]).
    pub fn with_process_stop(mut self, stop: CancellationToken) -> Self {
        self.process_stop = Some(stop);
        self
    }

    /// The process's own stop: cancelled when the runtime stops for good (the worker's hard stop).
    /// A lease without one answers with its own cancellation.
    pub fn process_stop(&self) -> &CancellationToken {
        self.process_stop.as_ref().unwrap_or(&self.cancel)
    }

    /// A lease cancelled through `cancel` (a child of a runtime-wide token, say).
    pub fn with_token(visible_until: Instant, cancel: CancellationToken) -> Self {
        Self {
            cancel,
            process_stop: None,
            visible_until: Mutex::new(visible_until),
            latest_visible_until: Mutex::new(None),
            claim: Mutex::new(None),
            claim_held_until: Mutex::new(None),
            reason: Arc::new(OnceLock::new()),
            claimed_before: AtomicBool::new(false),
        }
    }

    /// Cancels the handler, recording why (the first reason given stands).
    pub fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.cancel.cancel();
    }

    /// The slot [`Lease::cancel`] records its reason in, shared with the run's context.
    pub fn cancel_reasons(&self) -> Arc<OnceLock<CancelReason>> {
        Arc::clone(&self.reason)
    }

    /// The token that cancels the message's handler.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// When the message becomes visible again unless extended: the earliest that may be, so
    /// extensions are planned by it.
    pub fn visible_until(&self) -> Instant {
        *lock(&self.visible_until)
    }

    /// Records an extension of the visibility deadline (counted from when the extension was sent, so
    /// exact: it ends the uncertainty of [`Lease::set_latest_visible_until`]).
    pub fn set_visible_until(&self, until: Instant) {
        *lock(&self.visible_until) = until;
        *lock(&self.latest_visible_until) = None;
    }

    /// Records that the deadline SQS applies may be as late as `latest`: a receive's answer arrives
    /// after SQS handed the message out, at a moment between the request and the answer that the
    /// consumer cannot see. [`Lease::visible_until`] is then the earliest it may be (counted from the
    /// request), and this the latest (counted from the answer), until the first extension.
    pub fn set_latest_visible_until(&self, latest: Instant) {
        if latest > self.visible_until() {
            *lock(&self.latest_visible_until) = Some(latest);
        }
    }

    /// The latest the visibility deadline may be: how long an extension may still be tried, and how
    /// long the claim must be held (the handler may run until then).
    pub fn latest_visible_until(&self) -> Instant {
        lock(&self.latest_visible_until).unwrap_or_else(|| self.visible_until())
    }

    /// The end of the idempotency claim's lease, as written to the store: the visibility deadline on
    /// this host's wall clock, plus [`CLOCK_SKEW_ALLOWANCE`] so that a consumer whose clock runs ahead
    /// of this one's by up to that much still sees the claim held until the deadline has passed.
    pub fn claim_lease_until(&self) -> SystemTime {
        to_wall_clock(self.claim_lease_until_instant())
    }

    /// The claim held for this message, if any.
    pub fn claim(&self) -> Option<Claim> {
        lock(&self.claim).clone()
    }

    /// Stores the claim just acquired, whose lease the store set to end at `lease_until` (as
    /// [`Lease::claim_lease_until_instant`] gave it when the claim was sent).
    pub fn hold_claim(&self, claim: Claim, lease_until: Instant) {
        *lock(&self.claim) = Some(claim);
        *lock(&self.claim_held_until) = Some(lease_until);
        self.claimed_before.store(true, Ordering::Release);
    }

    /// Records that the store accepted an extension of the claim's lease to `lease_until` (as
    /// [`Lease::claim_lease_until_instant`] gave it when the extension was sent).
    pub fn claim_extended(&self, lease_until: Instant) {
        // A claim taken back meanwhile stays taken back.
        if let Some(held) = lock(&self.claim_held_until).as_mut()
            && *held < lease_until
        {
            *held = lease_until;
        }
    }

    /// The earliest moment another consumer may take the claim over: its lease end as the store last
    /// accepted it, less [`CLOCK_SKEW_ALLOWANCE`] (a consumer whose clock runs ahead of this one's by
    /// up to that much sees the lease end that much earlier). `None` while no claim is held.
    pub fn claim_open_to_takeover_at(&self) -> Option<Instant> {
        let held = (*lock(&self.claim_held_until))?;
        Some(held - CLOCK_SKEW_ALLOWANCE)
    }

    /// [`Lease::claim_lease_until`] on this process's clock.
    pub fn claim_lease_until_instant(&self) -> Instant {
        self.latest_visible_until() + CLOCK_SKEW_ALLOWANCE
    }

    /// True when a claim was held under this lease before: this delivery's run is being repeated in
    /// place (a FIFO head retried while its group waits).
    pub fn claimed_before(&self) -> bool {
        self.claimed_before.load(Ordering::Acquire)
    }

    /// Takes the claim back before settling it (from then on the lease holds no claim to renew).
    pub fn take_claim(&self) -> Option<Claim> {
        *lock(&self.claim_held_until) = None;
        lock(&self.claim).take()
    }
}

/// Why a run's handler was cancelled, as [`Context::cancel_reason`](crate::Context::cancel_reason)
/// tells it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The handler reached its timeout (or the Lambda invocation's deadline).
    TimedOut,
    /// The message is no longer held for this run: its visibility could not be extended, or SQS
    /// handed it to another consumer.
    VisibilityLost,
    /// The idempotency claim could not be renewed before it lapses: another delivery of the job could
    /// take it over, so this run stops first.
    ClaimNotRenewed,
    /// The idempotency claim was taken over by another run.
    ClaimTakenOver,
    /// The message reached the longest time a job may hold it (the worker's `max_processing_time`, or
    /// SQS's 12 hours).
    ProcessingTimeLimit,
    /// The runtime is stopping.
    Stopping,
}

impl std::fmt::Display for CancelReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TimedOut => "the handler reached its deadline",
            Self::VisibilityLost => "the message is no longer held for this run",
            Self::ClaimNotRenewed => "the idempotency claim could not be renewed before it lapses",
            Self::ClaimTakenOver => "the idempotency claim was taken over by another run",
            Self::ProcessingTimeLimit => "the job reached the longest time it may hold its message",
            Self::Stopping => "the runtime is stopping",
        })
    }
}

/// Converts a (tokio) instant to wall-clock time.
pub(crate) fn to_wall_clock(instant: Instant) -> SystemTime {
    let now = Instant::now();
    let wall = crate::wall_clock::now();
    if instant >= now {
        wall + (instant - now)
    } else {
        wall - (now - instant)
    }
}
