//! The per-message pipeline both runtimes call: route and decode → claim → handle → settle the claim.
//!
//! # Design note: ordering
//!
//! 1. **Decode before claim.** A body that cannot decode would fail on every delivery; claiming first
//!    would only add a write. It is rejected without touching the store.
//! 2. **Claim before handle, and fail closed.** The handler runs only under an acquired claim. If the
//!    store cannot be reached the message is retried, never run unclaimed.
//! 3. **The claim's lease is the message's visibility deadline.** If this worker dies, the claim lapses
//!    exactly when SQS delivers the message again, so the next delivery can take it over. The runtime's
//!    heartbeat extends both together through [`Lease`].
//! 4. **Settle the claim before the runtime applies the outcome.** Complete (on success) or release (on
//!    failure) happens here; the runtime deletes or re-times the message afterwards. A crash between the
//!    two leaves a completed record and a message that comes back: the next delivery is acknowledged as
//!    a duplicate without running. A release that dead-letters is tried again in a store outage, but
//!    never into the time the runtime's DLQ send needs after it ([`Budget::release_retries_until`]):
//!    given up, the DLQ copy still goes out; cut, neither would, and the message would come back
//!    and run again.
//! 5. The claim is taken out of the [`Lease`] before it is settled, so the heartbeat can no longer extend
//!    a record that is being completed or released.
//!
//! # Failure table
//!
//! Every failure ends in one of three states: done once, back in the queue, or in the DLQ with a reason.
//!
//! | failure point | what happens | why it is safe |
//! |---|---|---|
//! | a large-payload pointer ([`crate::payload`]): object fetched | the payload replaces the pointer, then as any message | the runtime keeps the original: a deferral, retry or DLQ copy carries the pointer and the object stays |
//! | pointer, but the object is missing | `Ack(Duplicate)` when the key's record says completed (a redelivery after the object was deleted); else `Reject` naming bucket and key | the payload is gone for good; nothing ran |
//! | pointer, but the payload store is unreachable or refuses (access, bucket) | `Defer` (no receive spent), handler not run | as a store outage: never dead-letters a job |
//! | pointer, but no payload store configured, or a marked body that is not a pointer | `Retry` (backoff), `Reject` at the last attempt / `Reject` | a consumer deploy with the store fixes the first; the second is poison input |
//! | job succeeded and its message was deleted | the runtime deletes the object ([`Pipeline::discard_payload`]) when the claim completed (idempotent handler with a store), unless kept; never for a duplicate or a cancel | never before the delete; a redelivery of any copy finds the completed record |
//! | a copy of a pointer message is about to be made (hop, deferral, DLQ) | the object is touched first (lifecycle restarts), a failed touch logged | the object outlives every copy ([`crate::payload`]) |
//! | body is a Conveyor envelope without attributes ([`crate::envelope`]) | opened: header → attributes, payload → body, then as any message | plain bodies are left alone |
//! | an SNS notification, EventBridge event, S3 notification or CloudEvent ([`crate::events`]) | opened (SNS's message opened again), routed by its own route, keyed by its id | plain bodies are left alone; detection asks for each envelope's whole shape |
//! | such an envelope, malformed (an SNS `Message` not a string, an event without `detail-type`, a CloudEvent without `type`) | `Reject` naming the field | poison input: the message will not change; nothing ran |
//! | an event no route takes | `Retry` (backoff); `Reject` with the reason on the last allowed attempt | as an unknown job type: a consumer deploy with the route and a redrive run it |
//! | S3's test event | `Ack(Ignored)`, nothing run | it carries no job |
//! | an SNS `SubscriptionConfirmation` / `UnsubscribeConfirmation` without `Router::sns_subscription` | `Ack(Ignored)`, nothing run, a warning naming the topic and what to do (never the token or URL) | it carries no job; left in the queue it would only reach the DLQ |
//! | not due yet (a delay past 15 minutes, [`crate::delay`]) | `Defer` by the rest of the delay, at most 15 minutes (no receive spent), before anything else | nothing ran; the copy keeps key, attributes and first-sent time |
//! | delayed job cancelled ([`crate::delay::cancel`]): first sent before the key's cancel marker | `Ack(Cancelled)` without running, logged, checked before the due check (so it stops hopping) | the producer asked for it; a job sent after the cancel runs |
//! | cancel marker unreadable | a hop goes on; a due job `Defer`s | nothing runs unchecked |
//! | no handler for the job type, or no type and no default route | `Retry` (backoff); `Reject` with the reason on the last allowed attempt | producers often deploy first; nothing ran; a redrive after the consumer's deploy runs it |
//! | schema version newer than the handler's | `Retry` (backoff); `Reject` on the last attempt | as above |
//! | schema version not a number, body does not decode | `Reject` | poison input: the body will not change; nothing ran |
//! | store unreachable or refusing the claim | `Defer` (a delayed copy; no receive spent), handler not run | fail closed: never run unclaimed, and an outage of the store never dead-letters a job |
//! | key completed before | `Ack(Duplicate)` without running | the effect already happened once |
//! | key in progress elsewhere | `Defer` until the other lease ends (no receive spent) | the other worker finishes (the copy is acked as a duplicate) or its lease lapses (the copy takes over); a duplicate never reaches the DLQ |
//! | same key, different payload (validation on) | `Reject` | a producer bug; running would apply the wrong payload |
//! | handler returns a retryable error, panics or times out (still running when the grace after its timeout ends, or returning an error within it) | release claim, `Retry` (backoff) | the retry can claim again |
//! | handler returns `Ok` after its timeout or a cancellation, within the grace | as a success: complete claim, `Ack` | the work is done; running it again would repeat an effect that cannot be taken back (`run`'s design note) |
//! | the same, on the last attempt the redrive policy allows | release claim, `Reject` with the last error | the DLQ copy says why (SQS's own redrive would move it without a reason). Attempts count runs, never receives: the store's run count ([`Claim::run`](crate::Claim::run), which also counts the runs of earlier copies and runs a runtime repeats in place; see [`run_number`]) |
//! | a retry at the message's last allowed receive with runs left (receives that went by unrun: a FIFO message behind its group) | the runtime decides by [`retry_path`](crate::runtime::retry_path): a standard queue's retry goes on a fresh copy carrying the runs; a FIFO message is retried in place while the runtime can hold it, then dead-lettered with the reason (`receives_exhausted`, status `dead_lettered`) | put back, SQS's redrive would move it at its next receive without a reason |
//! | claimed with the runs already spent (the last run's reject was sent but the message came back: its delete failed) | release claim, `Reject` (retries exhausted) without running | never a run over the budget; a DLQ redrive (a message carrying the failure attribute) starts its count at 1 |
//! | handler returns a permanent error | release claim, `Reject` | retrying cannot help |
//! | run cancelled (lease lost, shutdown) | release claim, `Retry` at once (`Defer` on the last attempt) | another delivery runs it; the claim is free for it; a cancellation never spends the last receive |
//! | complete fails (store down) | tried again (the worker: up to [`COMPLETE_RETRY_LIMIT`], even past a lost lease, until its hard stop; Lambda: until its settle deadline); then `Ack` anyway, logged | the work is done; deleting the message stops SQS redelivery. Only when the tries end first does the record stay in progress until its lease lapses, so a redelivery or a producer re-send after that could run again (the at-least-once window) |
//! | complete fenced (lease taken over) | `Ack`, logged as a possible double run | only after a lapsed lease, which the heartbeat prevents |
//! | output too large for the store | complete without output, `Ack` | succeeded work never becomes a failure |
//! | release fails | outcome unchanged | the record lapses with the lease; the retry waits for it |
//! | worker dies anywhere | message reappears after its visibility timeout, claim lapses at the same time | the next delivery claims and runs it, or acks it if it was completed |
//! | DLQ send fails (applied by the runtime, [`reject`](crate::reject)) | message stays, visible after its backoff | nothing deleted before the DLQ has a copy |
//! | a progress write fails or is fenced (tracked jobs) | logged; the next report tries again (a fenced one stops them) | progress is advisory; the last report rides on complete or release |
//! | counting a flow child's end fails, or sending the flow's parent fails | `Defer` instead of the outcome | the child's record is settled; its copy comes back as a duplicate and repeats the flow step (see [`crate::flow`]) |
//! | a flow child whose flow has no records here (expired, another table) | its own outcome stands, logged as an error | final: deferring would loop; the deadline sweep never needed it |
//! | reading a flow parent's children fails | `Defer`, handler not run | the parent runs later with every output |
//! | a flow parent whose flow has no records here | `Reject` with the reason, not run | final and kept in the DLQ to redrive once the table is right |
//! | a failure notice (`FailParent`): the first copy / a second copy or a resumed flow's | `Reject` with the child's reason / `Ack`, not run | one DLQ entry per failed flow; a resumed flow's parent runs instead |

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::context::Context;
use crate::delay::{CancelCheck, Clock, check_cancelled, due_at, next_hop, system_clock};
use crate::flow::Flows;
use crate::flow_step;
use crate::handler::{ErasedHandler, HandlerSettings, PreparedJob};
use crate::idempotency::{
    Claim, ClaimOutcome, ClaimRequest, EXPIRY_PAST_LEASE, IdempotencyRecord, IdempotencyStore, RecordStatus,
    StoreError, wait_for_lease,
};
use crate::lease::Lease;
use crate::limits::MAX_DELAY;
use crate::message::Message;
use crate::outcome::{AckReason, DeferCause, Failure, Origin, Outcome, RunResult, classify};
use crate::payload::{PayloadError, PayloadPointer, Payloads, ResolveError};
use crate::progress::{ProgressReporter, ProgressWriter};
use crate::router::{Opening, Router};
use crate::store_health::StoreHealth;
use crate::store_retry::StoreRetry;
use crate::tracking::{JobChange, JobStatus, status_after};

