//! Dispatch by job type.

use std::collections::HashMap;
use std::sync::Arc;

use crate::batch::{BatchHandler, Gathered};
use crate::error::HandlerError;
use crate::events::{self, Envelope, Notice, Route};
use crate::handler::{ErasedHandler, Handler, HandlerSettings, Typed};
use crate::message::{AttributeValue, JOB_TYPE_ATTRIBUTE, Message};

/// Several job types on one queue: dispatches on the `conveyor.type` attribute.
///
/// Messages without that attribute (plain JSON from the AWS CLI, boto3 or an SNS raw delivery) go to
/// the default handler when one is set. An unknown type, or an untyped message without a default,
/// is a permanent failure that names what was expected: it goes to the DLQ, it never panics.
///
/// What AWS services put on a queue is opened first ([`crate::events`]): an SNS notification's
/// message routes like any message, and events route by what they are:
///
/// ```
/// # use conveyor_core::{Context, Handler, HandlerError, Router, events::S3Event};
/// # macro_rules! handler { ($name:ident, $job:ty, $type:literal) => {
/// #     struct $name;
/// #     impl Handler for $name {
/// #         type Job = $job;
/// #         type Output = ();
/// #         const JOB_TYPE: &'static str = $type;
/// #         async fn handle(&self, _job: $job, _ctx: Context) -> Result<(), HandlerError> { Ok(()) }
/// #     }
/// # } }
/// # handler!(SendEmail, serde_json::Value, "send_email");
/// # handler!(OrderPlaced, serde_json::Value, "order_placed");
/// # handler!(OrderCreated, serde_json::Value, "order_created");
/// # handler!(Thumbnail, S3Event, "thumbnail");
/// let router = Router::new()
///     .route(SendEmail)                                 // conveyor.type = "send_email"
///     .event("my.app", "Order Placed", OrderPlaced)     // EventBridge: source, detail-type
///     .cloud_event("com.example.order.created", OrderCreated) // CloudEvents: type
///     .s3_events(Thumbnail);                            // S3 event notifications
/// ```
#[derive(Clone, Default)]
pub struct Router {
    routes: HashMap<&'static str, Arc<dyn ErasedHandler>>,
    default_route: Option<Arc<dyn ErasedHandler>>,
    /// EventBridge routes by `(source, detail-type)`.
    events: HashMap<(String, String), &'static str>,
    /// CloudEvents routes by `type`.
    cloud_events: HashMap<String, &'static str>,
    /// The S3 event notifications route.
    s3_events: Option<&'static str>,
    /// The SNS subscription confirmations route.
    sns_subscription: Option<&'static str>,
}

/// A message as the router opened it ([`Router::open`]).
#[derive(Debug)]
pub(crate) enum Opening {
    /// Nothing to open: route the message as it is.
    Plain,
    /// Opened: route this message (its `conveyor.type` names the handler of an event route).
    Opened {
        /// The job's message.
        message: Box<Message>,
        /// The envelopes it came in, outermost first.
        envelopes: Arc<[Envelope]>,
    },
    /// A notice without a job (S3's test event, an SNS confirmation no route takes): acknowledge it,
    /// run nothing.
    Ignored(Notice),
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("job_types", &self.job_types())
            .field("events", &self.event_routes())
            .field(
                "default",
                &self.default_route.as_ref().map(|route| route.job_type()),
            )
            .finish()
    }
}

impl Router {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// A router that sends every message, typed or not, to `handler`.
    pub fn single<H: Handler>(handler: H) -> Self {
        let erased: Arc<dyn ErasedHandler> = Arc::new(Typed::new(handler));
        let mut router = Self::new();
        router.routes.insert(erased.job_type(), Arc::clone(&erased));
        router.default_route = Some(erased);
        router
    }

    /// Routes messages whose `conveyor.type` is `H::JOB_TYPE` to `handler`. A later route for the
    /// same type replaces the earlier one.
    pub fn route<H: Handler>(mut self, handler: H) -> Self {
        self.routes.insert(H::JOB_TYPE, Arc::new(Typed::new(handler)));
        self
    }

    /// Routes messages whose `conveyor.type` is `B::JOB_TYPE` to the batch handler `handler`: their
    /// jobs are gathered into calls of up to [`BatchSettings::max_jobs`](crate::BatchSettings::max_jobs)
    /// (see [`BatchHandler`](crate::BatchHandler) and `docs/batch-handlers.md`). A later route for the
    /// same type replaces the earlier one.
    pub fn batch_route<B: BatchHandler>(mut self, handler: B) -> Self {
        self.routes.insert(B::JOB_TYPE, Arc::new(Gathered::new(handler)));
        self
    }

