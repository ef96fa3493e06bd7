//! `MemoryQueue`: an in-memory [`Queue`] with SQS's semantics, for tests and benchmarks.
//!
//! # Design note: how a message moves
//!
//! Every message lives in one map, keyed by a sequence number given at send time, with a status:
//! `Delayed`, `Visible` or `InFlight`. Two structures schedule it:
//!
//! - `ready` (standard queues): the visible messages, oldest first, as `(seq, version)` pairs;
//! - `timers` (both kinds): a min-heap of `(deadline, seq, version)`: when a delayed message becomes
//!   visible, and when an in-flight message's visibility timeout runs out.
//!
//! A message's `version` changes every time it is rescheduled (received, visibility changed), so older
//! entries in `ready` and `timers` are recognised as stale and skipped when they surface: nothing is
//! ever searched for or removed from the middle of a structure, and receive costs O(batch) plus the
//! stale entries it meets. Due timers are applied at the start of every receive, depth and snapshot
//! (`promote_due`), with the queue's lock held, so no background task is needed and the queue works
//! under `tokio::time::pause()` (all deadlines are `tokio::time::Instant`).
//!
//! Standard queues behave as SQS fair queues when messages carry a `MessageGroupId` (see [`fair`]): a
//! receive takes the quiet groups' messages first while one group holds a large share of the messages
//! in flight. Every group's in-flight count is kept on both kinds of queue.
//!
//! FIFO queues scan `fifo_order` (all live messages in send order) and take the first visible messages
//! of groups with nothing in flight, several of one group in order when possible, as SQS does. The scan
//! stops at the batch size; it is O(n) at worst, fine for tests.
//!
//! A receipt handle encodes the queue, the message and the receipt's generation. It is valid only while
//! that receipt is the message's latest and the message is in flight (its deadline has not passed):
//! stricter than SQS, which silently accepts some stale deletes. Deleting an already deleted message with
//! its latest handle succeeds, as on SQS (remembered for the last [`TOMBSTONES`] deletes).
//!
//! Long polling: a waiting receive registers with a [`Notify`] before looking at the queue, then sleeps
//! until it is notified (send, visibility change, redrive into this queue) or until the earliest timer or
//! its own wait ends, whichever comes first; no wake-up can be lost between the look and the sleep.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::limits::{
    MAX_DELAY, MAX_MESSAGE_ATTRIBUTES, MAX_MESSAGE_BYTES, MAX_RECEIVE_MESSAGES, MAX_VISIBILITY_TIMEOUT,
    MAX_WAIT_TIME,
};
use conveyor_core::runtime::dead_letter_copy;
use conveyor_core::{
    message::{Attributes, Message, ReceiptHandle},
    port::{
        DeadLetter, EntryError, EntryFailure, OutgoingMessage, Queue, QueueDepth, QueueError,
        VisibilityChange,
    },
    runtime::Failure,
};
use tokio::sync::Notify;
use tokio::time::Instant;

pub mod fair;

/// How many deleted messages' last receipts are remembered, so a repeated delete succeeds as on SQS.
pub const TOMBSTONES: usize = 65_536;
/// SQS's FIFO deduplication window.
pub(crate) const DEDUPLICATION_WINDOW: Duration = Duration::from_secs(5 * 60);
/// The default visibility timeout, as on a new SQS queue.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a message is, as [`MemoryQueue::snapshot`] reports it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Sent with a delay that has not passed yet.
    Delayed,
    /// Can be received now.
    Visible,
    /// Received; invisible until its visibility timeout ends.
    InFlight,
}

/// One message as stored, for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedMessage {
    /// The message id.
    pub id: String,
    /// The body.
    pub body: String,
    /// The message attributes.
    pub attributes: Attributes,
    /// How many times it has been received.
    pub receive_count: u32,
    /// The FIFO group.
    pub group_id: Option<String>,
    /// Where it is.
    pub state: MessageState,
}

/// Behaviours real queues have where [`MemoryQueue`] is strict by default: a simulation turns them on
/// ([`MemoryQueue::with_quirks`]) so that the runtimes meet what SQS and the emulators really do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quirks {
    /// FIFO: a group is unlocked as soon as any of its in-flight messages becomes visible again (its
    /// visibility timeout ran out, or it was released), while others of the group are still in flight,
    /// as LocalStack does. SQS keeps the group locked until every message of it is deleted or visible.
    pub early_group_unlock: bool,
    /// A delete with a receipt handle that is no longer the message's latest (it was received again
    /// since) succeeds without deleting it, as SQS's documentation allows ("the request succeeds, but
    /// the message might not be deleted").
    pub stale_delete_succeeds: bool,
    /// Standard queues: every `n`-th delivery also leaves a duplicate of the message visible, a copy
    /// with the same message id and a receipt of its own, as SQS's at-least-once delivery may.
    pub duplicate_every: Option<u32>,
    /// `MessageRetentionPeriod`: a message stored longer than this is deleted, in flight or not
    /// ([`MemoryQueue::expired`] lists them).
    pub retention: Option<Duration>,
}

/// Requests made through the [`Queue`] trait, counted as SQS would bill them (a batch call of up to
/// 10 entries is one request). [`MemoryQueue::push`] is not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueRequests {
    /// `ReceiveMessage` calls.
    pub receive: u64,
    /// Calls that returned no message.
    pub empty_receive: u64,
    /// Messages returned by receives.
    pub messages_received: u64,
    /// `SendMessage` calls (including dead-letter copies sent into this queue).
    pub send: u64,
    /// `DeleteMessageBatch` calls (10 entries each).
    pub delete: u64,
    /// `ChangeMessageVisibilityBatch` calls (10 entries each).
    pub change_visibility: u64,
    /// `dead_letter` calls on this queue (each one a send on its DLQ).
    pub dead_letter: u64,
    /// `GetQueueAttributes` calls for depth.
    pub depth: u64,
    /// Messages moved to the DLQ by the redrive policy.
    pub redriven: u64,
}

impl QueueRequests {
    /// All requests (not message counts).
    pub fn total(&self) -> u64 {
        self.receive + self.send + self.delete + self.change_visibility + self.dead_letter + self.depth
    }
}

