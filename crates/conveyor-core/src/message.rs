//! A received SQS message, as every runtime hands it to the pipeline.

use std::collections::BTreeMap;
use std::time::SystemTime;

/// Message attribute holding the job type the [`Router`](crate::Router) dispatches on.
pub const JOB_TYPE_ATTRIBUTE: &str = "conveyor.type";
/// Message attribute holding the job's schema version (a positive integer).
pub const SCHEMA_VERSION_ATTRIBUTE: &str = "conveyor.version";
/// Message attribute holding the producer's idempotency key (a business key).
pub const IDEMPOTENCY_KEY_ATTRIBUTE: &str = "conveyor.key";
/// Message attribute added to dead-lettered messages: the failure as JSON.
pub const FAILURE_ATTRIBUTE: &str = "conveyor.failure";
/// Message attribute holding the job's tenant on a FIFO queue, where `MessageGroupId` is the FIFO group
/// (on a standard queue the tenant is the `MessageGroupId`; see `src/tenant.rs`).
pub const TENANT_ATTRIBUTE: &str = "conveyor.tenant";
/// Message attribute of a deferred copy: its history as JSON ([`DeferralRecord`]).
pub const DEFERRAL_ATTRIBUTE: &str = "conveyor.deferral";

/// The opaque handle SQS returns with each receive; needed to delete or extend that receipt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReceiptHandle(pub String);

impl ReceiptHandle {
    /// The handle as SQS wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One message attribute, mirroring SQS's `MessageAttributeValue`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttributeValue {
    /// `String`, `Number`, `Binary`, optionally with a custom suffix (`String.json`).
    pub data_type: String,
    /// Set for `String` and `Number` types.
    pub string_value: Option<String>,
    /// Set for `Binary` types.
    pub binary_value: Option<Vec<u8>>,
}

impl AttributeValue {
    /// A `String` attribute.
    pub fn string(value: impl Into<String>) -> Self {
        Self {
            data_type: "String".to_owned(),
            string_value: Some(value.into()),
            binary_value: None,
        }
    }

    /// A `Number` attribute.
    pub fn number(value: impl ToString) -> Self {
        Self {
            data_type: "Number".to_owned(),
            string_value: Some(value.to_string()),
            binary_value: None,
        }
    }

    /// The attribute's size as SQS counts it against the 1 MiB message limit: name is added by the caller.
    pub fn size(&self) -> usize {
        self.data_type.len()
            + self.string_value.as_ref().map_or(0, String::len)
            + self.binary_value.as_ref().map_or(0, Vec::len)
    }
}

/// Message attributes by name.
pub type Attributes = BTreeMap<String, AttributeValue>;

/// Attribute names, types and values, as SQS counts them against the 1 MiB message limit.
pub(crate) fn attributes_size(attributes: &Attributes) -> usize {
    attributes
        .iter()
        .map(|(name, value)| name.len() + value.size())
        .sum()
}

/// A message as received from a queue (by the worker's `ReceiveMessage` or in a Lambda `SqsEvent`).
#[derive(Debug, Clone)]
pub struct Message {
    /// SQS's message id.
    pub id: String,
    /// The handle of this receipt.
    pub receipt_handle: ReceiptHandle,
    /// The body, as sent.
    pub body: String,
    /// User message attributes (including Conveyor's `conveyor.*` ones).
    pub attributes: Attributes,
    /// `ApproximateReceiveCount`: 1 on the first delivery.
    pub receive_count: u32,
    /// `SentTimestamp`.
    pub sent_at: Option<SystemTime>,
    /// `ApproximateFirstReceiveTimestamp`: when the message was first received.
    pub first_received_at: Option<SystemTime>,
    /// `MessageGroupId`: the FIFO group on FIFO queues, the tenant (fair queues) on standard ones.
    pub group_id: Option<String>,
    /// `MessageDeduplicationId` on FIFO queues.
    pub deduplication_id: Option<String>,
    /// `AWSTraceHeader`, when the producer propagated an X-Ray trace.
    pub trace_header: Option<String>,
}

impl Message {
    /// A message with the given id and body and nothing else: for tests and tools.
    pub fn new(id: impl Into<String>, body: impl Into<String>) -> Self {
        let id = id.into();
        Self {
            receipt_handle: ReceiptHandle(format!("rh-{id}")),
            id,
            body: body.into(),
            attributes: Attributes::new(),
            receive_count: 1,
            sent_at: None,
            first_received_at: None,
            group_id: None,
            deduplication_id: None,
            trace_header: None,
        }
    }

    /// A string (or number) attribute's value.
    pub fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .get(name)
            .and_then(|value| value.string_value.as_deref())
    }

    /// The job type Conveyor's producer set, if any.
    pub fn job_type(&self) -> Option<&str> {
        self.string_attribute(JOB_TYPE_ATTRIBUTE)
    }

    /// The producer's idempotency key, if any.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.string_attribute(IDEMPOTENCY_KEY_ATTRIBUTE)
            .filter(|key| !key.is_empty())
    }

    /// The size SQS counts against its 1 MiB limit: body plus attribute names, types and values.
    pub fn size(&self) -> usize {
        self.body.len() + attributes_size(&self.attributes)
    }

    /// The id of the job's first copy: this message's id, or the original's when this is a deferred copy.
    /// The idempotency key falls back to it when the producer set no key.
    pub fn original_id(&self) -> String {
        DeferralRecord::of(self).map_or_else(|| self.id.clone(), |record| record.original_id)
    }

    /// Which run of the job this delivery is (1 = first): the receive count, plus the runs of earlier
    /// copies when this is a deferred copy. Deferrals themselves never count.
    pub fn attempt(&self) -> u32 {
        self.runs_before().saturating_add(self.receive_count.max(1))
    }

    /// The runs of the job before this copy of its message (0 unless it is a deferred or retried copy).
    pub fn runs_before(&self) -> u32 {
        DeferralRecord::of(self).map_or(0, |record| record.attempts)
    }
}

/// The history a deferred copy carries (attribute `conveyor.deferral`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeferralRecord {
    /// The message id of the first copy: the idempotency key's fallback.
    pub original_id: String,
    /// When the first copy was sent (epoch milliseconds), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sent_ms: Option<u64>,
    /// Runs (receives that reached the handler or failed it) before this copy.
    pub attempts: u32,
    /// How many times the job was deferred so far.
    pub deferrals: u32,
    /// What the job has been deferred for since its last run ([`DeferCause::name`](crate::runtime::DeferCause::name)),
    /// when every deferral since then had that cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Since when (epoch milliseconds) it has been deferred for `waiting_for`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since_ms: Option<u64>,
}

impl DeferralRecord {
    /// The record a message carries, if it is a deferred copy (an unreadable one counts as none).
    pub fn of(message: &Message) -> Option<DeferralRecord> {
        let json = message.string_attribute(DEFERRAL_ATTRIBUTE)?;
        serde_json::from_str(json).ok()
    }
}
