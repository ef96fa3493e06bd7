//! Flows: a parent job sent once all its children are done (BullMQ's flow producer, on SQS and
//! DynamoDB).
//!
//! # Design note: counting, and why the parent runs exactly once and never early
//!
//! A producer writes a flow's records before it sends any child: a small **head** (the counters, the
//! policy, the deadline, the markers), the **parent's message** with the children's ids, and one
//! **child item** per child (its record key; later its end and output). Each child's message carries
//! `conveyor.flow` = `<flow id>/<child id>`. Re-sending the same flow (same id, same content) writes
//! what is missing and never overwrites a child item (each is written only where none exists), so a
//! producer that crashed half-way finishes the flow by sending it again; a re-send with other content
//! is refused ([`Created::Conflict`]).
//!
//! When a child's run ends for good (completed, a duplicate of a completed run, or dead-lettered), the
//! consumer's pipeline counts it with one atomic write on the child's own item **and** the head's
//! counter (a DynamoDB transaction), conditional on the child item existing (membership: a child of
//! another flow, or of no flow, is never counted) and on the child not being counted yet (a duplicate
//! or a crash's redelivery counts once). The one change allowed is failed → succeeded: a dead-lettered
//! child that an operator redrives and that then succeeds moves its count, so a failed flow resumes.
//! Counters are whole numbers that only these writes change: `succeeded + failed` never exceeds the
//! children's number, so no count can finish a flow early.
//!
//! Ordering, in the pipeline: complete the child's record → count it (keeping its output on its child
//! item for the flow's lifetime) → read the head → send the parent if due → mark it sent → the runtime
//! deletes the child's message. A crash anywhere before the delete brings the child's message back; its
//! claim answers "already completed" (a duplicate), the count is refused as already made, the head is
//! read, and if the parent is due but not marked sent it is sent again. The parent's message carries
//! the idempotency key `flow:<flow id>`, so a parent sent twice runs once. Bookkeeping that fails (the
//! store down) defers the child's message instead of deleting it, so no count is lost.
//!
//! A child that ends outside any consumer (SQS's redrive moves it to the DLQ after a crash, an out of
//! memory or a Lambda timeout on its last receive) or was never sent (a producer that crashed and did
//! not send again) is found by the **deadline sweep** ([`crate::flow_sweep`]): past the flow's
//! deadline, each child not counted is looked up in its idempotency record (completed: counted as
//! succeeded, its output kept) or counted as failed with the reason, and the policy decides. Every
//! flow therefore ends: completed, failed, or counted out at its deadline (logged and counted in
//! `conveyor_flows_overdue_total`).
//!
//! Failure policy ([`ChildFailurePolicy`], BullMQ's four): `FailParent` (the default) sends the parent
//! as a **failure notice** marked `conveyor.flow.failed` as soon as a child is dead-lettered; the
//! pipeline claims the notice once in the flow (a second copy is a duplicate) and rejects it without
//! running, so the DLQ holds one entry with the child's reason, and a notice made stale by a resumed
//! flow is acknowledged. `Ignore` counts a failed child as finished and shows its reason to the parent;
//! `RemoveDependency` counts it as finished and hides it from the parent; `ContinueParent` sends the
//! parent as soon as a child fails, without waiting for the others.
//!
//! A parent its queue refuses (typed [`QueueError`]s: `QueueMissing`, `AccessDenied`, `Invalid`, a
//! configuration mistake) is counted on the flow's head with the reason ([`FlowStore::parent_refused`]);
//! the step fails and is tried again (the child's message defers, or the next sweep pass) until
//! [`PARENT_SEND_TRIES`] refusals, then the flow **ends as failed** with the reason
//! ([`FlowState::parent_failed_at`], shown by `conveyor jobs describe-flow` and the console) and is
//! closed; the child's own outcome stands. An outage (`Unavailable`) counts no try: the send is
//! tried again, as every outage is, until SQS answers. Nothing reads an error's message to decide.
//!
//! **The deadline and running children.** At the deadline the sweep counts a child as failed only
//! when it is not running: a child whose idempotency record is claimed with a lease not over runs
//! (its consumer heartbeats the lease with the message's visibility), so it is left uncounted and
//! the flow stays open until its own consumer counts it; its lease ends with its process, after which
//! the sweep counts it. **What the parent saw is what the flow says:** once the parent was sent (or
//! ran), a failed count never moves to succeeded (the child's late success is `Before` and logged);
//! before that, a redriven child's success moves it, so a failed flow resumes. (A parent that runs on
//! `ContinueParent` sees children still pending as pending; their later ends are counted.)
//!
//! **A parent runs at most once, however long the deadline.** The parent's idempotency record lives
//! `record_ttl` (24 hours by default), a flow's records live until 14 days after its deadline. When
//! the parent's run completes, the pipeline marks it on the flow's head ([`FlowStore::mark_parent_ran`],
//! before its message is deleted; a failed mark defers the message, whose duplicate marks it), which
//! finishes and closes the flow: no later child duplicate and no sweep sends it again, even when
//! the parent-sent mark was lost, and a parent's copy that still arrives is acknowledged without
//! running because the flow says it ran.
//!
//! An unknown flow (its records expired, or the consumer reads another table than the producer wrote)
//! is final: a child's own outcome stands (logged as an error), and a parent is rejected to the DLQ
//! with the reason, never deferred without end.
//!
//! Nested flows: a child may itself be the parent of a flow. Its message is the sub-flow's parent
//! message (sent when the sub-flow finishes) and carries the outer flow's `conveyor.flow`, so its own
//! success counts in the outer flow like any child's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