#[derive(Debug, Default)]
struct Counters {
    receive: AtomicU64,
    empty_receive: AtomicU64,
    messages_received: AtomicU64,
    send: AtomicU64,
    delete: AtomicU64,
    change_visibility: AtomicU64,
    dead_letter: AtomicU64,
    depth: AtomicU64,
    redriven: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

fn batch_calls(entries: usize) -> u64 {
    entries.div_ceil(conveyor_core::limits::MAX_BATCH_ENTRIES).max(1) as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Delayed,
    Visible,
    InFlight,
}

#[derive(Debug)]
struct Stored {
    id: String,
    body: String,
    attributes: Attributes,
    group_id: Option<String>,
    deduplication_id: Option<String>,
    trace_header: Option<String>,
    sent_at: SystemTime,
    /// When it was stored, on tokio's clock (retention counts from it; a duplicate keeps its original's).
    stored_at: Instant,
    /// When it was first received, on tokio's clock (SQS's 12 hours of visibility count from it).
    first_received: Option<Instant>,
    receive_count: u32,
    /// The generation of the latest receipt (0 before the first receive).
    receipt: u64,
    /// When a delayed or in-flight message becomes visible.
    visible_at: Instant,
    status: Status,
    /// Changes whenever the message is rescheduled; older `ready`/`timers` entries are stale.
    version: u64,
}

/// When a receive hands messages out and for how long they stay invisible.
#[derive(Debug, Clone, Copy)]
struct Lease {
    now: Instant,
    visibility: Duration,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    next_version: u64,
    messages: HashMap<u64, Stored>,
    ready: VecDeque<(u64, u64)>,
    fifo_order: BTreeSet<u64>,
    group_in_flight: HashMap<String, u32>,
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    in_flight: u64,
    delayed: u64,
    tombstones: HashMap<u64, u64>,
    tombstone_order: VecDeque<u64>,
    dedup: HashMap<String, String>,
    dedup_order: VecDeque<(Instant, String)>,
    /// Deliveries so far (for [`Quirks::duplicate_every`]).
    deliveries: u64,
}

impl State {
    fn version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// Makes due delayed and expired in-flight messages visible.
    fn promote_due(&mut self, now: Instant, fifo: bool, quirks: Quirks) {
        while let Some(Reverse((at, seq, version))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let next_version = self.next_version + 1;
            let Some(message) = self.messages.get_mut(&seq) else {
                continue;
            };
            if message.version != version {
                continue;
            }
            match message.status {
                Status::Visible => continue,
                Status::Delayed => self.delayed -= 1,
                Status::InFlight => {
                    self.in_flight -= 1;
                    unlock_group(&mut self.group_in_flight, message.group_id.as_deref(), quirks);
                }
            }
            message.status = Status::Visible;
            message.version = next_version;
            self.next_version = next_version;
            if !fifo {
                self.ready.push_back((seq, next_version));
            }
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The in-flight message a receipt names, if that receipt is still its latest and unexpired.
    fn leased(&mut self, handle: &Receipt, now: Instant) -> Option<&mut Stored> {
        self.messages.get_mut(&handle.seq).filter(|message| {
            message.status == Status::InFlight
                && message.receipt == handle.generation
                && message.visible_at > now
        })
    }

    fn remove(&mut self, seq: u64, fifo: bool) -> Option<Stored> {
        let message = self.messages.remove(&seq)?;
        match message.status {
            Status::Delayed => self.delayed -= 1,
            Status::InFlight => {
                self.in_flight -= 1;
                release_group(&mut self.group_in_flight, message.group_id.as_deref());
            }
            Status::Visible => {}
        }
        if fifo {
            self.fifo_order.remove(&seq);
        }
        Some(message)
    }

    fn remember_deleted(&mut self, seq: u64, generation: u64) {
        if self.tombstone_order.len() >= TOMBSTONES
            && let Some(oldest) = self.tombstone_order.pop_front()
        {
            self.tombstones.remove(&oldest);
        }
        self.tombstones.insert(seq, generation);
        self.tombstone_order.push_back(seq);
    }

    fn forget_old_dedup_ids(&mut self, now: Instant) {
        while let Some((at, _)) = self.dedup_order.front() {
            if now.saturating_duration_since(*at) < DEDUPLICATION_WINDOW {
                break;
            }
            if let Some((_, id)) = self.dedup_order.pop_front() {
                self.dedup.remove(&id);
            }
        }
    }
}

/// A message of `group` became visible again: one fewer in flight, or (LocalStack's early unlock,
/// [`Quirks::early_group_unlock`]) the group unlocked whatever else of it is in flight.
fn unlock_group(groups: &mut HashMap<String, u32>, group: Option<&str>, quirks: Quirks) {
    if quirks.early_group_unlock
        && let Some(group) = group
    {
        groups.remove(group);
        return;
    }
    release_group(groups, group);
}

fn release_group(groups: &mut HashMap<String, u32>, group: Option<&str>) {
    let Some(group) = group else { return };
    if let Some(count) = groups.get_mut(group) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            groups.remove(group);
        }
    }
}

/// A parsed receipt handle: `<queue nonce>-<seq>-<generation>` in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Receipt {
    nonce: u32,
    seq: u64,
    generation: u64,
}

impl Receipt {
    fn format(self) -> String {
        format!("{:08x}-{:x}-{:x}", self.nonce, self.seq, self.generation)
    }

    fn parse(handle: &str) -> Option<Self> {
        let mut parts = handle.split('-');
        let nonce = u32::from_str_radix(parts.next()?, 16).ok()?;
        let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
        let generation = u64::from_str_radix(parts.next()?, 16).ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            nonce,
            seq,
            generation,
        })
    }
}

#[derive(Debug)]
struct Redrive {
    dead_letter_queue: Arc<MemoryQueue>,
    max_receive_count: u32,
}

/// An in-memory queue with SQS's semantics: visibility timeouts, redelivery with a higher receive
/// count and a new receipt handle, redrive to a DLQ after `maxReceiveCount` receives, FIFO groups,
/// delays, long polling, and per-entry batch failures. Standard queues are fair queues, as on SQS: while
/// one `MessageGroupId` holds a large share of the messages in flight, receives take the other groups'
/// messages first ([`fair`]; [`MemoryQueue::without_fair_queues`] turns that off).
///
/// Differences from SQS, all on the strict side: only the latest receipt handle of an in-flight message
/// is valid (SQS accepts some stale deletes without deleting; here they fail with
/// [`EntryError::LeaseLost`]); a handle it never issued is [`EntryError::NotIssued`], as on SQS; receives are exact (SQS may return fewer messages than are visible).
/// FIFO queues deduplicate on `deduplication_id`, or on the body when none is given (as with
/// content-based deduplication), for five minutes.
///
/// ```
/// # async fn demo() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use conveyor_core::port::Queue;
/// use conveyor_testing::MemoryQueue;
///
/// let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
/// let queue = MemoryQueue::standard("jobs")
///     .with_visibility_timeout(Duration::from_secs(30))
///     .with_dead_letter_queue(Arc::clone(&dlq), 5);
/// queue.push("{\"n\":1}").unwrap();
/// let received = queue.receive(10, Duration::ZERO).await.unwrap();
/// assert_eq!(received[0].receive_count, 1);
/// # }
/// ```
#[derive(Debug)]
pub struct MemoryQueue {
    name: String,
    fifo: bool,
    /// Standard queues only: receives favour quiet groups, as SQS fair queues do.
    fair: bool,
    nonce: u32,
    visibility_timeout: Duration,
    redrive: Option<Redrive>,
    state: Mutex<State>,
    arrivals: Notify,
    counters: Counters,
    unavailable: AtomicBool,
    /// Each message the redrive policy moved: its id and when its last hold ended.
    redriven: std::sync::Mutex<Vec<(String, Instant)>>,
    /// The real queues' behaviours turned on ([`MemoryQueue::with_quirks`]).
    quirks: Quirks,
    /// Each message retention deleted: its id, when it was stored and when it was deleted.
    expired: std::sync::Mutex<Vec<(String, Instant, Instant)>>,
}

