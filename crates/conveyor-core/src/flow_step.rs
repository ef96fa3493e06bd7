//! The pipeline's flow steps (see [`crate::flow`] for the design and its ordering): reject a parent
//! whose flow failed, read a parent's children's results, and count a child's end, sending the parent
//! when the count finishes the flow.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::flow::{ChildEnd, ChildResult, FLOW_FAILED_ATTRIBUTE, Flows, child_of, parent_of};
use crate::idempotency::{IdempotencyStore, StoreError};
use crate::message::Message;
use crate::outcome::{AckReason, Failure, Origin, Outcome};

/// How long a child's message waits when its flow bookkeeping failed (half to all of it, jittered).
const BOOKKEEPING_DEFERRAL: Duration = Duration::from_secs(30);

/// A parent sent because its flow failed is rejected with the child's reason, without running.
pub(crate) fn failed_parent(message: &Message, origin: Origin<'_>) -> Option<Outcome> {
    parent_of(message)?;
    let reason = message.string_attribute(FLOW_FAILED_ATTRIBUTE)?;
    let failure = Failure::now(reason, origin.attempt, origin.queue, origin.handler);
    Some(Outcome::Reject(failure))
}

/// The children's results of a parent's flow, with their outputs read from their records; `None` for a
/// message that is no flow's parent.
pub(crate) async fn children(
    flows: &Flows,
    store: Option<&Arc<dyn IdempotencyStore>>,
    message: &Message,
) -> Result<Option<Arc<Vec<ChildResult>>>, StoreError> {
    let Some(flow_id) = parent_of(message) else {
        return Ok(None);
    };
    let Some(flow) = flows.store.flow(flow_id).await? else {
        tracing::warn!(
            flow_id,
            "parent of a flow that has no record (expired?); running without children"
        );
        return Ok(Some(Arc::new(Vec::new())));
    };
    let mut results = Vec::with_capacity(flow.children.len());
    for (id, key) in &flow.children {
        let error = flow.failed.get(id).cloned();
        let output = match (&error, store) {
            (None, Some(store)) => store.get(key).await?.and_then(|record| record.output),
            _ => None,
        };
        results.push(ChildResult {
            id: id.clone(),
            key: key.clone(),
            output,
            error,
        });
    }
    Ok(Some(Arc::new(results)))
}

/// Counts a flow child's end and sends the parent when due. Returns the outcome to apply: the same,
/// or a deferral when the bookkeeping failed (the child's redelivery, a duplicate, does it again).
pub(crate) async fn after_child(flows: &Flows, message: &Message, outcome: Outcome) -> Outcome {
    let Some((flow_id, child_id)) = child_of(message) else {
        return outcome;
    };
    let end = match &outcome {
        Outcome::Ack(AckReason::Completed | AckReason::Duplicate) => ChildEnd::Succeeded,
        Outcome::Reject(failure) => ChildEnd::Failed(failure.error.clone()),
        Outcome::Ack(AckReason::Cancelled) => ChildEnd::Failed("cancelled by its producer".to_owned()),
        Outcome::Retry { .. } | Outcome::Defer { .. } => return outcome,
    };
    match count_and_send(flows, flow_id, child_id, &end).await {
        Ok(()) => outcome,
        Err(error) => {
            tracing::warn!(%error, flow_id, child_id, "flow bookkeeping failed; the child's message comes back to do it");
            let delay = crate::backoff::equal_jitter(BOOKKEEPING_DEFERRAL);
            Outcome::Defer {
                delay,
                reason: format!("flow {flow_id}: {error}"),
            }
        }
    }
}

/// Why the flow step failed.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("counting the child failed: {0}")]
    Store(#[from] StoreError),
    #[error("sending the parent failed: {0}")]
    Send(#[from] crate::queue::QueueError),
}

async fn count_and_send(
    flows: &Flows,
    flow_id: &str,
    child_id: &str,
    end: &ChildEnd,
) -> Result<(), StepError> {
    let counted = flows.store.child_finished(flow_id, child_id, end).await?;
    let flow = counted.flow;
    tracing::debug!(
        flow_id,
        child_id,
        first_time = counted.first_time,
        pending = flow.pending(),
        "flow child counted"
    );
    let Some(failure) = flow.parent_due() else {
        return Ok(());
    };
    if flow.parent_sent_at.is_some() {
        return Ok(());
    }
    let message = flow.parent.to_outgoing(flow_id, failure.as_deref());
    let id = flows.sender.send_to(&flow.parent.queue_url, message).await?;
    tracing::info!(flow_id, message_id = %id, failed = failure.is_some(), "flow finished; parent sent");
    if let Err(error) = flows.store.mark_parent_sent(flow_id, SystemTime::now()).await {
        // A later duplicate of a child may send the parent again; its key settles it as a duplicate.
        tracing::warn!(%error, flow_id, "parent sent but not marked; a redelivered child may send it again");
    }
    Ok(())
}
