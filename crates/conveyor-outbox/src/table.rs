//! [`OutboxTable`]: where outbox items live and how they are laid out.
//!
//! An outbox item is one DynamoDB item holding a job already encoded for SQS. The attribute names below
//! are fixed (prefixed `outbox_` so they sit beside an application's own attributes in a single-table
//! design); the table's name and its key attribute names are configurable. There is no TTL: a committed
//! job stays until it was sent (or an operator removes it).

/// The format version written in [`VERSION`]. Version 2 keys jobs by aggregate and sequence; a relay
/// that finds a newer version stops on that aggregate with an error instead of skipping it.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// Marks an item as an outbox job (its value is the format version).
pub const VERSION: &str = "outbox_version";
/// The item id (a UUID unless the application chose one): the FIFO deduplication id, and the base of the
/// default idempotency key `outbox:<id>`.
pub const ID: &str = "outbox_id";
/// The target queue's URL.
pub const QUEUE_URL: &str = "outbox_queue_url";
/// The job type (`conveyor.type`), for logs.
pub const JOB_TYPE: &str = "outbox_job_type";
/// The aggregate id: its jobs are sent in sequence order; on a FIFO queue it is the message group id.
pub const AGGREGATE: &str = "outbox_aggregate";
/// The job's sequence number in its aggregate (from 1), and on the head item the last one allocated.
pub const SEQUENCE: &str = "outbox_sequence";
/// The idempotency key the consumer settles the job under (`conveyor.key`).
pub(crate) const IDEMPOTENCY_KEY: &str = "outbox_idempotency_key";
/// The encoded message body.
pub(crate) const BODY: &str = "outbox_body";
/// The message attributes: a map of name to `{type, string | binary}`.
pub(crate) const ATTRIBUTES: &str = "outbox_attributes";
/// The delivery delay in milliseconds, counted from when the relay sends (standard queues only).
pub(crate) const DELAY_MS: &str = "outbox_delay_ms";
/// The FIFO message group id.
pub const GROUP_ID: &str = "outbox_group_id";
/// The FIFO message deduplication id.
pub const DEDUPLICATION_ID: &str = "outbox_deduplication_id";
/// An X-Ray trace header.
pub const TRACE_HEADER: &str = "outbox_trace_header";
/// When the job was committed, epoch milliseconds (the pending index's sort key).
pub const CREATED_AT: &str = "outbox_created_at";
/// The pending index's partition key: `pending#<bucket>` while the job waits, `parked` once parked.
pub const PENDING: &str = "outbox_pending";
/// Failed sends so far.
pub const ATTEMPTS: &str = "outbox_attempts";
/// The last failure's reason.
pub const LAST_ERROR: &str = "outbox_last_error";
/// When the job was parked, epoch milliseconds.
pub const PARKED_AT: &str = "outbox_parked_at";
/// The lease's owner, epoch and version (on the lease item).
pub(crate) const LEASE_OWNER: &str = "outbox_lease_owner";
pub(crate) const LEASE_EPOCH: &str = "outbox_lease_epoch";
pub(crate) const LEASE_VERSION: &str = "outbox_lease_version";

/// The global secondary index over [`PENDING`] and [`CREATED_AT`] (keys only): unsent jobs oldest first,
/// for the sweep, the polling relay and the backlog.
pub const PENDING_INDEX: &str = "outbox-pending";
/// The number of `pending#<bucket>` values: an aggregate's jobs go to one bucket (a hash of the
/// aggregate), so the index's writes spread over this many partitions (DynamoDB takes about 1,000 writes
/// per second per partition key) while a sweep costs this many queries.
pub(crate) const PENDING_BUCKETS: u32 = 4;
/// [`PENDING`]'s value for parked jobs.
pub(crate) const PARKED: &str = "parked";

/// The environment variable naming the outbox table (the relay Lambda, the worker's relay task and
/// `conveyor outbox relay` read it).
pub const TABLE_ENV: &str = "CONVEYOR_OUTBOX_TABLE";
/// The environment variable naming the partition key attribute (default `pk`).
pub const PARTITION_KEY_ENV: &str = "CONVEYOR_OUTBOX_PARTITION_KEY";
/// The environment variable naming the sort key attribute (default `sk`).
pub const SORT_KEY_ENV: &str = "CONVEYOR_OUTBOX_SORT_KEY";

/// The prefix of outbox key values.
pub(crate) const KEY_PREFIX: &str = "outbox#";

/// The outbox table: its name and key attribute names.
///
/// Jobs are keyed by aggregate (partition key `outbox#<aggregate>`) and sequence (sort key
/// `outbox#job#<sequence, 20 digits>`), beside the aggregate's head item (sort key `outbox#head`, the last
/// sequence allocated). The default key names (`pk` and `sk`, strings) are what
/// `infra/modules/outbox-relay` creates for a dedicated table and the usual ones of a single-table
/// design, so the outbox can live in the application's own table; the table needs the
/// [`PENDING_INDEX`] index either way ([`crate::create_outbox_table`] shows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// The table's name.
    pub name: String,
    /// The partition key attribute (a string).
    pub partition_key: String,
    /// The sort key attribute (a string).
    pub sort_key: String,
}

impl OutboxTable {
    /// A table named `name` with the default key names: partition key `pk`, sort key `sk`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            partition_key: "pk".to_owned(),
            sort_key: "sk".to_owned(),
        }
    }

    /// The table from the environment: [`TABLE_ENV`] (required), [`PARTITION_KEY_ENV`], [`SORT_KEY_ENV`];
    /// `None` when [`TABLE_ENV`] is unset.
    pub fn from_env() -> Option<Self> {
        let name = std::env::var(TABLE_ENV).ok().filter(|name| !name.is_empty())?;
        let mut table = Self::new(name);
        if let Ok(key) = std::env::var(PARTITION_KEY_ENV)
            && !key.is_empty()
        {
            table = table.partition_key(key);
        }
        if let Ok(key) = std::env::var(SORT_KEY_ENV)
            && !key.is_empty()
        {
            table = table.sort_key(key);
        }
        Some(table)
    }

    /// The partition key attribute's name.
    pub fn partition_key(mut self, name: impl Into<String>) -> Self {
        self.partition_key = name.into();
        self
    }

    /// The sort key attribute's name.
    pub fn sort_key(mut self, name: impl Into<String>) -> Self {
        self.sort_key = name.into();
        self
    }

    /// The partition key value of `aggregate`'s items.
    pub fn aggregate_key(aggregate: &str) -> String {
        format!("{KEY_PREFIX}{aggregate}")
    }

    /// The aggregate of a partition key value, when it is an outbox one (not a lease).
    pub fn aggregate_of(partition_key_value: &str) -> Option<&str> {
        let aggregate = partition_key_value.strip_prefix(KEY_PREFIX)?;
        (!aggregate.starts_with(LEASE_PREFIX)).then_some(aggregate)
    }

    /// The sort key value of job `sequence`.
    pub(crate) fn job_key(sequence: u64) -> String {
        format!("{JOB_PREFIX}{sequence:020}")
    }
}

/// The sort key prefix of jobs.
pub(crate) const JOB_PREFIX: &str = "outbox#job#";
/// The sort key of an aggregate's head item.
pub(crate) const HEAD_KEY: &str = "outbox#head";
/// The partition key prefix (after [`KEY_PREFIX`]) of leases: aggregates may not start with it.
pub(crate) const LEASE_PREFIX: &str = "lease#";
