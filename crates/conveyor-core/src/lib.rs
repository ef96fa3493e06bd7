#![doc = include_str!("../README.md")]

// The modules are private; what a user writes is at the root, and the rest is in four public modules
// with one job each: `message` (the message model), `events` (what AWS services put on a queue), `port` (what an adapter implements), `runtime`
// (what the worker and the Lambda adapter call), `limits`, `config` and `metric_names` (shared names and
// numbers). Every public item has exactly one path.
mod background;
mod backoff;
mod batch;
pub mod config;
mod context;
mod dead_letter;
mod defaults;
mod deferral;
mod delay;
mod display;
mod disposition;
mod envelope;
mod error;
pub mod events;
mod fifo_gate;
mod flow;
mod flow_step;
mod flow_sweep;
mod handler;
mod idempotency;
mod lease;
pub mod limits;
mod log_output;
pub mod message;
pub mod metric_names;
mod outcome;
mod payload;
mod pipeline;
mod progress;
mod queue;
mod rate;
mod record_key;
mod router;
mod start_line;
mod store_env;
mod store_health;
mod store_retry;
pub mod tenant;
mod tenant_limits;
mod tenant_metrics;
#[cfg(test)]
mod test_logs;
mod timer;
pub mod trace;
mod tracking;
mod unrun;
mod visibility_cap;
#[doc(hidden)] // a simulation hook: the simulator runs the runtimes on a virtual wall clock
pub mod wall_clock;

pub use background::BackgroundTask;
pub use backoff::Backoff;
pub use batch::{Batch, BatchHandler, BatchJob, BatchResult, BatchSettings};
pub use context::Context;
pub use delay::{CancelError, Cancelled};
pub use disposition::RejectMode;
pub use error::{ErrorKind, HandlerError};
pub use flow::{
    ChildFailurePolicy, ChildResult, DEFAULT_FLOW_DEADLINE, FLOW_RETENTION, Flows, PARENT_SEND_TRIES,
};
pub use flow_sweep::{FlowSweeper, SweepReport, sweep_overdue_flows};
pub use handler::{BoxFuture, Handler, HandlerSettings};
pub use lease::CancelReason;
pub use payload::Payloads;
pub use pipeline::Pipeline;
pub use record_key::{KeySource, KeyStyle, PowertoolsFlavor, PowertoolsKey};
pub use router::Router;
pub use timer::{RelayedTimers, TimerChange, TimerError, TimerRelay, Timers};
pub use tracking::{JobQuery, JobRecord, JobStatus, Progress};

/// The ports: what an adapter implements ([`Queue`](port::Queue), [`IdempotencyStore`](port::IdempotencyStore),
/// [`PayloadStore`](port::PayloadStore), [`FlowStore`](port::FlowStore), [`FlowSender`](port::FlowSender)),
/// with the types their methods take and return and the helpers every implementation shares.
///
/// `conveyor-sqs`, `conveyor-dynamodb` and `conveyor-s3` implement them for AWS; `conveyor-testing`
/// implements them in memory and holds the conformance suites each implementation must pass.
pub mod port {
    pub use crate::flow::{
        ChildEnd, Count, Created, FLOW_CHILD_ATTRIBUTE, FlowChild, FlowSender, FlowState, FlowStore, NewFlow,
        ParentDue, ParentMessage, flow_of_parent_record, parent_key, unknown_flow,
    };
    pub use crate::idempotency::{
        Claim, ClaimOutcome, ClaimRequest, EXPIRY_PAST_LEASE, IdempotencyRecord, IdempotencyStore,
        REDRIVE_REASON, RecordStatus, StoreError, idempotency_key, next_token, payload_hash,
    };
    pub use crate::payload::{
        LEGACY_SIZE_ATTRIBUTE, PayloadError, PayloadPointer, PayloadStore, PointerError, ResolveError,
        SIZE_ATTRIBUTE, declared_size, marking_attribute, resolve, resolved, size_attribute,
    };
    pub use crate::queue::{
        DeadLetter, EntryError, EntryFailure, OutgoingMessage, Queue, QueueDepth, QueueError,
        VisibilityChange,
    };
    pub use crate::record_key::KeyError;
    pub use crate::timer::{
        ClaimedTimer, NewTimer, OVERDUE_AFTER, OVERDUE_HINT, RELAY_MARK_EVERY, RelayMark, TIMER_CLAIM,
        TIMER_KEY_PREFIX, Timer, TimerStore, new_timer, not_waiting, timer_key,
    };
    pub use crate::tracking::{JobChange, StatusTime, from_epoch_millis, newest_first, to_epoch_millis};
}