/// How long a cancelled handler may take to return on its own before its future is dropped.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// The key [`Pipeline::check_store`] reads: no job's key (those are namespaced by job type).
const STORE_PROBE_KEY: &str = "conveyor:probe#start-up";
/// How long a job waits when the idempotency store cannot be reached (half to all of it, jittered).
const STORE_OUTAGE_DEFERRAL: Duration = Duration::from_secs(30);

/// The per-message pipeline. Cheap to clone; share one per runtime.
#[derive(Clone)]
pub struct Pipeline {
    router: Router,
    store: Option<Arc<dyn IdempotencyStore>>,
    /// Overrides every handler's retry budget (a deployment's choice).
    retry_budget: Option<Backoff>,
    /// The wall clock due times are judged by ([`crate::delay`]).
    clock: Clock,
    /// The longest hop of a job not due yet (SQS's 15 minutes unless a test shortens it).
    max_hop: Duration,
    /// Flow bookkeeping, when flows are on (see [`crate::flow`]).
    flows: Option<Flows>,
    timers: Option<crate::timer::Timers>,
    /// Large payloads (claim check), when on (see [`crate::payload`]).
    payloads: Option<Payloads>,
    /// What the store's last answered claim said about its configuration.
    store_health: StoreHealth,
    /// How message spans relate to the producer's span (feature `otel`).
    trace_relation: crate::trace::ProducerRelation,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("router", &self.router)
            .field("store", &self.store.is_some())
            .field("retry_budget", &self.retry_budget.map(|backoff| backoff.budget))
            .field("max_hop", &self.max_hop)
            .finish()
    }
}

/// What a runtime knows about the limits of one delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct Budget {
    /// Bounds the handler beyond its own timeout (the Lambda invocation's deadline).
    pub run_deadline: Option<Instant>,
    /// The runs the queue's redrive policy allows (`maxReceiveCount`); `None` when it has no DLQ.
    pub max_attempts: Option<u32>,
    /// Store calls (claim, complete, release) and a cancelled handler's grace end by this (the Lambda
    /// invocation's deadline less a reserve for the response); `None`: only the clients' own deadlines.
    pub settle_deadline: Option<Instant>,
    /// A release that dead-letters (a rejected run's) is tried again in a store outage until this at
    /// most, then given up: the runtime still has to send the message to the DLQ after it (the Lambda:
    /// its handlers' cutoff, which keeps the settle reserve for that send). Its first try is bounded by
    /// `settle_deadline` only. `None`: until [`COMPLETE_RETRY_LIMIT`] or the process stops.
    pub release_retries_until: Option<Instant>,
    /// A handler told to stop (its deadline came, or its lease was lost) has until this to return a
    /// result that stands (see the design note on `run`), never more than [`CANCEL_GRACE`] and never
    /// past `settle_deadline`. A runtime with a hard deadline (Lambda's invocation) sets it to where
    /// its settle reserve begins, so that a late `Ok`'s completion still lands. `None`: the whole
    /// [`CANCEL_GRACE`], up to `settle_deadline`.
    pub grace_until: Option<Instant>,
}

/// What the pipeline did with one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    /// What the runtime must do with the message.
    pub outcome: Outcome,
    /// The job type that handled it, when one was found.
    pub job_type: Option<&'static str>,
    /// How long the handler ran, when it ran.
    pub handler_duration: Option<Duration>,
    /// The output as JSON: the new one, or the stored one for a duplicate.
    pub output: Option<String>,
    /// Which run of the job this was by the store's count ([`Claim::run`](crate::port::Claim::run)), when
    /// a claim was taken; a runtime that applies the last-attempt rules itself counts this, not only
    /// the receive count.
    pub run: Option<u32>,
}

impl Processed {
    /// The result for a message whose handler did not run (no output, no claim): what a runtime
    /// settles itself (a deferral it decided, a dead-lettering at the last receive).
    pub fn not_run(outcome: Outcome, job_type: Option<&'static str>) -> Self {
        Self {
            outcome,
            job_type,
            handler_duration: None,
            output: None,
            run: None,
        }
    }

    /// True when the handler ran.
    pub fn ran(&self) -> bool {
        self.handler_duration.is_some()
    }

    /// Which run of the job this was, the count the retry budget spends ([`run_number`]).
    pub fn attempt(&self, message: &Message) -> u32 {
        run_number(message, self.run)
    }

    /// The backoff delay to use if a reject cannot reach the DLQ.
    pub fn fallback_delay(&self) -> Duration {
        match &self.outcome {
            Outcome::Retry { delay, .. } | Outcome::Defer { delay, .. } => *delay,
            _ => Duration::from_secs(60),
        }
    }
}

/// Which run of a job `message` carries, the count its retry budget spends: the store's count when the
/// job was claimed (`claimed_run`, [`Claim::run`]: it counts runs a runtime repeated in place and the
/// runs of earlier copies), never less than the runs an earlier copy carries plus this one (a record
/// that expired between two runs starts its count again); unclaimed, the receive count plus the runs
/// of earlier copies, all there is. Receives a message spent without running (a FIFO message behind
/// its group) never count: they bound how long a message is held ([`retry_path`](crate::runtime::retry_path)).
pub fn run_number(message: &Message, claimed_run: Option<u32>) -> u32 {
    match claimed_run {
        Some(run) => run.max(message.runs_before().saturating_add(1)),
        None => message.attempt(),
    }
}

impl Pipeline {
    /// A pipeline without idempotency.
    pub fn new(router: Router) -> Self {
        Self {
            router,
            store: None,
            retry_budget: None,
            clock: system_clock(),
            max_hop: MAX_DELAY,
            flows: None,
            timers: None,
            payloads: None,
            store_health: StoreHealth::default(),
            trace_relation: crate::trace::ProducerRelation::default(),
        }
    }

    /// Makes the span that sent a job the parent of the span each run of it is processed in, instead of
    /// a link (OpenTelemetry's default for messaging; see [`crate::trace::ProducerRelation`]). Takes
    /// effect with the `otel` feature.
    pub fn with_trace_relation(mut self, relation: crate::trace::ProducerRelation) -> Self {
        self.trace_relation = relation;
        self
    }

    /// The span of one message in a runtime: [`crate::trace::message_span`] with this pipeline's
    /// [`Pipeline::with_trace_relation`].
    pub fn message_span(&self, message: &Message, queue: &str) -> tracing::Span {
        // An SNS notification (raw delivery off) carries the publisher's context inside its body's
        // `MessageAttributes`: the span reads it from the opened message (with `otel` only: opening
        // parses the body).
        if cfg!(feature = "otel")
            && message.job_type().is_none()
            && message
                .string_attribute(crate::trace::TRACEPARENT_ATTRIBUTE)
                .is_none()
            && let Some(opened) = self.router.opened(message)
        {
            return crate::trace::message_span(&opened, queue, self.trace_relation);
        }
        crate::trace::message_span(message, queue, self.trace_relation)
    }

