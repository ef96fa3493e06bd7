//! [`NewJob`]: a typed job to send, and the limits checked before it leaves the process.

use std::time::{Duration, SystemTime};

use conveyor_core::limits::{MAX_DELAY, MAX_MESSAGE_BYTES, MAX_PRODUCER_ATTRIBUTES};
use conveyor_core::message::{
    IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE, TENANT_ATTRIBUTE,
};
use conveyor_core::runtime::{DUE_ATTRIBUTE, MAX_TOTAL_DELAY, due_value};
use conveyor_core::{
    Handler,
    message::{AttributeValue, Attributes},
    port::{OutgoingMessage, QueueError},
};
use serde::Serialize;

/// Why a job was not sent.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProduceError {
    /// The payload does not serialise to JSON.
    #[error("job {job_type}: the payload does not serialise to JSON: {message}")]
    Serialize {
        /// The job type.
        job_type: String,
        /// serde_json's message.
        message: String,
    },
    /// The body is empty; SQS refuses empty messages.
    #[error("job {job_type}: the message body is empty, and SQS refuses empty messages")]
    EmptyBody {
        /// The job type.
        job_type: String,
    },
    /// Body plus attributes exceed SQS's message size limit.
    #[error(
        "job {job_type} is {size} bytes (body plus message attributes), over SQS's limit of {limit} bytes (the \
         queue's MaximumMessageSize): \
         turn on large payloads (Producer::with_large_payloads, or CONVEYOR_PAYLOAD_BUCKET for `conveyor send`) so \
         the body goes to S3 and the message carries a pointer, or send a smaller payload"
    )]
    TooLarge {
        /// The job type.
        job_type: String,
        /// The message's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// More message attributes than a producer may set.
    #[error(
        "job {job_type} has {count} message attributes, over the limit of {limit}: SQS allows 10 per message \
         and Conveyor reserves one for the failure record (conveyor.failure) added when a job is \
         dead-lettered (conveyor.type and conveyor.version count, and conveyor.key when set)"
    )]
    TooManyAttributes {
        /// The job type.
        job_type: String,
        /// How many the job would carry.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// Storing a large payload failed (nothing was sent).
    #[error("job {job_type}: storing its large payload failed: {error}")]
    Payload {
        /// The job type.
        job_type: String,
        /// What the payload store said.
        error: conveyor_core::port::PayloadError,
    },
    /// A message attribute that cannot be sent.
    #[error("job {job_type}: message attribute {name:?} {reason}")]
    InvalidAttribute {
        /// The job type.
        job_type: String,
        /// The attribute's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A schema version of 0.
    #[error("job {job_type}: schema version must be 1 or more")]
    InvalidVersion {
        /// The job type.
        job_type: String,
    },
    /// A delay longer than the queue keeps a message (its `MessageRetentionPeriod`, at most 14 days).
    #[error(
        "job {job_type} asks for a delay of {}s, longer than the queue keeps a message ({}s, its \
         MessageRetentionPeriod; SQS allows at most 14 days): raise the queue's retention, or schedule it \
         with EventBridge Scheduler, which can send it to the queue when it is due",
        delay.as_secs(), limit.as_secs()
    )]
    DelayTooLong {
        /// The job type.
        job_type: String,
        /// The delay asked for.
        delay: Duration,
        /// The limit.
        limit: Duration,
    },
    /// A per-message delay on a FIFO queue.
    #[error(
        "job {job_type}: FIFO queues do not support a per-message delay; set the queue's DelaySeconds, or \
         send delayed jobs to a standard queue"
    )]
    DelayOnFifo {
        /// The job type.
        job_type: String,
    },
    /// A FIFO queue without a message group id.
    #[error(
        "job {job_type}: FIFO queue {queue} needs a message group id: call NewJob::group_id (jobs of one group \
         run in order)"
    )]
    MissingGroupId {
        /// The job type.
        job_type: String,
        /// The queue's name.
        queue: String,
    },
    /// A tenant SQS would refuse as a `MessageGroupId`.
    #[error("job {job_type}: tenant {tenant:?} cannot be sent: {error}")]
    InvalidTenant {
        /// The job type.
        job_type: String,
        /// The tenant as given (at most its first 140 characters).
        tenant: String,
        /// What is wrong with it.
        error: conveyor_core::tenant::TenantError,
    },
    /// A standard queue's message group is the tenant; a different group id was set too.
    #[error(
        "job {job_type}: on standard queue {queue} the MessageGroupId is the tenant ({tenant:?}), and a          different group id ({group_id:?}) was set; set only the tenant (message groups order jobs on FIFO          queues only)"
    )]
    GroupIsTheTenant {
        /// The job type.
        job_type: String,
        /// The queue's name.
        queue: String,
        /// The tenant.
        tenant: String,
        /// The group id set besides.
        group_id: String,
    },
    /// SQS refused this one entry of a batch.
    #[error("SQS refused the job ({code}): {message}")]
    Rejected {
        /// SQS's error code.
        code: String,
        /// SQS's message.
        message: String,
        /// SQS's `SenderFault`.
        sender_fault: bool,
    },
    /// The call failed as a whole (queue missing, access denied, unavailable, invalid request).
    #[error(transparent)]
    Queue(QueueError),
    /// The request never reached the SQS endpoint that a variable set (nothing listens there, or its
    /// host does not resolve): a configuration error, not an outage. Nothing was sent.
    #[error(
        "not sent: {0}; the producer does not wait for the endpoint to come up: {fix}",
        fix = .0.fix()
    )]
    Unreachable(crate::endpoint::UnreachableEndpoint),
    /// The job is due later than 15 minutes and the timer store ([`Producer::with_timers`](crate::Producer::with_timers))
    /// failed or refused it: nothing was kept or sent.
    #[error("job {job_type} could not be kept in the timer table: {error}")]
    Timer {
        /// The job type.
        job_type: String,
        /// What the store said.
        error: conveyor_core::port::StoreError,
    },
    /// On a FIFO queue, an earlier job of the same message group was not sent in this batch (or
    /// buffer): this one was held back rather than overtake it.
    #[error(
        "not sent: an earlier job of message group {group:?} was not sent, and this one would have \
         overtaken it; send the group's jobs again from the first that failed, in order"
    )]
    GroupHeld {
        /// The message group.
        group: String,
    },
    /// The [`BatchingProducer`](crate::BatchingProducer) was shut down before it took the job: it was
    /// not sent.
    #[error(
        "not sent: the batching producer was shut down before it took the job; send it before \
         BatchingProducer::shutdown, or with another producer"
    )]
    ShutDown,
    /// The [`BatchingProducer`](crate::BatchingProducer)'s sending task ended without an answer for the
    /// job (its runtime is shutting down): it may or may not have been sent.
    #[error(
        "the batching producer's task ended before SQS answered for the job (is the runtime shutting \
         down?): it may or may not have been sent; consumers are idempotent, so sending it again is safe"
    )]
    Unanswered,
}

