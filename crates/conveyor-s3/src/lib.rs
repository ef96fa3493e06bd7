#![doc = include_str!("../README.md")]

mod classify;
mod client;
mod env;
pub mod iam;
mod store;

pub use client::{
    ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, MAX_ATTEMPTS, OPERATION_TIMEOUT, retry_config, s3_client,
    s3_client_from_env, timeout_config,
};
pub use env::{BUCKET_ENV, CLEANUP_ENV, EnvError, payload_bucket_from_env, payloads_from_env};
pub use store::S3PayloadStore;