    /// Judges due times ([`crate::delay`]) by `clock` instead of the system clock (tests: a fast clock).
    #[doc(hidden)] // a test hook: the tests run hours of time on a fast clock
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The time due times are judged by: the system clock, or the one [`Pipeline::with_clock`] set.
    /// Runtimes ask it too when they decide how long a job not due yet may stay away.
    pub fn now(&self) -> std::time::SystemTime {
        (self.clock)()
    }

    /// The longest a job not due yet may stay away from its consumers without a copy being made (a
    /// runtime's fallback when a hop cannot be sent: the message is kept and hidden instead): SQS's 12
    /// hours, and for a message with a large-payload pointer at most one touch period
    /// ([`Payloads::touch_every`]), so its object is touched as often as a hopping job's and outlives it.
    pub fn longest_stay_away(&self, message: &Message) -> Duration {
        let longest = crate::limits::MAX_VISIBILITY_TIMEOUT;
        match (&self.payloads, PayloadPointer::of(message)) {
            (Some(payloads), Some(_)) => longest.min(payloads.touch_every),
            _ => longest,
        }
    }

    /// Re-sends a job that is not due yet at least every `max_hop` (default, and at most, SQS's 15
    /// minutes; tests shorten it together with a fast [`Pipeline::with_clock`]).
    #[doc(hidden)] // a test hook: the tests run hours of time on a fast clock
    pub fn with_max_delay_hop(mut self, max_hop: Duration) -> Self {
        self.max_hop = max_hop.min(MAX_DELAY);
        self
    }

    /// The flows, when on: a worker runs their deadline sweep ([`crate::FlowSweeper`]) beside its jobs.
    pub fn flows(&self) -> Option<&Flows> {
        self.flows.as_ref()
    }

    /// The queue's timer table, when on: a worker runs a [`crate::TimerRelay`] for it beside its jobs, and
    /// the Lambda adapter relays it when invoked with `{"conveyor": "relay_timers"}`.
    pub fn timers(&self) -> Option<&crate::timer::Timers> {
        self.timers.as_ref()
    }

    /// Relays the due jobs of `timers` (the long delays a producer kept with `Producer::with_timers`)
    /// from this pipeline's runtime: see [`Pipeline::timers`].
    pub fn with_timers(mut self, timers: crate::timer::Timers) -> Self {
        self.timers = Some(timers);
        self
    }

    /// Counts flow children's ends in `flows.store` and sends parents through `flows.sender` (see
    /// `src/flow.rs`).
    pub fn with_flows(mut self, flows: Flows) -> Self {
        self.flows = Some(flows);
        self
    }

    /// Gives every handler this retry budget instead of its own (`HandlerSettings::backoff`): a
    /// deployment's choice, such as a short budget on a staging queue.
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = Some(Backoff::with_budget(budget));
        self
    }

    fn backoff(&self, settings: &HandlerSettings) -> Backoff {
        self.retry_budget.unwrap_or(settings.backoff)
    }

    /// Claims an idempotency record for every handler whose settings are idempotent.
    pub fn with_store(mut self, store: Arc<dyn IdempotencyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Resolves large-payload pointers (SQS Extended Client format) through `payloads.store` before
    /// decoding, and lets the runtimes delete the object after success (see [`PayloadStore`](crate::port::PayloadStore)).
    pub fn with_payloads(mut self, payloads: Payloads) -> Self {
        self.payloads = Some(payloads);
        self
    }
}

/// The runtime side: what `conveyor-worker`, `conveyor-lambda` and the simulator call for each message. A
/// handler or a `main` never needs these.
impl Pipeline {
    /// The large-payload settings, when on.
    pub fn payloads(&self) -> Option<&Payloads> {
        self.payloads.as_ref()
    }

    /// True when the runtime must call [`Pipeline::discard_payload`] once `message`'s delete after a
    /// success (`Ack(Completed)`, never a duplicate or a cancel) is confirmed: it carries a pointer,
    /// objects are deleted after success, and its handler is idempotent with a store (the completed
    /// record answers for every other copy).
    pub fn discards_payload_of(&self, message: &Message) -> bool {
        self.payloads
            .as_ref()
            .is_some_and(|payloads| payloads.delete_after_success)
            && matches!(PayloadPointer::of(message), Some(Ok(_)))
            // Only a completed claim makes every other copy a duplicate that needs no object.
            && self.store.is_some()
            && self
                .router
                .handler_for(message)
                .is_ok_and(|handler| handler.settings().idempotent)
    }

    /// Deletes the payload object of `message` (the original, pointer-carrying one) after its job
    /// succeeded and its delete from the queue was confirmed. Never call it after a failure, a retry,
    /// a deferral or a DLQ: those copies still point at the object. A failed delete is logged; the
    /// bucket's lifecycle rule removes the object later.
    pub async fn discard_payload(&self, message: &Message) {
        if !self.discards_payload_of(message) {
            return;
        }
        let (Some(payloads), Some(Ok(pointer))) = (&self.payloads, PayloadPointer::of(message)) else {
            return;
        };
        if !payloads.owns(&pointer.bucket) {
            tracing::info!(
                %pointer,
                own_bucket = payloads.own_bucket.as_deref(),
                "payload object not deleted after success: it is in another bucket than this consumer's \
                 (CONVEYOR_PAYLOAD_BUCKET); that bucket's lifecycle rule removes it"
            );
            return;
        }
        match payloads.store.delete(&pointer.bucket, &pointer.key).await {
            Ok(()) => tracing::debug!(%pointer, "payload object deleted after success"),
            Err(error) => tracing::warn!(
                %error,
                %pointer,
                "could not delete the payload object after success; the bucket's lifecycle rule removes it"
            ),
        }
    }

