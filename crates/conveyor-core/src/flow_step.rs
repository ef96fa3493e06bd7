//! The pipeline's flow steps (see [`crate::flow`] for the design and its ordering): settle a failure
//! notice, read a parent's children's results, and count a child's end, sending the parent when due.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::flow::{
    ChildEnd, ChildFailurePolicy, ChildResult, Count, FLOW_FAILED_ATTRIBUTE, FlowState, Flows,
    PARENT_SEND_TRIES, ParentDue, child_of, parent_of, unknown_flow,
};
use crate::idempotency::StoreError;
use crate::message::Message;
use crate::outcome::{AckReason, DeferCause, Failure, Origin, Outcome};

/// How long a message waits when its flow bookkeeping failed (half to all of it, jittered).
const BOOKKEEPING_DEFERRAL: Duration = Duration::from_secs(30);

fn deferral(reason: String) -> Outcome {
    Outcome::Defer {
        delay: crate::backoff::equal_jitter(BOOKKEEPING_DEFERRAL),
        reason,
        cause: DeferCause::FlowBookkeeping,
    }
}

/// A failure notice (a parent sent because a child failed under `FailParent`): rejected once per flow
/// with the child's reason, without running; a second copy, or one made stale by a resumed flow, is
/// acknowledged. `None` for any other message.
pub(crate) async fn failure_notice(
    flows: Option<&Flows>,
    message: &Message,
    origin: Origin<'_>,
) -> Option<Outcome> {
    let flow_id = parent_of(message)?;
    let reason = message.string_attribute(FLOW_FAILED_ATTRIBUTE)?;
    let reject = || Outcome::Reject(Failure::now(reason, origin.attempt, origin.queue, origin.handler));
    let Some(flows) = flows else {
        return Some(reject());
    };
    let flow = match flows.store.flow(flow_id).await {
        Ok(Some(flow)) => flow,
        Ok(None) => return Some(reject()),
        Err(error) => return Some(deferral(format!("flow {flow_id}: {error}"))),
    };
    if flow.failed == 0 || flow.is_finished() {
        tracing::info!(flow_id, "failure notice of a flow that resumed; acknowledging it");
        return Some(Outcome::Ack(AckReason::Duplicate));
    }
    // The first message id of the notice: a deferred copy of it (its claim answer lost) claims as itself.
    match flows
        .store
        .claim_failure_notice(flow_id, &message.original_id())
        .await
    {
        Ok(true) => Some(reject()),
        Ok(false) => {
            tracing::info!(flow_id, "a second failure notice of the flow; acknowledging it");
            Some(Outcome::Ack(AckReason::Duplicate))
        }
        Err(error) => Some(deferral(format!("flow {flow_id}: {error}"))),
    }
}

/// The children's results of a parent's flow: `Ok(None)` for a message that is no flow's parent,
/// `Err(outcome)` when the parent must not run now (its flow unknown: rejected; the store down:
/// deferred).
pub(crate) async fn children(
    flows: Option<&Flows>,
    message: &Message,
    origin: Origin<'_>,
) -> Result<Option<Arc<Vec<ChildResult>>>, Outcome> {
    let (Some(flows), Some(flow_id)) = (flows, parent_of(message)) else {
        return Ok(None);
    };
    let read = async {
        let Some(flow) = flows.store.flow(flow_id).await? else {
            return Ok(None);
        };
        let children = flows.store.children(flow_id).await?;
        Ok::<_, StoreError>(Some((flow, children)))
    };
    let (flow, children) = match read.await {
        Ok(Some(found)) => found,
        Ok(None) => {
            let reason = unknown_flow(flow_id);
            tracing::error!(flow_id, "{reason}");
            let failure = Failure::now(reason, origin.attempt, origin.queue, origin.handler);
            return Err(Outcome::Reject(failure));
        }
        Err(error) => return Err(deferral(format!("reading the flow's children failed: {error}"))),
    };
    if flow.parent_ran_at.is_some() {
        // Sent again after its record expired (a flow whose deadline outlasts the record, its sent
        // mark lost): the flow's own mark says it ran, and it lives as long as the flow.
        tracing::info!(
            flow_id,
            "the flow's parent ran before; acknowledging this copy without running it"
        );
        return Err(Outcome::Ack(AckReason::Duplicate));
    }
    let results = children
        .into_iter()
        .filter_map(|child| {
            let pending = child.end.is_none();
            let (output, error) = match child.end {
                Some(ChildEnd::Succeeded { output }) => (output, None),
                Some(ChildEnd::Failed(_)) if flow.policy == ChildFailurePolicy::RemoveDependency => {
                    return None;
                }
                Some(ChildEnd::Failed(reason)) => (None, Some(reason)),
                None => (None, None),
            };
            Some(ChildResult {
                id: child.id,
                key: child.key,
                output,
                error,
                pending,
            })
        })
        .collect();
    Ok(Some(Arc::new(results)))
}

