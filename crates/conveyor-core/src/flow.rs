//! Flows: a parent job sent once all its children are done (BullMQ's flow producer, on SQS and
//! DynamoDB).
//!
//! # Design note: counting, and why the parent runs exactly once
//!
//! A producer writes one **flow record** (the parent's message, the children's record keys, the
//! failure policy) before it sends the children. Each child carries `conveyor.flow` =
//! `<flow id>/<child id>`. When a child's run ends for good (its idempotency record completed, or the
//! job dead-lettered), the consumer's pipeline records it in the flow with one conditional write that
//! is idempotent per child (`NOT contains(done, child)`): a child completing twice (a duplicate, a
//! crash after the count) counts once. The write returns the flow as it now is; the write that
//! finishes the flow (all children done, or ignored as failed) sends the parent.
//!
//! Ordering, in the pipeline: complete the child's record → count it in the flow → send the parent
//! (if this count finished the flow) → mark the parent sent → the runtime deletes the child's message.
//! A crash anywhere before the delete brings the child's message back; its claim answers "already
//! completed" (a duplicate), and the duplicate runs the same flow step again: the count is refused as
//! already counted, the flow is read back, and if it is finished but the parent is not marked sent,
//! the parent is sent again. The parent's message carries the idempotency key `flow:<flow id>`, so a
//! parent sent twice this way runs once: the second copy is settled as a duplicate. Bookkeeping that
//! fails (the store down) defers the child's message instead of deleting it, so no count is lost.
//!
//! The parent's handler finds the children's results in [`Context::flow_children`](crate::Context):
//! each child's record key, status, output (read from its idempotency record when the parent's run
//! starts) and, for a failed child, its reason.
//!
//! Failure policy ([`ChildFailurePolicy`]): `FailParent` (the default, BullMQ's `failParentOnFailure`)
//! sends the parent as soon as a child is dead-lettered, marked with `conveyor.flow.failed`; the
//! pipeline rejects such a parent without running it, so it reaches the DLQ with the child's reason.
//! `Ignore` (BullMQ's `ignoreDependencyOnFailure`) counts a dead-lettered child as finished and
//! records its reason; the parent runs when the rest are done.
//!
//! Nested flows: a child may itself be the parent of a flow. Its message is the sub-flow's parent
//! message (sent when the sub-flow finishes) and carries the outer flow's `conveyor.flow`, so its own
//! success counts in the outer flow like any child's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::idempotency::StoreError;
use crate::message::{AttributeValue, Message};
use crate::queue::{OutgoingMessage, QueueError};

/// `<flow id>/<child id>` on a child's message.
pub const FLOW_CHILD_ATTRIBUTE: &str = "conveyor.flow";
/// The flow id on a parent's message.
pub(crate) const FLOW_PARENT_ATTRIBUTE: &str = "conveyor.flow.parent";
/// On a parent sent because a child was dead-lettered (policy `FailParent`): the child's reason.
pub(crate) const FLOW_FAILED_ATTRIBUTE: &str = "conveyor.flow.failed";

/// The parent's idempotency key in flow `flow_id`: a parent sent twice runs once.
pub fn parent_key(flow_id: &str) -> String {
    format!("flow:{flow_id}")
}

/// What a dead-lettered child does to its flow.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildFailurePolicy {
    /// The parent fails: it goes to the DLQ with the child's reason, without running.
    #[default]
    FailParent,
    /// The failed child counts as finished and its reason is recorded; the parent runs when the rest
    /// are done and sees which children failed.
    Ignore,
}

impl ChildFailurePolicy {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildFailurePolicy::FailParent => "fail_parent",
            ChildFailurePolicy::Ignore => "ignore",
        }
    }

    /// The policy a stored name stands for.
    pub fn parse(text: &str) -> Option<Self> {
        [ChildFailurePolicy::FailParent, ChildFailurePolicy::Ignore]
            .into_iter()
            .find(|policy| policy.as_str() == text)
    }
}

/// The parent's message as the flow record keeps it until it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentMessage {
    /// The queue to send it to.
    pub queue_url: String,
    /// The body.
    pub body: String,
    /// Its string and number attributes (type, version, key, flow attributes): name → (data type,
    /// value).
    pub attributes: BTreeMap<String, (String, String)>,
    /// FIFO message group, on a FIFO queue.
    pub group_id: Option<String>,
}

