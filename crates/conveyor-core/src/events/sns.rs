//! SNS notifications delivered to an SQS subscription with raw message delivery off: the body is
//! SNS's JSON envelope (`"Type": "Notification"`), whose `Message` is what the publisher sent.
//!
//! Detection needs the envelope's full shape: `Type` equal to `Notification` and the strings
//! `MessageId`, `TopicArn`, `Message` and `Timestamp`. A subscription confirmation (a cross-account
//! subscription's first message) is not a notification and is left as it is.

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
    #[serde(default)]
    signature_version: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(rename = "SigningCertURL", alias = "SigningCertUrl", default)]
    signing_cert_url: Option<String>,
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
        signature_version: raw.signature_version,
        signature: raw.signature,
        signing_cert_url: raw.signing_cert_url,
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
