//! The timer table: a carrier for long delays that can be listed, run now, rescheduled and cancelled.
//!
//! # Design note: one item per delayed job, sent by whichever relay claims it first
//!
//! SQS hops ([`crate::delay`]) carry a delayed job inside the queue, where nobody can list it, move it
//! or take it out. With a timer store ([`TimerStore`]; `conveyor-dynamodb` keeps it in the idempotency
//! table, `conveyor-testing` in memory) the producer writes a job due later than SQS's 15 minutes as
//! one *timer* instead: the encoded message, its queue and its due time. A relay ([`TimerRelay`] beside
//! a worker, or one pass of [`Timers::relay`] from a Lambda sweep or the CLI) sends the timers due
//! within its *lookahead* with the remaining delay as `DelaySeconds`, so a job still starts on time to
//! the second while the relay polls only every `interval` (< lookahead).
//!
//! The steps for one timer, each a conditional write on its item:
//! 1. **claim**: only when the timer exists and holds no live claim; writes a token and
//!    `claimed_until = now + TIMER_CLAIM` (the claiming relay's clock). Any number of relays (every
//!    worker of the queue may run one) race here and one wins, so no lease is needed.
//! 2. **send** the message (its due attribute set to the timer's due time, its delay the rest of the wait).
//!    A failed send ends the claim early so that the next pass tries again, but leaves the timer
//!    claimed for changes: a send that failed (a timeout, a lost reply) may have reached the queue.
//! 3. **finish**: deletes the item, only while the token is still this relay's.
//!
//! Failure windows: a relay that dies between 1 and 2 leaves a claim that another relay takes over
//! once it has lapsed (the job starts up to [`TIMER_CLAIM`] late). One that dies between 2 and 3 leaves
//! a sent timer that is sent again after the lapse: the at-least-once window. Both copies carry the same
//! idempotency key (the producer's, else `timer:<id>`, see [`timer_key`]), so an idempotent handler runs
//! the job once.
//!
//! Changing a timer is a conditional write too: [`Timers::reschedule`] and [`Timers::cancel`] succeed only
//! while no claim exists, *lapsed or not*: a claim may have sent the job already, so a cancel that
//! answered [`TimerChange::Changed`] means the job is never sent, and [`TimerChange::Sending`] means it
//! is already on its way (stop it by key with `Producer::cancel`: the message carries the due attribute,
//! so the consumer checks the cancel marker). [`Timers::run_now`] claims, sends without a delay and
//! finishes, through the same steps as the relay.
//!
//! # Design note: nothing waits silently
//!
//! A timer is sent only by a relay, and a relay runs only where a consumer's pipeline has timers on
//! (`conveyor::Pipeline::with_timers`). Without one a timer would wait past its due time forever,
//! unsaid. Two signals make that visible:
//! - **Overdue.** A relay sends each timer *before* its due time (its lookahead), so an unclaimed timer
//!   still listed [`OVERDUE_AFTER`] past its due time means no relay runs for its queue:
//!   [`Timer::is_overdue`] says so, and `conveyor delays list` and the console flag it with
//!   [`OVERDUE_HINT`].
//! - **Seen.** Each relay pass that reads the store leaves a [`RelayMark`] (when it ran, its lookahead)
//!   through [`TimerStore::mark_relay`], at most once per [`RELAY_MARK_EVERY`] per relay handle; a
//!   producer that keeps a timer reads the mark ([`TimerStore::relay_mark`]) and warns when no relay was
//!   seen recently ([`RelayMark::is_fresh`]). On DynamoDB the mark is one item per queue with a TTL;
//!   its cost is one `UpdateItem` per running relay per minute, and one eventually consistent
//!   `GetItem` per producer per ten minutes while it keeps timers (see `conveyor-dynamodb`'s timers).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::StreamExt as _;

use crate::background::BackgroundTask;
use crate::delay::{Clock, DUE_ATTRIBUTE, due_value, system_clock};
use crate::flow::FlowSender;
use crate::handler::BoxFuture;
use crate::idempotency::StoreError;
use crate::limits::MAX_DELAY;
use crate::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE};
use crate::queue::{OutgoingMessage, QueueError};