impl ProduceError {
    /// The error's class, as a send span's OpenTelemetry `error.type` says it (low cardinality: the
    /// variant's name, or the queue error's).
    pub(crate) fn error_type(&self) -> &'static str {
        match self {
            ProduceError::Serialize { .. } => "Serialize",
            ProduceError::EmptyBody { .. } => "EmptyBody",
            ProduceError::TooLarge { .. } => "TooLarge",
            ProduceError::TooManyAttributes { .. } => "TooManyAttributes",
            ProduceError::Payload { .. } => "Payload",
            ProduceError::InvalidAttribute { .. } => "InvalidAttribute",
            ProduceError::InvalidVersion { .. } => "InvalidVersion",
            ProduceError::DelayTooLong { .. } => "DelayTooLong",
            ProduceError::DelayOnFifo { .. } => "DelayOnFifo",
            ProduceError::MissingGroupId { .. } => "MissingGroupId",
            ProduceError::InvalidTenant { .. } => "InvalidTenant",
            ProduceError::GroupIsTheTenant { .. } => "GroupIsTheTenant",
            ProduceError::Rejected { .. } => "Rejected",
            ProduceError::Queue(QueueError::QueueMissing { .. }) => "QueueMissing",
            ProduceError::Queue(QueueError::AccessDenied { .. }) => "AccessDenied",
            ProduceError::Queue(QueueError::Unavailable { .. }) => "Unavailable",
            ProduceError::Queue(_) => "Queue",
            ProduceError::Unreachable(_) => "Unreachable",
            ProduceError::Timer { .. } => "Timer",
            ProduceError::GroupHeld { .. } => "GroupHeld",
            ProduceError::ShutDown => "ShutDown",
            ProduceError::Unanswered => "Unanswered",
        }
    }
}

