#![doc = include_str!("../README.md")]

pub mod background;
pub mod backoff;
pub mod config;
pub mod context;
pub mod dead_letter;
pub mod defaults;
pub mod deferral;
pub mod delay;
pub mod display;
pub mod disposition;
pub mod envelope;
pub mod error;
pub mod flow;
mod flow_step;
pub mod handler;
pub mod idempotency;
pub mod lease;
pub mod limits;
pub mod log_output;
pub mod message;
pub mod metric_names;
pub mod outcome;
pub mod payload;
pub mod pipeline;
pub mod progress;
pub mod queue;
pub mod record_key;
pub mod router;
pub mod tracking;

pub use background::BackgroundTask;
pub use backoff::Backoff;
pub use context::Context;
pub use disposition::{Disposition, RejectMode, reject};
pub use error::{ErrorKind, HandlerError};
pub use flow::{ChildFailurePolicy, ChildResult, FlowSender, FlowStore, Flows};
pub use handler::{BoxFuture, Handler, HandlerSettings};
pub use idempotency::{
    Claim, ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError,
};
pub use lease::Lease;
pub use message::{AttributeValue, Attributes, Message, ReceiptHandle};
pub use outcome::{AckReason, Failure, Outcome};
pub use payload::{PayloadError, PayloadPointer, PayloadStore, Payloads};
pub use pipeline::{Budget, Pipeline, Processed};
pub use queue::{
    DeadLetter, EntryError, EntryFailure, OutgoingMessage, Queue, QueueDepth, QueueError, VisibilityChange,
};
pub use record_key::{KeySource, KeyStyle, PowertoolsFlavor, PowertoolsKey};
pub use router::Router;
pub use tracking::{JobChange, JobQuery, JobRecord, JobStatus, Progress};