/// How long a relay's claim on a timer holds before another relay may send it (see the module's note).
pub const TIMER_CLAIM: Duration = Duration::from_secs(300);
/// The prefix of the idempotency key a timer's job gets when its producer set none.
pub const TIMER_KEY_PREFIX: &str = "timer:";
/// Timers read per page by a relay pass.
const PAGE: usize = 100;
/// Pages one relay pass reads at most (10,000 timers).
const MAX_PAGES: usize = 100;
/// Timers one relay claims and sends at once.
const SEND_CONCURRENCY: usize = 16;
/// How long past its due time an unclaimed timer is listed before it counts as overdue: every relay
/// sends a timer before it is due (its lookahead is a minute or more), so one this late means that no
/// relay runs for its queue.
pub const OVERDUE_AFTER: Duration = Duration::from_secs(120);
/// What an overdue timer means and how to fix it, in the words the CLI and the console print.
pub const OVERDUE_HINT: &str = "overdue: no relay has sent it. The consumers' relay sends timer-table jobs \
     only when their pipeline has timers on: conveyor::Pipeline::with_timers(timers) in the worker (it then \
     runs a conveyor::TimerRelay), or on Lambda the relay schedule (timer_relay = true in \
     infra/modules/lambda-consumer). Send the due ones now with `conveyor delays relay`.";
/// A relay writes its [`RelayMark`] at most this often (per [`Timers`] handle).
pub const RELAY_MARK_EVERY: Duration = Duration::from_secs(60);
/// Slack for clocks and slow passes when judging whether a [`RelayMark`] is fresh.
const RELAY_MARK_GRACE: Duration = Duration::from_secs(60);

/// A relay's "seen" mark for one queue: when a relay pass last ran and how far ahead it sends (see
/// the module's note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayMark {
    /// When the pass ran (the relay's clock).
    pub seen: SystemTime,
    /// How far ahead of their due time that relay sends timers.
    pub lookahead: Duration,
}

impl RelayMark {
    /// Until when this mark says that a relay runs: its lookahead covers the time to its next pass,
    /// plus the mark's own period ([`RELAY_MARK_EVERY`]) and a minute of slack.
    pub fn fresh_until(&self) -> SystemTime {
        self.seen + self.lookahead + RELAY_MARK_EVERY + RELAY_MARK_GRACE
    }

    /// Whether a relay was seen recently enough at `now` to send the timers due.
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        now <= self.fresh_until()
    }
}

/// A job to keep until it is due.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTimer {
    /// The timer's id (unique per queue).
    pub id: String,
    /// The queue to send the job to.
    pub queue_url: String,
    /// When the job is due.
    pub due: SystemTime,
    /// The job's type, for listings.
    pub job_type: String,
    /// The message to send, as the producer encoded it (no delay; the relay sets the rest of the wait).
    pub message: OutgoingMessage,
}

/// A timer as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// The timer's id.
    pub id: String,
    /// The queue the job goes to.
    pub queue_url: String,
    /// When the job is due.
    pub due: SystemTime,
    /// The job's type.
    pub job_type: String,
    /// When the timer was written.
    pub created: SystemTime,
    /// Until when a relay's claim holds, while one does (the job is being sent, or its relay stopped).
    pub claimed_until: Option<SystemTime>,
}

impl Timer {
    /// Its state at `now` in an operator's words (the CLI's listing and the console's page say the same).
    pub fn describe_state(&self, now: SystemTime) -> String {
        match self.claimed_until {
            None => "delayed".to_owned(),
            Some(until) if until > now => {
                format!("sending (claimed until {})", crate::display::format_time(until))
            }
            Some(_) => "sending (claim lapsed: the next relay pass sends it)".to_owned(),
        }
    }

    /// Whether the timer is overdue at `now`: due more than [`OVERDUE_AFTER`] ago and held by no live
    /// claim, which means that no relay runs for its queue (see [`OVERDUE_HINT`]).
    pub fn is_overdue(&self, now: SystemTime) -> bool {
        let claimed = self.claimed_until.is_some_and(|until| until > now);
        !claimed && self.due + OVERDUE_AFTER < now
    }
}