    /// Probes the idempotency store once (a read of a key no job uses), so a runtime can refuse to
    /// start against a store it cannot use: `Err(Misconfigured)` (a table that does not exist, access
    /// denied) carries what to fix. An outage is not a configuration error: it is logged and `Ok`, and
    /// jobs defer until the store answers. `Ok` without a store, or when no handler is idempotent.
    ///
    /// It also refuses a tracked handler with the Powertools key style: `send_tracked` cannot know the
    /// consumer's Powertools key, and Powertools consumers sharing the records write no status.
    pub async fn check_store(&self) -> Result<(), StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        check_tracking(&self.router)?;
        if !self
            .router
            .settings()
            .iter()
            .any(|(_, settings)| settings.idempotent)
        {
            return Ok(());
        }
        match store.get(STORE_PROBE_KEY).await {
            Ok(_) => Ok(()),
            Err(error @ StoreError::Misconfigured { .. }) => Err(error),
            Err(error) => {
                tracing::warn!(%error, "the idempotency store does not answer at start; jobs wait for it (an outage, not a configuration error)");
                Ok(())
            }
        }
    }

    /// Whether the store's last answered claim said it is misconfigured (a runtime's readiness reports
    /// it); every clone of the handle follows the pipeline.
    pub fn store_health(&self) -> StoreHealth {
        self.store_health.clone()
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The store, when idempotency is on.
    pub fn store(&self) -> Option<&Arc<dyn IdempotencyStore>> {
        self.store.as_ref()
    }

    /// Runs one message through decode → claim → handle → settle, and returns the outcome. A flow
    /// child's end is counted in its flow before the outcome goes back (see `src/flow.rs`).
    pub async fn process(
        &self,
        message: Arc<Message>,
        queue: Arc<str>,
        lease: &Lease,
        budget: Budget,
    ) -> Processed {
        let max_attempts = budget.max_attempts;
        let processed = self
            .run_message(Arc::clone(&message), Arc::clone(&queue), lease, budget)
            .await;
        let processed = self.after_flow_child(&message, processed).await;
        let processed = self
            .bounded_deferral(&message, &queue, max_attempts, processed)
            .await;
        self.keep_payload(&message, &processed.outcome).await;
        processed
    }

    /// A deferral past its cause's bound becomes a dead-lettering with the cause
    /// ([`past_its_bound`](crate::runtime::past_its_bound)); a tracked job's status then says
    /// `dead_lettered` (asked once: see `src/unrun.rs`).
    async fn bounded_deferral(
        &self,
        message: &Message,
        queue: &str,
        max_attempts: Option<u32>,
        processed: Processed,
    ) -> Processed {
        if !matches!(processed.outcome, Outcome::Defer { .. }) {
            return processed;
        }
        let origin = Origin {
            queue,
            handler: processed.job_type.unwrap_or(""),
            attempt: processed.attempt(message),
            receive: message.receive_count.max(1),
            max_attempts,
        };
        let outcome = crate::deferral::past_its_bound(message, processed.outcome, origin, (self.clock)());
        if let Outcome::Reject(failure) = &outcome {
            self.unrun_at_the_last_receive(message, failure, None).await;
        }
        Processed { outcome, ..processed }
    }

    /// Touches the large-payload object of `message` before the runtime sends a new message pointing
    /// at it (a DLQ copy always; a hop or deferred copy once per `touch_every`), so the object outlives
    /// every copy (see `crate::payload`'s design note).
    async fn keep_payload(&self, message: &Message, outcome: &Outcome) {
        match outcome {
            Outcome::Reject(_) => self.touch_payload(message).await,
            Outcome::Defer { .. } => self.touch_payload_when_due(message).await,
            _ => {}
        }
    }

    /// Before a runtime sends a copy of `message` that never went through [`Pipeline::process`] (a
    /// message deferred unrun: not started before a Lambda invocation's cutoff, at a worker's shutdown,
    /// or held back by a concurrency limit or an open circuit): touches its large-payload object when
    /// due, as the pipeline's own deferrals do, so the object outlives the copy. Nothing for a message
    /// without a pointer or a pipeline without payloads.
    pub async fn before_unrun_copy(&self, message: &Message) {
        self.touch_payload_when_due(message).await;
    }

    /// Touches the object when a copy made now starts a new period of `touch_every`.
    async fn touch_payload_when_due(&self, message: &Message) {
        let Some(payloads) = &self.payloads else {
            return;
        };
        if crate::payload::touch_due(message, (self.clock)(), payloads.touch_every) {
            self.touch_payload(message).await;
        }
    }

    async fn touch_payload(&self, message: &Message) {
        let Some(payloads) = &self.payloads else {
            return;
        };
        let Some(Ok(pointer)) = PayloadPointer::of(message) else {
            return;
        };
        match payloads.store.touch(&pointer.bucket, &pointer.key).await {
            Ok(()) => tracing::debug!(%pointer, "payload object touched before a copy"),
            Err(error) => {
                tracing::warn!(%error, %pointer, "could not touch the payload object; it expires from its last touch");
            }
        }
    }

    async fn run_message(
        &self,
        message: Arc<Message>,
        queue: Arc<str>,
        lease: &Lease,
        budget: Budget,
    ) -> Processed {
        let Budget {
            run_deadline,
            max_attempts,
            settle_deadline,
            release_retries_until,
            grace_until,
        } = budget;
        // Envelopes (Conveyor's body envelope, SNS notifications, events from AWS services) are opened
        // before anything else (see `crate::events`).
        let (message, envelopes) = match self.router.open(&message) {
            Ok(Opening::Plain) => (message, None),
            Ok(Opening::Opened { message, envelopes }) => (Arc::from(message), Some(envelopes)),
            Ok(Opening::Ignored(notice)) => {
                notice.log_acknowledged();
                return Processed::not_run(Outcome::Ack(AckReason::Ignored), None);
            }
            Err(error) => {
                let origin = Origin {
                    queue: &queue,
                    handler: "",
                    attempt: message.attempt(),
                    receive: message.receive_count.max(1),
                    max_attempts,
                };
                let backoff = self.retry_budget.unwrap_or_default();
                return Processed::not_run(classify(RunResult::Failed(error), origin, &backoff), None);
            }
        };
        // A cancelled delayed job stops here, at its next hop or when due (see `crate::delay`).
        if let Some(processed) = self.cancelled(&message).await {
            return processed;
        }
        if let Some(delay) = next_hop(&message, (self.clock)(), self.max_hop) {
            tracing::debug!(?delay, "not due yet; sending the next hop");
            let reason = "not due yet".to_owned();
            let job_type = self
                .router
                .handler_for(&message)
                .ok()
                .map(|handler| handler.job_type());
            let cause = DeferCause::NotDue;
            return Processed::not_run(Outcome::Defer { delay, reason, cause }, job_type);
        }
        let origin = Origin {
            queue: &queue,
            handler: "",
            attempt: message.attempt(),
            receive: message.receive_count.max(1),
            max_attempts,
        };
        // A large-payload pointer is resolved after the due check (a job not due yet is not fetched on
        // every hop) and before anything reads the body; the object may itself hold an envelope. The
        // runtime keeps the original message: what it sends on (a deferred copy, the DLQ copy) is the
        // pointer, and the object stays.
        let message = match self.resolve_payload(message, origin).await {
            Ok(message) => message,
            Err(processed) => return *processed,
        };
        let handler = match self.router.handler_for(&message) {
            Ok(handler) => Arc::clone(handler),
            Err(error) => {
                let backoff = self.retry_budget.unwrap_or_default();
                let outcome = classify(RunResult::Failed(error), origin, &backoff);
                return Processed::not_run(outcome, None);
            }
        };
        let job_type = handler.job_type();
        let origin = Origin {
            handler: job_type,
            ..origin
        };
        let settings = handler.settings();
        let job = match handler.prepare(&message) {
            Ok(job) => job,
            Err(error) => {
                let outcome = classify(RunResult::Failed(error), origin, &self.backoff(settings));
                return Processed::not_run(outcome, Some(job_type));
            }
        };

        if let Some(outcome) = flow_step::failure_notice(self.flows.as_ref(), &message, origin).await {
            return Processed::not_run(outcome, Some(job_type));
        }
        let flow_children = match flow_step::children(self.flows.as_ref(), &message, origin).await {
            Ok(children) => children,
            Err(outcome) => return Processed::not_run(outcome, Some(job_type)),
        };

        let store = self.store.as_ref().filter(|_| settings.idempotent);
        let (claim, idempotency_key) = match store {
            None => (None, None),
            Some(store) => match claim(
                store.as_ref(),
                handler.as_ref(),
                &message,
                origin,
                lease,
                settle_deadline,
                &self.store_health,
            )
            .await
            {
                Ok(claim) => {
                    let key = claim.key.clone();
                    (Some(claim), Some(key))
                }
                Err(processed) => return *processed,
            },
        };
        // The retry budget counts runs (`run_number`): more than the receive count when runs were
        // repeated in place (a FIFO head retried while its group waits), fewer when receives went by
        // unrun (a FIFO message behind its group).
        let claimed_run = claim.as_ref().map(|claim| claim.run);
        let origin = Origin {
            attempt: run_number(&message, claimed_run),
            ..origin
        };
        if let (Some(store), Some(claim), Some(max)) = (store, &claim, max_attempts)
            && claim.run > max
        {
            let failure = spent(
                store.as_ref(),
                claim,
                lease,
                origin,
                max,
                settle_deadline,
                settings,
            )
            .await;
            return Processed::not_run(Outcome::Reject(failure), Some(job_type));
        }

        let started = Instant::now();
        let mut deadline = started + settings.timeout;
        if let Some(run_deadline) = run_deadline {
            deadline = deadline.min(run_deadline);
        }
        // The handler's token: cancelled with the lease, and at its deadline (a grace before the drop).
        let handler_token = lease.cancellation().child_token();
        // A tracked run's progress reports go to its record (see `crate::progress`).
        let reporter = settings.tracked.then(|| Arc::new(ProgressReporter::default()));
        let writer = match (store, &claim, &reporter) {
            (Some(store), Some(claim), Some(reporter)) => Some(ProgressWriter::start(
                Arc::clone(store),
                claim.clone(),
                Arc::clone(reporter),
                settings.progress_interval,
            )),
            _ => None,
        };
        let ctx = Context::new(
            Arc::clone(&message),
            Arc::clone(&queue),
            deadline,
            handler_token.clone(),
            idempotency_key,
        )
        .with_fencing_token(claim.as_ref().map(|claim| claim.token))
        .with_progress(reporter.clone())
        .with_flow_children(flow_children)
        .with_envelopes(envelopes)
        .with_cancel_reasons(lease.cancel_reasons());
        // The time the handler actually had: its own timeout, or less when the run deadline (a Lambda
        // invocation's) comes first, so a timeout's reason names the real limit.
        let allowed = deadline.saturating_duration_since(started);
        let limits = RunLimits {
            deadline,
            allowed,
            grace_until: earliest(grace_until, settle_deadline),
        };
        let (result, output) = run(job, ctx, limits, &handler_token, lease).await;
        let handler_duration = Some(started.elapsed());
        let outcome = classify(result, origin, &self.backoff(settings));
        if let Some(writer) = writer
            && bounded(settle_deadline, writer.stop()).await.is_err()
        {
            tracing::warn!("a progress write did not finish before the deadline");
        }

        if let (Some(store), Some(claim)) = (store, claim) {
            lease.take_claim();
            // A tracked job's new status (and its last progress report) rides on the settling write.
            let change = reporter
                .map(|reporter| settled_change(job_type, &outcome, reporter.take(), origin, settings));
            let (store, change) = (store.as_ref(), change.as_ref());
            let settling = async {
                if matches!(outcome, Outcome::Ack(AckReason::Completed)) {
                    complete(store, &claim, output.as_deref(), settings, change, lease).await;
                } else {
                    release(store, &claim, change, lease, release_retries_until).await;
                }
            };
            if bounded(settle_deadline, settling).await.is_err() {
                tracing::warn!(key = %claim.key, "settling the claim did not finish before the deadline; it lapses with its lease");
            }
        }
        Processed {
            outcome,
            job_type: Some(job_type),
            handler_duration,
            output,
            run: claimed_run,
        }
    }

    /// `Some` when the delayed `message` was cancelled before it was sent (`Ack(Cancelled)`), or when
    /// it is due and its cancel marker cannot be read (`Defer`: fail closed). A hop goes on when the
    /// marker cannot be read: nothing runs.
    async fn cancelled(&self, message: &Message) -> Option<Processed> {
        let store = self.store.as_ref()?;
        due_at(message)?;
        let handler = self.router.handler_for(message).ok()?;
        let job_type = handler.job_type();
        let key = handler.settings().key_style.key(job_type, message).ok()?;
        let now = (self.clock)();
        match check_cancelled(store.as_ref(), &key, message, now).await {
            CancelCheck::Live => None,
            CancelCheck::Cancelled => {
                tracing::info!(%key, "cancelled: dropping the delayed job without running it");
                Some(Processed::not_run(
                    Outcome::Ack(AckReason::Cancelled),
                    Some(job_type),
                ))
            }
            CancelCheck::Unknown(_) if next_hop(message, now, self.max_hop).is_some() => None,
            CancelCheck::Unknown(error) => {
                tracing::warn!(%error, %key, "cannot read the cancel marker of a due job; deferring");
                let delay = crate::backoff::equal_jitter(STORE_OUTAGE_DEFERRAL);
                let reason = format!("cancel check failed: {error}");
                let cause = DeferCause::StoreUnreachable;
                Some(Processed::not_run(
                    Outcome::Defer { delay, reason, cause },
                    Some(job_type),
                ))
            }
        }
    }

    /// The message with its large payload in place of the pointer; `Err` carries the finished result
    /// when it cannot be had (see the failure table).
    async fn resolve_payload(
        &self,
        message: Arc<Message>,
        origin: Origin<'_>,
    ) -> Result<Arc<Message>, Box<Processed>> {
        let Some(found) = PayloadPointer::of(&message) else {
            return Ok(message);
        };
        let job_type = self
            .router
            .handler_for(&message)
            .ok()
            .map(|handler| handler.job_type());
        let origin = Origin {
            handler: job_type.unwrap_or(""),
            ..origin
        };
        let reject = |reason: String| {
            let failure = Failure::now(reason, origin.attempt, origin.queue, origin.handler);
            Err(Box::new(Processed::not_run(Outcome::Reject(failure), job_type)))
        };
        let pointer = match found {
            Ok(pointer) => pointer,
            Err(error) => return reject(error.to_string()),
        };
        let Some(payloads) = &self.payloads else {
            // Like an unknown job type: the consumer's deploy with a payload store fixes it.
            let error = crate::HandlerError::retryable(format!(
                "the message is a large-payload pointer to {pointer} but this consumer has no payload store: \
                 set CONVEYOR_PAYLOAD_BUCKET (or build the pipeline with Pipeline::with_payloads)"
            ));
            let backoff = self.retry_budget.unwrap_or_default();
            let outcome = classify(RunResult::Failed(error), origin, &backoff);
            return Err(Box::new(Processed::not_run(outcome, job_type)));
        };
        let error = match crate::payload::resolve(payloads.store.as_ref(), &message, &pointer).await {
            Ok(resolved) => {
                let opened = crate::envelope::open(&resolved).unwrap_or(resolved);
                return Ok(Arc::new(opened));
            }
            Err(error) => error,
        };
        match error {
            ResolveError::Store(PayloadError::NotFound { .. }) => {
                if let Some(duplicate) = self.completed_before(&message, job_type).await {
                    return Err(Box::new(duplicate));
                }
                reject(format!("{error}; the job cannot run"))
            }
            ResolveError::NotText { .. } => reject(error.to_string()),
            ResolveError::Store(_) => {
                tracing::warn!(%error, %pointer, "cannot fetch the large payload; deferring");
                let delay = crate::backoff::equal_jitter(STORE_OUTAGE_DEFERRAL);
                let reason = format!("payload fetch failed: {error}");
                let cause = DeferCause::PayloadUnavailable;
                Err(Box::new(Processed::not_run(
                    Outcome::Defer { delay, reason, cause },
                    job_type,
                )))
            }
        }
    }

    /// `Ack(Duplicate)` when `message`'s idempotency record (built without its body) says completed: a
    /// redelivery of a job whose object was deleted after its success.
    async fn completed_before(&self, message: &Message, job_type: Option<&'static str>) -> Option<Processed> {
        let store = self.store.as_ref()?;
        let handler = self.router.handler_for(message).ok()?;
        let settings = handler.settings();
        if !settings.idempotent {
            return None;
        }
        let key = settings.key_style.key(handler.job_type(), message).ok()?;
        let record = store.get(&key).await.ok()??;
        if record.status != RecordStatus::Completed {
            return None;
        }
        tracing::info!(key = %record.key, "payload gone but the job completed before: acknowledging the duplicate");
        Some(Processed {
            outcome: Outcome::Ack(AckReason::Duplicate),
            job_type,
            handler_duration: None,
            output: record.output,
            run: None,
        })
    }

    /// A flow child's end counted in its flow (the parent sent when due), before the runtime applies
    /// the outcome; see [`crate::flow`].
    async fn after_flow_child(&self, message: &Message, mut processed: Processed) -> Processed {
        if let Some(flows) = &self.flows {
            processed.outcome =
                flow_step::after_child(flows, message, processed.outcome, processed.output.as_deref()).await;
        }
        processed
    }
}

