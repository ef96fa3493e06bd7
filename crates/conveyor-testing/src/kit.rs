//! Testing your own handlers, without AWS: run a handler on a job through the real pipeline and see
//! what the runtime would do with the message (Sidekiq::Testing's and Oban.Testing's `perform_job`).
//!
//! ```
//! use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
//! use conveyor_testing::kit::{JobRunner, TestJob};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Invoice { cents: i64 }
//!
//! struct ChargeInvoice;
//!
//! impl Handler for ChargeInvoice {
//!     type Job = Invoice;
//!     type Output = String;
//!     const JOB_TYPE: &'static str = "charge_invoice";
//!
//!     async fn handle(&self, job: Invoice, _ctx: Context) -> Result<String, HandlerError> {
//!         if job.cents <= 0 {
//!             return Err(HandlerError::permanent("nothing to charge"));
//!         }
//!         Ok(format!("charged {}", job.cents))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let runner = JobRunner::new(Pipeline::new(Router::new().route(ChargeInvoice)));
//! let ran = runner.run(TestJob::new("charge_invoice", &Invoice { cents: 500 })).await;
//! assert_eq!(ran.output::<String>().as_deref(), Some("charged 500"));
//!
//! let ran = runner.run(TestJob::new("charge_invoice", &Invoice { cents: 0 })).await;
//! assert_eq!(ran.dead_lettered(), Some("nothing to charge"));
//! # }
//! ```
//!
//! With the feature `sqs` (on with `aws`), `MemorySqs` gives an SQS client answered in this process: a handler's
//! [`Producer`](conveyor_sqs::Producer) built on it sends nowhere, and the test reads what it sent.

#[cfg(feature = "sqs")]
mod memory_sqs;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conveyor_core::message::{
    AttributeValue, DEFERRAL_ATTRIBUTE, DeferralRecord, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE,
    Message,
};
use conveyor_core::runtime::{AckReason, Budget, Lease, Outcome, Processed};
use conveyor_core::{Context, Pipeline};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "sqs")]
pub use memory_sqs::{MemorySqs, SentMessage};

/// How long a test run may hold its message: the handler's own timeout still applies within it.
const TEST_VISIBILITY: Duration = Duration::from_secs(300);

/// Message ids for test jobs, unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One delivery of a job, as a runtime would receive it: the job type, its JSON body, and the
/// delivery's details (which attempt, how many the queue allows, the producer's key).
#[derive(Debug, Clone)]
pub struct TestJob {
    message: Message,
    max_attempts: Option<u32>,
}

impl TestJob {
    /// The first delivery of `job` for the handler of `job_type`. Panics when `job` cannot be
    /// serialized to JSON (a test's own value).
    pub fn new(job_type: &str, job: &impl Serialize) -> Self {
        let body =
            serde_json::to_string(job).unwrap_or_else(|error| panic!("the test job is not JSON: {error}"));
        Self::with_body(job_type, body)
    }

    /// A delivery whose body is `body` as it stands (a malformed body, an old producer's shape).
    pub fn with_body(job_type: &str, body: impl Into<String>) -> Self {
        let id = format!("test-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let mut message = Message::new(id, body);
        message
            .attributes
            .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
        message.sent_at = Some(std::time::SystemTime::now());
        Self {
            message,
            max_attempts: Some(conveyor_core::runtime::MAX_RECEIVE_COUNT),
        }
    }

    /// The producer's idempotency key (`NewJob::key`).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.message.attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            AttributeValue::string(key.into()),
        );
        self
    }

    /// This delivery is run `attempt` (1 = first) of at most `max_attempts` (the queue's
    /// `maxReceiveCount`): a retryable failure at the last one goes to the DLQ. The retry budget counts
    /// runs, not receives, so the message is built as a copy that carries `attempt - 1` earlier runs
    /// (its first receive; a store that counts runs agrees, as it never counts fewer than a copy
    /// carries).
    pub fn attempt(mut self, attempt: u32, max_attempts: u32) -> Self {
        self.message.receive_count = 1;
        self.message.attributes.remove(DEFERRAL_ATTRIBUTE);
        if attempt > 1 {
            let record = DeferralRecord {
                original_id: self.message.id.clone(),
                first_sent_ms: None,
                attempts: attempt - 1,
                deferrals: 0,
                waiting_for: None,
                waiting_since_ms: None,
            };
            let json = serde_json::to_string(&record).unwrap_or_default();
            self.message
                .attributes
                .insert(DEFERRAL_ATTRIBUTE.to_owned(), AttributeValue::string(json));
        }
        self.max_attempts = Some(max_attempts);
        self
    }

    /// A queue without a DLQ: failures are retried without end.
    pub fn without_dead_letter_queue(mut self) -> Self {
        self.max_attempts = None;
        self
    }

    /// The message this delivery carries.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// A [`Context`] for this delivery, for calling a handler's `handle` directly: the queue is `test`,
    /// the deadline five minutes away, never cancelled.
    pub fn context(&self) -> Context {
        Context::new(
            Arc::new(self.message.clone()),
            Arc::from("test"),
            Instant::now() + TEST_VISIBILITY,
            CancellationToken::new(),
            self.message.idempotency_key().map(str::to_owned),
        )
    }
}

