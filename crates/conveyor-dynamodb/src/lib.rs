#![doc = include_str!("../README.md")]

mod cache;
mod classify;
mod client;
pub mod defaults;
pub mod flows;
pub mod iam;
mod item;
pub mod jobs;
mod options;
mod size;
mod store;
mod table;
mod timers;

pub use client::{
    ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, INITIAL_BACKOFF, MAX_ATTEMPTS, MAX_BACKOFF, OPERATION_TIMEOUT,
    dynamodb_client_from_env, retry_config, timeout_config,
};
pub use options::{AttributeNames, DataFormat, OversizedOutput, SortKey, StoreOptions};
pub use store::{CLAIM_CONDITION, DynamoStore, EXTEND_CONDITION, TOKEN_CONDITION};
pub use table::{TableError, create_idempotency_table};