/// A timer claimed for sending.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTimer {
    /// The timer.
    pub timer: Timer,
    /// The message kept with it.
    pub message: OutgoingMessage,
}

/// The answer to a change of one timer.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerChange {
    /// Done: the timer was changed (or removed, for a cancel) before any relay claimed it.
    Changed,
    /// No timer has this id on this queue: it was sent (and finished), cancelled, or never written.
    NotFound,
    /// A relay has claimed it: the job is being sent or was sent; nothing was changed.
    Sending,
}

/// Why timer `id` could not be found: what [`TimerChange::NotFound`] and a run-now of no timer say.
pub fn not_waiting(id: &str) -> String {
    format!("no delayed job {id} waits for this queue: it was sent or cancelled already")
}

impl TimerChange {
    /// The answer to a change of timer `id` in an operator's words (`done`: "cancelled",
    /// "rescheduled"): `Ok` when it was made, `Err` with what happened and what to do otherwise. The
    /// CLI and the console say the same.
    pub fn describe(self, id: &str, done: &str) -> Result<String, String> {
        match self {
            TimerChange::Changed => Ok(format!("{done} delayed job {id}")),
            TimerChange::NotFound => Err(not_waiting(id)),
            TimerChange::Sending => Err(format!(
                "delayed job {id} was not {done}: a relay has claimed it, so it is being sent or was sent; \
                 stop it by its key with Producer::cancel, which the consumer checks when it arrives"
            )),
        }
    }
}

/// Where timers are kept: `conveyor-dynamodb`'s `DynamoStore` (the idempotency table) on AWS,
/// `conveyor-testing`'s `MemoryTimers` in tests. Every write is conditional as the module's note says;
/// `conveyor-testing`'s `timer_conformance` suite checks an implementation.
#[async_trait]
pub trait TimerStore: Send + Sync {
    /// Writes `timer` unless a timer with its id exists on its queue (then nothing changes: a retried
    /// write is harmless); true when it was written.
    async fn put_timer(&self, timer: &NewTimer, now: SystemTime) -> Result<bool, StoreError>;

    /// The timers of `queue_url` due at or before `before` (all when `None`), soonest first, at most `limit`.
    async fn timers(
        &self,
        queue_url: &str,
        before: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError>;

    /// One timer.
    async fn timer(&self, queue_url: &str, id: &str) -> Result<Option<Timer>, StoreError>;

    /// Moves a timer's due time, while no claim exists.
    async fn reschedule_timer(
        &self,
        queue_url: &str,
        id: &str,
        due: SystemTime,
    ) -> Result<TimerChange, StoreError>;

    /// Removes a timer, while no claim exists.
    async fn cancel_timer(&self, queue_url: &str, id: &str) -> Result<TimerChange, StoreError>;

    /// Claims a timer with `token` until `until`, when it exists and holds no claim that lasts past
    /// `now`; the timer and its message when claimed.
    async fn claim_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
        until: SystemTime,
    ) -> Result<Option<ClaimedTimer>, StoreError>;

    /// Ends a claim early (its send failed), while `token` holds it: any relay may claim the timer again
    /// at `now`, but it stays claimed for [`TimerStore::reschedule_timer`] and [`TimerStore::cancel_timer`]
    /// (they answer [`TimerChange::Sending`]), because a send that failed may still have reached the queue.
    async fn release_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
    ) -> Result<(), StoreError>;

    /// Removes a sent timer, while `token` holds it.
    async fn finish_timer(&self, queue_url: &str, id: &str, token: &str) -> Result<(), StoreError>;

    /// Whether this store keeps relay marks ([`TimerStore::mark_relay`]); without them nobody can tell
    /// whether a relay runs, and the producer does not warn. Default: false.
    fn keeps_relay_marks(&self) -> bool {
        false
    }

    /// Records that a relay of `queue_url` ran (one small item per queue, replaced each time; see the
    /// module's note). Default: keeps nothing.
    async fn mark_relay(&self, queue_url: &str, mark: &RelayMark) -> Result<(), StoreError> {
        let _ = (queue_url, mark);
        Ok(())
    }

    /// The last relay mark of `queue_url`, if any. Default: none.
    async fn relay_mark(&self, queue_url: &str) -> Result<Option<RelayMark>, StoreError> {
        let _ = queue_url;
        Ok(None)
    }
}

