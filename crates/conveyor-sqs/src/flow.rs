//! [`FlowProducer`]: sends a parent job with its children (BullMQ's flow producer); the parent is sent
//! by the consumer that finishes the last child (see `conveyor-core/src/flow.rs` for how it is counted).
//!
//! ```no_run
//! # async fn example(client: aws_sdk_sqs::Client, store: std::sync::Arc<dyn conveyor_core::port::FlowStore>)
//! # -> Result<(), conveyor_sqs::FlowError> {
//! use conveyor_sqs::{Flow, FlowProducer, NewJob};
//!
//! let queue = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs";
//! let mut flow = Flow::new("report:r-1", NewJob::new("report", serde_json::json!({"id": "r-1"})), queue);
//! for chunk in 0..8 {
//!     flow = flow.child(NewJob::new("report_chunk", serde_json::json!({"report": "r-1", "chunk": chunk})), queue);
//! }
//! FlowProducer::new(client, store).send(&flow).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use conveyor_core::limits::MAX_PRODUCER_ATTRIBUTES;
use conveyor_core::message::{IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use conveyor_core::port::idempotency_key;
use conveyor_core::port::{FLOW_CHILD_ATTRIBUTE, NewFlow, ParentMessage, parent_key};
use conveyor_core::{
    ChildFailurePolicy,
    message::AttributeValue,
    port::{Created, FlowSender, FlowStore, OutgoingMessage, QueueError, StoreError},
};
use serde::Serialize;

use crate::convert::queue_name;
use crate::job::{NewJob, ProduceError};
use crate::send::send_message;

/// Why a flow was not (completely) sent. Sending the same flow (same id) again is safe: its record
/// is written once, and its children carry keys derived from the flow id, so the ones already sent
/// are settled as duplicates.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// A job of the flow breaks a limit or does not encode; nothing was sent.
    #[error("flow {flow}: {error}")]
    Job {
        /// The flow id.
        flow: String,
        /// What was wrong.
        error: ProduceError,
    },
    /// A job has more attributes than a flow job may carry (it needs one for the flow).
    #[error(
        "flow {flow}: job {job_type} carries {count} attributes; a flow job may carry {limit} (the flow takes one)"
    )]
    TooManyAttributes {
        /// The flow id.
        flow: String,
        /// The job type.
        job_type: String,
        /// Its attributes, the flow's included.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The flow has no children (send the parent as an ordinary job instead).
    #[error("flow {0} has no children; send its parent as an ordinary job")]
    NoChildren(String),
    /// The flow record could not be written; no child was sent.
    #[error("flow {flow}: writing its record failed: {error}")]
    Store {
        /// The flow id.
        flow: String,
        /// What the store said.
        error: StoreError,
    },
    /// A flow with this id and other content (parent, children or policy) exists; nothing was sent.
    #[error(
        "flow {0} exists with another parent, other children or another policy; nothing was sent (a flow \
         id names one flow: use a new id for a different one)"
    )]
    Conflict(String),
    /// A child could not be sent; send the flow again (the same id) to finish it.
    #[error("flow {flow}: sending child {child} failed (send the flow again with the same id): {error}")]
    Send {
        /// The flow id.
        flow: String,
        /// The child's id.
        child: String,
        /// What SQS said.
        error: QueueError,
    },
}

/// One encoded job of a flow, and where it goes.
#[derive(Debug, Clone)]
struct FlowJob {
    queue_url: String,
    job_type: String,
    message: Result<OutgoingMessage, ProduceError>,
}

impl FlowJob {
    fn new<J: Serialize>(job: &NewJob<J>, queue_url: String) -> Self {
        Self {
            message: job.to_message(queue_name(&queue_url)),
            job_type: job.job_type().to_owned(),
            queue_url,
        }
    }
}

/// One child: a job, or a nested flow whose parent is the child.
#[derive(Debug, Clone)]
enum Child {
    Job(FlowJob),
    Flow(Box<Flow>),
}

/// A parent and its children, to send with [`FlowProducer::send`].
#[derive(Debug, Clone)]
pub struct Flow {
    id: String,
    parent: FlowJob,
    children: Vec<Child>,
    policy: ChildFailurePolicy,
    deadline: Duration,
    tenant: Option<String>,
}

