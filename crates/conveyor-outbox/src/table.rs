//! [`OutboxTable`]: where outbox items live and how they are laid out.
//!
//! An outbox item is one DynamoDB item holding a job already encoded for SQS. The attribute names below
//! are fixed (prefixed `outbox_` so they sit beside an application's own attributes in a single-table
//! design); the table's name, its key attribute names and the TTL attribute are configurable.

use std::time::Duration;

/// The format version written in [`VERSION`]; the relay skips (and logs) items of a newer format.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Marks an item as an outbox item (its value is the format version). Items without it are not the
/// relay's business: in a single-table design they are the application's own.
pub const VERSION: &str = "outbox_version";
/// The item id (a UUID unless the application chose one): the FIFO deduplication id, and the base of the
/// default idempotency key `outbox:<id>`.
pub const ID: &str = "outbox_id";
/// The target queue's URL.
pub const QUEUE_URL: &str = "outbox_queue_url";
/// The job type (`conveyor.type`), for logs.
pub const JOB_TYPE: &str = "outbox_job_type";
/// The aggregate id: records of one aggregate are sent in commit order; on a FIFO queue it is the message
/// group id.
pub(crate) const AGGREGATE: &str = "outbox_aggregate";
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
/// When the item was built, epoch milliseconds.
pub const CREATED_AT: &str = "outbox_created_at";

/// The environment variable naming the outbox table (the relay Lambda, the worker's relay task and
/// `conveyor outbox relay` read it).
pub const TABLE_ENV: &str = "CONVEYOR_OUTBOX_TABLE";
/// The environment variable naming the partition key attribute (default `pk`).
pub const PARTITION_KEY_ENV: &str = "CONVEYOR_OUTBOX_PARTITION_KEY";
/// The environment variable naming the sort key attribute (default `sk`; empty for none).
pub const SORT_KEY_ENV: &str = "CONVEYOR_OUTBOX_SORT_KEY";
/// The environment variable naming the TTL attribute (default `expires_at`).
pub const TTL_ATTRIBUTE_ENV: &str = "CONVEYOR_OUTBOX_TTL_ATTRIBUTE";

/// The prefix of the key values of outbox items (`outbox#<id>`).
pub(crate) const KEY_PREFIX: &str = "outbox#";

/// The TTL written on outbox items when none is configured: a backstop for items whose delete failed
/// after they were sent. Longer than the stream's 24-hour retention, so an item is never expired before
/// a relay could have read it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The outbox table: its name, key attribute names and TTL attribute.
///
/// The default layout (`pk` and `sk` strings, TTL attribute `expires_at`) is what the
/// `infra/modules/outbox-relay` Terraform module creates for a dedicated table, and the usual key names of
/// a single-table design, so the outbox can live in the application's own table unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// The table's name.
    pub name: String,
    /// The partition key attribute (a string).
    pub partition_key: String,
    /// The sort key attribute (a string), when the table has one.
    pub sort_key: Option<String>,
    /// The table's TTL attribute (epoch seconds).
    pub ttl_attribute: String,
}

impl OutboxTable {
    /// A table named `name` with the default layout: partition key `pk`, sort key `sk`, TTL attribute
    /// `expires_at`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            partition_key: "pk".to_owned(),
            sort_key: Some("sk".to_owned()),
            ttl_attribute: "expires_at".to_owned(),
        }
    }

    /// The table from the environment: [`TABLE_ENV`] (required), [`PARTITION_KEY_ENV`], [`SORT_KEY_ENV`]
    /// (empty for a table without a sort key), [`TTL_ATTRIBUTE_ENV`]; `None` when [`TABLE_ENV`] is unset.
    pub fn from_env() -> Option<Self> {
        let name = std::env::var(TABLE_ENV).ok().filter(|name| !name.is_empty())?;
        let mut table = Self::new(name);
        if let Ok(key) = std::env::var(PARTITION_KEY_ENV) {
            table = table.partition_key(key);
        }
        if let Ok(key) = std::env::var(SORT_KEY_ENV) {
            table = table.sort_key(Some(key.as_str()).filter(|key| !key.is_empty()));
        }
        if let Ok(name) = std::env::var(TTL_ATTRIBUTE_ENV) {
            table = table.ttl_attribute(name);
        }
        Some(table)
    }

    /// The partition key attribute's name.
    pub fn partition_key(mut self, name: impl Into<String>) -> Self {
        self.partition_key = name.into();
        self
    }

    /// The sort key attribute's name, or `None` for a table with a partition key only.
    pub fn sort_key(mut self, name: Option<&str>) -> Self {
        self.sort_key = name.map(str::to_owned);
        self
    }

    /// The TTL attribute's name (the one the table's `TimeToLiveSpecification` names).
    pub fn ttl_attribute(mut self, name: impl Into<String>) -> Self {
        self.ttl_attribute = name.into();
        self
    }

    /// The key attribute names, partition key first.
    pub fn key_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.partition_key.as_str()).chain(self.sort_key.as_deref())
    }

    /// The key value of the outbox item with id `id` (the same value for both key attributes).
    pub fn key_value(id: &str) -> String {
        format!("{KEY_PREFIX}{id}")
    }
}
