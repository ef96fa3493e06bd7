//! What a handler knows about the message it runs for.

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::HandlerError;
use crate::events::{CloudEvent, Envelope, EventBridgeEvent, SnsNotification};
use crate::flow::ChildResult;
use crate::lease::CancelReason;
use crate::message::{Attributes, Message};
use crate::progress::ProgressReporter;

/// The context of one job run: the message's metadata, a deadline and a cancellation token.
///
/// Long jobs should watch [`Context::cancelled`]: it fires when the worker lost the message's lease
/// (another worker may run it) or when shutdown's drain deadline passed. Stop, and return an error.
#[derive(Debug, Clone)]
pub struct Context {
    message: Arc<Message>,
    queue: Arc<str>,
    deadline: Instant,
    cancel: CancellationToken,
    idempotency_key: Option<String>,
    fencing_token: Option<u64>,
    progress: Option<Arc<ProgressReporter>>,
    flow_children: Option<Arc<Vec<ChildResult>>>,
    envelopes: Option<Arc<[Envelope]>>,
    cancel_reasons: Option<Arc<OnceLock<CancelReason>>>,
}

impl Context {
    /// A context for `message` from `queue`, ending at `deadline`, cancelled through `cancel`.
    pub fn new(
        message: Arc<Message>,
        queue: Arc<str>,
        deadline: Instant,
        cancel: CancellationToken,
        idempotency_key: Option<String>,
    ) -> Self {
        Self {
            message,
            queue,
            deadline,
            cancel,
            idempotency_key,
            fencing_token: None,
            progress: None,
            flow_children: None,
            envelopes: None,
            cancel_reasons: None,
        }
    }

    /// The same context reading why it was cancelled from `reasons` (the lease's, see
    /// [`Lease::cancel`](crate::runtime::Lease::cancel)).
    pub fn with_cancel_reasons(mut self, reasons: Arc<OnceLock<CancelReason>>) -> Self {
        self.cancel_reasons = Some(reasons);
        self
    }

    /// The same context carrying the fencing token of the claim the run holds.
    pub fn with_fencing_token(mut self, fencing_token: Option<u64>) -> Self {
        self.fencing_token = fencing_token;
        self
    }

    /// The same context reporting progress to `reporter` (a tracked job's run).
    pub fn with_progress(mut self, reporter: Option<Arc<ProgressReporter>>) -> Self {
        self.progress = reporter;
        self
    }

    /// Reports how far the job is (0 to 100 percent, and what it is doing). Cheap and never waits: a
    /// tracked job's record gets the latest report at most once per the handler's
    /// `progress_interval` while it runs, and the last one always, with the job's end. Ignored for
    /// untracked jobs (`HandlerSettings::tracked`).
    pub fn progress(&self, percent: u8, message: impl Into<String>) {
        if let Some(reporter) = &self.progress {
            reporter.report(percent, message.into());
        }
    }

    /// The same context carrying the envelopes the message came in (outermost first).
    pub fn with_envelopes(mut self, envelopes: Option<Arc<[Envelope]>>) -> Self {
        self.envelopes = envelopes;
        self
    }

    /// The envelopes the message came in, outermost first: an SNS notification, then the event it
    /// carried, say (see [`crate::events`]). Empty for a message sent straight to the queue.
    pub fn envelopes(&self) -> &[Envelope] {
        self.envelopes.as_deref().unwrap_or_default()
    }

    /// The SNS notification the message came in, when it was published to a topic (raw delivery off).
    pub fn sns(&self) -> Option<&SnsNotification> {
        self.envelopes().iter().find_map(|envelope| match envelope {
            Envelope::Sns(notification) => Some(notification),
            _ => None,
        })
    }

    /// The EventBridge event whose `detail` is the job, when it is one.
    pub fn event(&self) -> Option<&EventBridgeEvent> {
        self.envelopes().iter().find_map(|envelope| match envelope {
            Envelope::EventBridge(event) => Some(event),
            _ => None,
        })
    }

    /// The CloudEvent whose data is the job, when it is one.
    pub fn cloud_event(&self) -> Option<&CloudEvent> {
        self.envelopes().iter().find_map(|envelope| match envelope {
            Envelope::CloudEvent(event) => Some(event),
            _ => None,
        })
    }

