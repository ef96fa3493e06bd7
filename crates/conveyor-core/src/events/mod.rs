//! Messages that AWS services put on a queue: SNS notifications, EventBridge events, S3 event
//! notifications and CloudEvents, opened before routing in the one pipeline both runtimes call.
//!
//! # Design note: opening
//!
//! A message is opened step by step, at most `MAX_DEPTH` (three) steps (S3 → SNS → SQS is two). A message
//! that carries `conveyor.type` is Conveyor's own and is never opened. Otherwise, in this order:
//!
//! | what | detected by | the job (body) | key (when the message has no `conveyor.key`) |
//! |---|---|---|---|
//! | CloudEvent, binary mode | attribute `ce_specversion` (or `ce-specversion`) | the body | `cloudevents:<source> <id>` |
//! | Conveyor's body envelope | exactly `conveyor` and `payload` | `payload` | the header's `key` |
//! | SNS notification (raw delivery off) | `Type: Notification`, `MessageId`, `TopicArn`, `Message`, `Timestamp` | `Message`, opened again; SNS's attributes become attributes | `sns:<MessageId>` |
//! | SNS subscription confirmation | `Type: SubscriptionConfirmation` or `UnsubscribeConfirmation`, `MessageId`, `Token`, `TopicArn`, `Message`, `SubscribeURL`, `Timestamp` | none: acknowledged with a warning naming the topic; with `Router::sns_subscription`, the whole message ([`SubscriptionConfirmation`]) | `sns:<MessageId>` |
//! | S3 test event | `Service: Amazon S3`, `Event: s3:TestEvent` | none: acknowledged, nothing runs | |
//! | S3 event notification | `Records[0].eventSource` is `aws:s3` | the whole notification ([`S3Event`]) | `s3:<bucket>/<key>@<sequencer>` per record |
//! | EventBridge event | all of `id`, `source`, `account`, `time`, `region`, `resources`, `detail` | `detail` | `eventbridge:<id>` |
//! | CloudEvent, structured mode | `specversion`, `id`, `source` | `data` (or `data_base64` decoded) | `cloudevents:<source> <id>` |
//!
//! Anything else is a plain body, left as it is (the default route). Detection asks for an
//! envelope's whole shape, so a user's JSON with a `source` or `Type` field stays plain; a body that
//! has the shape but not a field routing needs (an event without `detail-type`, a CloudEvent without
//! `type`, an SNS `Message` that is not a string) is a permanent failure naming what is wrong. The
//! innermost envelope gives the key: an event's own id is stable across every path it took
//! (an SNS publish re-delivered keeps its `MessageId` too).

mod cloudevents;
mod eventbridge;
mod s3;
mod sns;

use serde_json::Value;

pub use cloudevents::CloudEvent;
pub use eventbridge::EventBridgeEvent;
pub use s3::{S3Event, S3Record};
pub use sns::{ConfirmationKind, SnsNotification, SubscriptionConfirmation};

use crate::message::{AttributeValue, IDEMPOTENCY_KEY_ATTRIBUTE, Message};

/// The most opening steps for one message (an SNS notification wrapping an event is two).
pub(crate) const MAX_DEPTH: usize = 3;

/// An envelope a message came in, as the handler sees it through
/// [`Context::envelopes`](crate::Context::envelopes).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Envelope {
    /// Published to an SNS topic, delivered by its SQS subscription (raw delivery off).
    Sns(SnsNotification),
    /// Put on an EventBridge bus, delivered by a rule's SQS target.
    EventBridge(EventBridgeEvent),
    /// A CloudEvent (structured or binary mode).
    CloudEvent(CloudEvent),
    /// An S3 event notification.
    S3(S3Event),
    /// An SNS subscription or unsubscribe confirmation (a [`Router::sns_subscription`](crate::Router::sns_subscription)
    /// handler's job).
    SnsConfirmation(SubscriptionConfirmation),
}

/// How an opened message is routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// By its `conveyor.type` attribute, or the default route (a plain body).
    Attributes,
    /// By an EventBridge event's `source` and `detail-type`.
    EventBridge { source: String, detail_type: String },
    /// By a CloudEvent's `type`.
    CloudEvent { event_type: String },
    /// To the S3 events route.
    S3,
    /// Nothing to run (S3's test event).
    TestEvent,
    /// An SNS confirmation: to the confirmations route, else acknowledged with a warning.
    SnsConfirmation(Notice),
}

/// A message that carries no job: acknowledged without running anything (unless a route takes it,
/// which only SNS confirmations may have), and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// S3's `s3:TestEvent`, sent when a bucket's notification configuration is saved.
    S3TestEvent,
    /// An SNS confirmation, with what the log may name (never its token or URL).
    SnsConfirmation {
        kind: ConfirmationKind,
        topic_arn: String,
        message_id: String,
    },
}

impl Notice {
    /// Logs the notice as it is acknowledged: what happened and what to do.
    pub(crate) fn log_acknowledged(&self) {
        match self {
            Notice::S3TestEvent => {
                tracing::info!(
                    what = "S3 test event",
                    "a notice without a job: acknowledged, nothing run"
                );
            }
            Notice::SnsConfirmation {
                kind: ConfirmationKind::Unsubscribe,
                topic_arn,
                message_id,
            } => tracing::warn!(
                topic_arn = %topic_arn,
                sns_message_id = %message_id,
                "SNS UnsubscribeConfirmation acknowledged: this queue's subscription to the topic was \
                 deleted and delivers nothing more; if that was not intended, subscribe the queue again"
            ),
            Notice::SnsConfirmation {
                topic_arn,
                message_id,
                ..
            } => tracing::warn!(
                topic_arn = %topic_arn,
                sns_message_id = %message_id,
                "SNS SubscriptionConfirmation acknowledged without confirming: the topic's subscription \
                 of this queue stays pending and delivers nothing. To take it, subscribe the queue from \
                 its own account (aws sns subscribe --topic-arn <topic> --protocol sqs \
                 --notification-endpoint <queue arn>, with the queue owner's credentials and sns:Subscribe \
                 allowed by the topic's policy: no confirmation needed), or route confirmations to a \
                 handler that calls ConfirmSubscription (Router::sns_subscription), deploy it and have \
                 the topic's owner subscribe the queue again"
            ),
        }
    }
}