/// Claims the message's key; `Err` carries the finished result when the handler must not run.
async fn claim(
    store: &dyn IdempotencyStore,
    handler: &dyn ErasedHandler,
    message: &Message,
    origin: Origin<'_>,
    lease: &Lease,
    settle_deadline: Option<Instant>,
    health: &StoreHealth,
) -> Result<Claim, Box<Processed>> {
    let job_type = handler.job_type();
    let settings = handler.settings();
    let now = crate::wall_clock::now();
    let key = match settings.key_style.key(job_type, message) {
        Ok(key) => key,
        Err(error) => {
            // The key is part of the job: a body without it cannot be made idempotent on any delivery.
            let failure = Failure::now(error.to_string(), origin.attempt, origin.queue, job_type);
            return Err(Box::new(Processed::not_run(
                Outcome::Reject(failure),
                Some(job_type),
            )));
        }
    };
    let lease_until = lease.claim_lease_until();
    let held_until = lease.claim_lease_until_instant();
    let request = ClaimRequest {
        key,
        lease_until,
        // The in-progress record outlives its lease (as each extension keeps it), however short
        // `record_ttl` is: an expired record is free to every claimant, Powertools' included. A
        // tracked one lasts the status retention: a run SQS's redrive takes is never settled, and its
        // record is what says so.
        expires_at: (now + settings.settled_record_ttl()).max(lease_until + EXPIRY_PAST_LEASE),
        validation: settings
            .validate_payload
            .then(|| settings.key_style.validation(message)),
        restart_runs: came_back_from_a_dlq(message) && !lease.claimed_before(),
        // SQS's redrive moves the message if this receive does not settle: the record says so.
        last_attempt: origin.max_attempts.is_some_and(|max| origin.attempt >= max),
    };
    let claiming = async {
        if !settings.tracked {
            return store.claim(&request).await;
        }
        let running = JobChange::now(job_type, JobStatus::Running, origin.attempt);
        store.claim_tracked(&request, &running).await
    };
    let answer = match bounded(settle_deadline, claiming).await {
        Ok(answer) => answer,
        Err(elapsed) => Err(StoreError::Unavailable {
            message: elapsed.to_string(),
        }),
    };
    match answer {
        Ok(ClaimOutcome::Acquired(claim)) => {
            health.set_answered();
            lease.hold_claim(claim.clone(), held_until);
            Ok(claim)
        }
        Ok(ClaimOutcome::Exists(record)) => {
            health.set_answered();
            Err(Box::new(existing_record(record, &request, origin, job_type, now)))
        }
        Err(error) => {
            // A configuration error found after the start-up check (the table deleted, a policy
            // changed) is deferred like an outage, so nothing is lost, but said as what it is, and
            // the runtime's readiness reports it.
            let (reason, cause) = if matches!(error, StoreError::Misconfigured { .. }) {
                health.set_misconfigured(error.to_string());
                tracing::error!(%error, key = %request.key, "the idempotency store is misconfigured; not running unclaimed until it is fixed");
                let reason = format!("claim refused, the store is misconfigured: {error}");
                (reason, DeferCause::StoreMisconfigured)
            } else {
                tracing::warn!(%error, key = %request.key, "cannot claim the idempotency key; not running unclaimed");
                (format!("claim failed: {error}"), DeferCause::StoreUnreachable)
            };
            let delay = crate::backoff::equal_jitter(STORE_OUTAGE_DEFERRAL);
            Err(Box::new(Processed::not_run(
                Outcome::Defer { delay, reason, cause },
                Some(job_type),
            )))
        }
    }
}

