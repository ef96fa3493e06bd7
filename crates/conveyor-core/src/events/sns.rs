//! SNS notifications delivered to an SQS subscription with raw message delivery off: the body is
//! SNS's JSON envelope (`"Type": "Notification"`), whose `Message` is what the publisher sent.
//!
//! Detection needs the envelope's full shape: `Type` equal to `Notification` and the strings
//! `MessageId`, `TopicArn`, `Message` and `Timestamp`.
//!
//! # Design note: subscription confirmations
//!
//! When a topic's owner subscribes a queue of another account, SNS puts a `SubscriptionConfirmation`
//! on the queue (and an `UnsubscribeConfirmation` when such a subscription is deleted): `Type`, `MessageId`, `Token`, `TopicArn`, `Message`, `SubscribeURL`, `Timestamp` and the
//! signature fields. The subscription delivers nothing until someone calls `ConfirmSubscription` with
//! the token (or visits the URL). Such a message is no job, so it is recognised by that whole shape
//! and, unless [`Router::sns_subscription`](crate::Router::sns_subscription) routes it to a handler,
//! acknowledged without running anything, with a warning that names the topic and what the operator
//! must do. The token and the URL are never logged: they confirm the subscription for whoever holds
//! them. Confirming is left to a handler on purpose: a queue that accepts messages from any topic
//! could otherwise be subscribed to anyone's topic just by sending it a confirmation.

use base64::Engine;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::message::{AttributeValue, Attributes};

/// Where a message published to an SNS topic came from: the notification's metadata, signature
/// fields included (verify them yourself if the queue accepts messages from other senders).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnsNotification {
    /// SNS's message id: the same on every delivery of one publish.
    pub message_id: String,
    /// The topic it was published to.
    pub topic_arn: String,
    /// The publisher's subject, when it set one.
    pub subject: Option<String>,
    /// When SNS accepted the publish (ISO 8601, as SNS wrote it).
    pub timestamp: String,
    /// The position in a FIFO topic, when it is one.
    pub sequence_number: Option<String>,
    /// `SignatureVersion` (`1`: SHA1, `2`: SHA256).
    pub signature_version: Option<String>,
    /// `Signature`, base64.
    pub signature: Option<String>,
    /// `SigningCertURL`: the certificate the signature verifies against.
    pub signing_cert_url: Option<String>,
    /// `UnsubscribeURL`.
    pub unsubscribe_url: Option<String>,
}

/// Which confirmation SNS sent.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmationKind {
    /// `SubscriptionConfirmation`: a subscription waits for `ConfirmSubscription`.
    Subscribe,
    /// `UnsubscribeConfirmation`: a subscription was deleted; its token and URL subscribe again.
    Unsubscribe,
}

impl ConfirmationKind {
    /// The `Type` SNS writes.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfirmationKind::Subscribe => "SubscriptionConfirmation",
            ConfirmationKind::Unsubscribe => "UnsubscribeConfirmation",
        }
    }

    fn of(kind: &str) -> Option<Self> {
        match kind {
            "SubscriptionConfirmation" => Some(ConfirmationKind::Subscribe),
            "UnsubscribeConfirmation" => Some(ConfirmationKind::Unsubscribe),
            _ => None,
        }
    }
}

/// An SNS `SubscriptionConfirmation` or `UnsubscribeConfirmation` delivered to the queue: the job of a
/// [`Router::sns_subscription`](crate::Router::sns_subscription) handler (use it as `Handler::Job`),
/// which confirms with SNS's `ConfirmSubscription` (`topic_arn`, `token`) after checking that the topic
/// is one it expects. Its `Debug` hides the token and the URL, which confirm the subscription for
/// whoever holds them.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "RawConfirmation")]
#[non_exhaustive]
pub struct SubscriptionConfirmation {
    /// Subscribe or unsubscribe.
    pub kind: ConfirmationKind,
    /// SNS's message id.
    pub message_id: String,
    /// The topic the subscription belongs to.
    pub topic_arn: String,
    /// The token `ConfirmSubscription` takes (valid for three days).
    pub token: String,
    /// `SubscribeURL`: visiting it confirms the subscription too.
    pub subscribe_url: String,
    /// SNS's text for people.
    pub message: String,
    /// When SNS sent it (ISO 8601, as SNS wrote it).
    pub timestamp: String,
    /// `SignatureVersion` (`1`: SHA1, `2`: SHA256).
    pub signature_version: Option<String>,
    /// `Signature`, base64.
    pub signature: Option<String>,
    /// `SigningCertURL`: the certificate the signature verifies against.
    pub signing_cert_url: Option<String>,
}

impl std::fmt::Debug for SubscriptionConfirmation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionConfirmation")
            .field("kind", &self.kind)
            .field("message_id", &self.message_id)
            .field("topic_arn", &self.topic_arn)
            .field("token", &"<hidden>")
            .field("subscribe_url", &"<hidden>")
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

/// The signature fields every SNS message may carry (a FIFO topic's carry none).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawSignature {
    #[serde(default)]
    signature_version: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(rename = "SigningCertURL", alias = "SigningCertUrl", default)]
    signing_cert_url: Option<String>,
}