/// A whole call's failure; a request that never reached the SQS endpoint a variable set
/// (`AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`) is [`ProduceError::Unreachable`], naming the address
/// and the variable.
impl From<QueueError> for ProduceError {
    fn from(error: QueueError) -> Self {
        match crate::endpoint::UnreachableEndpoint::from_queue_error(&error, crate::endpoint::env_var) {
            Some(endpoint) => ProduceError::Unreachable(endpoint),
            None => ProduceError::Queue(error),
        }
    }
}

/// A job to send: a serialisable payload plus the attributes Conveyor's consumers read.
///
/// ```
/// use std::time::Duration;
/// use conveyor_sqs::NewJob;
///
/// #[derive(serde::Serialize)]
/// struct WelcomeEmail { user_id: u64 }
///
/// let job = NewJob::new("welcome_email", WelcomeEmail { user_id: 42 })
///     .key("welcome_email:user:42")
///     .delay(Duration::from_secs(60));
/// assert_eq!(job.job_type(), "welcome_email");
/// ```
#[derive(Debug, Clone)]
pub struct NewJob<J> {
    job_type: String,
    payload: J,
    version: u32,
    key: Option<String>,
    delay: Option<Duration>,
    deliver_at: Option<SystemTime>,
    group_id: Option<String>,
    tenant: Option<String>,
    deduplication_id: Option<String>,
    attributes: Attributes,
    trace_header: Option<String>,
}

impl<J: Serialize> NewJob<J> {
    /// A job of `job_type` (sent as `conveyor.type`) with schema version 1.
    pub fn new(job_type: impl Into<String>, payload: J) -> Self {
        Self {
            job_type: job_type.into(),
            payload,
            version: 1,
            key: None,
            delay: None,
            deliver_at: None,
            group_id: None,
            tenant: None,
            deduplication_id: None,
            attributes: Attributes::new(),
            trace_header: None,
        }
    }

    /// A job for handler `H`: its `JOB_TYPE` and `VERSION`.
    pub fn for_handler<H>(payload: J) -> Self
    where
        H: Handler<Job = J>,
    {
        Self::new(H::JOB_TYPE, payload).version(H::VERSION)
    }