/// How long a flow may take by default before the deadline sweep counts its unfinished children as
/// failed ([`NewFlow::deadline`]).
pub const DEFAULT_FLOW_DEADLINE: Duration = Duration::from_secs(24 * 3600);
/// Sends of a flow's parent (or failure notice) that its queue may refuse for a configuration
/// mistake (the queue does not exist, access denied, a request SQS refuses) before the flow ends as
/// failed with the reason ([`FlowState::parent_failed_at`]). An outage (SQS unavailable) counts no
/// try: the send is tried again until SQS answers.
pub const PARENT_SEND_TRIES: u64 = 5;
/// How long a flow's records are kept after its deadline: SQS's longest retention, so a parent or a
/// child redriven from a DLQ still finds its flow and every child's output.
pub const FLOW_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// The parent's idempotency key in flow `flow_id`: a parent sent twice runs once.
pub fn parent_key(flow_id: &str) -> String {
    format!("flow:{flow_id}")
}

/// The flow whose parent has record key `record_key` (`conveyor:<type>#flow:<flow id>`), if it is one.
pub fn flow_of_parent_record(record_key: &str) -> Option<&str> {
    record_key.split_once('#')?.1.strip_prefix("flow:")
}

/// What a dead-lettered child does to its flow (BullMQ's four options).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildFailurePolicy {
    /// The parent fails: it goes to the DLQ with the child's reason, without running (BullMQ's
    /// `failParentOnFailure`). Redriving the child until it succeeds resumes the flow.
    #[default]
    FailParent,
    /// The failed child counts as finished and its reason is shown to the parent, which runs when the
    /// rest are done (`ignoreDependencyOnFailure`).
    Ignore,
    /// The failed child counts as finished and is left out of the parent's children
    /// (`removeDependencyOnFailure`).
    RemoveDependency,
    /// The parent runs as soon as a child fails, without waiting for the others
    /// (`continueParentOnFailure`).
    ContinueParent,
}

impl ChildFailurePolicy {
    const ALL: [ChildFailurePolicy; 4] = [
        ChildFailurePolicy::FailParent,
        ChildFailurePolicy::Ignore,
        ChildFailurePolicy::RemoveDependency,
        ChildFailurePolicy::ContinueParent,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildFailurePolicy::FailParent => "fail_parent",
            ChildFailurePolicy::Ignore => "ignore",
            ChildFailurePolicy::RemoveDependency => "remove_dependency",
            ChildFailurePolicy::ContinueParent => "continue_parent",
        }
    }

    /// The policy a stored name stands for.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|policy| policy.as_str() == text)
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
    /// `MessageGroupId`: the FIFO group on a FIFO queue, the tenant on a standard one.
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

    /// The message to send: as kept, with `conveyor.flow.failed` when it is a failure notice.
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
        // A FIFO queue needs a deduplication id; the flow's own id makes SQS drop a second send too. A
        // failure notice has its own, so a resumed flow's parent is not dropped as the notice's copy.
        // On a standard queue the group is the tenant (fair queues), which takes no deduplication id.
        let fifo = self.queue_url.ends_with(".fifo");
        let deduplication_id = self.group_id.as_ref().filter(|_| fifo).map(|_| {
            let seed = match failure {
                Some(_) => format!("{flow_id}#failed"),
                None => flow_id.to_owned(),
            };
            crate::idempotency::payload_hash(&seed)
        });
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
    /// When the deadline sweep counts the children still unfinished as failed.
    pub deadline: SystemTime,
}