impl ParentMessage {
    /// The parent's message kept from `message` (binary attributes are not kept).
    pub fn from_outgoing(queue_url: &str, message: &OutgoingMessage) -> Self {
        let attributes = message
            .attributes
            .iter()
            .filter_map(|(name, value)| {
                let text = value.string_value.as_ref()?;
                Some((name.clone(), (value.data_type.clone(), text.clone())))
            })
            .collect();
        Self {
            queue_url: queue_url.to_owned(),
            body: message.body.clone(),
            attributes,
            group_id: message.group_id.clone(),
        }
    }

    /// The message to send: as kept, with `conveyor.flow.failed` when the flow failed.
    pub fn to_outgoing(&self, flow_id: &str, failure: Option<&str>) -> OutgoingMessage {
        let mut attributes: crate::message::Attributes = self
            .attributes
            .iter()
            .map(|(name, (data_type, value))| {
                let value = AttributeValue {
                    data_type: data_type.clone(),
                    string_value: Some(value.clone()),
                    binary_value: None,
                };
                (name.clone(), value)
            })
            .collect();
        if let Some(reason) = failure {
            attributes.insert(FLOW_FAILED_ATTRIBUTE.to_owned(), AttributeValue::string(reason));
        }
        attributes.insert(FLOW_PARENT_ATTRIBUTE.to_owned(), AttributeValue::string(flow_id));
        // A FIFO queue needs a deduplication id; the flow's own id makes SQS drop a second send too.
        let deduplication_id = self
            .group_id
            .as_ref()
            .map(|_| crate::idempotency::payload_hash(flow_id));
        OutgoingMessage {
            body: self.body.clone(),
            attributes,
            delay: None,
            group_id: self.group_id.clone(),
            deduplication_id,
            trace_header: None,
        }
    }
}

/// A flow as the producer creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFlow {
    /// The flow's id.
    pub id: String,
    /// The parent's message.
    pub parent: ParentMessage,
    /// The parent's record key (its job type and `flow:<id>`), for `jobs show`.
    pub parent_record: String,
    /// Child id → the child's idempotency record key (where its output will be).
    pub children: BTreeMap<String, String>,
    /// What a dead-lettered child does.
    pub policy: ChildFailurePolicy,
    /// When it was created.
    pub created_at: SystemTime,
}

/// How a child's run ended for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    /// Its record is completed.
    Succeeded,
    /// It was dead-lettered with this reason.
    Failed(String),
}

/// A flow as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowState {
    /// The flow's id.
    pub id: String,
    /// The parent's message.
    pub parent: ParentMessage,
    /// The parent's record key.
    pub parent_record: String,
    /// Child id → record key.
    pub children: BTreeMap<String, String>,
    /// The children counted as succeeded.
    pub done: Vec<String>,
    /// The children dead-lettered, with their reasons.
    pub failed: BTreeMap<String, String>,
    /// The failure policy.
    pub policy: ChildFailurePolicy,
    /// When the parent was sent (after the flow finished or failed), if it was.
    pub parent_sent_at: Option<u64>,
}

impl FlowState {
    /// Children neither done nor failed.
    pub fn pending(&self) -> usize {
        self.children
            .len()
            .saturating_sub(self.done.len() + self.failed.len())
    }

    /// What the parent is owed now: `Some(None)` to run it, `Some(Some(reason))` to fail it, `None`
    /// while children are pending (and the policy does not fail it yet).
    pub fn parent_due(&self) -> Option<Option<String>> {
        if self.policy == ChildFailurePolicy::FailParent
            && let Some((child, reason)) = self.failed.iter().next()
        {
            return Some(Some(format!(
                "child {child} of flow {} failed: {reason}",
                self.id
            )));
        }
        (self.pending() == 0).then_some(None)
    }
}

/// The answer to [`FlowStore::child_finished`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// False when the child had been counted before (a duplicate or a crash's redelivery).
    pub first_time: bool,
    /// The flow after the count.
    pub flow: FlowState,
}