impl Flow {
    /// A flow `id` (a business id such as `report:r-1`: sending the same id again is settled as a
    /// duplicate) whose `parent` goes to `queue_url` once every child succeeded. The parent's
    /// idempotency key is its own (`NewJob::key`) or `flow:<id>`. The parent's tenant (`NewJob::tenant`)
    /// is every child's that has none of its own.
    pub fn new<J: Serialize>(id: impl Into<String>, parent: NewJob<J>, queue_url: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            parent: FlowJob::new(&parent, queue_url.into()),
            children: Vec::new(),
            policy: ChildFailurePolicy::default(),
            deadline: conveyor_core::DEFAULT_FLOW_DEADLINE,
            tenant: parent.tenant_id().map(str::to_owned),
        }
    }

    /// Adds a child sent to `queue_url` now. Its idempotency key is its own (`NewJob::key`) or
    /// `flow:<flow id>:<child id>`; its handler must be idempotent (its output is read from its record).
    pub fn child<J: Serialize>(mut self, job: NewJob<J>, queue_url: impl Into<String>) -> Self {
        let job = match (&self.tenant, job.tenant_id()) {
            (Some(tenant), None) => job.tenant(tenant.clone()),
            _ => job,
        };
        self.children
            .push(Child::Job(FlowJob::new(&job, queue_url.into())));
        self
    }

    /// Adds a nested flow: its parent is a child of this flow, sent when its own children are done.
    pub fn child_flow(mut self, flow: Flow) -> Self {
        self.children.push(Child::Flow(Box::new(flow)));
        self
    }

    /// What a dead-lettered child does (default: the parent fails, to the DLQ with the child's reason).
    pub fn on_child_failure(mut self, policy: ChildFailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long the flow may take (default 24 hours): past it, the deadline sweep
    /// (`conveyor_core::FlowSweeper`) counts the children still unfinished as failed and the policy
    /// decides; the flow's records are kept 14 days longer.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The flow's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// What [`FlowProducer::send`] sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSent {
    /// The flow id.
    pub flow: String,
    /// The parent's record key (`conveyor jobs show` it once sent).
    pub parent_record: String,
    /// Child id → record key of every direct child.
    pub children: BTreeMap<String, String>,
    /// Messages sent now (the leaf children of every nested flow).
    pub messages_sent: usize,
}

/// Sends flows: writes each flow's record, then sends its children.
#[derive(Clone)]
pub struct FlowProducer {
    sender: Arc<dyn FlowSender>,
    store: Arc<dyn FlowStore>,
}

impl std::fmt::Debug for FlowProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowProducer").finish_non_exhaustive()
    }
}

/// A child's id in its flow: its index, zero-padded so ids sort in the order children were added.
fn child_id(index: usize) -> String {
    format!("{index:05}")
}

/// Adds `name` to a flow job's message, within the attribute limit.
fn add_attribute(
    flow: &str,
    job: &FlowJob,
    message: &mut OutgoingMessage,
    name: &str,
    value: &str,
) -> Result<(), FlowError> {
    // The trace context gives way to the flow's attributes.
    if !message.attributes.contains_key(name) {
        conveyor_core::trace::make_room(&mut message.attributes, 1, MAX_PRODUCER_ATTRIBUTES);
    }
    message
        .attributes
        .insert(name.to_owned(), AttributeValue::string(value));
    if message.attributes.len() > MAX_PRODUCER_ATTRIBUTES {
        return Err(FlowError::TooManyAttributes {
            flow: flow.to_owned(),
            job_type: job.job_type.clone(),
            count: message.attributes.len(),
            limit: MAX_PRODUCER_ATTRIBUTES,
        });
    }
    Ok(())
}

/// The message of `job` with its key (its own or `default_key`); returns it and its record key.
fn keyed(flow: &str, job: &FlowJob, default_key: &str) -> Result<(OutgoingMessage, String), FlowError> {
    let mut message = job.message.clone().map_err(|error| FlowError::Job {
        flow: flow.to_owned(),
        error,
    })?;
    let key = match message
        .attributes
        .get(IDEMPOTENCY_KEY_ATTRIBUTE)
        .and_then(|value| value.string_value.clone())
    {
        Some(key) => key,
        None => {
            add_attribute(flow, job, &mut message, IDEMPOTENCY_KEY_ATTRIBUTE, default_key)?;
            default_key.to_owned()
        }
    };
    let job_type = message
        .attributes
        .get(JOB_TYPE_ATTRIBUTE)
        .and_then(|value| value.string_value.clone())
        .unwrap_or_else(|| job.job_type.clone());
    Ok((message, idempotency_key(&job_type, Some(&key), "")))
}

/// A flow ready to send: its record and its messages, nested flows' included.
struct Plan {
    records: Vec<NewFlow>,
    messages: Vec<(String, String, OutgoingMessage)>,
}