impl MemoryQueue {
    /// A queue named `name`: FIFO when the name ends in `.fifo`, standard otherwise.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            fifo: name.ends_with(".fifo"),
            fair: true,
            name,
            nonce: uuid::Uuid::new_v4().as_u128() as u32,
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            redrive: None,
            state: Mutex::new(State::default()),
            arrivals: Notify::new(),
            counters: Counters::default(),
            redriven: std::sync::Mutex::new(Vec::new()),
            unavailable: AtomicBool::new(false),
            quirks: Quirks::default(),
            expired: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A standard queue (a `.fifo` suffix is dropped).
    pub fn standard(name: &str) -> Self {
        Self::new(name.strip_suffix(".fifo").unwrap_or(name))
    }

    /// A FIFO queue (`.fifo` is appended when missing).
    pub fn fifo(name: &str) -> Self {
        if name.ends_with(".fifo") {
            return Self::new(name);
        }
        Self::new(format!("{name}.fifo"))
    }

    /// Turns the fair-queue ordering of a standard queue off (on by default, as on SQS, where every
    /// standard queue is a fair queue for messages with a `MessageGroupId`): receives then take visible
    /// messages oldest first whatever their group, as LocalStack 4.8 does. For comparisons; see [`fair`].
    pub fn without_fair_queues(mut self) -> Self {
        self.fair = false;
        self
    }

    /// Turns on behaviours real queues have ([`Quirks`]); none by default.
    pub fn with_quirks(mut self, quirks: Quirks) -> Self {
        self.quirks = quirks;
        self
    }

    /// Each message [`Quirks::retention`] deleted: its id, when it was stored and when it was deleted
    /// (tokio's clock), in the order they were deleted.
    pub fn expired(&self) -> Vec<(String, Instant, Instant)> {
        self.expired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets the queue's visibility timeout (default 30 s, as on SQS).
    pub fn with_visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = timeout;
        self
    }

    /// Sets a redrive policy: a message received `max_receive_count` times moves to `dlq` instead of
    /// being delivered again; [`Queue::dead_letter`] sends copies there.
    pub fn with_dead_letter_queue(mut self, dlq: Arc<MemoryQueue>, max_receive_count: u32) -> Self {
        self.redrive = Some(Redrive {
            dead_letter_queue: dlq,
            max_receive_count: max_receive_count.max(1),
        });
        self
    }

    /// The dead-letter queue, when a redrive policy is set.
    pub fn dead_letter_queue(&self) -> Option<&Arc<MemoryQueue>> {
        self.redrive.as_ref().map(|redrive| &redrive.dead_letter_queue)
    }

    /// Makes every [`Queue`] call fail with [`QueueError::Unavailable`] (or work again), as when SQS is
    /// down or throttling. [`MemoryQueue::push`] and the inspection helpers keep working.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Sends a message without counting a request: for tests and benchmark set-up.
    pub fn push(&self, body: impl Into<String>) -> Result<String, QueueError> {
        let body = body.into();
        let group_id = self.fifo.then(|| "default".to_owned());
        self.push_message(OutgoingMessage {
            body,
            group_id,
            ..OutgoingMessage::default()
        })
    }

    /// Sends `message` without counting a request.
    pub fn push_message(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        self.validate(&message)?;
        let now = Instant::now();
        let id = {
            let mut state = self.lock();
            if self.fifo {
                state.forget_old_dedup_ids(now);
                let dedup_key = message
                    .deduplication_id
                    .clone()
                    .unwrap_or_else(|| format!("body:{}", message.body));
                if let Some(id) = state.dedup.get(&dedup_key) {
                    return Ok(id.clone());
                }
                let id = self.enqueue(&mut state, message, now);
                state.dedup.insert(dedup_key.clone(), id.clone());
                state.dedup_order.push_back((now, dedup_key));
                id
            } else {
                self.enqueue(&mut state, message, now)
            }
        };
        self.arrivals.notify_waiters();
        Ok(id)
    }

    /// Every live message (delayed, visible and in flight), oldest first.
    pub fn snapshot(&self) -> Vec<QueuedMessage> {
        let mut state = self.lock();
        state.promote_due(Instant::now(), self.fifo, self.quirks);
        let mut seqs: Vec<u64> = state.messages.keys().copied().collect();
        seqs.sort_unstable();
        seqs.iter()
            .filter_map(|seq| state.messages.get(seq))
            .map(|message| QueuedMessage {
                id: message.id.clone(),
                body: message.body.clone(),
                attributes: message.attributes.clone(),
                receive_count: message.receive_count,
                group_id: message.group_id.clone(),
                state: match message.status {
                    Status::Delayed => MessageState::Delayed,
                    Status::Visible => MessageState::Visible,
                    Status::InFlight => MessageState::InFlight,
                },
            })
            .collect()
    }

    /// The messages in the dead-letter queue (empty without one).
    pub fn messages_in_dlq(&self) -> Vec<QueuedMessage> {
        self.dead_letter_queue()
            .map(|dlq| dlq.snapshot())
            .unwrap_or_default()
    }

    /// The number of live messages (delayed, visible and in flight).
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// True when no message is left.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Exact counts, without counting a request.
    pub fn counts(&self) -> QueueDepth {
        let mut state = self.lock();
        state.promote_due(Instant::now(), self.fifo, self.quirks);
        QueueDepth {
            visible: state.messages.len() as u64 - state.in_flight - state.delayed,
            in_flight: state.in_flight,
            delayed: state.delayed,
        }
    }