    /// The same context carrying a flow parent's children's results.
    pub fn with_flow_children(mut self, children: Option<Arc<Vec<ChildResult>>>) -> Self {
        self.flow_children = children;
        self
    }

    /// A flow parent's children's results (outputs read from their records, failed children with their
    /// reasons), by child id; `None` when this job is no flow's parent (see `src/flow.rs`).
    pub fn flow_children(&self) -> Option<&[ChildResult]> {
        self.flow_children.as_deref().map(Vec::as_slice)
    }

    /// How many of a flow parent's children were dead-lettered (policies `Ignore` and `ContinueParent`);
    /// 0 for other jobs.
    pub fn failed_children(&self) -> usize {
        self.flow_children()
            .unwrap_or_default()
            .iter()
            .filter(|child| child.error.is_some())
            .count()
    }

    /// The succeeded children's outputs decoded as `T`, in child id order (failed children, and pending
    /// ones under `ContinueParent`, are left out); a permanent error when one does not decode, or when a
    /// succeeded child has no stored output.
    pub fn child_outputs<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, HandlerError> {
        let children = self.flow_children().unwrap_or_default();
        children
            .iter()
            .filter(|child| child.error.is_none() && !child.pending)
            .map(|child| {
                let output = child.output.as_deref().ok_or_else(|| {
                    HandlerError::permanent(format!(
                        "flow child {} ({}) has no stored output (too large for the store?)",
                        child.id, child.key
                    ))
                })?;
                serde_json::from_str(output).map_err(|error| {
                    HandlerError::permanent(format!(
                        "output of flow child {} does not decode: {error}",
                        child.id
                    ))
                })
            })
            .collect()
    }

    /// SQS's message id.
    pub fn message_id(&self) -> &str {
        &self.message.id
    }

    /// The queue the message came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// 1 on the first delivery, then 2, 3, ...
    pub fn receive_count(&self) -> u32 {
        self.message.receive_count
    }

    /// When the producer sent the message.
    pub fn sent_at(&self) -> Option<SystemTime> {
        self.message.sent_at
    }

    /// The message attributes (including Conveyor's `conveyor.*` ones).
    pub fn attributes(&self) -> &Attributes {
        &self.message.attributes
    }

    /// The FIFO message group, on FIFO queues.
    pub fn group_id(&self) -> Option<&str> {
        self.message.group_id.as_deref()
    }

    /// The job's tenant (`NewJob::tenant`), when the producer set one: the `MessageGroupId` on a
    /// standard queue, the `conveyor.tenant` attribute (else the group) on a FIFO queue.
    pub fn tenant(&self) -> Option<&str> {
        self.message.tenant()
    }

    /// The X-Ray trace header the producer propagated, if any.
    pub fn trace_header(&self) -> Option<&str> {
        self.message.trace_header.as_deref()
    }

    /// The idempotency key this run was claimed under, when idempotency is on.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// The fencing token of the idempotency claim this run holds, when idempotency is on: a number
    /// greater than every earlier claim's on this key. A downstream write stores the highest token it
    /// has seen and refuses a lower one, so a run whose lease lapsed and was taken over cannot apply
    /// its effect after the new holder (see `examples/src/fenced_ledger.rs`).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// When the handler's timeout (or the Lambda invocation's deadline) runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The token that is cancelled when the run must stop.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Resolves when the run must stop; use in `tokio::select!` around long steps.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// True once the run must stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Why the run must stop, once it must ([`Context::is_cancelled`]); `None` before. A
    /// cancellation the runtime gave no reason for reads as [`CancelReason::TimedOut`] past the
    /// deadline and [`CancelReason::Stopping`] before it.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        if !self.cancel.is_cancelled() {
            return None;
        }
        if let Some(reason) = self.cancel_reasons.as_ref().and_then(|slot| slot.get()) {
            return Some(*reason);
        }
        if Instant::now() >= self.deadline {
            return Some(CancelReason::TimedOut);
        }
        Some(CancelReason::Stopping)
    }
}