/// Why a timer operation failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    /// The timer store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The queue refused the job's message; the timer is kept and sent again at the next pass.
    #[error("sending timer {id} to its queue failed (kept, sent again at the next pass): {error}")]
    Send {
        /// The timer.
        id: String,
        /// What the queue said.
        error: QueueError,
    },
}

/// The idempotency key a timer's job is settled under: the producer's, else `timer:<id>`, so a copy
/// sent twice (a relay stopped between its send and its finish) runs once on an idempotent handler.
pub fn timer_key(message: &OutgoingMessage, id: &str) -> String {
    match message
        .attributes
        .get(IDEMPOTENCY_KEY_ATTRIBUTE)
        .and_then(|value| value.string_value.as_deref())
    {
        Some(key) if !key.is_empty() => key.to_owned(),
        _ => format!("{TIMER_KEY_PREFIX}{id}"),
    }
}

/// A new timer id: 32 hexadecimal digits.
fn new_timer_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The timer for `message` due at `due` on `queue_url`: the message gets its due attribute and an
/// idempotency key ([`timer_key`]) and loses its delay (the relay sets the rest of the wait).
pub fn new_timer(queue_url: &str, job_type: &str, due: SystemTime, mut message: OutgoingMessage) -> NewTimer {
    let id = new_timer_id();
    let key = timer_key(&message, &id);
    message
        .attributes
        .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    message
        .attributes
        .insert(DUE_ATTRIBUTE.to_owned(), AttributeValue::number(due_value(due)));
    message.delay = None;
    NewTimer {
        id,
        queue_url: queue_url.to_owned(),
        due,
        job_type: job_type.to_owned(),
        message,
    }
}

/// What one relay pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayedTimers {
    /// Timers sent and finished.
    pub sent: usize,
    /// Timers whose send failed (kept for the next pass).
    pub failed: usize,
    /// Timers another relay held.
    pub skipped: usize,
}

/// The timers of one queue, with what sends their jobs.
#[derive(Clone)]
pub struct Timers {
    store: Arc<dyn TimerStore>,
    sender: Arc<dyn FlowSender>,
    queue_url: String,
    owner: String,
    clock: Clock,
    /// When this handle (and its clones) last wrote its relay mark.
    marked: Arc<std::sync::Mutex<Option<SystemTime>>>,
}

impl std::fmt::Debug for Timers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timers")
            .field("queue_url", &self.queue_url)
            .finish_non_exhaustive()
    }
}

impl Timers {
    /// The timers of the queue at `queue_url` kept in `store`, sent through `sender`
    /// (`conveyor_sqs::SqsSender` on AWS).
    pub fn new(
        store: Arc<dyn TimerStore>,
        sender: Arc<dyn FlowSender>,
        queue_url: impl Into<String>,
    ) -> Self {
        Self {
            store,
            sender,
            queue_url: queue_url.into(),
            owner: format!("pid-{}", std::process::id()),
            clock: system_clock(),
            marked: Arc::default(),
        }
    }

    /// Reads the time from `clock` instead of the system clock, and names claims after `owner`
    /// (the simulator: relays with skewed virtual clocks).
    #[doc(hidden)] // a test hook
    pub fn with_clock(mut self, owner: &str, clock: Clock) -> Self {
        self.owner = owner.to_owned();
        self.clock = clock;
        self
    }

    /// The time on this handle's clock.
    pub fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// Keeps `message` (a job of `job_type`) until `due`; returns the timer's id.
    pub async fn put(
        &self,
        job_type: &str,
        due: SystemTime,
        message: OutgoingMessage,
    ) -> Result<String, StoreError> {
        let timer = new_timer(&self.queue_url, job_type, due, message);
        self.store.put_timer(&timer, self.now()).await?;
        tracing::debug!(queue = %self.queue_url, timer = %timer.id, job_type, "job kept in the timer table");
        Ok(timer.id)
    }