    /// The schema version (`conveyor.version`, default 1).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// The idempotency key (`conveyor.key`): a business key such as `welcome_email:user:42`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// A delivery delay (standard queues only), up to the queue's retention period. Up to 15 minutes
    /// it is SQS's `DelaySeconds`; a longer one travels as a due time (`conveyor.due`) and the
    /// consumers re-send it every 15 minutes until it is due, without running it or spending a receive
    /// (`conveyor-core/src/delay.rs`). Replaces an earlier [`NewJob::deliver_at`].
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.deliver_at = None;
        self
    }

    /// Delivers the job at `time` (a time in the past delivers it at once); as [`NewJob::delay`], counted
    /// from when the job is sent. Replaces an earlier [`NewJob::delay`].
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        self.deliver_at = Some(time);
        self.delay = None;
        self
    }

    /// The delay asked for, counted from `now`.
    pub(crate) fn delay_from(&self, now: SystemTime) -> Option<Duration> {
        match self.deliver_at {
            Some(time) => Some(time.duration_since(now).unwrap_or_default()),
            None => self.delay,
        }
        .filter(|delay| !delay.is_zero())
    }

    /// The FIFO message group id (required on FIFO queues).
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// The tenant the job belongs to (a customer, an account): sent as `MessageGroupId` on a standard
    /// queue, which SQS fair queues use to keep quiet tenants' jobs moving while one tenant floods the
    /// queue, and as the `conveyor.tenant` attribute on a FIFO queue, whose group stays the FIFO group.
    /// The handler reads it with `Context::tenant`; the worker's per-tenant limits key on it. SQS's
    /// rules apply: 1 to 128 ASCII letters, digits and punctuation, checked at send.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The tenant, when set.
    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The FIFO deduplication id (needed unless the queue has content-based deduplication).
    pub fn deduplication_id(mut self, deduplication_id: impl Into<String>) -> Self {
        self.deduplication_id = Some(deduplication_id.into());
        self
    }

    /// An extra message attribute (names starting with `conveyor.` are reserved).
    pub fn attribute(mut self, name: impl Into<String>, value: AttributeValue) -> Self {
        self.attributes.insert(name.into(), value);
        self
    }

    /// An X-Ray trace header, sent as the `AWSTraceHeader` system attribute.
    pub fn trace_header(mut self, header: impl Into<String>) -> Self {
        self.trace_header = Some(header.into());
        self
    }

    /// The job type.
    pub fn job_type(&self) -> &str {
        &self.job_type
    }

    /// The idempotency key (`NewJob::key`), when set.
    pub fn producer_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The payload.
    pub fn payload(&self) -> &J {
        &self.payload
    }

    /// The message to send to a queue named `queue` (FIFO when it ends in `.fifo`), with every limit
    /// checked: size, attribute count and names, delay, FIFO group.
    pub fn to_message(&self, queue: &str) -> Result<OutgoingMessage, ProduceError> {
        let message = self.encode(queue)?;
        check_size(&self.job_type, &message, MAX_MESSAGE_BYTES)?;
        Ok(message)
    }

    /// [`NewJob::to_message`] without the size check: the producer offloads a large body first.
    pub(crate) fn encode(&self, queue: &str) -> Result<OutgoingMessage, ProduceError> {
        let job_type = || self.job_type.clone();
        let body = serde_json::to_string(&self.payload).map_err(|error| ProduceError::Serialize {
            job_type: job_type(),
            message: error.to_string(),
        })?;
        if body.is_empty() {
            return Err(ProduceError::EmptyBody { job_type: job_type() });
        }
        if self.version == 0 {
            return Err(ProduceError::InvalidVersion { job_type: job_type() });
        }
        for name in self.attributes.keys() {
            if let Some(reason) = attribute_name_problem(name) {
                return Err(ProduceError::InvalidAttribute {
                    job_type: job_type(),
                    name: name.clone(),
                    reason,
                });
            }
        }
        let mut attributes = self.attributes.clone();
        attributes.insert(
            JOB_TYPE_ATTRIBUTE.to_owned(),
            AttributeValue::string(&self.job_type),
        );
        attributes.insert(
            SCHEMA_VERSION_ATTRIBUTE.to_owned(),
            AttributeValue::number(self.version),
        );
        if let Some(key) = &self.key {
            attributes.insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
        }
        let now = SystemTime::now();
        let delay = self.delay_from(now);
        // Every delayed job carries its due time, so a cancel can find it (a short one never hops).
        if let Some(delay) = delay {
            attributes.insert(
                DUE_ATTRIBUTE.to_owned(),
                AttributeValue::number(due_value(now + delay)),
            );
        }
        let fifo = queue.ends_with(".fifo");
        let group_id = self.tenant_and_group(queue, fifo, &mut attributes)?;
        if attributes.len() > MAX_PRODUCER_ATTRIBUTES {
            return Err(ProduceError::TooManyAttributes {
                job_type: job_type(),
                count: attributes.len(),
                limit: MAX_PRODUCER_ATTRIBUTES,
            });
        }
        // The sending span's trace context, in the room the job's own attributes leave (feature `otel`
        // of conveyor-core; see `conveyor_core::trace`).
        let mut trace_header = self.trace_header.clone();
        conveyor_core::trace::inject(&mut attributes, &mut trace_header, MAX_PRODUCER_ATTRIBUTES);
        let message = OutgoingMessage {
            body,
            attributes,
            delay: delay.map(|delay| delay.min(MAX_DELAY)),
            group_id,
            deduplication_id: self.deduplication_id.clone(),
            trace_header,
        };
        if let Some(delay) = delay {
            if fifo {
                return Err(ProduceError::DelayOnFifo { job_type: job_type() });
            }
            if delay > MAX_TOTAL_DELAY {
                return Err(ProduceError::DelayTooLong {
                    job_type: job_type(),
                    delay,
                    limit: MAX_TOTAL_DELAY,
                });
            }
        }
        if fifo && message.group_id.as_deref().is_none_or(str::is_empty) {
            return Err(ProduceError::MissingGroupId {
                job_type: job_type(),
                queue: queue.to_owned(),
            });
        }
        Ok(message)
    }
}