/// The result for a message whose key already has a live record.
fn existing_record(
    record: IdempotencyRecord,
    request: &ClaimRequest,
    origin: Origin<'_>,
    job_type: &'static str,
    now: SystemTime,
) -> Processed {
    if let (Some(expected), Some(stored)) = (&request.validation, &record.validation)
        && expected != stored
    {
        let reason = format!(
            "idempotency key {} was used before with a different payload; the producer must use a new key \
             for a different job",
            request.key
        );
        let failure = Failure::now(reason, origin.attempt, origin.queue, job_type);
        return Processed::not_run(Outcome::Reject(failure), Some(job_type));
    }
    match record.status {
        RecordStatus::Completed => {
            tracing::info!(key = %record.key, "duplicate: already completed, acknowledging without running");
            Processed {
                outcome: Outcome::Ack(AckReason::Duplicate),
                job_type: Some(job_type),
                handler_duration: None,
                output: record.output,
                run: None,
            }
        }
        RecordStatus::InProgress | RecordStatus::Expired => {
            let fallback = request
                .lease_until
                .duration_since(now)
                .unwrap_or(Duration::from_secs(30));
            let delay = wait_for_lease(&record, now, fallback).min(crate::limits::MAX_VISIBILITY_TIMEOUT);
            tracing::info!(key = %record.key, ?delay, "in progress elsewhere; deferring until its lease ends");
            let reason = crate::outcome::IN_PROGRESS_ELSEWHERE.to_owned();
            let cause = DeferCause::KeyInProgress;
            Processed::not_run(Outcome::Defer { delay, reason, cause }, Some(job_type))
        }
    }
}

/// The earlier of two optional instants; `None` only when both are.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A run's time limits.
#[derive(Debug, Clone, Copy)]
struct RunLimits {
    /// The handler's deadline (its timeout, or the run deadline when earlier).
    deadline: Instant,
    /// How long that was, for the timeout's reason.
    allowed: Duration,
    /// A cancelled or timed-out handler's grace ends here at the latest.
    grace_until: Option<Instant>,
}

/// The deadline did not leave time for the call.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no answer before the deadline")]
struct Elapsed;

/// `call`, cut at `deadline` when there is one.
async fn bounded<T>(
    deadline: Option<Instant>,
    call: impl std::future::Future<Output = T>,
) -> Result<T, Elapsed> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, call).await.map_err(|_| Elapsed),
        None => Ok(call.await),
    }
}

/// Why a run was told to stop before it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// It reached its deadline.
    TimedOut,
    /// Its lease was lost, or the runtime is shutting down.
    Cancelled,
}

/// What a handler's future gave: its result, or the payload of its panic.
type Finished = std::thread::Result<Result<Option<String>, crate::HandlerError>>;

/// Runs the handler with its deadline, panic catching and cancellation. A handler that is cancelled
/// (lease lost, shutdown) or reaches its deadline sees its context cancelled first and gets a grace
/// period ([`CANCEL_GRACE`], never past `grace_until`) to return before its future is dropped.
///
/// # Design note: a result that arrives before the run is dropped stands
///
/// A handler told to stop may already have done its work: an email API call on the wire when the
/// deadline came cannot be taken back. What it returns within its grace is what happened, so it is
/// judged by [`late_result`], the one place that does, on timeout as on cancellation (a batch call's
/// results reach each job's run through this same path): `Ok` is a success (the claim completes and
/// the job is not run again); an error is the stop's own failure (a timeout retries with the
/// backoff, a cancellation at once); a panic is a panic. Only a handler still running when its grace
/// ends is timed out or cancelled.
async fn run(
    job: PreparedJob,
    ctx: Context,
    limits: RunLimits,
    handler_token: &tokio_util::sync::CancellationToken,
    lease: &Lease,
) -> (RunResult, Option<String>) {
    let cancel = lease.cancellation().clone();
    let mut handler = AssertUnwindSafe(job(ctx)).catch_unwind();
    let stopped = tokio::select! {
        biased;
        result = tokio::time::timeout_at(limits.deadline, &mut handler) => match result {
            Ok(finished) if cancel.is_cancelled() => return late_result(finished, Stopped::Cancelled, limits),
            Ok(finished) => return judge(finished),
            Err(_) => Stopped::TimedOut,
        },
        () = cancel.cancelled() => Stopped::Cancelled,
    };
    // Tell the handler (a cancellation reached its token already), let it wind down within the
    // grace, then drop it.
    handler_token.cancel();
    let grace_end = {
        let end = Instant::now() + CANCEL_GRACE;
        limits.grace_until.map_or(end, |until| end.min(until))
    };
    match tokio::time::timeout_at(grace_end, &mut handler).await {
        Ok(finished) => late_result(finished, stopped, limits),
        Err(_) => (stopped_result(stopped, limits), None),
    }
}

/// A handler that returned before it was told to stop: its own result.
fn judge(finished: Finished) -> (RunResult, Option<String>) {
    match finished {
        Err(panic) => (RunResult::Panicked(panic_message(panic.as_ref())), None),
        Ok(Err(error)) => (RunResult::Failed(error), None),
        Ok(Ok(output)) => (RunResult::Succeeded, output),
    }
}

/// A handler that returned after it was told to stop (`stopped`), within its grace: its `Ok` stands
/// (the work is done), its error is the stop's failure (it may be no more than "I was told to stop"),
/// its panic a panic. See the design note on [`run`].
fn late_result(finished: Finished, stopped: Stopped, limits: RunLimits) -> (RunResult, Option<String>) {
    match finished {
        Ok(Ok(output)) => {
            if stopped == Stopped::TimedOut {
                tracing::info!(allowed = ?limits.allowed, "handler returned ok after its timeout, within its grace: its result stands");
            }
            (RunResult::Succeeded, output)
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, ?stopped, "a handler told to stop returned an error");
            (stopped_result(stopped, limits), None)
        }
        Err(panic) => (RunResult::Panicked(panic_message(panic.as_ref())), None),
    }
}

/// The failure of a run that `stopped` ended.
fn stopped_result(stopped: Stopped, limits: RunLimits) -> RunResult {
    match stopped {
        Stopped::TimedOut => RunResult::TimedOut(limits.allowed),
        Stopped::Cancelled => RunResult::Cancelled,
    }
}

/// What a caught panic said.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        return (*text).to_owned();
    }
    if let Some(text) = payload.downcast_ref::<String>() {
        return text.clone();
    }
    "non-string panic payload".to_owned()
}