/// Counts a flow child's end and sends the parent when due. Returns the outcome to apply: the same,
/// or a deferral when the bookkeeping failed (the child's redelivery, a duplicate, does it again).
pub(crate) async fn after_child(
    flows: &Flows,
    message: &Message,
    outcome: Outcome,
    output: Option<&str>,
) -> Outcome {
    if let Err(error) = parent_ran(flows, message, &outcome).await {
        let flow_id = parent_of(message).unwrap_or_default();
        tracing::warn!(%error, flow_id, "marking the flow's parent as run failed; its message comes back to do it");
        return deferral(format!("flow {flow_id}: {error}"));
    }
    let Some((flow_id, child_id)) = child_of(message) else {
        return outcome;
    };
    let Some(end) = child_end(message, &outcome, output) else {
        return outcome;
    };
    match count_and_send(flows, flow_id, child_id, &end).await {
        Ok(()) => outcome,
        Err(error) => {
            tracing::warn!(%error, flow_id, child_id, "flow bookkeeping failed; the child's message comes back to do it");
            deferral(format!("flow {flow_id}: {error}"))
        }
    }
}

/// Marks a flow's parent as run once its record is completed (a run, or a duplicate of one: a crash
/// between the record and the mark), before its message is deleted; the mark outlives the parent's
/// idempotency record (see [`crate::flow`]).
async fn parent_ran(flows: &Flows, message: &Message, outcome: &Outcome) -> Result<(), StepError> {
    let Some(flow_id) = parent_of(message) else {
        return Ok(());
    };
    let ran = matches!(outcome, Outcome::Ack(AckReason::Completed | AckReason::Duplicate));
    if !ran || message.string_attribute(FLOW_FAILED_ATTRIBUTE).is_some() {
        return Ok(());
    }
    flows.store.mark_parent_ran(flow_id, SystemTime::now()).await?;
    Ok(())
}

/// How a flow child's message ended for its flow, `None` while it has not ended for good.
///
/// A failure notice of a nested flow (the sub-flow's parent sent as `conveyor.flow.failed`) is a
/// failure in the outer flow however it is settled: the first copy is rejected, but a second copy
/// (two children failing at once), a DLQ copy redriven under a new message id, or a notice made stale
/// by a resumed sub-flow is acknowledged as a duplicate without running, and that acknowledgement is
/// no success of the sub-flow. A resumed sub-flow's parent counts its own success when it runs (a
/// failed count may move to succeeded, never back).
fn child_end(message: &Message, outcome: &Outcome, output: Option<&str>) -> Option<ChildEnd> {
    if matches!(outcome, Outcome::Retry { .. } | Outcome::Defer { .. }) {
        return None;
    }
    // Rejected or acknowledged, a notice is a failure.
    if parent_of(message).is_some()
        && let Some(reason) = message.string_attribute(FLOW_FAILED_ATTRIBUTE)
    {
        return Some(ChildEnd::Failed(reason.to_owned()));
    }
    match outcome {
        Outcome::Ack(AckReason::Completed | AckReason::Duplicate | AckReason::Ignored) => {
            Some(ChildEnd::Succeeded {
                output: output.map(str::to_owned),
            })
        }
        Outcome::Reject(failure) => Some(ChildEnd::Failed(failure.error.clone())),
        Outcome::Ack(AckReason::Cancelled) => Some(ChildEnd::Failed("cancelled by its producer".to_owned())),
        Outcome::Retry { .. } | Outcome::Defer { .. } => None,
    }
}

