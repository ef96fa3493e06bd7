#![doc = include_str!("../README.md")]

pub use conveyor_core::{
    BackgroundTask, Backoff, Batch, BatchHandler, BatchJob, BatchResult, BatchSettings, CancelReason,
    Cancelled, ChildFailurePolicy, ChildResult, Context, ErrorKind, Flows, Handler, HandlerError,
    HandlerSettings, JobQuery, JobRecord, JobStatus, KeySource, KeyStyle, Payloads, Pipeline,
    PowertoolsFlavor, PowertoolsKey, Progress, RejectMode, Router, TimerChange, TimerRelay, Timers,
};

/// What AWS services put on a queue (SNS notifications, EventBridge events, S3 notifications,
/// CloudEvents): the types a handler of a [`Router::event`], [`Router::cloud_event`] or
/// [`Router::s3_events`] route reads, and [`events::Envelope`] from [`Context::envelopes`].
pub use conveyor_core::events;

/// The rest of the core, for adapters and runtimes: `core::message` (the message model), `core::port`
/// (`Queue`, `IdempotencyStore`, `PayloadStore`, `FlowStore`, `TimerStore`), `core::runtime`, `core::limits`.
pub use conveyor_core as core;

/// SQS: the producer (`Producer`, `NewJob`), the queue adapter, flows' sender and the admin calls
/// (feature `sqs`, which `worker` and `lambda` turn on).
#[cfg(feature = "sqs")]
pub use conveyor_sqs as sqs;

/// The long-poll runtime (feature `worker`).
#[cfg(feature = "worker")]
pub use conveyor_worker as worker;

/// The Lambda runtime (feature `lambda`).
#[cfg(feature = "lambda")]
pub use conveyor_lambda as lambda;

/// The DynamoDB idempotency store, job tracking and flow counting (feature `dynamodb`).
#[cfg(feature = "dynamodb")]
pub use conveyor_dynamodb as dynamodb;

/// Large payloads in S3 (feature `s3`).
#[cfg(feature = "s3")]
pub use conveyor_s3 as s3;

/// Schedules (feature `schedule`).
#[cfg(feature = "schedule")]
pub use conveyor_schedule as schedule;

/// The transactional outbox (feature `outbox`).
#[cfg(feature = "outbox")]
pub use conveyor_outbox as outbox;

/// Test doubles and helpers (feature `testing`).
#[cfg(feature = "testing")]
pub use conveyor_testing as testing;

/// OpenTelemetry export over OTLP/HTTP from the standard `OTEL_*` variables (`conveyor-otel`); trace
/// propagation itself is `conveyor::core::trace`.
#[cfg(feature = "otel")]
pub use conveyor_otel as otel;

/// The names a handler, a producer and a `main` use: `use conveyor::prelude::*;`.
pub mod prelude {
    pub use conveyor_core::{
        Backoff, Batch, BatchHandler, BatchResult, BatchSettings, Context, Handler, HandlerError,
        HandlerSettings, Pipeline, Router,
    };
    #[cfg(feature = "sqs")]
    pub use conveyor_sqs::{BatchingConfig, BatchingProducer, NewJob, Producer};

    #[cfg(feature = "worker")]
    pub use conveyor_worker::{Runner, Worker};

    #[cfg(feature = "dynamodb")]
    pub use conveyor_dynamodb::DynamoStore;
}