    /// Whether the store keeps relay marks (see [`TimerStore::keeps_relay_marks`]).
    pub fn keeps_relay_marks(&self) -> bool {
        self.store.keeps_relay_marks()
    }

    /// The queue's last relay mark, if any (see the module's note).
    pub async fn relay_mark(&self) -> Result<Option<RelayMark>, StoreError> {
        self.store.relay_mark(&self.queue_url).await
    }

    /// The queue's timers, soonest first, at most `limit`.
    pub async fn list(&self, limit: usize) -> Result<Vec<Timer>, StoreError> {
        self.store.timers(&self.queue_url, None, limit).await
    }

    /// One timer.
    pub async fn get(&self, id: &str) -> Result<Option<Timer>, StoreError> {
        self.store.timer(&self.queue_url, id).await
    }

    /// Moves a timer's due time (see [`TimerChange`] for the answers).
    pub async fn reschedule(&self, id: &str, due: SystemTime) -> Result<TimerChange, StoreError> {
        self.store.reschedule_timer(&self.queue_url, id, due).await
    }

    /// Removes a timer: its job is never sent when the answer is [`TimerChange::Changed`].
    pub async fn cancel(&self, id: &str) -> Result<TimerChange, StoreError> {
        self.store.cancel_timer(&self.queue_url, id).await
    }

    /// Sends a timer's job now; its message id, or `None` when no unclaimed timer has this id.
    pub async fn run_now(&self, id: &str) -> Result<Option<String>, TimerError> {
        let now = self.now();
        let Some((mut claimed, token)) = self.claim(id, now).await? else {
            return Ok(None);
        };
        claimed.timer.due = now;
        self.send_claimed(claimed, &token, now).await.map(Some)
    }

    /// Claims timer `id` at `now` with a fresh token; the timer and the token when claimed.
    async fn claim(&self, id: &str, now: SystemTime) -> Result<Option<(ClaimedTimer, String)>, StoreError> {
        let token = self.token(now);
        let claimed = self
            .store
            .claim_timer(&self.queue_url, id, &token, now, now + TIMER_CLAIM)
            .await?;
        Ok(claimed.map(|claimed| (claimed, token)))
    }

    /// One relay pass: sends the timers due within `lookahead` of now (this handle's clock), page after
    /// page while pages come back full and something was sent (a burst of timers due at one moment
    /// drains in one pass), 16 timers at a time.
    pub async fn relay(&self, lookahead: Duration) -> Result<RelayedTimers, StoreError> {
        let mut report = RelayedTimers::default();
        for _ in 0..MAX_PAGES {
            let now = self.now();
            let due = self
                .store
                .timers(&self.queue_url, Some(now + lookahead), PAGE)
                .await?;
            let full = due.len() == PAGE;
            let page = self.relay_page(due, now).await?;
            report.sent += page.sent;
            report.failed += page.failed;
            report.skipped += page.skipped;
            if !full || page.sent == 0 {
                break;
            }
        }
        self.mark_seen(lookahead).await;
        Ok(report)
    }

