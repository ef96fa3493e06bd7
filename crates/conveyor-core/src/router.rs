//! Dispatch by job type.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::HandlerError;
use crate::handler::{ErasedHandler, Handler, HandlerSettings, Typed};
use crate::message::{JOB_TYPE_ATTRIBUTE, Message};

/// Several job types on one queue: dispatches on the `conveyor.type` attribute.
///
/// Messages without that attribute (plain JSON from the AWS CLI, boto3 or an SNS raw delivery) go to
/// the default handler when one is set. An unknown type, or an untyped message without a default,
/// is a permanent failure that names what was expected: it goes to the DLQ, it never panics.
#[derive(Clone, Default)]
pub struct Router {
    routes: HashMap<&'static str, Arc<dyn ErasedHandler>>,
    default_route: Option<Arc<dyn ErasedHandler>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("job_types", &self.job_types())
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
        self.route_for(message).map(|handler| handler.job_type())
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
