//! The `Handler` trait users implement, and its type-erased form the router stores.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::backoff::Backoff;
use crate::context::Context;
use crate::error::HandlerError;
use crate::message::{Message, SCHEMA_VERSION_ATTRIBUTE};

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A job handler: decodes a typed job from the message body and does the work.
///
/// ```
/// use conveyor_core::{Context, Handler, HandlerError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Deserialize)]
/// struct WelcomeEmail { user_id: u64 }
///
/// #[derive(Serialize)]
/// struct Sent { provider_id: String }
///
/// struct SendWelcomeEmail;
///
/// impl Handler for SendWelcomeEmail {
///     type Job = WelcomeEmail;
///     type Output = Sent;
///     const JOB_TYPE: &'static str = "welcome_email";
///
///     async fn handle(&self, job: WelcomeEmail, _ctx: Context) -> Result<Sent, HandlerError> {
///         if job.user_id == 0 {
///             return Err(HandlerError::permanent("user 0 does not exist"));
///         }
///         Ok(Sent { provider_id: format!("msg-{}", job.user_id) })
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// The job, decoded from the message body as JSON.
    type Job: DeserializeOwned + Send + 'static;
    /// The result, stored as JSON in the idempotency record so a duplicate can read it.
    type Output: Serialize + Send + 'static;
    /// The job type producers put in the `conveyor.type` attribute.
    const JOB_TYPE: &'static str;
    /// The schema version this handler decodes. Producers stamp it in `conveyor.version`.
    const VERSION: u32 = 1;

    /// Does the job. Return a permanent error when retrying cannot help.
    fn handle(
        &self,
        job: Self::Job,
        ctx: Context,
    ) -> impl Future<Output = Result<Self::Output, HandlerError>> + Send;

    /// Decodes a job written with an older schema version (`version < Self::VERSION`).
    /// The default refuses, which sends such messages to the DLQ with the reason.
    fn upgrade(&self, version: u32, _payload: serde_json::Value) -> Result<Self::Job, HandlerError> {
        Err(no_upgrade(
            Self::JOB_TYPE,
            version,
            Self::VERSION,
            "Handler::upgrade",
        ))
    }

    /// Timeout, backoff and idempotency settings.
    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default()
    }
}

/// The error of a job written with an older schema version than its handler decodes, when the handler
/// defines no upgrade (`upgrade`, the method named by `method`): permanent, it goes to the DLQ.
pub(crate) fn no_upgrade(job_type: &str, version: u32, decodes: u32, method: &str) -> HandlerError {
    HandlerError::permanent(format!(
        "job {job_type} has schema version {version}, this handler decodes version {decodes} and defines no \
         upgrade from it: implement {method}"
    ))
}

/// Per-handler settings: `HandlerSettings::default()` and a `with_*` setter per field.
#[derive(Debug, Clone, PartialEq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct HandlerSettings {
    /// The longest one run may take; past it the run counts as a retryable failure.
    pub timeout: Duration,
    /// Backoff for retryable failures.
    pub backoff: Backoff,
    /// Claim an idempotency record before running (when the runtime has a store).
    pub idempotent: bool,
    /// Store a hash of the body and refuse a duplicate key whose body differs.
    pub validate_payload: bool,
    /// How long a completed record suppresses duplicates.
    pub record_ttl: Duration,
    /// How the record id and validation hash are built: Conveyor's own (default) or a Powertools
    /// consumer's, to deduplicate with it (see [`KeyStyle`](crate::KeyStyle)).
    pub key_style: crate::record_key::KeyStyle,
    /// Keep a job record (status, attempts, last error, progress, output) in the idempotency record
    /// (see [`JobStatus`](crate::JobStatus)); needs `idempotent` and a store.
    pub tracked: bool,
    /// The least time between two progress writes of one run (see [`Context::progress`](crate::Context::progress)).
    pub progress_interval: Duration,
    /// How long a tracked job's record keeps a final status (default 14 days, SQS's longest
    /// retention: set it to at least the DLQ's `message_retention_seconds`). A tracked record's
    /// expiry is the longer of this and `record_ttl`, so it also suppresses duplicates that long;
    /// untracked records keep `record_ttl`.
    pub status_retention: Duration,
}

impl HandlerSettings {
    /// How long a record the pipeline settles keeps counting: `record_ttl`, or for a tracked job the
    /// longer of that and `status_retention`.
    pub fn settled_record_ttl(&self) -> Duration {
        if self.tracked {
            self.record_ttl.max(self.status_retention)
        } else {
            self.record_ttl
        }
    }
}