/// The first wait between tries of a completion the store did not answer (doubling, jittered).
const COMPLETE_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between tries of a completion.
const COMPLETE_RETRY_LONGEST: Duration = Duration::from_millis(500);
/// The job's runs are spent (its last run was rejected, but that move to the DLQ did not land, so the
/// message came back): it goes to the DLQ now, without another run over the budget.
async fn spent(
    store: &dyn IdempotencyStore,
    claim: &Claim,
    lease: &Lease,
    origin: Origin<'_>,
    max: u32,
    settle_deadline: Option<Instant>,
    settings: &HandlerSettings,
) -> Failure {
    lease.take_claim();
    let error = format!(
        "not run again: its {max} allowed runs are spent (this would be run {}); the last one's move to the \
         DLQ did not land, so the message came back",
        claim.run
    );
    tracing::warn!(key = %claim.key, run = claim.run, max, "runs spent; dead-lettering without running");
    let mut failure = Failure::now(error, origin.attempt, origin.queue, origin.handler);
    failure.retries_exhausted = true;
    // A tracked claim wrote `running`: the release says `dead_lettered` again (nothing runs).
    let change = settings.tracked.then(|| {
        let outcome = Outcome::Reject(failure.clone());
        settled_change(origin.handler, &outcome, None, origin, settings)
    });
    let releasing = async {
        match &change {
            Some(change) => store.release_tracked(claim, change).await,
            None => store.release(claim).await,
        }
    };
    if bounded(settle_deadline, releasing).await.is_err() {
        tracing::warn!(key = %claim.key, "releasing the claim did not finish before the deadline; it lapses with its lease");
    }
    failure
}

/// Refuses a tracked handler ([`HandlerSettings::tracked`]) with the Powertools key style: its
/// records are keyed as a Powertools consumer keys them (function name and a hash of the body), which
/// a producer's `send_tracked` cannot know, and the Powertools consumers sharing those records write
/// no status, so `jobs show` would lie for every job they run.
fn check_tracking(router: &Router) -> Result<(), StoreError> {
    for (job_type, settings) in router.settings() {
        if settings.tracked
            && settings.idempotent
            && matches!(settings.key_style, crate::KeyStyle::Powertools(_))
        {
            return Err(StoreError::Misconfigured {
                message: format!(
                    "job type {job_type} is tracked (HandlerSettings::tracked) with the Powertools key style: a \
                     producer's send_tracked writes the sent status under Conveyor's key, which this consumer \
                     never claims, and Powertools consumers sharing the records write no status. Keep the \
                     Conveyor key style for tracked jobs (deduplicating with a Powertools consumer needs the \
                     Powertools style: track those jobs from the Powertools side, or not at all)"
                ),
            });
        }
    }
    Ok(())
}

/// A tracked job's change for `outcome`: its status and error, the last progress report, and, for a
/// final status, the record kept for the status retention.
///
/// # Design note: a rejection whose DLQ send fails
///
/// The release writes `dead_lettered` before the runtime sends the DLQ copy (the record is settled
/// first, step 4 of the ordering above). If that send fails, the message stays and comes back. Were it
/// claimed as any retry, the job would run again (`dead_lettered` → `running` → ...), and a status
/// read in between would lie both ways. So a rejection also spends the runs (the record's run count
/// becomes the redrive policy's `maxReceiveCount`, [`JobChange::spend_runs`]): the comeback's claim is
/// over the budget and takes the "runs spent" row of the failure table: released as `dead_lettered`
/// again, not run, and sent to the DLQ again (or moved there by SQS's redrive once its receives are
/// spent). `dead_lettered` is then what happened: the job never runs again from this queue, and its
/// message ends in the DLQ. A redrive back from the DLQ restarts the count and runs it, truthfully
/// `running`.
fn settled_change(
    job_type: &str,
    outcome: &Outcome,
    progress: Option<crate::tracking::Progress>,
    origin: Origin<'_>,
    settings: &HandlerSettings,
) -> JobChange {
    let (status, error) = status_after(outcome);
    let mut change = JobChange {
        error,
        progress,
        ..JobChange::now(job_type, status, origin.attempt)
    };
    if status == JobStatus::DeadLettered {
        change.spend_runs = origin.max_attempts;
    }
    if status.is_final() {
        let until = change.at + settings.settled_record_ttl();
        return change.keep_until(until);
    }
    change
}

/// A DLQ copy moved back to its queue (a redrive): it carries the failure that sent it there, it is
/// not a deferred copy, and this is its first receive. Its runs count from 1 again.
fn came_back_from_a_dlq(message: &Message) -> bool {
    message.receive_count <= 1
        && message.attributes.contains_key(crate::message::FAILURE_ATTRIBUTE)
        && !message
            .attributes
            .contains_key(crate::message::DEFERRAL_ATTRIBUTE)
}