/// What the runtimes (`conveyor-worker`, `conveyor-lambda`) and the simulator call: the pipeline's
/// outcomes and leases, dead-lettering and deferral, delays, jitter for their own pauses, envelopes, logging
/// output and the defaults shared with `infra/`. A handler or a producer never needs these.
pub mod runtime {
    pub use crate::backoff::{added_jitter, doubling, equal_jitter};
    pub use crate::dead_letter::{dead_letter_copy, original_attributes};
    pub use crate::defaults::{
        CLOCK_SKEW_ALLOWANCE, DRAIN_DEADLINE, ECS_STOP_TIMEOUT_SECS, IDEMPOTENCY_RECORD_TTL,
        LAMBDA_VISIBILITY_RATIO, MAX_RECEIVE_COUNT, MIN_VISIBILITY_TIMEOUT, QUEUE_VISIBILITY_TIMEOUT_SECS,
        SHUTDOWN_RESERVE, STATUS_RETENTION,
    };
    pub use crate::deferral::{
        DeferralError, deferred_copy, deferred_copy_for, past_its_bound, retried_copy,
    };
    pub use crate::delay::{
        CANCEL_KEY_PREFIX, Clock, DUE_ATTRIBUTE, MAX_TOTAL_DELAY, cancel, cancel_at, cancel_marker_key,
        cancelled_before, due_at, due_value, first_sent, record_key_for,
    };
    pub use crate::display::{
        display_chain, format_age, format_epoch_millis, format_time, write_error_chain,
    };
    pub use crate::disposition::{Disposition, reject};
    pub use crate::envelope::{Header, open, seal, sorted};
    pub use crate::fifo_gate::{GroupGate, GroupGates, Ticket, Turn};
    pub use crate::handler::ErasedHandler;
    pub use crate::lease::Lease;
    pub use crate::log_output::{
        ENV_LOG_FORMAT, LogFormat, LossyWriter, UnknownLogFormat, stderr, stdout, write_errors,
    };
    pub use crate::outcome::{
        AckReason, CANCELLED, DeferCause, Failure, NotRun, Origin, Outcome, RetryPath, RunResult,
        at_last_attempt, classify, epoch_millis, not_run_at_the_last_receive, retry_path,
    };
    pub use crate::pipeline::{Budget, CANCEL_GRACE, COMPLETE_RETRY_LIMIT, Processed, run_number};
    pub use crate::progress::ProgressReporter;
    pub use crate::rate::TokenBucket;
    pub use crate::start_line::{describe_store, describe_tenants, describe_tracking, on_off};
    pub use crate::store_env::{ENV_IDEMPOTENCY_TABLE, StoreChoice, StoreEnvError, store_from_env};
    pub use crate::store_health::StoreHealth;
    pub use crate::tenant_limits::{
        TenantAdmission, TenantGuards, TenantLimit, TenantLimitError, TenantLimits, TenantOverride,
        TenantSettings, TenantSlot,
    };
    pub use crate::tenant_metrics::{NONE as NO_TENANT, OTHER as OTHER_TENANTS, TenantMetrics};
    pub use crate::unrun::UnrunJob;
    pub use crate::visibility_cap::{visibility_cap, visibility_room};
}