impl Default for HandlerSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(15 * 60),
            backoff: Backoff::default(),
            idempotent: true,
            validate_payload: false,
            record_ttl: crate::defaults::IDEMPOTENCY_RECORD_TTL,
            key_style: crate::record_key::KeyStyle::Conveyor,
            tracked: false,
            progress_interval: crate::defaults::PROGRESS_INTERVAL,
            status_retention: crate::defaults::STATUS_RETENTION,
        }
    }
}

/// A decoded job, ready to run once claimed. Running it returns the output as JSON text.
pub(crate) type PreparedJob =
    Box<dyn FnOnce(Context) -> BoxFuture<Result<Option<String>, HandlerError>> + Send>;

/// A handler with its types erased, as the [`Router`](crate::Router) stores it.
pub trait ErasedHandler: Send + Sync {
    /// The job type.
    fn job_type(&self) -> &'static str;
    /// The handler's settings.
    fn settings(&self) -> &HandlerSettings;
    /// Decodes the message into a job ready to run; a permanent error when it cannot.
    fn prepare(&self, message: &Message) -> Result<PreparedJob, HandlerError>;
    /// The most jobs one call takes, for a batch handler ([`crate::BatchHandler`]); `None` for a
    /// handler that takes one job at a time.
    fn batch_size(&self) -> Option<usize> {
        None
    }
}

/// Wraps a typed [`Handler`] as an [`ErasedHandler`].
pub(crate) struct Typed<H: Handler> {
    handler: Arc<H>,
    settings: HandlerSettings,
}

impl<H: Handler> Typed<H> {
    pub(crate) fn new(handler: H) -> Self {
        let settings = handler.settings();
        Self {
            handler: Arc::new(handler),
            settings,
        }
    }

    fn decode(&self, message: &Message) -> Result<H::Job, HandlerError> {
        decode(H::JOB_TYPE, H::VERSION, message, |version, payload| {
            self.handler.upgrade(version, payload)
        })
    }
}

/// Decodes `message`'s body as a job of `job_type` at schema `version`, an older version through
/// `upgrade`: what a [`Handler`] and a [`BatchHandler`](crate::BatchHandler) share.
pub(crate) fn decode<J: DeserializeOwned>(
    job_type: &str,
    current: u32,
    message: &Message,
    upgrade: impl FnOnce(u32, serde_json::Value) -> Result<J, HandlerError>,
) -> Result<J, HandlerError> {
    let version = schema_version(message)?.unwrap_or(current);
    if version > current {
        // Retryable: the producer deployed first; the consumer's deploy usually follows within the
        // retry budget. Past it, the job reaches the DLQ with this reason.
        return Err(HandlerError::retryable(format!(
            "job {job_type} has schema version {version}, newer than the {current} this consumer decodes: deploy \
             the newer consumer (a job still failing when its retries run out waits in the DLQ for a redrive)"
        )));
    }
    if version == current {
        return serde_json::from_str(&message.body).map_err(|error| body_error(job_type, &error));
    }
    let payload: serde_json::Value =
        serde_json::from_str(&message.body).map_err(|error| body_error(job_type, &error))?;
    upgrade(version, payload)
}

fn body_error(job_type: &str, error: &serde_json::Error) -> HandlerError {
    HandlerError::permanent(format!("body is not a valid {job_type} job: {error}"))
}

fn schema_version(message: &Message) -> Result<Option<u32>, HandlerError> {
    let Some(text) = message.string_attribute(SCHEMA_VERSION_ATTRIBUTE) else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(version) if version > 0 => Ok(Some(version)),
        _ => Err(HandlerError::permanent(format!(
            "attribute {SCHEMA_VERSION_ATTRIBUTE} is {text:?}; it must be a positive integer"
        ))),
    }
}

impl<H: Handler> ErasedHandler for Typed<H> {
    fn job_type(&self) -> &'static str {
        H::JOB_TYPE
    }

    fn settings(&self) -> &HandlerSettings {
        &self.settings
    }

    fn prepare(&self, message: &Message) -> Result<PreparedJob, HandlerError> {
        let job = self.decode(message)?;
        let handler = Arc::clone(&self.handler);
        Ok(Box::new(move |ctx| {
            Box::pin(async move {
                let output = handler.handle(job, ctx).await?;
                Ok(encode_output(&output))
            })
        }))
    }
}

/// The output as JSON, or `None` (logged) when it does not serialise: the work is done either way, so
/// a serialisation bug must not turn a success into a retry.
pub(crate) fn encode_output<T: Serialize>(output: &T) -> Option<String> {
    match serde_json::to_string(output) {
        Ok(json) => Some(json),
        Err(error) => {
            tracing::error!(%error, "handler output does not serialise to JSON; storing no output");
            None
        }
    }
}