/// Runs test jobs through a [`Pipeline`]: decoding, the idempotency claim when the pipeline has a
/// store (a [`MemoryIdempotencyStore`](crate::MemoryIdempotencyStore) keeps it in memory), the
/// handler, and the outcome a runtime would act on.
#[derive(Debug)]
pub struct JobRunner {
    pipeline: Pipeline,
}

impl JobRunner {
    /// A runner for `pipeline` (its router, store, flows, payloads and clock are used as they are).
    pub fn new(pipeline: Pipeline) -> Self {
        Self { pipeline }
    }

    /// Runs one delivery and returns what the runtime would do with the message.
    pub async fn run(&self, job: TestJob) -> Ran {
        let lease = Lease::new(Instant::now() + TEST_VISIBILITY);
        let budget = Budget::default().with_max_attempts(job.max_attempts);
        let processed = self
            .pipeline
            .process(Arc::new(job.message), Arc::from("test"), &lease, budget)
            .await;
        Ran { processed }
    }
}

/// What a runtime would do with a test job's message after its run.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    processed: Processed,
}

impl Ran {
    /// The outcome as the runtimes see it (delete, retry after a delay, dead-letter, defer unrun).
    pub fn outcome(&self) -> &Outcome {
        &self.processed.outcome
    }

    /// True when the handler ran now and succeeded (the message is deleted).
    pub fn succeeded(&self) -> bool {
        matches!(self.processed.outcome, Outcome::Ack(AckReason::Completed))
    }

    /// True when the handler did not run because the job was done before (same idempotency key).
    pub fn duplicate(&self) -> bool {
        matches!(self.processed.outcome, Outcome::Ack(AckReason::Duplicate))
    }

    /// The handler's output (or, for a duplicate, the stored one), decoded; `None` when there is none
    /// or it does not decode as `T`.
    pub fn output<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(self.processed.output.as_deref()?).ok()
    }

    /// When the job will be retried: after this delay (backoff with jitter, or the handler's
    /// `retry_after`).
    pub fn retried_after(&self) -> Option<Duration> {
        match &self.processed.outcome {
            Outcome::Retry { delay, .. } => Some(*delay),
            _ => None,
        }
    }

    /// The reason the message goes to the DLQ, when it does (a permanent error, the last attempt's
    /// failure, an undecodable body, no handler for its type).
    pub fn dead_lettered(&self) -> Option<&str> {
        match &self.processed.outcome {
            Outcome::Reject(failure) => Some(&failure.error),
            _ => None,
        }
    }

    /// When the job goes back unrun (not due yet, its key in progress elsewhere, the store unreachable):
    /// after this delay, with why.
    pub fn deferred(&self) -> Option<(Duration, &str)> {
        match &self.processed.outcome {
            Outcome::Defer { delay, reason, .. } => Some((*delay, reason)),
            _ => None,
        }
    }

    /// True when the handler ran (false for a duplicate, a cancelled or deferred job, an undecodable
    /// body).
    pub fn handler_ran(&self) -> bool {
        self.processed.ran()
    }
}
