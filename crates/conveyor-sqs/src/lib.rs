#![doc = include_str!("../README.md")]

pub mod admin;
mod batch;
mod batching;
mod client;
mod convert;
pub mod endpoint;
mod errors;
mod fifo_order;
mod flow;
pub mod iam;
mod job;
mod large;
#[cfg(test)]
mod mock_client;
mod producer;
mod queue;
pub mod redrive;
mod relay_watch;
#[cfg(test)]
mod request_shape_tests;
mod send;
mod tracked;

pub use batching::{BatchingConfig, BatchingError, BatchingProducer, MAX_LINGER};
pub use client::{
    ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, INITIAL_BACKOFF, MAX_ATTEMPTS, MAX_BACKOFF, OPERATION_TIMEOUT,
    RECEIVE_MARGIN, lease_timeout_config, receive_timeout_config, retry_config, sqs_client_from_env,
    sqs_client_with_timeouts, timeout_config,
};
pub use flow::{Flow, FlowError, FlowProducer, FlowSent, SqsSender};
pub use job::{NewJob, ProduceError};
pub use producer::{BATCH_ATTEMPTS, BATCH_RETRY_BASE, BatchReport, CancelError, Producer};
pub use queue::SqsQueue;
pub use redrive::{QueueArn, RedrivePolicy};