/// How long a completion the store does not answer is tried (a store outage longer than this leaves
/// the record in progress until its lease lapses).
pub const COMPLETE_RETRY_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Completes the claim of a run that succeeded (recording a tracked job's `change` in the same
/// write); any other outcome releases it ([`release`]). Never changes the outcome.
///
/// A completion the store does not answer (`Unavailable`) is tried again, for up to
/// [`COMPLETE_RETRY_LIMIT`]: until the process stops ([`Lease::process_stop`], the worker's hard
/// stop) or the caller's deadline cuts it (the Lambda invocation's settle deadline, see [`Budget`]).
/// The job's effect happened; a completion that never lands would let a later duplicate run it again
/// once the claim lapses. A lost lease does not stop the tries: the message may come back, and a
/// completion that lands before its next delivery claims makes that delivery a duplicate (one that
/// lands after a takeover is fenced, harmlessly). What stays is the at-least-once window: the process
/// dies, or the Lambda invocation ends, in a store outage between the effect and the completion.
async fn complete(
    store: &dyn IdempotencyStore,
    claim: &Claim,
    output: Option<&str>,
    settings: &HandlerSettings,
    change: Option<&JobChange>,
    lease: &Lease,
) {
    let expires_at = crate::wall_clock::now() + settings.settled_record_ttl();
    let complete = |output| async move {
        match change {
            Some(change) => store.complete_tracked(claim, output, expires_at, change).await,
            None => store.complete(claim, output, expires_at).await,
        }
    };
    let mut output = output;
    let mut retry = completion_retry(lease, None);
    let result = loop {
        match complete(output).await {
            Err(StoreError::OutputTooLarge { size, limit, .. }) if output.is_some() => {
                tracing::warn!(size, limit, key = %claim.key, "output too large for the store; completing without it");
                output = None;
            }
            Err(error @ StoreError::Unavailable { .. }) => {
                tracing::warn!(%error, key = %claim.key, "the completion did not land; trying again");
                if !retry.after(&error).await {
                    break Err(error);
                }
            }
            other => break other,
        }
    };
    match result {
        Ok(()) => {}
        Err(StoreError::Fenced { .. }) => tracing::error!(
            key = %claim.key,
            "claim was taken over while the handler ran (its lease lapsed): the job may have run twice"
        ),
        Err(error) => tracing::error!(
            %error,
            key = %claim.key,
            "job succeeded but its record could not be completed; acknowledging anyway"
        ),
    }
}

/// Releases the claim (recording a tracked job's `change`). A release that dead-letters a tracked
/// job is tried again while the store is unavailable, as a completion is: its message leaves for the
/// DLQ, and a status left `running` would say so until the record expired. Any other release is tried
/// once: the claim lapses with its lease, and the job's next run writes its status.
///
/// The tries of a release that dead-letters end by `retries_until` too ([`Budget::release_retries_until`]):
/// the DLQ send comes after the release (the design note's point 4), and a release that took the time
/// the send needs would leave both undone: the message listed, back in the queue, its claim lapsed
/// without the spent runs that stop a comeback, so the rejected job ran again (seed 9324). Given up, the
/// DLQ copy still goes out with its reason; only the status stays what the run's claim wrote.
async fn release(
    store: &dyn IdempotencyStore,
    claim: &Claim,
    change: Option<&JobChange>,
    lease: &Lease,
    retries_until: Option<Instant>,
) {
    let Some(change) = change else {
        if let Err(error) = store.release(claim).await {
            tracing::warn!(%error, key = %claim.key, "could not release the claim; it lapses with its lease");
        }
        return;
    };
    let mut retry = completion_retry(lease, retries_until);
    loop {
        let error = match store.release_tracked(claim, change).await {
            Ok(()) => return,
            Err(error) => error,
        };
        let again = change.status.is_final() && retry.after(&error).await;
        if !again {
            tracing::warn!(%error, key = %claim.key, status = %change.status, "could not release the claim; it lapses with its lease");
            return;
        }
        tracing::warn!(%error, key = %claim.key, "the release did not land; trying again");
    }
}

/// The tries of a completion (or a final release): [`COMPLETE_RETRY_LIMIT`] at most, until the
/// process stops, and by `until` when given.
fn completion_retry(lease: &Lease, until: Option<Instant>) -> StoreRetry<'_> {
    let limit = Instant::now() + COMPLETE_RETRY_LIMIT;
    StoreRetry::new(
        COMPLETE_RETRY_FIRST,
        COMPLETE_RETRY_LONGEST,
        until.map_or(limit, |until| until.min(limit)),
    )
    .until_stopped(lease.process_stop())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde::Deserialize;
    use tokio::time::Instant;

    use super::*;
    use crate::handler::Handler;
    use crate::message::{AttributeValue, JOB_TYPE_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE};
    use crate::{Context, HandlerError};

    /// Version 2 of an invoice job: amounts in cents. Version 1 had `amount` in whole euros.
    #[derive(Debug, Deserialize)]
    struct InvoiceV2 {
        cents: u64,
    }

    struct ChargeInvoice;

    impl Handler for ChargeInvoice {
        type Job = InvoiceV2;
        type Output = u64;
        const JOB_TYPE: &'static str = "invoice";
        const VERSION: u32 = 2;

        async fn handle(&self, job: InvoiceV2, _ctx: Context) -> Result<u64, HandlerError> {
            Ok(job.cents)
        }

        fn upgrade(&self, version: u32, payload: serde_json::Value) -> Result<InvoiceV2, HandlerError> {
            match (version, payload["amount"].as_u64()) {
                (1, Some(euros)) => Ok(InvoiceV2 { cents: euros * 100 }),
                _ => Err(HandlerError::permanent(format!(
                    "cannot upgrade invoice v{version}"
                ))),
            }
        }
    }

    /// Version 2, with no upgrade from version 1.
    struct Plain;

    impl Handler for Plain {
        type Job = serde_json::Value;
        type Output = ();
        const JOB_TYPE: &'static str = "plain";
        const VERSION: u32 = 2;

        async fn handle(&self, _job: serde_json::Value, _ctx: Context) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    /// Ignores its context: works `ms`, then returns `Ok(ms)`, or a permanent error when `fail` is set.
    struct Late;

    impl Handler for Late {
        type Job = serde_json::Value;
        type Output = u64;
        const JOB_TYPE: &'static str = "late";

        async fn handle(&self, job: serde_json::Value, _ctx: Context) -> Result<u64, HandlerError> {
            let ms = job["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if job["fail"].as_bool() == Some(true) {
                return Err(HandlerError::permanent("stopped"));
            }
            Ok(ms)
        }

        fn settings(&self) -> HandlerSettings {
            HandlerSettings::default().with_timeout(Duration::from_secs(5))
        }
    }

    async fn process_late(body: &str) -> (Processed, Duration) {
        let pipeline = Pipeline::new(Router::new().route(Late));
        let lease = Lease::new(Instant::now() + Duration::from_secs(30));
        let started = Instant::now();
        let processed = pipeline
            .process(
                message("late", None, body),
                Arc::from("jobs"),
                &lease,
                Budget::default(),
            )
            .await;
        (processed, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn an_ok_returned_within_the_grace_after_the_timeout_stands() {
        let (processed, took) = process_late(r#"{"ms": 6000}"#).await;
        assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
        assert_eq!(processed.output.as_deref(), Some("6000"));
        assert_eq!(took, Duration::from_secs(6), "not held to the end of the grace");
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_still_running_when_the_grace_ends_times_out() {
        let (processed, took) = process_late(r#"{"ms": 8000}"#).await;
        let Outcome::Retry { reason, .. } = &processed.outcome else {
            panic!("expected a retry, got {:?}", processed.outcome)
        };
        assert!(reason.contains("timed out after 5s"), "{reason}");
        assert_eq!(took, Duration::from_secs(5) + CANCEL_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_returned_within_the_grace_after_the_timeout_is_the_timeouts() {
        let (processed, _) = process_late(r#"{"ms": 6000, "fail": true}"#).await;
        let Outcome::Retry { reason, .. } = &processed.outcome else {
            panic!("expected a retry, got {:?}", processed.outcome)
        };
        assert!(reason.contains("timed out after 5s"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_within_the_timeout_is_the_handlers_own() {
        let (processed, _) = process_late(r#"{"ms": 4000, "fail": true}"#).await;
        assert!(matches!(&processed.outcome, Outcome::Reject(failure) if failure.error == "stopped"));
    }

    fn message(job_type: &str, version: Option<&str>, body: &str) -> Arc<Message> {
        let mut message = Message::new("m-1", body);
        message
            .attributes
            .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
        if let Some(version) = version {
            message.attributes.insert(
                SCHEMA_VERSION_ATTRIBUTE.to_owned(),
                AttributeValue::number(version),
            );
        }
        Arc::new(message)
    }

    async fn process(message: Arc<Message>) -> Processed {
        let pipeline = Pipeline::new(Router::new().route(ChargeInvoice).route(Plain));
        let lease = Lease::new(Instant::now() + Duration::from_secs(30));
        pipeline
            .process(message, Arc::from("jobs"), &lease, Budget::default())
            .await
    }

    fn rejection(processed: &Processed) -> &str {
        match &processed.outcome {
            Outcome::Reject(failure) => &failure.error,
            other => panic!("expected a reject, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_older_version_runs_through_the_handlers_upgrade() {
        let processed = process(message("invoice", Some("1"), r#"{"amount": 12}"#)).await;
        assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
        assert_eq!(processed.output.as_deref(), Some("1200"));
    }

    #[tokio::test]
    async fn the_current_version_and_an_unversioned_body_decode_directly() {
        let current = process(message("invoice", Some("2"), r#"{"cents": 5}"#)).await;
        assert_eq!(current.output.as_deref(), Some("5"));
        let unversioned = process(message("invoice", None, r#"{"cents": 7}"#)).await;
        assert_eq!(unversioned.output.as_deref(), Some("7"));
    }

    #[tokio::test]
    async fn a_newer_version_retries_and_reaches_the_dlq_with_its_reason_at_the_last_attempt() {
        let processed = process(message("invoice", Some("3"), r#"{"cents": 5}"#)).await;
        let Outcome::Retry { reason, .. } = &processed.outcome else {
            panic!("expected a retry, got {:?}", processed.outcome)
        };
        assert!(reason.contains("newer than the 2"), "{reason}");
        assert!(!processed.ran());

        let pipeline = Pipeline::new(Router::new().route(ChargeInvoice));
        let lease = Lease::new(Instant::now() + Duration::from_secs(30));
        let mut last = (*message("invoice", Some("3"), r#"{"cents": 5}"#)).clone();
        last.receive_count = 4;
        let budget = Budget {
            max_attempts: Some(4),
            ..Budget::default()
        };
        let processed = pipeline
            .process(Arc::new(last), Arc::from("jobs"), &lease, budget)
            .await;
        let reason = rejection(&processed);
        assert!(
            reason.contains("newer than the 2") && reason.contains("attempt 4 of the 4"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn malformed_versions_missing_and_failed_upgrades_are_rejected() {
        let processed = process(message("plain", Some("0"), "{}")).await;
        assert!(rejection(&processed).contains("positive integer"));
        let processed = process(message("plain", Some("1"), "{}")).await;
        assert!(
            rejection(&processed).contains("defines no upgrade"),
            "{}",
            rejection(&processed)
        );
        let mut older = Message::new("m-2", "{}");
        older
            .attributes
            .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("invoice"));
        older
            .attributes
            .insert(SCHEMA_VERSION_ATTRIBUTE.to_owned(), AttributeValue::number(1));
        let processed = process(Arc::new(older)).await;
        assert!(rejection(&processed).contains("cannot upgrade invoice v1"));
    }

    /// Sleeps far longer than any deadline in these tests.
    struct Sleeper;

    impl Handler for Sleeper {
        type Job = serde_json::Value;
        type Output = ();
        const JOB_TYPE: &'static str = "sleeper";

        async fn handle(&self, _job: serde_json::Value, _ctx: Context) -> Result<(), HandlerError> {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_at_the_run_deadline_names_the_real_limit() {
        let pipeline = Pipeline::new(Router::new().route(Sleeper));
        let lease = Lease::new(Instant::now() + Duration::from_secs(30));
        let budget = Budget {
            run_deadline: Some(Instant::now() + Duration::from_millis(9_500)),
            ..Budget::default()
        };
        let processed = pipeline
            .process(message("sleeper", None, "{}"), Arc::from("jobs"), &lease, budget)
            .await;
        let Outcome::Retry { reason, .. } = &processed.outcome else {
            panic!("expected a retry, got {:?}", processed.outcome)
        };
        assert!(reason.contains("9.5s"), "{reason}");
        assert!(
            !reason.contains("900s"),
            "the handler's own 15-minute timeout is not what cut it: {reason}"
        );
    }
}