    /// Leaves this relay's mark, at most once per [`RELAY_MARK_EVERY`] per handle; a failed write is
    /// logged and tried again at the next pass (it never fails the pass).
    async fn mark_seen(&self, lookahead: Duration) {
        if !self.store.keeps_relay_marks() {
            return;
        }
        let now = self.now();
        let last = *self
            .marked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|last| now < last + RELAY_MARK_EVERY && now >= last) {
            return;
        }
        let mark = RelayMark { seen: now, lookahead };
        match self.store.mark_relay(&self.queue_url, &mark).await {
            Ok(()) => {
                *self
                    .marked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(now);
            }
            Err(error) => {
                tracing::warn!(queue = %self.queue_url, %error, "the timer relay could not leave its seen mark");
            }
        }
    }

    /// Claims and sends the timers of one page.
    async fn relay_page(&self, due: Vec<Timer>, now: SystemTime) -> Result<RelayedTimers, StoreError> {
        let mut report = RelayedTimers::default();
        let (held, free): (Vec<Timer>, Vec<Timer>) = due
            .into_iter()
            .partition(|timer| timer.claimed_until.is_some_and(|until| until > now));
        report.skipped = held.len();
        let outcomes: Vec<Result<Option<String>, TimerError>> = futures_util::stream::iter(free)
            .map(|timer| self.relay_one(timer, now))
            .buffer_unordered(SEND_CONCURRENCY)
            .collect()
            .await;
        for outcome in outcomes {
            match outcome {
                Ok(Some(_)) => report.sent += 1,
                Ok(None) => report.skipped += 1,
                Err(TimerError::Store(error)) => return Err(error),
                Err(error) => {
                    tracing::warn!(queue = %self.queue_url, %error, "a due timer was not sent");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// Claims one timer and sends it; `None` when another relay holds it.
    async fn relay_one(&self, timer: Timer, now: SystemTime) -> Result<Option<String>, TimerError> {
        let Some((claimed, token)) = self.claim(&timer.id, now).await? else {
            return Ok(None);
        };
        self.send_claimed(claimed, &token, now).await.map(Some)
    }

    async fn send_claimed(
        &self,
        claimed: ClaimedTimer,
        token: &str,
        now: SystemTime,
    ) -> Result<String, TimerError> {
        let id = claimed.timer.id.clone();
        let mut message = claimed.message;
        let due = claimed.timer.due;
        message
            .attributes
            .insert(DUE_ATTRIBUTE.to_owned(), AttributeValue::number(due_value(due)));
        message.delay = due
            .duration_since(now)
            .ok()
            .filter(|rest| !rest.is_zero())
            .map(|rest| rest.min(MAX_DELAY));
        match self.sender.send_to(&self.queue_url, message).await {
            Ok(message_id) => {
                self.store.finish_timer(&self.queue_url, &id, token).await?;
                tracing::debug!(queue = %self.queue_url, timer = %id, %message_id, "timer sent");
                Ok(message_id)
            }
            Err(error) => {
                self.store.release_timer(&self.queue_url, &id, token, now).await?;
                Err(TimerError::Send { id, error })
            }
        }
    }

    fn token(&self, now: SystemTime) -> String {
        format!(
            "{}-{}-{:08x}",
            self.owner,
            crate::tracking::to_epoch_millis(now),
            fastrand::u32(..)
        )
    }
}

/// Sends the due timers of `timers` every `interval` beside a worker's jobs (a [`BackgroundTask`]):
/// every worker of a queue may run one (see the module's note).
#[derive(Debug)]
pub struct TimerRelay {
    timers: Timers,
    interval: Duration,
}

impl TimerRelay {
    /// A relay of `timers` polling every 20 s with a lookahead of 60 s.
    pub fn new(timers: Timers) -> Self {
        Self {
            timers,
            interval: Duration::from_secs(20),
        }
    }

    /// Polls every `interval` instead (the lookahead stays three intervals).
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// One pass now.
    pub async fn relay(&self) -> Result<RelayedTimers, StoreError> {
        self.timers.relay(self.interval * 3).await
    }
}

impl BackgroundTask for TimerRelay {
    fn name(&self) -> &'static str {
        "timer relay"
    }

    fn run(self: Box<Self>, drain: tokio_util::sync::CancellationToken) -> BoxFuture<()> {
        Box::pin(async move {
            loop {
                match self.relay().await {
                    Ok(report) if report.sent + report.failed > 0 => {
                        tracing::info!(sent = report.sent, failed = report.failed, "due timers relayed")
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "the timer relay failed; trying again at the next pass")
                    }
                }
                tokio::select! {
                    biased;
                    () = drain.cancelled() => return,
                    () = tokio::time::sleep(crate::backoff::equal_jitter(self.interval)) => {}
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with no timers that counts the relay marks written.
    #[derive(Default)]
    struct MarkCounter {
        marks: std::sync::Mutex<Vec<RelayMark>>,
    }

    #[async_trait]
    impl TimerStore for MarkCounter {
        async fn put_timer(&self, _: &NewTimer, _: SystemTime) -> Result<bool, StoreError> {
            Ok(true)
        }
        async fn timers(&self, _: &str, _: Option<SystemTime>, _: usize) -> Result<Vec<Timer>, StoreError> {
            Ok(Vec::new())
        }
        async fn timer(&self, _: &str, _: &str) -> Result<Option<Timer>, StoreError> {
            Ok(None)
        }
        async fn reschedule_timer(&self, _: &str, _: &str, _: SystemTime) -> Result<TimerChange, StoreError> {
            Ok(TimerChange::NotFound)
        }
        async fn cancel_timer(&self, _: &str, _: &str) -> Result<TimerChange, StoreError> {
            Ok(TimerChange::NotFound)
        }
        async fn claim_timer(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: SystemTime,
            _: SystemTime,
        ) -> Result<Option<ClaimedTimer>, StoreError> {
            Ok(None)
        }
        async fn release_timer(&self, _: &str, _: &str, _: &str, _: SystemTime) -> Result<(), StoreError> {
            Ok(())
        }
        async fn finish_timer(&self, _: &str, _: &str, _: &str) -> Result<(), StoreError> {
            Ok(())
        }
        fn keeps_relay_marks(&self) -> bool {
            true
        }
        async fn mark_relay(&self, _: &str, mark: &RelayMark) -> Result<(), StoreError> {
            if let Ok(mut marks) = self.marks.lock() {
                marks.push(*mark);
            }
            Ok(())
        }
    }

    struct NoSender;

    #[async_trait]
    impl FlowSender for NoSender {
        async fn send_to(&self, _: &str, _: OutgoingMessage) -> Result<String, QueueError> {
            Ok("m".to_owned())
        }
    }

    #[tokio::test]
    async fn a_relay_marks_itself_seen_at_most_once_a_minute() -> Result<(), StoreError> {
        let store = Arc::new(MarkCounter::default());
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let offset = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let read = Arc::clone(&offset);
        let clock: Clock =
            Arc::new(move || start + Duration::from_secs(read.load(std::sync::atomic::Ordering::Relaxed)));
        let timers = Timers::new(store.clone(), Arc::new(NoSender), "q").with_clock("relay", clock);
        // A pass every 20 s for three minutes (a worker's relay), through clones of one handle.
        for pass in 0..10u64 {
            offset.store(pass * 20, std::sync::atomic::Ordering::Relaxed);
            timers.clone().relay(Duration::from_secs(60)).await?;
        }
        let marks = store.marks.lock().map(|marks| marks.clone()).unwrap_or_default();
        let seen: Vec<u64> = marks
            .iter()
            .filter_map(|mark| mark.seen.duration_since(start).ok())
            .map(|since| since.as_secs())
            .collect();
        assert_eq!(seen, [0, 60, 120, 180], "one write a minute");
        assert!(marks.iter().all(|mark| mark.lookahead == Duration::from_secs(60)));
        let last = marks.last().copied().ok_or_else(|| StoreError::Unavailable {
            message: "no mark".to_owned(),
        })?;
        assert!(last.is_fresh(last.seen + Duration::from_secs(180)));
        assert!(!last.is_fresh(last.seen + Duration::from_secs(181)));
        Ok(())
    }

    #[test]
    fn a_timer_keeps_the_producers_key_or_gets_its_own() {
        let mut message = OutgoingMessage {
            body: "{}".to_owned(),
            delay: Some(Duration::from_secs(900)),
            ..OutgoingMessage::default()
        };
        let due = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let timer = new_timer("q", "email", due, message.clone());
        assert_eq!(timer.message.delay, None);
        assert_eq!(
            timer_key(&timer.message, "x"),
            format!("{TIMER_KEY_PREFIX}{}", timer.id)
        );
        assert_eq!(
            timer.message.attributes[DUE_ATTRIBUTE].string_value.as_deref(),
            Some("1000000")
        );
        message.attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            AttributeValue::string("order-7"),
        );
        let keyed = new_timer("q", "email", due, message);
        assert_eq!(timer_key(&keyed.message, &keyed.id), "order-7");
        assert_ne!(keyed.id, timer.id);
    }
}