impl<J> NewJob<J> {
    /// The `MessageGroupId` to send, after checking the tenant: on a standard queue the tenant, on a
    /// FIFO queue the group (the tenant then goes in `conveyor.tenant` unless it is the group).
    fn tenant_and_group(
        &self,
        queue: &str,
        fifo: bool,
        attributes: &mut Attributes,
    ) -> Result<Option<String>, ProduceError> {
        let Some(tenant) = &self.tenant else {
            return Ok(self.group_id.clone());
        };
        if let Err(error) = conveyor_core::tenant::check_tenant(tenant) {
            return Err(ProduceError::InvalidTenant {
                job_type: self.job_type.clone(),
                tenant: tenant.chars().take(140).collect(),
                error,
            });
        }
        if fifo {
            if self.group_id.as_deref() != Some(tenant) {
                attributes.insert(TENANT_ATTRIBUTE.to_owned(), AttributeValue::string(tenant));
            }
            return Ok(self.group_id.clone());
        }
        if let Some(group_id) = self.group_id.as_ref().filter(|group_id| *group_id != tenant) {
            return Err(ProduceError::GroupIsTheTenant {
                job_type: self.job_type.clone(),
                queue: queue.to_owned(),
                tenant: tenant.clone(),
                group_id: group_id.clone(),
            });
        }
        Ok(Some(tenant.clone()))
    }
}

/// SQS's naming rules for message attributes, plus Conveyor's reserved prefix.
fn attribute_name_problem(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("conveyor.") {
        return Some("uses the prefix conveyor., which Conveyor reserves for its own attributes".to_owned());
    }
    if conveyor_core::port::marking_attribute(
        &std::iter::once((name.to_owned(), conveyor_core::message::AttributeValue::number(0))).collect(),
    )
    .is_some()
    {
        return Some(
            "is reserved for large-payload pointers (the SQS Extended Client Library's marker)".to_owned(),
        );
    }
    if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        return Some("uses a prefix SQS reserves (AWS. or Amazon.)".to_owned());
    }
    if name.is_empty() || name.len() > 256 {
        return Some("must be 1 to 256 characters long".to_owned());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Some("may contain only letters, digits, '_', '-' and '.'".to_owned());
    }
    if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        return Some("may not start or end with '.', nor hold '..'".to_owned());
    }
    None
}