impl NewFlow {
    /// A digest of what the flow is (parent, children, policy), to tell a re-send from a conflict.
    pub fn fingerprint(&self) -> String {
        let content = serde_json::json!({
            "parent": self.parent,
            "parent_record": self.parent_record,
            "children": self.children,
            "policy": self.policy,
        });
        crate::idempotency::payload_hash(&content.to_string())
    }
}

/// What [`FlowStore::create_flow`] did.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The records were written (or completed, after a producer that stopped half-way).
    Written,
    /// A flow with this id and other content exists: nothing was changed.
    Conflict,
}

/// How a child's run ended for good. Exhaustive: every `FlowStore` must store each variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    /// Its record is completed; its output (JSON text), kept for the parent.
    Succeeded {
        /// The output.
        output: Option<String>,
    },
    /// It was dead-lettered (or counted out at the flow's deadline) with this reason.
    Failed(String),
}

/// A flow's head as the store holds it: counters and markers, no per-child data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowState {
    /// The flow's id.
    pub id: String,
    /// The parent's record key.
    pub parent_record: String,
    /// The failure policy.
    pub policy: ChildFailurePolicy,
    /// Children in the flow.
    pub children: u64,
    /// Children counted as succeeded.
    pub succeeded: u64,
    /// Children counted as failed.
    pub failed: u64,
    /// The first failure counted (`child <id>: <reason>`).
    pub first_failure: Option<String>,
    /// The deadline (epoch ms).
    pub deadline: u64,
    /// When the parent was sent to run (epoch ms), if it was.
    pub parent_sent_at: Option<u64>,
    /// When a failure notice was sent (epoch ms), if one was.
    pub failure_sent_at: Option<u64>,
    /// When the parent's run completed (epoch ms), if it did: the guard that keeps a parent sent
    /// again (after its idempotency record expired) from running again.
    #[serde(default)]
    pub parent_ran_at: Option<u64>,
    /// Sends of the parent its queue refused (missing, access denied, a request SQS refuses).
    #[serde(default)]
    pub parent_refusals: u64,
    /// Why the parent's queue refused it, last time.
    #[serde(default)]
    pub parent_error: Option<String>,
    /// When the flow ended as failed because its parent could not be sent (epoch ms), after
    /// [`PARENT_SEND_TRIES`] refusals.
    #[serde(default)]
    pub parent_failed_at: Option<u64>,
}

/// What the parent is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentDue {
    /// Send it to run.
    Run,
    /// Send it as a failure notice with this reason (policy `FailParent`).
    Fail(String),
}

impl FlowState {
    /// Children neither succeeded nor failed.
    pub fn pending(&self) -> u64 {
        self.children.saturating_sub(self.succeeded + self.failed)
    }

    /// What the parent is owed now, `None` while it must wait.
    pub fn parent_due(&self) -> Option<ParentDue> {
        let finished = self.pending() == 0;
        match self.policy {
            ChildFailurePolicy::FailParent if self.failed > 0 => {
                let failure = self.first_failure.as_deref().unwrap_or("a child failed");
                Some(ParentDue::Fail(format!("flow {} failed: {failure}", self.id)))
            }
            ChildFailurePolicy::ContinueParent if self.failed > 0 => Some(ParentDue::Run),
            _ => finished.then_some(ParentDue::Run),
        }
    }

    /// True once the parent was sent to run, ran, or could not be sent for good: nothing more
    /// happens to the flow (no parent is sent again, no failed count moves to succeeded).
    pub fn is_finished(&self) -> bool {
        self.parent_sent_at.is_some() || self.parent_ran_at.is_some() || self.parent_failed_at.is_some()
    }

    /// Where the parent stands: `ran <time>`, `sent <time>`, `failed: ...` (a failure notice, or a
    /// parent its queue refused), or `waiting for its children` (what `conveyor jobs describe-flow`
    /// and the console print).
    pub fn parent_state(&self) -> String {
        let time = crate::display::format_epoch_millis;
        let error = self.parent_error.as_deref().unwrap_or("its queue refused it");
        if let Some(millis) = self.parent_failed_at {
            return format!(
                "failed {}: the parent could not be sent ({} tries): {error}",
                time(millis),
                self.parent_refusals
            );
        }
        match (self.parent_ran_at, self.parent_sent_at, self.failure_sent_at) {
            (Some(millis), _, _) => format!("ran {}", time(millis)),
            (None, Some(millis), _) => format!("sent {}", time(millis)),
            (None, None, Some(millis)) => format!("failed: notice sent {}", time(millis)),
            (None, None, None) if self.parent_refusals > 0 => format!(
                "due, refused {} of {PARENT_SEND_TRIES} tries: {error}",
                self.parent_refusals
            ),
            (None, None, None) => "waiting for its children".to_owned(),
        }
    }