    /// The requests made so far.
    pub fn requests(&self) -> QueueRequests {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        QueueRequests {
            receive: load(&counters.receive),
            empty_receive: load(&counters.empty_receive),
            messages_received: load(&counters.messages_received),
            send: load(&counters.send),
            delete: load(&counters.delete),
            change_visibility: load(&counters.change_visibility),
            dead_letter: load(&counters.dead_letter),
            depth: load(&counters.depth),
            redriven: load(&counters.redriven),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_available(&self) -> Result<(), QueueError> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(QueueError::Unavailable {
                message: format!("memory queue {} is set unavailable", self.name),
            });
        }
        Ok(())
    }

    fn validate(&self, message: &OutgoingMessage) -> Result<(), QueueError> {
        let invalid = |message: String| Err(QueueError::Invalid { message });
        if message.body.is_empty() {
            return invalid("the message body must not be empty".to_owned());
        }
        let size = message.size();
        if size > MAX_MESSAGE_BYTES {
            return invalid(format!(
                "message is {size} bytes, over the limit of {MAX_MESSAGE_BYTES}"
            ));
        }
        if message.attributes.len() > MAX_MESSAGE_ATTRIBUTES {
            return invalid(format!(
                "message has {} attributes, over the limit of {MAX_MESSAGE_ATTRIBUTES}",
                message.attributes.len()
            ));
        }
        let delay = message.delay.unwrap_or_default();
        if delay > MAX_DELAY {
            return invalid(format!("delay {delay:?} is over the limit of {MAX_DELAY:?}"));
        }
        if self.fifo && message.group_id.is_none() {
            return invalid(format!("queue {} is FIFO: MessageGroupId is required", self.name));
        }
        // SQS takes a MessageGroupId on standard queues too (the tenant of fair queues), by the same rules.
        if let Some(group) = &message.group_id
            && let Err(error) = conveyor_core::tenant::check_tenant(group)
        {
            return invalid(format!("MessageGroupId {group:?} is invalid: {error}"));
        }
        if !self.fifo && message.deduplication_id.is_some() {
            return invalid(format!(
                "queue {} is standard: MessageDeduplicationId is not valid for this queue type",
                self.name
            ));
        }
        if self.fifo && !delay.is_zero() {
            return invalid(format!(
                "queue {} is FIFO: per-message delays are not supported (DelaySeconds)",
                self.name
            ));
        }
        Ok(())
    }

    fn enqueue(&self, state: &mut State, message: OutgoingMessage, now: Instant) -> String {
        state.next_seq += 1;
        let seq = state.next_seq;
        let id = format!("{:08x}-0000-4000-8000-{seq:012x}", self.nonce);
        let delay = message.delay.unwrap_or_default();
        let version = state.version();
        let status = if delay.is_zero() {
            Status::Visible
        } else {
            Status::Delayed
        };
        state.messages.insert(
            seq,
            Stored {
                id: id.clone(),
                body: message.body,
                attributes: message.attributes,
                group_id: message.group_id,
                deduplication_id: message.deduplication_id,
                trace_header: message.trace_header,
                sent_at: conveyor_core::wall_clock::now(),
                stored_at: now,
                first_received: None,
                receive_count: 0,
                receipt: 0,
                visible_at: now + delay,
                status,
                version,
            },
        );
        self.schedule_new(state, seq, status, now + delay, version);
        id
    }

    /// Puts a newly stored message in the structures for its status.
    fn schedule_new(&self, state: &mut State, seq: u64, status: Status, at: Instant, version: u64) {
        if self.fifo {
            state.fifo_order.insert(seq);
        }
        match status {
            Status::Delayed => {
                state.delayed += 1;
                state.timers.push(Reverse((at, seq, version)));
            }
            Status::Visible if !self.fifo => state.ready.push_back((seq, version)),
            _ => {}
        }
    }

    /// Accepts a message moved here by a source queue's redrive policy: same id, body, attributes.
    fn accept_redriven(&self, mut moved: Vec<Stored>) {
        {
            let mut state = self.lock();
            for mut message in moved.drain(..) {
                state.next_seq += 1;
                let seq = state.next_seq;
                let version = state.version();
                message.status = Status::Visible;
                message.version = version;
                message.receipt = 0;
                message.visible_at = Instant::now();
                state.messages.insert(seq, message);
                self.schedule_new(&mut state, seq, Status::Visible, Instant::now(), version);
            }
        }
        self.arrivals.notify_waiters();
    }

    /// Takes up to `max` messages; redriven ones are returned in `moved` for the DLQ.
    fn take(&self, state: &mut State, max: usize, lease: Lease, moved: &mut Vec<Stored>) -> Vec<Message> {
        self.expire(state, lease.now);
        state.promote_due(lease.now, self.fifo, self.quirks);
        let mut batch = Vec::with_capacity(max.min(state.messages.len()));
        if self.fifo {
            self.take_fifo(state, max, lease, &mut batch, moved);
        } else {
            self.take_standard(state, max, lease, &mut batch, moved);
        }
        batch
    }

    /// Deletes the messages stored longer than the retention ([`Quirks::retention`]), in flight or not.
    fn expire(&self, state: &mut State, now: Instant) {
        let Some(retention) = self.quirks.retention else {
            return;
        };
        let mut old: Vec<u64> = state
            .messages
            .iter()
            .filter(|(_, message)| message.stored_at + retention <= now)
            .map(|(seq, _)| *seq)
            .collect();
        old.sort_unstable();
        let mut expired = self.expired.lock().unwrap_or_else(PoisonError::into_inner);
        for seq in old {
            if let Some(message) = state.remove(seq, self.fifo) {
                tracing::debug!(queue = %self.name, id = %message.id, "message deleted: past its retention");
                expired.push((message.id, message.stored_at, now));
            }
        }
    }

    /// A copy of the message at `seq` as a duplicate delivery leaves it: same id, body and attributes,
    /// visible, with a receipt of its own.
    fn duplicate(&self, state: &mut State, seq: u64) {
        let Some(original) = state.messages.get(&seq) else {
            return;
        };
        let copy = Stored {
            id: original.id.clone(),
            body: original.body.clone(),
            attributes: original.attributes.clone(),
            group_id: original.group_id.clone(),
            deduplication_id: original.deduplication_id.clone(),
            trace_header: original.trace_header.clone(),
            sent_at: original.sent_at,
            stored_at: original.stored_at,
            first_received: original.first_received,
            // Delivered at the count of the delivery it duplicates (never redriven before it is
            // delivered as often as the original was).
            receive_count: original.receive_count.saturating_sub(1),
            receipt: 0,
            visible_at: original.visible_at,
            status: Status::Visible,
            version: 0,
        };
        state.next_seq += 1;
        let copy_seq = state.next_seq;
        let version = state.version();
        state.messages.insert(copy_seq, Stored { version, ..copy });
        state.ready.push_back((copy_seq, version));
    }

