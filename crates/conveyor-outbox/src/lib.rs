#![doc = include_str!("../README.md")]

#[doc(hidden)]
pub mod backlog;
pub mod conformance;
mod dynamo;
mod encode;
mod env;
mod item;
mod lease;
pub mod memory;
mod poller;
#[cfg(feature = "postgres")]
pub mod postgres;
mod relay;
mod resend;
mod setup;
mod sink;
pub mod store;
pub mod table;

pub use dynamo::DynamoOutboxStore;
pub use encode::{EncodedJob, encode};
pub use env::{
    LEASE_SECONDS_ENV, MAX_ATTEMPTS_ENV, POSTGRES_URL_ENV, RelayConfigError, dynamodb_client,
    poller_from_env, postgres_store, relay_for,
};
pub use item::{Outbox, OutboxError, OutboxWrite, is_sequence_conflict};
pub use lease::{Lease, LeaseFence};
pub use poller::{
    OLDEST_UNSENT_METRIC, PARKED_METRIC, Poller, PollerOptions, PollerProgress, ProgressSnapshot,
    SENT_METRIC, backlog, publish,
};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOutbox, PostgresOutboxError, PostgresOutboxStore, PostgresWrite};
pub use relay::{Fence, Relay, RelayOptions, RelayReport, Unfenced, WallClock};
pub use resend::{Parked, Resent, resend};
pub use setup::{CreateTableError, create_outbox_table};
pub use sink::{JobSink, QueueSink, SendFailure, SqsSink};
pub use store::{Backlog, JobRef, LeaseRecord, OutboxStore, StoreError, StoredJob};
pub use table::OutboxTable;