    /// Each batch route's job type and most jobs per call, sorted: a runtime checks at start-up that
    /// it lets that many messages run at once.
    pub fn batch_sizes(&self) -> Vec<(&'static str, usize)> {
        let mut sizes: Vec<(&'static str, usize)> = self
            .routes
            .values()
            .filter_map(|handler| Some((handler.job_type(), handler.batch_size()?)))
            .collect();
        sizes.sort_unstable();
        sizes
    }

    /// Routes EventBridge events with this `source` and `detail-type` to `handler` (a rule's SQS
    /// target); the handler's job is the event's `detail`, and [`Context::envelopes`](crate::Context::envelopes)
    /// has the rest. `H::JOB_TYPE` still names the handler (metrics, idempotency keys, logs), and
    /// messages with that `conveyor.type` reach it too.
    pub fn event<H: Handler>(
        mut self,
        source: impl Into<String>,
        detail_type: impl Into<String>,
        handler: H,
    ) -> Self {
        self.events
            .insert((source.into(), detail_type.into()), H::JOB_TYPE);
        self.route(handler)
    }

    /// Routes CloudEvents of this `type` to `handler`; the handler's job is the event's data.
    pub fn cloud_event<H: Handler>(mut self, event_type: impl Into<String>, handler: H) -> Self {
        self.cloud_events.insert(event_type.into(), H::JOB_TYPE);
        self.route(handler)
    }

    /// Routes S3 event notifications to `handler`, whose job is the notification
    /// ([`S3Event`](crate::events::S3Event), every record of it). S3's test event is acknowledged
    /// without running anything.
    pub fn s3_events<H: Handler>(mut self, handler: H) -> Self {
        self.s3_events = Some(H::JOB_TYPE);
        self.route(handler)
    }

    /// Routes SNS `SubscriptionConfirmation` and `UnsubscribeConfirmation` messages to `handler`, whose
    /// job is the confirmation ([`SubscriptionConfirmation`](crate::events::SubscriptionConfirmation):
    /// topic ARN, token, subscribe URL). Without this route they are acknowledged without running
    /// anything, with a warning naming the topic. A handler confirms with SNS's `ConfirmSubscription`;
    /// check the topic first (anyone allowed to send to the queue can send a confirmation):
    ///
    /// ```
    /// # use conveyor_core::{Context, Handler, HandlerError, Router};
    /// use conveyor_core::events::{ConfirmationKind, SubscriptionConfirmation};
    ///
    /// struct ConfirmOrders;
    ///
    /// impl Handler for ConfirmOrders {
    ///     type Job = SubscriptionConfirmation;
    ///     type Output = ();
    ///     const JOB_TYPE: &'static str = "sns_subscription";
    ///
    ///     async fn handle(&self, job: SubscriptionConfirmation, _ctx: Context) -> Result<(), HandlerError> {
    ///         if job.kind != ConfirmationKind::Subscribe
    ///             || job.topic_arn != "arn:aws:sns:eu-west-1:111122223333:orders"
    ///         {
    ///             return Ok(()); // not ours to confirm: acknowledged, nothing done
    ///         }
    ///         // sns.confirm_subscription().topic_arn(&job.topic_arn).token(&job.token).send().await?;
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let router = Router::new().sns_subscription(ConfirmOrders);
    /// # let _ = router;
    /// ```
    pub fn sns_subscription<H: Handler>(mut self, handler: H) -> Self {
        self.sns_subscription = Some(H::JOB_TYPE);
        self.route(handler)
    }

    /// Routes messages without a `conveyor.type` attribute to `handler`.
    pub fn default_route<H: Handler>(mut self, handler: H) -> Self {
        self.default_route = Some(Arc::new(Typed::new(handler)));
        self
    }

    /// The routed job types, sorted.
    pub fn job_types(&self) -> Vec<&'static str> {
        let mut types: Vec<&'static str> = self.routes.keys().copied().collect();
        types.sort_unstable();
        types
    }

    /// Each routed handler's job type and settings (the default route included), for start-up checks.
    pub fn settings(&self) -> Vec<(&'static str, HandlerSettings)> {
        let mut all: Vec<(&'static str, HandlerSettings)> = self
            .routes
            .values()
            .chain(self.default_route.iter())
            .map(|handler| (handler.job_type(), handler.settings().clone()))
            .collect();
        all.sort_by_key(|(job_type, _)| *job_type);
        all.dedup_by_key(|(job_type, _)| *job_type);
        all
    }

    /// The job type that would handle `message`, if any: a cheap lookup for logs and admission control
    /// (no error is built; [`Router::handler_for`] says why there is none).
    pub fn job_type_for(&self, message: &Message) -> Option<&'static str> {
        let route = match self.open(message) {
            Ok(Opening::Plain) => self.route_for(message),
            Ok(Opening::Opened { message, .. }) => self.route_for(&message),
            Ok(Opening::Ignored(_)) | Err(_) => None,
        };
        route.map(|handler| handler.job_type())
    }

