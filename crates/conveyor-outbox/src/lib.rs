#![doc = include_str!("../README.md")]

#[doc(hidden)]
pub mod backlog;
pub mod image;
mod item;
mod relay;
mod setup;
pub mod state;
mod stream;
pub mod table;

pub use image::{Change, Image, StreamRecord, Value};
pub use item::{Outbox, OutboxError, OutboxItem};
pub use relay::{Relay, RelayReport};
pub use setup::{CreateTableError, create_outbox_table};
pub use stream::{
    LEASE_SECONDS_ENV, ProgressSnapshot, RelayProgress, STATE_TABLE_ENV, StreamRelay, StreamRelayError,
    StreamRelayOptions, stream_relay_from_env, streams_client, streams_client_from_env,
};
pub use table::OutboxTable;