/// The confirmation as SNS writes it.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawConfirmation {
    #[serde(rename = "Type")]
    kind: String,
    message_id: String,
    token: String,
    topic_arn: String,
    message: String,
    #[serde(rename = "SubscribeURL", alias = "SubscribeUrl")]
    subscribe_url: String,
    timestamp: String,
    #[serde(flatten)]
    signed: RawSignature,
}

impl TryFrom<RawConfirmation> for SubscriptionConfirmation {
    type Error = String;

    fn try_from(raw: RawConfirmation) -> Result<Self, String> {
        let kind = ConfirmationKind::of(&raw.kind).ok_or_else(|| {
            format!(
                "Type {:?} is neither SubscriptionConfirmation nor UnsubscribeConfirmation",
                raw.kind
            )
        })?;
        Ok(SubscriptionConfirmation {
            kind,
            message_id: raw.message_id,
            topic_arn: raw.topic_arn,
            token: raw.token,
            subscribe_url: raw.subscribe_url,
            message: raw.message,
            timestamp: raw.timestamp,
            signature_version: raw.signed.signature_version,
            signature: raw.signed.signature,
            signing_cert_url: raw.signed.signing_cert_url,
        })
    }
}

/// The fields every confirmation has (the signature fields are kept when present).
pub(crate) const CONFIRMATION_FIELDS: [&str; 6] = [
    "MessageId",
    "Token",
    "TopicArn",
    "Message",
    "SubscribeURL",
    "Timestamp",
];

/// Which confirmation `body` is, when it has a confirmation's whole shape.
pub(crate) fn confirmation_kind(body: &Map<String, Value>) -> Option<ConfirmationKind> {
    let kind = ConfirmationKind::of(body.get("Type")?.as_str()?)?;
    CONFIRMATION_FIELDS
        .iter()
        .all(|field| body.contains_key(*field))
        .then_some(kind)
}

/// The confirmation; `Err` names what is wrong with a body that has its shape (never its token).
pub(crate) fn open_confirmation(body: Value) -> Result<SubscriptionConfirmation, String> {
    serde_json::from_value(body).map_err(|error| format!("SNS subscription confirmation: {error}"))
}

/// The notification as SNS writes it.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Raw {
    message_id: String,
    topic_arn: String,
    message: String,
    timestamp: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    sequence_number: Option<String>,
    #[serde(default)]
    message_attributes: Option<Map<String, Value>>,
    #[serde(flatten)]
    signed: RawSignature,
    #[serde(rename = "UnsubscribeURL", alias = "UnsubscribeUrl", default)]
    unsubscribe_url: Option<String>,
}

/// One SNS message attribute: `{"Type": "String", "Value": "..."}`; binary values are base64.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAttribute {
    #[serde(rename = "Type")]
    data_type: String,
    value: String,
}

/// True when `body` has the shape of an SNS notification.
pub(crate) fn is_notification(body: &Map<String, Value>) -> bool {
    body.get("Type").and_then(Value::as_str) == Some("Notification")
        && ["MessageId", "TopicArn", "Message", "Timestamp"]
            .iter()
            .all(|field| body.contains_key(*field))
}

/// The notification's metadata, the published message and its attributes; `Err` names what is wrong
/// with a body that has the notification's shape.
pub(crate) fn open(body: Value) -> Result<(SnsNotification, String, Attributes), String> {
    let raw: Raw = serde_json::from_value(body).map_err(|error| format!("SNS notification: {error}"))?;
    let mut attributes = Attributes::new();
    for (name, value) in raw.message_attributes.unwrap_or_default() {
        let attribute: RawAttribute = serde_json::from_value(value).map_err(|error| {
            format!(
                "SNS notification {}: message attribute {name:?}: {error}",
                raw.message_id
            )
        })?;
        attributes.insert(
            name.clone(),
            attribute_value(attribute).map_err(|error| {
                format!(
                    "SNS notification {}: message attribute {name:?}: {error}",
                    raw.message_id
                )
            })?,
        );
    }
    let notification = SnsNotification {
        message_id: raw.message_id,
        topic_arn: raw.topic_arn,
        subject: raw.subject,
        timestamp: raw.timestamp,
        sequence_number: raw.sequence_number,
        signature_version: raw.signed.signature_version,
        signature: raw.signed.signature,
        signing_cert_url: raw.signed.signing_cert_url,
        unsubscribe_url: raw.unsubscribe_url,
    };
    Ok((notification, raw.message, attributes))
}

/// SNS's attribute as SQS's: `String`, `Number` and `String.Array` keep their text, `Binary` is decoded.
fn attribute_value(raw: RawAttribute) -> Result<AttributeValue, String> {
    if !raw.data_type.starts_with("Binary") {
        return Ok(AttributeValue {
            data_type: raw.data_type,
            string_value: Some(raw.value),
            binary_value: None,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw.value.as_bytes())
        .map_err(|error| format!("binary value is not base64: {error}"))?;
    Ok(AttributeValue {
        data_type: raw.data_type,
        string_value: None,
        binary_value: Some(bytes),
    })
}