    /// A short account: `3 of 5 succeeded, 1 failed, 1 pending`.
    pub fn summary(&self) -> String {
        format!(
            "{} children: {} succeeded, {} failed, {} pending",
            self.children,
            self.succeeded,
            self.failed,
            self.pending()
        )
    }
}

/// One child as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowChild {
    /// The child's id in the flow.
    pub id: String,
    /// The child's idempotency record key.
    pub key: String,
    /// How it ended, once counted.
    pub end: Option<ChildEnd>,
}

/// The answer to [`FlowStore::child_finished`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Count {
    /// Counted now; the flow after the count.
    Counted(FlowState),
    /// Counted before (a duplicate, a crash's redelivery); the flow as it is.
    Before(FlowState),
    /// No such child in such a flow: the flow has no records (expired, another table) or the child
    /// is not one of its children.
    NotInFlow,
}

/// The flows port, on DynamoDB (`conveyor-dynamodb`) and in memory (`conveyor-testing`); the
/// `flows` conformance suite checks both.
///
/// - `create_flow` writes what is missing of the flow's records and overwrites nothing; the same
///   content again is `Written`, other content under the same id is `Conflict`.
/// - `child_finished` is atomic and idempotent per child: a member is counted once, as succeeded or as
///   failed, whatever the number of calls, except that a failed child may later count as succeeded
///   (the failed count moves to the succeeded one) while the parent was not sent (once it was, the
///   parent saw the failure and the flow keeps it: `Before`); a non-member is never counted.
/// - `mark_parent_sent`, `mark_failure_sent`, `mark_parent_ran`, `mark_parent_failed` set their time
///   once; `claim_failure_notice` answers true for the first message id it is given (and for that id
///   again), false for any other; `parent_refused` adds one each call.
/// - `overdue` lists flows past their deadline that are not closed; `close` takes a flow off it, and
///   so do `mark_parent_sent`, `mark_parent_ran` and `mark_parent_failed`.
#[async_trait]
pub trait FlowStore: Send + Sync {
    /// Writes a new flow's records (or what is missing of them).
    async fn create_flow(&self, flow: &NewFlow) -> Result<Created, StoreError>;

    /// Counts a child's end.
    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Count, StoreError>;

    /// Records that the parent was sent to run (and closes the flow).
    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError>;

    /// Records that a failure notice was sent.
    async fn mark_failure_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError>;

