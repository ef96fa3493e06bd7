//! [`OutboxStore`]: where committed jobs wait until the relay has sent them. Implemented on DynamoDB
//! ([`crate::DynamoOutboxStore`]), on Postgres (feature `postgres`) and in memory
//! ([`crate::memory::MemoryOutboxStore`], for tests and the simulator); every implementation passes the
//! same conformance suite ([`crate::conformance`]).
//!
//! # The contract
//!
//! - **Order by construction.** Each aggregate's jobs carry a sequence number the writer allocated in the
//!   application's own transaction (a per-aggregate counter updated under a condition, or a row lock):
//!   job `n + 1` of an aggregate can commit only after job `n` committed. [`OutboxStore::jobs`] returns an
//!   aggregate's unsent jobs lowest sequence first, reading its own writes (a consistent read).
//! - **Removal is the relay's fence.** [`OutboxStore::remove_sent`] removes a job only if it is still
//!   there, and says per job whether this call removed it. A relay sends job `n + 1` only after its own
//!   removal of job `n` succeeded, and removes job `n` only after SQS accepted it. So whichever relays
//!   run, however they interleave, job `n + 1` is first sent after job `n` was accepted: a relay that loses
//!   a race sends at most one duplicate of a job already sent, and then stops on that aggregate.
//! - **Nothing expires.** A committed job stays until it was sent or an operator removes it: no TTL.
//! - **Parking.** A job that failed permanently too often is parked with its reason; an aggregate whose
//!   first unsent job is parked is not relayed (its later jobs wait behind it, in order) until
//!   [`OutboxStore::unpark`].

use std::time::Duration;

use async_trait::async_trait;
use conveyor_core::port::OutgoingMessage;

/// A failed store operation.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store is unreachable or throttling: trying again later may work.
    #[error("outbox store {store} is unavailable: {message}")]
    Unavailable {
        /// The table or database.
        store: String,
        /// What happened.
        message: String,
    },
    /// The store is set up wrongly (a missing table or index, denied permissions): an operator must fix it.
    #[error("outbox store {store} is misconfigured: {message}")]
    Misconfigured {
        /// The table or database.
        store: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A stored job cannot be read back (written by a newer format, or edited by hand).
    #[error("outbox store {store}: job {aggregate}#{sequence} cannot be read: {message}")]
    Unreadable {
        /// The table or database.
        store: String,
        /// The job's aggregate.
        aggregate: String,
        /// The job's sequence number.
        sequence: u64,
        /// What is wrong.
        message: String,
    },
}

impl StoreError {
    /// True when the same call may succeed later without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// One committed job as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredJob {
    /// The aggregate whose order the job keeps (on a FIFO queue its message group id).
    pub aggregate: String,
    /// The job's place in its aggregate, from 1.
    pub sequence: u64,
    /// The item id (the FIFO deduplication id, and `outbox:<id>` the default idempotency key).
    pub id: String,
    /// The target queue's URL.
    pub queue_url: String,
    /// The job type, for logs.
    pub job_type: String,
    /// The encoded message.
    pub message: OutgoingMessage,
    /// When the job was committed (the writer's clock), epoch milliseconds.
    pub created_at_millis: u64,
    /// Failed sends so far.
    pub attempts: u32,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// Parked (not relayed until unparked), with when, epoch milliseconds.
    pub parked_at_millis: Option<u64>,
}

impl StoredJob {
    /// The job's reference.
    pub fn reference(&self) -> JobRef {
        JobRef {
            aggregate: self.aggregate.clone(),
            sequence: self.sequence,
        }
    }
}

/// A job's identity in the store: its aggregate and sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobRef {
    /// The aggregate.
    pub aggregate: String,
    /// The sequence number.
    pub sequence: u64,
}

/// What waits in the outbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backlog {
    /// When the oldest unsent, unparked job was committed (epoch milliseconds), if any.
    pub oldest_pending_millis: Option<u64>,
    /// Aggregates with unsent, unparked jobs (up to the limit asked for), oldest first.
    pub pending_aggregates: Vec<String>,
    /// Parked jobs (up to the limit asked for), oldest first.
    pub parked: Vec<StoredJob>,
}

/// The relay's lease as stored: who holds it, its epoch (one higher at every takeover) and its version
/// (one higher at every renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The holder, or empty when released.
    pub owner: String,
    /// Raised by every takeover.
    pub epoch: u64,
    /// Raised by every renewal.
    pub version: u64,
}

/// Where committed jobs wait: see the module's contract.
#[async_trait]
pub trait OutboxStore: Send + Sync + std::fmt::Debug {
    /// The table or database, for logs and errors.
    fn name(&self) -> &str;

    /// Requests (DynamoDB calls, SQL statements) made so far, for the figures; 0 when not counted.
    fn requests(&self) -> u64 {
        0
    }

    /// Up to `limit` of `aggregate`'s unsent jobs (parked ones included), lowest sequence first, read
    /// consistently.
    async fn jobs(&self, aggregate: &str, limit: usize) -> Result<Vec<StoredJob>, StoreError>;

    /// Up to `limit` aggregates with an unsent, unparked job committed before `committed_before_millis`,
    /// oldest first. May lag the writes by moments (an index); the relay reads the jobs with
    /// [`OutboxStore::jobs`].
    async fn pending(&self, limit: usize, committed_before_millis: u64) -> Result<Vec<String>, StoreError>;

    /// Removes the jobs that are still there; per job, true when this call removed it.
    async fn remove_sent(&self, jobs: &[JobRef]) -> Result<Vec<bool>, StoreError>;

    /// Says that the relay sent and removed `aggregate`'s jobs up to `last_sequence` and read nothing after
    /// it: a store that indexes pending aggregates drops the aggregate's entry, unless a job was committed
    /// after `last_sequence`. The default does nothing.
    async fn drained(&self, aggregate: &str, last_sequence: u64) -> Result<(), StoreError> {
        let _ = (aggregate, last_sequence);
        Ok(())
    }

    /// Records a failed send of `job` (its attempts one higher, its reason); parks it when `parked_at_millis`
    /// is set (the relay's clock).
    async fn record_failure(
        &self,
        job: &JobRef,
        reason: &str,
        parked_at_millis: Option<u64>,
    ) -> Result<(), StoreError>;

    /// Unparks the parked jobs of `aggregate` (their attempts back to 0); returns how many.
    async fn unpark(&self, aggregate: &str) -> Result<usize, StoreError>;

    /// The backlog: the oldest pending job's age, up to `limit` pending aggregates and parked jobs.
    async fn backlog(&self, limit: usize) -> Result<Backlog, StoreError>;

    /// The lease named `name`, if one was ever written.
    async fn read_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError>;

    /// Writes `lease` if the stored one is still `expected` (`None`: none exists); false when it changed.
    async fn write_lease(
        &self,
        name: &str,
        expected: Option<&LeaseRecord>,
        lease: &LeaseRecord,
    ) -> Result<bool, StoreError>;
}

/// The lease duration below which a relay refuses to start: shorter leases are lost to ordinary latency.
pub const MIN_LEASE: Duration = Duration::from_secs(3);