/// Refuses a message over `limit` bytes (body plus attributes).
pub(crate) fn check_size(
    job_type: &str,
    message: &OutgoingMessage,
    limit: usize,
) -> Result<(), ProduceError> {
    let size = message.size();
    if size > limit {
        return Err(ProduceError::TooLarge {
            job_type: job_type.to_owned(),
            size,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use conveyor_core::{Context, HandlerError};
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Email {
        user_id: u64,
    }

    struct SendEmail;

    impl Handler for SendEmail {
        type Job = Email;
        type Output = ();
        const JOB_TYPE: &'static str = "email";
        const VERSION: u32 = 3;

        async fn handle(&self, _job: Email, _ctx: Context) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    #[test]
    fn for_handler_stamps_type_and_version() {
        let message = NewJob::for_handler::<SendEmail>(Email { user_id: 1 })
            .key("email:1")
            .trace_header("Root=1-abc")
            .to_message("jobs")
            .unwrap();
        assert_eq!(message.body, r#"{"user_id":1}"#);
        assert_eq!(
            message.attributes[JOB_TYPE_ATTRIBUTE],
            AttributeValue::string("email")
        );
        assert_eq!(
            message.attributes[SCHEMA_VERSION_ATTRIBUTE],
            AttributeValue::number(3)
        );
        assert_eq!(
            message.attributes[IDEMPOTENCY_KEY_ATTRIBUTE],
            AttributeValue::string("email:1")
        );
        assert_eq!(message.trace_header.as_deref(), Some("Root=1-abc"));
    }

    #[test]
    fn oversized_bodies_name_size_and_limit() {
        let error = NewJob::new("big", "x".repeat(MAX_MESSAGE_BYTES))
            .to_message("jobs")
            .unwrap_err();
        let ProduceError::TooLarge { size, limit, .. } = &error else {
            panic!("{error:?}")
        };
        assert!(*size > *limit);
        let text = error.to_string();
        assert!(
            text.contains(&size.to_string()) && text.contains("1048576"),
            "{text}"
        );
    }

    #[test]
    fn attribute_limit_counts_conveyor_attributes_and_explains_the_reserved_slot() {
        let mut job = NewJob::new("t", 1).key("k");
        for i in 0..6 {
            job = job.attribute(format!("a{i}"), AttributeValue::string("v"));
        }
        assert!(job.to_message("jobs").is_ok(), "3 + 6 = 9 is allowed");
        let error = job
            .attribute("a6", AttributeValue::string("v"))
            .to_message("jobs")
            .unwrap_err();
        assert!(matches!(
            error,
            ProduceError::TooManyAttributes {
                count: 10,
                limit: 9,
                ..
            }
        ));
        assert!(error.to_string().contains("conveyor.failure"));
    }

    #[test]
    fn delays_and_fifo_rules() {
        let long = NewJob::new("t", 1)
            .delay(Duration::from_secs(15 * 24 * 3600))
            .to_message("jobs")
            .unwrap_err();
        assert!(matches!(long, ProduceError::DelayTooLong { .. }));
        assert!(long.to_string().contains("EventBridge Scheduler"));
        assert!(long.to_string().contains("1209600s"), "{long}");
        let before = SystemTime::now();
        let hours = NewJob::new("t", 1)
            .delay(Duration::from_secs(2 * 3600))
            .to_message("jobs")
            .unwrap();
        assert_eq!(hours.delay, Some(MAX_DELAY), "the first hop");
        let due: u64 = hours.attributes[DUE_ATTRIBUTE]
            .string_value
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        let expected = conveyor_core::runtime::epoch_millis(before + Duration::from_secs(2 * 3600));
        assert!((expected..expected + 5_000).contains(&due), "{due} vs {expected}");
        let at = NewJob::new("t", 1)
            .deliver_at(SystemTime::now() + Duration::from_secs(60))
            .to_message("jobs")
            .unwrap();
        assert!(at.delay.is_some_and(|delay| delay <= Duration::from_secs(60)));
        assert!(
            at.attributes.contains_key(DUE_ATTRIBUTE),
            "short delays carry their due time too (a cancel finds them)"
        );
        let past = NewJob::new("t", 1)
            .deliver_at(SystemTime::UNIX_EPOCH)
            .to_message("jobs")
            .unwrap();
        assert_eq!(past.delay, None);
        assert!(
            NewJob::new("t", 1)
                .delay(Duration::from_secs(15 * 60))
                .to_message("jobs")
                .is_ok()
        );

        let fifo_delay = NewJob::new("t", 1)
            .group_id("g")
            .delay(Duration::from_secs(5))
            .to_message("jobs.fifo")
            .unwrap_err();
        assert!(matches!(fifo_delay, ProduceError::DelayOnFifo { .. }));
        let no_group = NewJob::new("t", 1).to_message("jobs.fifo").unwrap_err();
        assert!(matches!(no_group, ProduceError::MissingGroupId { ref queue, .. } if queue == "jobs.fifo"));
        assert!(NewJob::new("t", 1).group_id("g").to_message("jobs.fifo").is_ok());
    }

    #[test]
    fn the_tenant_is_the_group_on_standard_queues_and_an_attribute_on_fifo() {
        let standard = NewJob::new("t", 1).tenant("acme").to_message("jobs").unwrap();
        assert_eq!(standard.group_id.as_deref(), Some("acme"));
        assert!(
            !standard.attributes.contains_key(TENANT_ATTRIBUTE),
            "no attribute spent on a standard queue"
        );
        let fifo = NewJob::new("t", 1)
            .group_id("order-7")
            .tenant("acme")
            .to_message("jobs.fifo")
            .unwrap();
        assert_eq!(fifo.group_id.as_deref(), Some("order-7"), "the FIFO group stays");
        assert_eq!(fifo.attributes[TENANT_ATTRIBUTE], AttributeValue::string("acme"));
        let same = NewJob::new("t", 1)
            .group_id("acme")
            .tenant("acme")
            .to_message("jobs.fifo")
            .unwrap();
        assert!(
            !same.attributes.contains_key(TENANT_ATTRIBUTE),
            "the group says it already"
        );
        let both = NewJob::new("t", 1)
            .group_id("g")
            .tenant("acme")
            .to_message("jobs")
            .unwrap_err();
        assert!(matches!(both, ProduceError::GroupIsTheTenant { .. }), "{both:?}");
        let bad = NewJob::new("t", 1)
            .tenant("acme corp")
            .to_message("jobs")
            .unwrap_err();
        let text = bad.to_string();
        assert!(
            text.contains("\"acme corp\"") && text.contains("' '") && text.contains("position 4"),
            "{text}"
        );
        let long = NewJob::new("t", 1)
            .tenant("x".repeat(129))
            .to_message("jobs")
            .unwrap_err();
        assert!(long.to_string().contains("129 characters"), "{long}");
    }

    #[test]
    fn bad_attribute_names_and_empty_bodies() {
        for name in ["conveyor.type", "AWS.x", "a b", ".a", "a..b", ""] {
            let error = NewJob::new("t", 1)
                .attribute(name, AttributeValue::string("v"))
                .to_message("jobs")
                .unwrap_err();
            assert!(
                matches!(error, ProduceError::InvalidAttribute { .. }),
                "{name}: {error:?}"
            );
        }
        // An empty string payload is the JSON text `""`, not an empty body.
        assert_eq!(NewJob::new("t", "").to_message("jobs").unwrap().body, "\"\"");
        assert!(matches!(
            NewJob::new("t", 1).version(0).to_message("jobs"),
            Err(ProduceError::InvalidVersion { .. })
        ));
    }
}
