//! The attributes of a dead-lettered copy: the original ones plus the failure record, within SQS's
//! limit of 10 message attributes.
//!
//! The rule (lossless, and the simplest one that is):
//!
//! 1. Any `conveyor.failure` the original carries (from an earlier dead-lettering) is replaced by the new
//!    failure; any `conveyor.overflow` it carries is unpacked first, so nothing nests.
//! 2. If the originals and the failure fit in 10 attributes, the copy has exactly those.
//! 3. Otherwise the copy keeps 8 originals (the `conveyor.*` ones and a large-payload marker first, then
//!    the rest by name), adds
//!    `conveyor.failure`, and moves every other original into one `conveyor.overflow` attribute (type `String`): a JSON
//!    object by attribute name, each `{"data_type": …, "string_value": …}` or
//!    `{"data_type": …, "binary_value": <base64>}`. [`original_attributes`] undoes it.
//!
//! Producers built on Conveyor never reach step 3: `conveyor_sqs::Producer` allows at most 9
//! attributes, keeping one slot for the failure. Step 3 covers messages sent by other producers.
//!
//! [`dead_letter_copy`] builds the whole copy (body, attributes, FIFO group and deduplication id, trace
//! header, the 1 MiB fallback); every [`Queue`](crate::Queue) implementation sends what it returns, so the
//! in-memory double and the SQS adapter cannot drift apart.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::limits::{MAX_MESSAGE_ATTRIBUTES, MAX_MESSAGE_BYTES};
use crate::message::{AttributeValue, Attributes, FAILURE_ATTRIBUTE, Message, attributes_size};
use crate::outcome::Failure;
use crate::queue::OutgoingMessage;

/// Attribute holding the originals that did not fit next to the failure record (JSON).
pub(crate) const OVERFLOW_ATTRIBUTE: &str = "conveyor.overflow";

/// The longest failure `error` text kept in the record; longer ones are cut (on a char boundary) and end
/// in `…`, so a huge error cannot push the copy over SQS's size limit.
pub(crate) const MAX_FAILURE_ERROR_BYTES: usize = 4096;

/// One overflowed attribute, as stored in the JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    data_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    string_value: Option<String>,
    /// Base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    binary_value: Option<String>,
}

impl Stored {
    fn from_value(value: &AttributeValue) -> Self {
        Self {
            data_type: value.data_type.clone(),
            string_value: value.string_value.clone(),
            binary_value: value.binary_value.as_ref().map(|bytes| BASE64.encode(bytes)),
        }
    }

    fn into_value(self) -> Option<AttributeValue> {
        let binary_value = match self.binary_value {
            Some(text) => Some(BASE64.decode(text).ok()?),
            None => None,
        };
        Some(AttributeValue {
            data_type: self.data_type,
            string_value: self.string_value,
            binary_value,
        })
    }
}

/// The attributes for the dead-lettered copy of a message with `original` attributes.
pub(crate) fn dead_letter_attributes(original: &Attributes, failure: &Failure) -> Attributes {
    let mut originals = original_attributes(original);
    // A dead-lettered deferred copy is final: redriven, it starts its runs afresh like any message back
    // from a DLQ (a deferral record left on it would make the claim count its spent runs again and
    // refuse it for ever; the flows simulation found it).
    originals.remove(crate::message::DEFERRAL_ATTRIBUTE);
    let failure_value = AttributeValue::string(bounded(failure).to_json());
    if originals.len() < MAX_MESSAGE_ATTRIBUTES {
        originals.insert(FAILURE_ATTRIBUTE.to_owned(), failure_value);
        return originals;
    }

    // Room for 8 originals: 10 minus the failure minus the overflow attribute.
    let keep = MAX_MESSAGE_ATTRIBUTES - 2;
    let mut names: Vec<String> = originals.keys().cloned().collect();
    // The large-payload marker stays in place too: consumers built on the SQS Extended Client Library
    // recognise a pointer by it (see `crate::payload`).
    names.sort_by_key(|name| {
        let kept_first = name.starts_with("conveyor.")
            || crate::payload::marking_attribute(
                &std::iter::once((name.clone(), AttributeValue::number(0))).collect(),
            )
            .is_some();
        (!kept_first, name.clone())
    });
    let mut overflow = BTreeMap::new();
    for name in names.into_iter().skip(keep) {
        if let Some(value) = originals.remove(&name) {
            overflow.insert(name, Stored::from_value(&value));
        }
    }
    let json = serde_json::to_string(&overflow).unwrap_or_else(|_| "{}".to_owned());
    originals.insert(OVERFLOW_ATTRIBUTE.to_owned(), AttributeValue::string(json));
    originals.insert(FAILURE_ATTRIBUTE.to_owned(), failure_value);
    originals
}

/// The original attributes of a (possibly dead-lettered) message: without `conveyor.failure`, with
/// `conveyor.overflow` unpacked. An overflow attribute that cannot be read is kept as it is.
/// The result may hold more than 10 attributes; a redrive that sends it on must decide what to keep.
pub fn original_attributes(attributes: &Attributes) -> Attributes {
    let mut originals = attributes.clone();
    originals.remove(FAILURE_ATTRIBUTE);
    let Some(overflow) = originals.remove(OVERFLOW_ATTRIBUTE) else {
        return originals;
    };
    let parsed = overflow
        .string_value
        .as_deref()
        .and_then(|json| serde_json::from_str::<BTreeMap<String, Stored>>(json).ok());
    let Some(parsed) = parsed else {
        originals.insert(OVERFLOW_ATTRIBUTE.to_owned(), overflow);
        return originals;
    };
    for (name, stored) in parsed {
        let stored_copy = stored.clone();
        match stored.into_value() {
            Some(value) => {
                originals.entry(name).or_insert(value);
            }
            None => {
                tracing::warn!(attribute = %name, "overflowed attribute has unreadable base64; keeping it as text");
                originals.entry(name).or_insert(AttributeValue {
                    data_type: stored_copy.data_type,
                    string_value: stored_copy.binary_value,
                    binary_value: None,
                });
            }
        }
    }
    originals
}