/// The flows port, on DynamoDB (`conveyor-dynamodb`) and in memory (`conveyor-testing`); the
/// `flows` conformance suite checks both.
///
/// - `create` writes the record only where none exists (a producer's re-send of the same flow id is
///   answered `Ok` without change).
/// - `child_finished` is atomic and idempotent per child: a child is counted once, as done or as
///   failed, whatever the number of calls; the flow comes back as it is after the call.
/// - `mark_parent_sent` sets the time once.
#[async_trait]
pub trait FlowStore: Send + Sync {
    /// Writes a new flow's record.
    async fn create_flow(&self, flow: &NewFlow) -> Result<(), StoreError>;

    /// Counts a child's end.
    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Counted, StoreError>;

    /// Records that the parent was sent.
    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError>;

    /// Reads a flow.
    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError>;
}

/// Sends a flow's messages to their queues: the children (the flow producer) and the parent (the
/// pipeline). `conveyor-sqs`'s `SqsSender` on AWS, `conveyor-testing`'s `QueueSender` in tests.
#[async_trait]
pub trait FlowSender: Send + Sync {
    /// Sends `message` to `queue_url`; returns the message id.
    async fn send_to(&self, queue_url: &str, message: OutgoingMessage) -> Result<String, QueueError>;
}

/// A child's result as the parent's handler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildResult {
    /// The child's id in the flow.
    pub id: String,
    /// The child's idempotency record key.
    pub key: String,
    /// Its output (JSON text), read from its record; `None` for a failed child, or an output that was
    /// too large for the store (read it from where the child put it, by `key`).
    pub output: Option<String>,
    /// Why it failed, for a dead-lettered child (policy `Ignore`).
    pub error: Option<String>,
}

/// What the pipeline needs for flows: where they are kept, and how a parent is sent.
#[derive(Clone)]
pub struct Flows {
    /// The flow records.
    pub store: Arc<dyn FlowStore>,
    /// Sends parents.
    pub sender: Arc<dyn FlowSender>,
}

impl std::fmt::Debug for Flows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flows").finish_non_exhaustive()
    }
}

/// The error for a flow that has no record (expired, or never created by a flow producer).
pub fn unknown_flow(flow_id: &str) -> StoreError {
    StoreError::Misconfigured {
        message: format!("flow {flow_id:?} has no record (expired, or never created by a flow producer)"),
    }
}

/// `(flow id, child id)` of a child's message.
pub(crate) fn child_of(message: &Message) -> Option<(&str, &str)> {
    message.string_attribute(FLOW_CHILD_ATTRIBUTE)?.rsplit_once('/')
}

/// The flow id of a parent's message.
pub(crate) fn parent_of(message: &Message) -> Option<&str> {
    message.string_attribute(FLOW_PARENT_ATTRIBUTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(children: usize, done: usize, failed: usize, policy: ChildFailurePolicy) -> FlowState {
        FlowState {
            id: "f".into(),
            parent: ParentMessage {
                queue_url: "q".into(),
                body: "{}".into(),
                attributes: BTreeMap::new(),
                group_id: None,
            },
            parent_record: "conveyor:report#flow:f".into(),
            children: (0..children).map(|i| (i.to_string(), format!("k{i}"))).collect(),
            done: (0..done).map(|i| i.to_string()).collect(),
            failed: (done..done + failed)
                .map(|i| (i.to_string(), "boom".to_owned()))
                .collect(),
            policy,
            parent_sent_at: None,
        }
    }

    #[test]
    fn the_parent_is_due_when_no_child_is_pending_or_one_failed_under_fail_parent() {
        assert_eq!(flow(3, 2, 0, ChildFailurePolicy::FailParent).parent_due(), None);
        assert_eq!(
            flow(3, 3, 0, ChildFailurePolicy::FailParent).parent_due(),
            Some(None)
        );
        let failed = flow(3, 1, 1, ChildFailurePolicy::FailParent).parent_due();
        assert!(
            matches!(failed, Some(Some(reason)) if reason.contains("child 1") && reason.contains("boom"))
        );
        assert_eq!(flow(3, 1, 1, ChildFailurePolicy::Ignore).parent_due(), None);
        assert_eq!(flow(3, 2, 1, ChildFailurePolicy::Ignore).parent_due(), Some(None));
    }

    #[test]
    fn child_attributes_split_at_the_last_slash() {
        let mut message = Message::new("m", "{}");
        message.attributes.insert(
            FLOW_CHILD_ATTRIBUTE.to_owned(),
            AttributeValue::string("report/r-1/7"),
        );
        assert_eq!(child_of(&message), Some(("report/r-1", "7")));
    }
}