impl FlowProducer {
    /// A producer sending through `client`, keeping flow records in `store` (the consumers'
    /// idempotency table: `conveyor_dynamodb::DynamoStore`).
    pub fn new(client: Client, store: Arc<dyn FlowStore>) -> Self {
        Self::with_sender(Arc::new(SqsSender::new(client)), store)
    }

    /// A producer sending through any [`FlowSender`] (an in-memory queue in tests).
    pub fn with_sender(sender: Arc<dyn FlowSender>, store: Arc<dyn FlowStore>) -> Self {
        Self { sender, store }
    }

    /// Writes the flow's records (outermost first) and sends its children. Every job is checked first,
    /// so a flow with a bad job sends nothing.
    pub async fn send(&self, flow: &Flow) -> Result<FlowSent, FlowError> {
        let mut plan = Plan {
            records: Vec::new(),
            messages: Vec::new(),
        };
        let (_, parent_record) = plan_flow(flow, None, &mut plan)?;
        let top = plan
            .records
            .first()
            .map(|record| record.children.clone())
            .unwrap_or_default();
        for record in &plan.records {
            let created = self
                .store
                .create_flow(record)
                .await
                .map_err(|error| FlowError::Store {
                    flow: record.id.clone(),
                    error,
                })?;
            if created == Created::Conflict {
                return Err(FlowError::Conflict(record.id.clone()));
            }
        }
        for (child, queue_url, message) in &plan.messages {
            self.sender
                .send_to(queue_url, message.clone())
                .await
                .map_err(|error| FlowError::Send {
                    flow: flow.id.clone(),
                    child: child.clone(),
                    error,
                })?;
        }
        tracing::info!(flow = %flow.id, children = top.len(), messages = plan.messages.len(), "flow sent");
        Ok(FlowSent {
            flow: flow.id.clone(),
            parent_record,
            children: top,
            messages_sent: plan.messages.len(),
        })
    }
}

/// Plans `flow` (whose parent is child `as_child` = (outer flow, child id) of an outer flow, when
/// nested); returns the parent's message and record key.
fn plan_flow(
    flow: &Flow,
    as_child: Option<(&str, &str)>,
    plan: &mut Plan,
) -> Result<(OutgoingMessage, String), FlowError> {
    if flow.children.is_empty() {
        return Err(FlowError::NoChildren(flow.id.clone()));
    }
    let (mut parent, parent_record) = keyed(&flow.id, &flow.parent, &parent_key(&flow.id))?;
    if let Some((outer, child)) = as_child {
        add_attribute(
            &flow.id,
            &flow.parent,
            &mut parent,
            FLOW_CHILD_ATTRIBUTE,
            &format!("{outer}/{child}"),
        )?;
    }
    // One slot for `conveyor.flow.parent`, added when the parent is sent.
    if parent.attributes.len() + 1 > MAX_PRODUCER_ATTRIBUTES {
        return Err(FlowError::TooManyAttributes {
            flow: flow.id.clone(),
            job_type: flow.parent.job_type.clone(),
            count: parent.attributes.len() + 1,
            limit: MAX_PRODUCER_ATTRIBUTES,
        });
    }
    let index = plan.records.len();
    plan.records.push(NewFlow {
        id: flow.id.clone(),
        parent: ParentMessage::from_outgoing(&flow.parent.queue_url, &parent),
        parent_record: parent_record.clone(),
        children: BTreeMap::new(),
        policy: flow.policy,
        created_at: SystemTime::now(),
        deadline: SystemTime::now() + flow.deadline,
    });
    let mut children = BTreeMap::new();
    for (position, child) in flow.children.iter().enumerate() {
        let id = child_id(position);
        let record = match child {
            Child::Job(job) => {
                let (mut message, record) = keyed(&flow.id, job, &format!("flow:{}:{id}", flow.id))?;
                add_attribute(
                    &flow.id,
                    job,
                    &mut message,
                    FLOW_CHILD_ATTRIBUTE,
                    &format!("{}/{id}", flow.id),
                )?;
                plan.messages.push((id.clone(), job.queue_url.clone(), message));
                record
            }
            Child::Flow(nested) => plan_flow(nested, Some((&flow.id, &id)), plan)?.1,
        };
        children.insert(id, record);
    }
    plan.records[index].children = children;
    Ok((parent, parent_record))
}

/// Sends flow parents with `SendMessage` (the consumer side of flows: `Pipeline::with_flows`).
#[derive(Debug, Clone)]
pub struct SqsSender {
    client: Client,
}

impl SqsSender {
    /// A sender through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl FlowSender for SqsSender {
    async fn send_to(&self, queue_url: &str, message: OutgoingMessage) -> Result<String, QueueError> {
        send_message(&self.client, queue_url, &message).await
    }
}