    fn redrives(&self, message: &Stored) -> bool {
        self.redrive
            .as_ref()
            .is_some_and(|redrive| message.receive_count >= redrive.max_receive_count)
    }

    fn take_standard(
        &self,
        state: &mut State,
        max: usize,
        lease: Lease,
        batch: &mut Vec<Message>,
        moved: &mut Vec<Stored>,
    ) {
        if self.fair {
            self.take_fair(state, max, lease, batch, moved);
        }
        while batch.len() < max {
            let Some((seq, version)) = state.ready.pop_front() else {
                break;
            };
            let Some(message) = state.messages.get(&seq) else {
                continue;
            };
            if message.version != version || message.status != Status::Visible {
                continue;
            }
            self.deliver_or_redrive(state, seq, lease, batch, moved);
        }
    }

    /// Whether this delivery leaves a duplicate behind ([`Quirks::duplicate_every`]).
    fn duplicates(&self, state: &mut State) -> bool {
        state.deliveries += 1;
        !self.fifo
            && self
                .quirks
                .duplicate_every
                .is_some_and(|every| every > 0 && state.deliveries.is_multiple_of(u64::from(every)))
    }

    /// Delivers a visible message of a standard queue, or moves it toward the DLQ when its receives
    /// are spent.
    fn deliver_or_redrive(
        &self,
        state: &mut State,
        seq: u64,
        lease: Lease,
        batch: &mut Vec<Message>,
        moved: &mut Vec<Stored>,
    ) {
        if state
            .messages
            .get(&seq)
            .is_some_and(|message| self.redrives(message))
        {
            moved.extend(state.remove(seq, false));
            return;
        }
        let delivered = self.deliver(state, seq, lease);
        if delivered.is_some() && self.duplicates(state) {
            self.duplicate(state, seq);
        }
        batch.extend(delivered);
    }

    /// While some group is noisy, takes the messages [`fair::pick`] orders; leaves the rest of the batch
    /// (none, unless nothing is noisy) to the oldest-first loop.
    fn take_fair(
        &self,
        state: &mut State,
        max: usize,
        lease: Lease,
        batch: &mut Vec<Message>,
        moved: &mut Vec<Stored>,
    ) {
        loop {
            let noisy = fair::noisy_groups(&state.group_in_flight, state.in_flight);
            let room = max.saturating_sub(batch.len());
            if noisy.is_empty() || room == 0 {
                return;
            }
            let picked = fair::pick(&state.ready, &state.messages, &noisy, room);
            if picked.is_empty() {
                return;
            }
            // Each picked message is delivered or redriven, so the loop ends; a redriven one leaves room
            // that the next round (with the counts it changed) fills.
            for seq in picked {
                self.deliver_or_redrive(state, seq, lease, batch, moved);
            }
        }
    }

    fn take_fifo(
        &self,
        state: &mut State,
        max: usize,
        lease: Lease,
        batch: &mut Vec<Message>,
        moved: &mut Vec<Stored>,
    ) {
        let mut deliver = Vec::new();
        let mut redrive = Vec::new();
        for seq in &state.fifo_order {
            if deliver.len() >= max {
                break;
            }
            let Some(message) = state.messages.get(seq) else {
                continue;
            };
            // Group counts change only after the scan, so several messages of a free group are taken in
            // order, and none of a group that was already in flight.
            let group = message.group_id.as_deref().unwrap_or_default();
            if message.status != Status::Visible || state.group_in_flight.contains_key(group) {
                continue;
            }
            if self.redrives(message) {
                redrive.push(*seq);
                continue;
            }
            deliver.push(*seq);
        }
        for seq in redrive {
            moved.extend(state.remove(seq, true));
        }
        for seq in deliver {
            batch.extend(self.deliver(state, seq, lease));
        }
    }

    /// Marks a visible message in flight with a new receipt and returns it as received.
    fn deliver(&self, state: &mut State, seq: u64, lease: Lease) -> Option<Message> {
        let Lease { now, visibility } = lease;
        let version = state.version();
        let deadline = now + visibility;
        let State {
            messages,
            group_in_flight,
            in_flight,
            timers,
            ..
        } = state;
        let message = messages.get_mut(&seq)?;
        *in_flight += 1;
        timers.push(Reverse((deadline, seq, version)));
        if let Some(group) = &message.group_id {
            *group_in_flight.entry(group.clone()).or_insert(0) += 1;
        }
        message.receive_count += 1;
        message.receipt = version;
        message.version = version;
        message.status = Status::InFlight;
        message.visible_at = deadline;
        let first_received = *message.first_received.get_or_insert(now);
        let receipt = Receipt {
            nonce: self.nonce,
            seq,
            generation: version,
        };
        Some(Message {
            id: message.id.clone(),
            receipt_handle: ReceiptHandle(receipt.format()),
            body: message.body.clone(),
            attributes: message.attributes.clone(),
            receive_count: message.receive_count,
            sent_at: Some(message.sent_at),
            first_received_at: Some(wall_clock_at(first_received, now)),
            group_id: message.group_id.clone(),
            deduplication_id: message.deduplication_id.clone(),
            trace_header: message.trace_header.clone(),
        })
    }

    fn parse_receipt(&self, handle: &ReceiptHandle) -> Option<Receipt> {
        Receipt::parse(handle.as_str()).filter(|receipt| receipt.nonce == self.nonce)
    }

    fn delete_one(&self, state: &mut State, handle: &ReceiptHandle, now: Instant) -> Result<(), EntryError> {
        let Some(receipt) = self.parse_receipt(handle) else {
            return Err(invalid_receipt());
        };
        if state.leased(&receipt, now).is_some() {
            state.remove(receipt.seq, self.fifo);
            state.remember_deleted(receipt.seq, receipt.generation);
            return Ok(());
        }
        if state.tombstones.get(&receipt.seq) == Some(&receipt.generation) {
            return Ok(());
        }
        let stale = state
            .messages
            .get(&receipt.seq)
            .is_some_and(|message| message.receipt > receipt.generation);
        if stale && self.quirks.stale_delete_succeeds {
            // SQS: "the request succeeds, but the message might not be deleted".
            return Ok(());
        }
        Err(lease_lost(state.messages.contains_key(&receipt.seq)))
    }