/// The copy of `message` to send to its DLQ with `failure` recorded (`dlq_fifo`: the DLQ is a FIFO queue).
///
/// On a FIFO DLQ the copy keeps the message's group (ordering in the DLQ follows the source) and is
/// deduplicated on the original message id, so dead-lettering the same message twice within 5 minutes
/// leaves one copy. If the original fitted in 1 MiB but the failure record does not, the copy goes
/// without it (the message matters more than its reason, which the caller logs).
pub fn dead_letter_copy(message: &Message, failure: &Failure, dlq_fifo: bool) -> OutgoingMessage {
    let mut attributes = dead_letter_attributes(&message.attributes, failure);
    if message.body.len() + attributes_size(&attributes) > MAX_MESSAGE_BYTES {
        tracing::warn!(
            message_id = %message.id,
            reason = %failure.error,
            "no room for the failure record within 1 MiB; dead-lettering the message without it"
        );
        attributes = message.attributes.clone();
    }
    OutgoingMessage {
        body: message.body.clone(),
        attributes,
        delay: None,
        group_id: dead_letter_group(message, dlq_fifo),
        deduplication_id: dlq_fifo.then(|| message.id.clone()),
        trace_header: message.trace_header.clone(),
    }
}

/// The copy's `MessageGroupId`: on a FIFO DLQ the message's group (or its id); on a standard DLQ its
/// tenant, so a fair DLQ keeps the tenants apart.
fn dead_letter_group(message: &Message, dlq_fifo: bool) -> Option<String> {
    if dlq_fifo {
        return Some(message.group_id.clone().unwrap_or_else(|| message.id.clone()));
    }
    message.tenant().map(str::to_owned)
}

fn bounded(failure: &Failure) -> Failure {
    if failure.error.len() <= MAX_FAILURE_ERROR_BYTES {
        return failure.clone();
    }
    let mut end = MAX_FAILURE_ERROR_BYTES;
    while !failure.error.is_char_boundary(end) {
        end -= 1;
    }
    Failure {
        error: format!("{}…", &failure.error[..end]),
        ..failure.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Failure {
        Failure::now("no such user", 2, "jobs", "email")
    }

    fn attributes(count: usize) -> Attributes {
        (0..count)
            .map(|i| (format!("a{i:02}"), AttributeValue::string(format!("v{i}"))))
            .collect()
    }

    #[test]
    fn fits_then_failure_is_added() {
        let original = attributes(9);
        let copy = dead_letter_attributes(&original, &failure());
        assert_eq!(copy.len(), 10);
        let json = copy[FAILURE_ATTRIBUTE].string_value.as_deref().unwrap();
        let parsed: Failure = serde_json::from_str(json).unwrap();
        assert_eq!(parsed, failure_with_time(&parsed));
        assert_eq!(original_attributes(&copy), original);
    }

    fn failure_with_time(parsed: &Failure) -> Failure {
        Failure {
            failed_at_ms: parsed.failed_at_ms,
            ..failure()
        }
    }

    #[test]
    fn ten_originals_overflow_losslessly_keeping_conveyor_ones() {
        let mut original = attributes(7);
        original.insert("conveyor.type".into(), AttributeValue::string("email"));
        original.insert("conveyor.version".into(), AttributeValue::number(1));
        original.insert(
            "zz.bin".into(),
            AttributeValue {
                data_type: "Binary".into(),
                string_value: None,
                binary_value: Some(vec![0, 1, 2, 255]),
            },
        );
        assert_eq!(original.len(), 10);
        let copy = dead_letter_attributes(&original, &failure());
        assert_eq!(copy.len(), MAX_MESSAGE_ATTRIBUTES);
        assert!(copy.contains_key("conveyor.type"));
        assert!(copy.contains_key("conveyor.version"));
        assert!(copy.contains_key(FAILURE_ATTRIBUTE));
        assert!(copy.contains_key(OVERFLOW_ATTRIBUTE));
        assert!(!copy.contains_key("zz.bin"), "the last by name overflows");
        assert_eq!(original_attributes(&copy), original);
    }

    #[test]
    fn dead_lettering_twice_replaces_the_failure_and_does_not_nest() {
        let original = attributes(10);
        let once = dead_letter_attributes(&original, &failure());
        let twice = dead_letter_attributes(&once, &Failure::now("second", 3, "jobs", "email"));
        assert_eq!(twice.len(), MAX_MESSAGE_ATTRIBUTES);
        assert!(
            twice[FAILURE_ATTRIBUTE]
                .string_value
                .as_deref()
                .unwrap()
                .contains("second")
        );
        assert_eq!(original_attributes(&twice), original);
    }

    #[test]
    fn huge_errors_are_cut() {
        let big = Failure::now("é".repeat(10_000), 1, "jobs", "email");
        let copy = dead_letter_attributes(&Attributes::new(), &big);
        let json = copy[FAILURE_ATTRIBUTE].string_value.as_deref().unwrap();
        let parsed: Failure = serde_json::from_str(json).unwrap();
        assert!(parsed.error.len() <= MAX_FAILURE_ERROR_BYTES + '…'.len_utf8());
        assert!(parsed.error.ends_with('…'));
    }
}
