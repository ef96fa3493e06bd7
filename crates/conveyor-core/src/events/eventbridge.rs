//! EventBridge events delivered by a rule's SQS target: the body is the event, `detail` the job.
//!
//! Detection needs the event's full shape, not one field: the keys `id`, `source`, `account`,
//! `time`, `region`, `resources` and `detail` must all be there (`version`, always `0`, may be
//! missing: hand-written examples leave it out) (a user's own JSON with a
//! `source` field is not an event). A body with that shape but without a `detail-type`, or with a
//! field of the wrong type, is a malformed event: a permanent failure naming the field.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The keys every EventBridge event carries, `detail-type` aside (its absence is reported).
const SHAPE: [&str; 7] = ["id", "source", "account", "time", "region", "resources", "detail"];

/// An EventBridge event's metadata (its `detail` is the handler's job).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventBridgeEvent {
    /// The event's id: unique per event, the same on every delivery of it.
    pub id: String,
    /// `source`, such as `aws.s3` or `my.app`.
    pub source: String,
    /// `detail-type`, such as `Object Created` or `Order Placed`.
    pub detail_type: String,
    /// The account it was put in.
    pub account: String,
    /// The region it was put in.
    pub region: String,
    /// When it happened (ISO 8601, as EventBridge wrote it).
    pub time: String,
    /// The ARNs it concerns.
    pub resources: Vec<String>,
    /// The envelope's version (`0`).
    pub version: String,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default = "version_zero")]
    version: String,
    id: String,
    #[serde(rename = "detail-type")]
    detail_type: Option<String>,
    source: String,
    account: String,
    time: String,
    region: String,
    resources: Vec<String>,
    detail: Value,
}

fn version_zero() -> String {
    "0".to_owned()
}

/// True when `body` has the shape of an EventBridge event.
pub(crate) fn is_event(body: &Map<String, Value>) -> bool {
    SHAPE.iter().all(|key| body.contains_key(*key))
}

/// The event's metadata and its `detail`; `Err` names what is wrong with a body that has the shape.
pub(crate) fn open(body: Value) -> Result<(EventBridgeEvent, Value), String> {
    let raw: Raw = serde_json::from_value(body).map_err(|error| format!("EventBridge event: {error}"))?;
    let Some(detail_type) = raw.detail_type.filter(|detail_type| !detail_type.is_empty()) else {
        return Err(format!(
            "EventBridge event {} (source {:?}) has no detail-type: it cannot be routed",
            raw.id, raw.source
        ));
    };
    let event = EventBridgeEvent {
        id: raw.id,
        source: raw.source,
        detail_type,
        account: raw.account,
        region: raw.region,
        time: raw.time,
        resources: raw.resources,
        version: raw.version,
    };
    Ok((event, raw.detail))
}