/// A message with its envelopes opened.
#[derive(Debug)]
pub(crate) struct Unwrapped {
    /// The job's message: its body and attributes, with the envelope's idempotency key.
    pub(crate) message: Message,
    /// The envelopes it came in, outermost first.
    pub(crate) envelopes: Vec<Envelope>,
    /// How to route it.
    pub(crate) route: Route,
}

/// One opening step's result.
enum Step {
    /// Nothing (more) to open.
    Plain,
    /// An SNS notification: its message is opened again.
    Sns(SnsNotification, Message),
    /// Opened for good.
    Done(Message, Option<Envelope>, Route),
}

/// `message` with its envelopes opened; `None` when it has none; `Err` says why a message with an
/// envelope's shape is malformed (a permanent failure).
pub(crate) fn open(message: &Message) -> Result<Option<Unwrapped>, String> {
    let mut envelopes = Vec::new();
    let mut current: Option<Message> = None;
    for _ in 0..MAX_DEPTH {
        match step(current.as_ref().unwrap_or(message))? {
            Step::Plain => break,
            Step::Sns(notification, inner) => {
                envelopes.push(Envelope::Sns(notification));
                current = Some(inner);
            }
            Step::Done(opened, envelope, route) => {
                envelopes.extend(envelope);
                return Ok(Some(keyed(opened, envelopes, route)));
            }
        }
    }
    Ok(current.map(|opened| keyed(opened, envelopes, Route::Attributes)))
}

fn step(message: &Message) -> Result<Step, String> {
    if message.job_type().is_some() {
        return Ok(Step::Plain);
    }
    if let Some(prefix) = cloudevents::binary_prefix(&message.attributes) {
        let mut opened = message.clone();
        let event = cloudevents::open_binary(&mut opened.attributes, prefix)?;
        let route = Route::CloudEvent {
            event_type: event.event_type.clone(),
        };
        return Ok(Step::Done(opened, Some(Envelope::CloudEvent(event)), route));
    }
    if !message.body.trim_start().starts_with('{') {
        return Ok(Step::Plain);
    }
    let Ok(Value::Object(body)) = serde_json::from_str::<Value>(&message.body) else {
        return Ok(Step::Plain);
    };
    if let Some(opened) = crate::envelope::open(message) {
        return Ok(Step::Done(opened, None, Route::Attributes));
    }
    if let Some(kind) = sns::confirmation_kind(&body) {
        let confirmation = sns::open_confirmation(Value::Object(body))?;
        let notice = Notice::SnsConfirmation {
            kind,
            topic_arn: confirmation.topic_arn.clone(),
            message_id: confirmation.message_id.clone(),
        };
        let envelope = Envelope::SnsConfirmation(confirmation);
        return Ok(Step::Done(
            message.clone(),
            Some(envelope),
            Route::SnsConfirmation(notice),
        ));
    }
    if sns::is_notification(&body) {
        let (notification, text, attributes) = sns::open(Value::Object(body))?;
        let mut inner = message.clone();
        inner.body = text;
        inner.attributes.extend(attributes);
        return Ok(Step::Sns(notification, inner));
    }
    if s3::is_test_event(&body) {
        return Ok(Step::Done(message.clone(), None, Route::TestEvent));
    }
    if s3::is_notification(&body) {
        let event = s3::open(Value::Object(body))?;
        return Ok(Step::Done(message.clone(), Some(Envelope::S3(event)), Route::S3));
    }
    if eventbridge::is_event(&body) {
        let (event, detail) = eventbridge::open(Value::Object(body))?;
        let mut opened = message.clone();
        opened.body = detail.to_string();
        let route = Route::EventBridge {
            source: event.source.clone(),
            detail_type: event.detail_type.clone(),
        };
        return Ok(Step::Done(opened, Some(Envelope::EventBridge(event)), route));
    }
    if cloudevents::is_structured(&body) {
        let (event, data) = cloudevents::open_structured(body)?;
        let mut opened = message.clone();
        opened.body = data;
        let route = Route::CloudEvent {
            event_type: event.event_type.clone(),
        };
        return Ok(Step::Done(opened, Some(Envelope::CloudEvent(event)), route));
    }
    Ok(Step::Plain)
}

/// The unwrapped message, given the innermost envelope's key when it carries none of its own.
fn keyed(mut message: Message, envelopes: Vec<Envelope>, route: Route) -> Unwrapped {
    if message.idempotency_key().is_none()
        && let Some(key) = envelopes.last().map(Envelope::key)
    {
        message
            .attributes
            .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    }
    Unwrapped {
        message,
        envelopes,
        route,
    }
}

impl Envelope {
    /// The idempotency key this envelope gives a job (see the module's table).
    fn key(&self) -> String {
        match self {
            Envelope::Sns(notification) => format!("sns:{}", notification.message_id),
            Envelope::SnsConfirmation(confirmation) => format!("sns:{}", confirmation.message_id),
            Envelope::EventBridge(event) => format!("eventbridge:{}", event.id),
            Envelope::CloudEvent(event) => event.key(),
            Envelope::S3(event) => event.key(),
        }
    }
}

#[cfg(test)]
mod confirmation_tests;
#[cfg(test)]
mod tests;