    /// Records that the parent's run completed (and closes the flow).
    async fn mark_parent_ran(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError>;

    /// Counts one send of the parent its queue refused, keeping `reason`; the refusals so far
    /// (`None`: no such flow).
    async fn parent_refused(&self, flow_id: &str, reason: &str) -> Result<Option<u64>, StoreError>;

    /// Ends the flow as failed because its parent could not be sent (and closes it).
    async fn mark_parent_failed(&self, flow_id: &str, reason: &str, at: SystemTime)
    -> Result<(), StoreError>;

    /// Claims the flow's one failure notice for `message_id`.
    async fn claim_failure_notice(&self, flow_id: &str, message_id: &str) -> Result<bool, StoreError>;

    /// Reads a flow's head.
    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError>;

    /// The parent's message.
    async fn parent(&self, flow_id: &str) -> Result<Option<ParentMessage>, StoreError>;

    /// Every child, in child id order, with its end and output.
    async fn children(&self, flow_id: &str) -> Result<Vec<FlowChild>, StoreError>;

    /// Up to `limit` flows whose deadline is before `now` and that are not closed.
    async fn overdue(&self, now: SystemTime, limit: usize) -> Result<Vec<String>, StoreError>;

    /// Takes a flow off the overdue list (its deadline was swept).
    async fn close(&self, flow_id: &str) -> Result<(), StoreError>;
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
    /// Its output (JSON text), kept on its flow record; `None` for a failed or pending child, or an
    /// output that was too large for the store (read it from where the child put it, by `key`).
    pub output: Option<String>,
    /// Why it failed, for a dead-lettered child (policies `Ignore` and `ContinueParent`).
    pub error: Option<String>,
    /// Not finished yet (policy `ContinueParent`: the parent ran on a failure before the rest).
    pub pending: bool,
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

/// Why a flow's message names a flow that has no records here.
pub fn unknown_flow(flow_id: &str) -> String {
    format!(
        "flow {flow_id:?} has no records in this consumer's table (they expired {} days after the flow's \
         deadline, or the producer wrote them to another table: give both the same table)",
        FLOW_RETENTION.as_secs() / 86_400
    )
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

    #[test]
    fn a_parents_record_key_names_its_flow() {
        let key = crate::idempotency::idempotency_key("report", Some(&parent_key("report:r-1")), "");
        assert_eq!(flow_of_parent_record(&key), Some("report:r-1"));
        assert_eq!(flow_of_parent_record("conveyor:report#r-1"), None);
        assert_eq!(flow_of_parent_record("flow:x"), None);
    }

    fn flow(children: u64, succeeded: u64, failed: u64, policy: ChildFailurePolicy) -> FlowState {
        FlowState {
            id: "f".into(),
            parent_record: "conveyor:report#flow:f".into(),
            policy,
            children,
            succeeded,
            failed,
            first_failure: (failed > 0).then(|| "child 00001: boom".to_owned()),
            deadline: 0,
            parent_sent_at: None,
            failure_sent_at: None,
            parent_ran_at: None,
            parent_refusals: 0,
            parent_error: None,
            parent_failed_at: None,
        }
    }

    #[test]
    fn the_parent_is_due_as_each_policy_says() {
        use ChildFailurePolicy::*;
        assert_eq!(flow(3, 2, 0, FailParent).parent_due(), None);
        assert_eq!(flow(3, 3, 0, FailParent).parent_due(), Some(ParentDue::Run));
        assert!(matches!(
            flow(3, 1, 1, FailParent).parent_due(),
            Some(ParentDue::Fail(reason)) if reason.contains("00001") && reason.contains("boom")
        ));
        for policy in [Ignore, RemoveDependency] {
            assert_eq!(flow(3, 1, 1, policy).parent_due(), None);
            assert_eq!(flow(3, 2, 1, policy).parent_due(), Some(ParentDue::Run));
        }
        assert_eq!(flow(3, 0, 1, ContinueParent).parent_due(), Some(ParentDue::Run));
        assert_eq!(flow(3, 2, 0, ContinueParent).parent_due(), None);
    }

    #[test]
    fn the_parents_state_says_why_it_failed_or_that_it_ran() {
        let mut state = flow(2, 2, 0, ChildFailurePolicy::Ignore);
        state.parent_refusals = 2;
        state.parent_error = Some("sending the parent to q was refused: access denied".into());
        assert!(
            state.parent_state().starts_with("due, refused 2 of 5 tries: "),
            "{}",
            state.parent_state()
        );
        assert!(!state.is_finished());
        state.parent_refusals = PARENT_SEND_TRIES;
        state.parent_failed_at = Some(1_796_000_000_000);
        let failed = state.parent_state();
        assert!(
            failed.contains("could not be sent (5 tries)") && failed.contains("access denied"),
            "{failed}"
        );
        assert!(state.is_finished());
        let mut ran = flow(1, 1, 0, ChildFailurePolicy::Ignore);
        ran.parent_ran_at = Some(1_796_000_000_000);
        assert!(
            ran.is_finished() && ran.parent_state().starts_with("ran "),
            "{}",
            ran.parent_state()
        );
    }

    #[test]
    fn policies_round_trip() {
        for policy in ChildFailurePolicy::ALL {
            assert_eq!(ChildFailurePolicy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(ChildFailurePolicy::parse("retry"), None);
    }

    #[test]
    fn the_fingerprint_tells_a_resend_from_a_conflict() {
        let new = |children: usize| NewFlow {
            id: "f".into(),
            parent: ParentMessage {
                queue_url: "q".into(),
                body: "{}".into(),
                attributes: BTreeMap::new(),
                group_id: None,
            },
            parent_record: "r".into(),
            children: (0..children)
                .map(|i| (format!("{i:05}"), format!("k{i}")))
                .collect(),
            policy: ChildFailurePolicy::FailParent,
            created_at: SystemTime::UNIX_EPOCH,
            deadline: SystemTime::UNIX_EPOCH,
        };
        assert_eq!(new(3).fingerprint(), new(3).fingerprint());
        assert_ne!(new(3).fingerprint(), new(4).fingerprint());
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