    fn change_one(
        &self,
        state: &mut State,
        change: &VisibilityChange,
        now: Instant,
    ) -> Result<(), EntryError> {
        let Some(receipt) = self.parse_receipt(&change.receipt_handle) else {
            return Err(invalid_receipt());
        };
        if change.timeout > MAX_VISIBILITY_TIMEOUT {
            return Err(invalid_parameter(format!(
                "visibility timeout {:?} is over the limit of {MAX_VISIBILITY_TIMEOUT:?}",
                change.timeout
            )));
        }
        let version = state.version();
        let fifo = self.fifo;
        let State {
            messages,
            group_in_flight,
            ready,
            timers,
            in_flight,
            ..
        } = state;
        let Some(message) = messages.get_mut(&receipt.seq).filter(|message| {
            message.status == Status::InFlight
                && message.receipt == receipt.generation
                && message.visible_at > now
        }) else {
            return Err(lease_lost(messages.contains_key(&receipt.seq)));
        };
        let first_received = message.first_received.unwrap_or(now);
        if now + change.timeout > first_received + MAX_VISIBILITY_TIMEOUT {
            return Err(invalid_parameter(format!(
                "visibility timeout {:?} would keep the message in flight more than {MAX_VISIBILITY_TIMEOUT:?} \
                 after its first receipt",
                change.timeout
            )));
        }
        message.version = version;
        if change.timeout.is_zero() {
            message.status = Status::Visible;
            message.visible_at = now;
            *in_flight -= 1;
            unlock_group(group_in_flight, message.group_id.as_deref(), self.quirks);
            if !fifo {
                ready.push_back((receipt.seq, version));
            }
            return Ok(());
        }
        message.visible_at = now + change.timeout;
        timers.push(Reverse((message.visible_at, receipt.seq, version)));
        Ok(())
    }