/// Why a flow step failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    #[error("the flow store failed: {0}")]
    Store(#[from] StoreError),
    #[error("sending the parent failed: {0}")]
    Send(#[from] crate::queue::QueueError),
}

/// Counts `end` for child `child_id` of `flow_id` and sends the parent when due.
pub(crate) async fn count_and_send(
    flows: &Flows,
    flow_id: &str,
    child_id: &str,
    end: &ChildEnd,
) -> Result<(), StepError> {
    let flow = match flows.store.child_finished(flow_id, child_id, end).await? {
        Count::Counted(flow) => flow,
        Count::Before(flow) => {
            tracing::debug!(flow_id, child_id, "flow child counted before");
            flow
        }
        Count::NotInFlow => {
            // Final: the child's own outcome stands; deferring would loop until its record expired.
            tracing::error!(
                flow_id,
                child_id,
                "flow child not counted: {}",
                unknown_flow(flow_id)
            );
            return Ok(());
        }
    };
    tracing::debug!(flow_id, child_id, pending = flow.pending(), "flow child counted");
    send_due(flows, &flow).await
}

/// Sends what the parent is owed, if it was not sent yet, and marks it.
pub(crate) async fn send_due(flows: &Flows, flow: &FlowState) -> Result<(), StepError> {
    if flow.is_finished() {
        return Ok(());
    }
    let failure = match flow.parent_due() {
        None => return Ok(()),
        Some(ParentDue::Fail(_)) if flow.failure_sent_at.is_some() => return Ok(()),
        Some(ParentDue::Fail(reason)) => Some(reason),
        Some(ParentDue::Run) => None,
    };
    let Some(parent) = flows.store.parent(&flow.id).await? else {
        tracing::error!(flow_id = %flow.id, "the flow's parent message is missing; the parent cannot be sent");
        return Ok(());
    };
    let message = parent.to_outgoing(&flow.id, failure.as_deref());
    let id = match flows.sender.send_to(&parent.queue_url, message).await {
        Ok(id) => id,
        // An outage: tried again (the child's message comes back, or the next sweep), uncounted.
        Err(error) if error.is_retryable() => return Err(StepError::Send(error)),
        Err(error) => return refused(flows, flow, &parent.queue_url, error).await,
    };
    tracing::info!(flow_id = %flow.id, message_id = %id, failed = failure.is_some(), "parent sent");
    let marked = match failure {
        Some(_) => flows.store.mark_failure_sent(&flow.id, SystemTime::now()).await,
        None => flows.store.mark_parent_sent(&flow.id, SystemTime::now()).await,
    };
    if let Err(error) = marked {
        // A later duplicate of a child may send it again: the parent's key (or the notice's claim)
        // settles the second copy as a duplicate.
        tracing::warn!(%error, flow_id = %flow.id, "parent sent but not marked; a redelivered child may send it again");
    }
    Ok(())
}

/// The parent's queue refused it for a configuration mistake (typed: the queue missing, access
/// denied, a request SQS refuses): counted in the flow; after [`PARENT_SEND_TRIES`] refusals the
/// flow ends as failed with the reason and the step succeeds (the child's outcome stands, the sweep
/// closes the flow), before that the step fails and is tried again.
async fn refused(
    flows: &Flows,
    flow: &FlowState,
    queue_url: &str,
    error: crate::queue::QueueError,
) -> Result<(), StepError> {
    let reason = format!("sending the parent to {queue_url} was refused: {error}");
    let Some(refusals) = flows.store.parent_refused(&flow.id, &reason).await? else {
        return Ok(());
    };
    if refusals < PARENT_SEND_TRIES {
        tracing::warn!(flow_id = %flow.id, refusals, %error, "the flow's parent queue refused the parent; trying again");
        return Err(StepError::Send(error));
    }
    flows
        .store
        .mark_parent_failed(&flow.id, &reason, SystemTime::now())
        .await?;
    tracing::error!(
        flow_id = %flow.id,
        refusals,
        %error,
        "the flow's parent could not be sent; the flow ended as failed (fix the parent's queue or its permissions \
         and send the flow again under a new id)"
    );
    Ok(())
}