    /// `message` with its envelopes opened (see [`crate::events`]), an event's handler named in its
    /// `conveyor.type`; `Err` for a malformed envelope (permanent) or an event no route takes
    /// (retryable, as an unknown job type).
    pub(crate) fn open(&self, message: &Message) -> Result<Opening, HandlerError> {
        let unwrapped = match events::open(message) {
            Ok(Some(unwrapped)) => unwrapped,
            Ok(None) => return Ok(Opening::Plain),
            Err(reason) => return Err(HandlerError::permanent(reason)),
        };
        let job_type = match &unwrapped.route {
            Route::Attributes => None,
            Route::TestEvent => return Ok(Opening::Ignored(Notice::S3TestEvent)),
            Route::SnsConfirmation(notice) => match self.sns_subscription {
                Some(job_type) => Some(job_type),
                None => return Ok(Opening::Ignored(notice.clone())),
            },
            Route::EventBridge { source, detail_type } => Some(
                self.events
                    .get(&(source.clone(), detail_type.clone()))
                    .copied()
                    .ok_or_else(|| {
                        self.unrouted(format!(
                            "EventBridge event (source {source:?}, detail-type {detail_type:?})"
                        ))
                    })?,
            ),
            Route::CloudEvent { event_type } => Some(
                self.cloud_events
                    .get(event_type)
                    .copied()
                    .ok_or_else(|| self.unrouted(format!("CloudEvent of type {event_type:?}")))?,
            ),
            Route::S3 => Some(
                self.s3_events
                    .ok_or_else(|| self.unrouted("S3 event notification".to_owned()))?,
            ),
        };
        let mut message = unwrapped.message;
        if let Some(job_type) = job_type {
            message
                .attributes
                .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
        }
        Ok(Opening::Opened {
            message: Box::new(message),
            envelopes: unwrapped.envelopes.into(),
        })
    }

    /// `message` opened when it has envelopes, else `None`: for the lookups outside the pipeline's run.
    pub(crate) fn opened(&self, message: &Message) -> Option<Message> {
        match self.open(message) {
            Ok(Opening::Opened { message, .. }) => Some(*message),
            _ => None,
        }
    }

    /// The error for an event no route takes: retryable, like an unknown job type.
    fn unrouted(&self, what: String) -> HandlerError {
        HandlerError::retryable(format!(
            "no route for this {what}; this consumer routes {}; add the route (Router::event, \
             Router::cloud_event, Router::s3_events), deploy, then redrive",
            self.event_routes()
        ))
    }

    /// The event routes, for error messages.
    fn event_routes(&self) -> String {
        let mut routes: Vec<String> = self
            .events
            .keys()
            .map(|(source, detail_type)| format!("event {source:?}/{detail_type:?}"))
            .chain(
                self.cloud_events
                    .keys()
                    .map(|event_type| format!("cloud event {event_type:?}")),
            )
            .chain(self.s3_events.map(|_| "S3 events".to_owned()))
            .chain(
                self.sns_subscription
                    .map(|_| "SNS subscription confirmations".to_owned()),
            )
            .collect();
        if routes.is_empty() {
            return "no events".to_owned();
        }
        routes.sort();
        routes.join(", ")
    }

    fn route_for(&self, message: &Message) -> Option<&Arc<dyn ErasedHandler>> {
        match message.job_type() {
            Some(job_type) => self.routes.get(job_type),
            None => self.default_route.as_ref(),
        }
    }

    /// The handler for `message`, or a permanent error saying why there is none.
    pub fn handler_for(&self, message: &Message) -> Result<&Arc<dyn ErasedHandler>, HandlerError> {
        match message.job_type() {
            // Retryable: producers often deploy first; the job reaches the DLQ with this reason once its
            // retry budget is spent, and a redrive after the consumer's deploy runs it.
            Some(job_type) => self.routes.get(job_type).ok_or_else(|| {
                HandlerError::retryable(format!(
                    "unknown job type {job_type:?} (attribute {JOB_TYPE_ATTRIBUTE}); this consumer handles {:?}; \
                     deploy a consumer that routes it, then redrive",
                    self.job_types()
                ))
            }),
            None => self.default_route.as_ref().ok_or_else(|| {
                HandlerError::permanent(format!(
                    "message has no {JOB_TYPE_ATTRIBUTE} attribute and this consumer has no default route; \
                     send it with Conveyor's producer or add Router::default_route"
                ))
            }),
        }
    }
}