    /// Each message the redrive policy moved to the DLQ, with the moment its last receive's hold
    /// ended (its visibility timeout, as last extended, ran out), on tokio's clock.
    pub fn redriven(&self) -> Vec<(String, Instant)> {
        self.redriven
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Moves redriven messages to the DLQ (outside this queue's lock).
    fn redrive(&self, moved: Vec<Stored>) {
        if moved.is_empty() {
            return;
        }
        bump(&self.counters.redriven, moved.len() as u64);
        self.redriven
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(
                moved
                    .iter()
                    .map(|message| (message.id.clone(), message.visible_at)),
            );
        if let Some(redrive) = &self.redrive {
            tracing::debug!(queue = %self.name, count = moved.len(), "messages moved to the DLQ by the redrive policy");
            redrive.dead_letter_queue.accept_redriven(moved);
        }
    }
}

/// A handle this queue never issued (malformed, or another queue's), as SQS's `ReceiptHandleIsInvalid`.
fn invalid_receipt() -> EntryError {
    EntryError::NotIssued("ReceiptHandleIsInvalid: the receipt handle is not one of this queue's".to_owned())
}

fn lease_lost(message_exists: bool) -> EntryError {
    let reason = if message_exists {
        "the receipt handle is not the message's latest, or the message is no longer in flight"
    } else {
        "the message was deleted or moved"
    };
    EntryError::LeaseLost(reason.to_owned())
}

/// The wall-clock time of `at`, counted back from `now` on tokio's clock. The queue keeps its time on
/// tokio's clock, and under `tokio::time::pause()` the wall clock does not follow it: a timestamp read
/// from the wall clock at the first receive would never age, and a consumer counting SQS's 12 hours
/// from `ApproximateFirstReceiveTimestamp` would find the first receive always just now.
fn wall_clock_at(at: Instant, now: Instant) -> SystemTime {
    let wall_now = conveyor_core::wall_clock::now();
    wall_now
        .checked_sub(now.saturating_duration_since(at))
        .unwrap_or(wall_now)
}

fn invalid_parameter(message: String) -> EntryError {
    EntryError::Failed {
        code: "InvalidParameterValue".to_owned(),
        message,
        sender_fault: true,
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn is_fifo(&self) -> bool {
        self.fifo
    }

    fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }

    fn max_receive_count(&self) -> Option<u32> {
        self.redrive.as_ref().map(|redrive| redrive.max_receive_count)
    }

    async fn receive_with_visibility(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        bump(&self.counters.receive, 1);
        self.check_available()?;
        if !(1..=MAX_RECEIVE_MESSAGES).contains(&max_messages) {
            return Err(QueueError::Invalid {
                message: format!(
                    "MaxNumberOfMessages is {max_messages}; it must be 1 to {MAX_RECEIVE_MESSAGES}"
                ),
            });
        }
        if wait > MAX_WAIT_TIME {
            return Err(QueueError::Invalid {
                message: format!("WaitTimeSeconds {wait:?} is over the limit of {MAX_WAIT_TIME:?}"),
            });
        }
        if visibility > MAX_VISIBILITY_TIMEOUT {
            return Err(QueueError::Invalid {
                message: format!("VisibilityTimeout {visibility:?} is over the limit of 12 hours"),
            });
        }
        let give_up = Instant::now() + wait;
        let mut moved = Vec::new();
        loop {
            let arrival = self.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            let now = Instant::now();
            let (batch, next_timer) = {
                let mut state = self.lock();
                let lease = Lease { now, visibility };
                let batch = self.take(&mut state, max_messages, lease, &mut moved);
                (batch, state.next_timer())
            };
            self.redrive(std::mem::take(&mut moved));
            if !batch.is_empty() || now >= give_up {
                bump(&self.counters.messages_received, batch.len() as u64);
                if batch.is_empty() {
                    bump(&self.counters.empty_receive, 1);
                }
                return Ok(batch);
            }
            let wake = next_timer.map_or(give_up, |at| at.min(give_up));
            tokio::select! {
                biased;
                () = &mut arrival => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    async fn delete_batch(&self, receipts: &[ReceiptHandle]) -> Result<Vec<EntryFailure>, QueueError> {
        bump(&self.counters.delete, batch_calls(receipts.len()));
        self.check_available()?;
        let now = Instant::now();
        let mut state = self.lock();
        let mut failures = Vec::new();
        for (index, handle) in receipts.iter().enumerate() {
            if let Err(error) = self.delete_one(&mut state, handle, now) {
                failures.push(EntryFailure { index, error });
            }
        }
        Ok(failures)
    }

    async fn change_visibility_batch(
        &self,
        changes: &[VisibilityChange],
    ) -> Result<Vec<EntryFailure>, QueueError> {
        bump(&self.counters.change_visibility, batch_calls(changes.len()));
        self.check_available()?;
        let now = Instant::now();
        let mut failures = Vec::new();
        {
            let mut state = self.lock();
            for (index, change) in changes.iter().enumerate() {
                if let Err(error) = self.change_one(&mut state, change, now) {
                    failures.push(EntryFailure { index, error });
                }
            }
        }
        if failures.len() < changes.len() {
            self.arrivals.notify_waiters();
        }
        Ok(failures)
    }

    async fn send(&self, message: OutgoingMessage) -> Result<String, QueueError> {
        bump(&self.counters.send, 1);
        self.check_available()?;
        self.push_message(message)
    }

    async fn dead_letter(&self, message: &Message, failure: &Failure) -> Result<DeadLetter, QueueError> {
        bump(&self.counters.dead_letter, 1);
        self.check_available()?;
        let Some(redrive) = &self.redrive else {
            return Ok(DeadLetter::NoDeadLetterQueue);
        };
        let dlq = &redrive.dead_letter_queue;
        dlq.send(dead_letter_copy(message, failure, dlq.fifo)).await?;
        Ok(DeadLetter::Sent(dlq.name.clone()))
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        bump(&self.counters.depth, 1);
        self.check_available()?;
        Ok(self.counts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipts(messages: &[Message]) -> Vec<ReceiptHandle> {
        messages
            .iter()
            .map(|message| message.receipt_handle.clone())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn received_messages_come_back_after_the_visibility_timeout() {
        let queue = MemoryQueue::standard("q").with_visibility_timeout(Duration::from_secs(10));
        queue.push("a").unwrap();
        let first = queue.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(first.len(), 1);
        assert!(queue.receive(10, Duration::ZERO).await.unwrap().is_empty());
        let started = Instant::now();
        let again = queue.receive(10, Duration::from_secs(20)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(again[0].receive_count, 2);
        assert_ne!(again[0].receipt_handle, first[0].receipt_handle);
        let stale = queue.delete_batch(&receipts(&first)).await.unwrap();
        assert!(matches!(stale[0].error, EntryError::LeaseLost(_)));
        assert!(queue.delete_batch(&receipts(&again)).await.unwrap().is_empty());
        assert!(
            queue.delete_batch(&receipts(&again)).await.unwrap().is_empty(),
            "repeat delete succeeds"
        );
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_receipt_is_not_valid_even_before_the_next_receive() {
        let queue = MemoryQueue::standard("q").with_visibility_timeout(Duration::from_secs(1));
        queue.push("a").unwrap();
        let first = queue.receive(1, Duration::ZERO).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let failures = queue.delete_batch(&receipts(&first)).await.unwrap();
        assert_eq!(failures.len(), 1);
        assert_eq!(queue.counts().visible, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn long_poll_wakes_on_send() {
        let queue = Arc::new(MemoryQueue::standard("q"));
        let waiting = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.receive(1, Duration::from_secs(20)).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = Instant::now();
        queue.push("late").unwrap();
        let received = waiting.await.unwrap().unwrap();
        assert_eq!(received[0].body, "late");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn long_poll_gives_up_after_wait() {
        let queue = MemoryQueue::standard("q");
        let started = Instant::now();
        assert!(
            queue
                .receive(10, Duration::from_secs(5))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(queue.requests().empty_receive, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn change_visibility_extends_and_zero_releases() {
        let queue = MemoryQueue::standard("q").with_visibility_timeout(Duration::from_secs(5));
        queue.push("a").unwrap();
        let first = queue.receive(1, Duration::ZERO).await.unwrap();
        let extend = VisibilityChange {
            receipt_handle: first[0].receipt_handle.clone(),
            timeout: Duration::from_secs(60),
        };
        assert!(
            queue
                .change_visibility_batch(std::slice::from_ref(&extend))
                .await
                .unwrap()
                .is_empty()
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(queue.receive(1, Duration::ZERO).await.unwrap().is_empty());
        let release = VisibilityChange {
            timeout: Duration::ZERO,
            ..extend
        };
        assert!(
            queue
                .change_visibility_batch(std::slice::from_ref(&release))
                .await
                .unwrap()
                .is_empty()
        );
        let again = queue.receive(1, Duration::ZERO).await.unwrap();
        assert_eq!(again[0].receive_count, 2);
        let stale = queue.change_visibility_batch(&[release]).await.unwrap();
        assert!(matches!(stale[0].error, EntryError::LeaseLost(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn visibility_cannot_pass_twelve_hours_from_first_receipt() {
        let queue = MemoryQueue::standard("q");
        queue.push("a").unwrap();
        let first = queue.receive(1, Duration::ZERO).await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        let change = VisibilityChange {
            receipt_handle: first[0].receipt_handle.clone(),
            timeout: MAX_VISIBILITY_TIMEOUT,
        };
        let failures = queue.change_visibility_batch(&[change]).await.unwrap();
        assert!(
            matches!(&failures[0].error, EntryError::Failed { code, .. } if code == "InvalidParameterValue")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn redrive_moves_after_max_receive_count() {
        let dlq = Arc::new(MemoryQueue::standard("dlq"));
        let queue = MemoryQueue::standard("q")
            .with_visibility_timeout(Duration::from_secs(1))
            .with_dead_letter_queue(Arc::clone(&dlq), 2);
        let id = queue.push("poison").unwrap();
        for expected in 1..=2 {
            let received = queue.receive(1, Duration::from_secs(5)).await.unwrap();
            assert_eq!(received[0].receive_count, expected);
        }
        assert!(queue.receive(1, Duration::from_secs(5)).await.unwrap().is_empty());
        let moved = queue.messages_in_dlq();
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].id, id);
        assert!(queue.is_empty());
        assert_eq!(queue.requests().redriven, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_blocks_a_group_while_one_of_its_messages_is_in_flight() {
        let queue = MemoryQueue::fifo("q");
        for (group, body) in [("a", "a1"), ("a", "a2"), ("b", "b1")] {
            grouped(&queue, group, body);
        }
        let first = queue.receive(1, Duration::ZERO).await.unwrap();
        assert_eq!(first[0].body, "a1");
        let second = queue.receive(10, Duration::ZERO).await.unwrap();
        let bodies: Vec<&str> = second.iter().map(|message| message.body.as_str()).collect();
        assert_eq!(bodies, ["b1"]);
        queue.delete_batch(&receipts(&first)).await.unwrap();
        let third = queue.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(third[0].body, "a2");
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_deduplicates_within_the_window() {
        let queue = MemoryQueue::fifo("q");
        let send = |dedup: &str| OutgoingMessage {
            body: "same".to_owned(),
            group_id: Some("g".to_owned()),
            deduplication_id: Some(dedup.to_owned()),
            ..OutgoingMessage::default()
        };
        let first = queue.push_message(send("d1")).unwrap();
        assert_eq!(queue.push_message(send("d1")).unwrap(), first);
        assert_eq!(queue.len(), 1);
        tokio::time::advance(DEDUPLICATION_WINDOW).await;
        assert_ne!(queue.push_message(send("d1")).unwrap(), first);
    }

    #[tokio::test(start_paused = true)]
    async fn delays_hold_messages_back() {
        let queue = MemoryQueue::standard("q");
        queue
            .push_message(OutgoingMessage {
                body: "later".to_owned(),
                delay: Some(Duration::from_secs(7)),
                ..OutgoingMessage::default()
            })
            .unwrap();
        assert_eq!(queue.counts().delayed, 1);
        let started = Instant::now();
        let received = queue.receive(1, Duration::from_secs(20)).await.unwrap();
        assert_eq!(received.len(), 1);
        assert_eq!(started.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test]
    async fn limits_are_errors() {
        let queue = MemoryQueue::standard("q");
        assert!(matches!(
            queue.receive(11, Duration::ZERO).await,
            Err(QueueError::Invalid { .. })
        ));
        assert!(matches!(
            queue.receive(0, Duration::ZERO).await,
            Err(QueueError::Invalid { .. })
        ));
        assert!(matches!(queue.push(""), Err(QueueError::Invalid { .. })));
        assert!(matches!(
            queue.push("x".repeat(MAX_MESSAGE_BYTES + 1)),
            Err(QueueError::Invalid { .. })
        ));
        let fifo = MemoryQueue::fifo("f");
        let no_group = OutgoingMessage {
            body: "x".to_owned(),
            ..OutgoingMessage::default()
        };
        assert!(matches!(
            fifo.push_message(no_group),
            Err(QueueError::Invalid { .. })
        ));
    }

    #[tokio::test]
    async fn unavailable_fails_every_call() {
        let queue = MemoryQueue::standard("q");
        queue.set_unavailable(true);
        assert!(queue.receive(1, Duration::ZERO).await.unwrap_err().is_retryable());
        assert!(queue.send(OutgoingMessage::default()).await.is_err());
        queue.set_unavailable(false);
        assert!(queue.receive(1, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn receipts_of_another_queue_are_refused() {
        let one = MemoryQueue::standard("one");
        let two = MemoryQueue::standard("two");
        one.push("a").unwrap();
        two.push("b").unwrap();
        let received = one.receive(1, Duration::ZERO).await.unwrap();
        let failures = two.delete_batch(&receipts(&received)).await.unwrap();
        assert_eq!(failures.len(), 1);
        assert_eq!(two.len(), 1);
    }

    fn grouped(queue: &MemoryQueue, group: &str, body: &str) {
        queue
            .push_message(OutgoingMessage {
                body: body.to_owned(),
                group_id: Some(group.to_owned()),
                ..OutgoingMessage::default()
            })
            .unwrap();
    }

    fn bodies(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|message| message.body.as_str()).collect()
    }

    /// 30 of the noisy group's messages in flight (30, and more than 10% of 30), 110 more waiting, then
    /// two quiet tenants' messages and one without a group: the receive takes the quiet ones first,
    /// then the noisy group's oldest. With fairness off, oldest first.
    #[tokio::test(start_paused = true)]
    async fn a_noisy_group_waits_behind_quiet_ones() {
        for fair in [true, false] {
            let mut queue = MemoryQueue::standard("q");
            if !fair {
                queue = queue.without_fair_queues();
            }
            for n in 0..140 {
                grouped(&queue, "noisy", &format!("n{n}"));
            }
            grouped(&queue, "quiet-a", "a");
            grouped(&queue, "quiet-b", "b");
            queue.push("ungrouped").unwrap();
            for _ in 0..3 {
                queue.receive(10, Duration::ZERO).await.unwrap();
            }
            let next = queue.receive(5, Duration::ZERO).await.unwrap();
            let expected = if fair {
                ["a", "b", "ungrouped", "n30", "n31"]
            } else {
                ["n30", "n31", "n32", "n33", "n34"]
            };
            assert_eq!(bodies(&next), expected, "fair queues {fair}");
        }
    }

    /// Below 30 in flight a group is never noisy, whatever its share; and a group stops being noisy
    /// once its in-flight count falls, so its backlog is served in order again.
    #[tokio::test(start_paused = true)]
    async fn a_group_is_noisy_only_with_30_in_flight_and_over_a_tenth() {
        let queue = MemoryQueue::standard("q");
        for n in 0..60 {
            grouped(&queue, "noisy", &format!("n{n}"));
        }
        grouped(&queue, "quiet", "q1");
        let first = queue.receive(10, Duration::ZERO).await.unwrap();
        let second = queue.receive(10, Duration::ZERO).await.unwrap();
        let third = queue.receive(9, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&third)[8], "n28", "29 in flight: not noisy yet");
        let fourth = queue.receive(2, Duration::ZERO).await.unwrap();
        assert_eq!(
            bodies(&fourth),
            ["n29", "n30"],
            "29 in flight is below the threshold"
        );
        grouped(&queue, "quiet", "q2");
        let fifth = queue.receive(2, Duration::ZERO).await.unwrap();
        assert_eq!(
            bodies(&fifth),
            ["q1", "q2"],
            "31 in flight: the quiet group goes first"
        );
        for done in [&first, &second] {
            queue.delete_batch(&receipts(done)).await.unwrap();
        }
        grouped(&queue, "quiet", "q3");
        let sixth = queue.receive(1, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&sixth), ["n31"], "11 in flight: not noisy any more");
    }

    /// Two noisy groups: the one with fewer in flight is served first, even when the other's backlog is
    /// older.
    #[tokio::test(start_paused = true)]
    async fn the_least_busy_noisy_group_goes_first() {
        let queue = MemoryQueue::standard("q");
        let sends = [
            ("big", 0..40),
            ("small", 0..30),
            ("big", 40..50),
            ("small", 30..40),
        ];
        for (group, numbers) in sends {
            for n in numbers {
                grouped(&queue, group, &format!("{group}{n}"));
            }
        }
        for _ in 0..7 {
            queue.receive(10, Duration::ZERO).await.unwrap();
        }
        let next = queue.receive(3, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&next), ["small30", "small31", "small32"]);
    }
}
