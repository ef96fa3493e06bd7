//! The openers on real payloads. Sources of `fixtures/` (taken 2026-12-05):
//! - `sns-notification-aws-docs.json`: the SQS body in AWS's "Fanout Amazon SNS notifications to Amazon
//!   SQS queues" guide;
//! - `*-localstack.json`: bodies LocalStack 4.8.1 delivered to SQS (SNS topic → SQS subscription with
//!   raw delivery off, S3 → SNS → SQS, EventBridge rule → SQS target);
//! - `*-aws-lambda-events.json`: the `aws_lambda_events` 1.2.1 crate's fixtures (`example-s3-event.json`,
//!   `example-eventbridge-schedule.json`);
//! - `s3-test-event-aws-docs.json`: the test message in AWS's "Event message structure" (S3 user guide);
//! - `cloudevent-structured-spec.json`: the JSON format example of the CloudEvents 1.0 spec.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::lease::Lease;
use crate::message::{JOB_TYPE_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE};
use crate::outcome::{AckReason, Outcome};
use crate::pipeline::Budget;
use crate::router::Opening;
use crate::{Context, Handler, HandlerError, Pipeline, Router};

const SNS_DOCS: &str = include_str!("fixtures/sns-notification-aws-docs.json");
const SNS_LOCALSTACK: &str = include_str!("fixtures/sns-notification-localstack.json");
const SNS_S3: &str = include_str!("fixtures/sns-s3-notification-localstack.json");
const S3_EVENT: &str = include_str!("fixtures/s3-event-aws-lambda-events.json");
const S3_TEST: &str = include_str!("fixtures/s3-test-event-aws-docs.json");
const EVENTBRIDGE: &str = include_str!("fixtures/eventbridge-localstack.json");
const SCHEDULE: &str = include_str!("fixtures/eventbridge-schedule-aws-lambda-events.json");
const CLOUDEVENT: &str = include_str!("fixtures/cloudevent-structured-spec.json");

fn opened(body: &str) -> Unwrapped {
    match open(&Message::new("sqs-1", body)) {
        Ok(Some(unwrapped)) => unwrapped,
        other => panic!("expected an opened message, got {other:?}"),
    }
}

fn malformed(body: &str) -> String {
    match open(&Message::new("sqs-1", body)) {
        Err(reason) => reason,
        other => panic!("expected a malformed envelope, got {other:?}"),
    }
}

#[test]
fn an_sns_notification_gives_its_message_and_metadata() {
    let unwrapped = opened(SNS_DOCS);
    assert_eq!(unwrapped.message.body, "Hello world!");
    assert_eq!(unwrapped.route, Route::Attributes);
    let [Envelope::Sns(sns)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    assert_eq!(sns.message_id, "63a3f6b6-d533-4a47-aef9-fcf5cf758c76");
    assert_eq!(sns.topic_arn, "arn:aws:sns:us-west-2:123456789012:MyTopic");
    assert_eq!(
        sns.subject.as_deref(),
        Some("Testing publish to subscribed queues")
    );
    assert_eq!(sns.timestamp, "2012-03-29T05:12:16.901Z");
    assert_eq!(sns.signature_version.as_deref(), Some("1"));
    assert_eq!(sns.signature.as_deref(), Some("EXAMPLEnTrFPa3..."));
    assert!(
        sns.signing_cert_url
            .as_deref()
            .is_some_and(|url| url.ends_with(".pem"))
    );
    assert!(
        sns.unsubscribe_url
            .as_deref()
            .is_some_and(|url| url.contains("Action=Unsubscribe"))
    );
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("sns:63a3f6b6-d533-4a47-aef9-fcf5cf758c76")
    );
}

#[test]
fn sns_message_attributes_become_message_attributes_and_route_a_conveyor_job() {
    let unwrapped = opened(SNS_LOCALSTACK);
    let message = &unwrapped.message;
    assert_eq!(message.body, r#"{"user_id": 1}"#);
    assert_eq!(message.job_type(), Some("welcome"));
    assert_eq!(message.string_attribute("num"), Some("3"));
    assert_eq!(message.attributes["num"].data_type, "Number");
    assert_eq!(
        message.attributes["bin"].binary_value.as_deref(),
        Some(&[1u8, 2][..])
    );
    assert_eq!(
        message.idempotency_key(),
        Some("sns:92bd46cd-cedd-4acd-bba4-a9efd06626da")
    );
}

#[test]
fn a_conveyor_key_published_through_sns_is_kept() {
    let mut body: serde_json::Value = serde_json::from_str(SNS_LOCALSTACK).unwrap();
    body["MessageAttributes"]["conveyor.key"] = serde_json::json!({"Type": "String", "Value": "user:1"});
    let unwrapped = opened(&body.to_string());
    assert_eq!(unwrapped.message.idempotency_key(), Some("user:1"));
}

#[test]
fn s3_through_sns_opens_both_and_keys_by_the_object() {
    let unwrapped = opened(SNS_S3);
    assert_eq!(unwrapped.route, Route::S3);
    let [Envelope::Sns(sns), Envelope::S3(event)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    assert_eq!(sns.subject.as_deref(), Some("Amazon S3 Notification"));
    assert_eq!(event.records[0].bucket, "bkt-two");
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("s3:bkt-two/k@0055AED6DCD90281E5")
    );
    // The job is the notification itself, as a handler decodes it.
    let job: S3Event = serde_json::from_str(&unwrapped.message.body).unwrap();
    assert_eq!(&job, event);
}

#[test]
fn an_s3_notification_decodes_its_records() {
    let unwrapped = opened(S3_EVENT);
    let [Envelope::S3(event)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    let record = &event.records[0];
    assert_eq!(record.event_name, "ObjectCreated:Put");
    assert_eq!(record.bucket, "sourcebucket");
    assert_eq!(record.key, "Happy Face.jpg");
    assert_eq!(record.size, Some(1024));
    assert_eq!(record.version_id.as_deref(), Some("version"));
    assert_eq!(record.etag.as_deref(), Some("d41d8cd98f00b204e9800998ecf8427e"));
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("s3:sourcebucket/Happy Face.jpg@Happy Sequencer")
    );
}

#[test]
fn several_s3_records_are_one_job_keyed_by_all_of_them() {
    let mut body: serde_json::Value = serde_json::from_str(S3_EVENT).unwrap();
    let mut second = body["Records"][0].clone();
    second["s3"]["object"]["key"] = "b+c%2Bd".into();
    second["s3"]["object"]["sequencer"] = "0A".into();
    body["Records"].as_array_mut().unwrap().push(second);
    let unwrapped = opened(&body.to_string());
    let [Envelope::S3(event)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    assert_eq!(event.records.len(), 2);
    assert_eq!(event.records[1].key, "b c+d");
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("s3:sourcebucket/Happy Face.jpg@Happy Sequencer sourcebucket/b c+d@0A")
    );
}

#[test]
fn the_s3_test_event_is_recognised_alone_and_through_sns() {
    assert_eq!(opened(S3_TEST).route, Route::TestEvent);
    let mut sns: serde_json::Value = serde_json::from_str(SNS_DOCS).unwrap();
    sns["Message"] = S3_TEST.trim().into();
    assert_eq!(opened(&sns.to_string()).route, Route::TestEvent);
}

#[test]
fn an_eventbridge_event_gives_its_detail() {
    let unwrapped = opened(EVENTBRIDGE);
    assert_eq!(unwrapped.message.body, r#"{"order":7}"#);
    assert_eq!(
        unwrapped.route,
        Route::EventBridge {
            source: "my.app".into(),
            detail_type: "Order Placed".into()
        }
    );
    let [Envelope::EventBridge(event)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    assert_eq!(event.resources, vec!["arn:x".to_owned()]);
    assert_eq!(event.account, "000000000000");
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("eventbridge:0f8f9f42-718b-405a-a056-68ecf3998982")
    );
    let schedule = opened(SCHEDULE);
    assert_eq!(schedule.message.body, "{}");
}

#[test]
fn an_eventbridge_event_through_sns_keeps_the_events_id() {
    let mut sns: serde_json::Value = serde_json::from_str(SNS_DOCS).unwrap();
    sns["Message"] = EVENTBRIDGE.trim().into();
    let unwrapped = opened(&sns.to_string());
    assert_eq!(unwrapped.envelopes.len(), 2);
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("eventbridge:0f8f9f42-718b-405a-a056-68ecf3998982")
    );
}

#[test]
fn malformed_envelopes_name_what_is_wrong() {
    let mut event: serde_json::Value = serde_json::from_str(EVENTBRIDGE).unwrap();
    event.as_object_mut().unwrap().remove("detail-type");
    assert!(malformed(&event.to_string()).contains("no detail-type"));

    let mut sns: serde_json::Value = serde_json::from_str(SNS_DOCS).unwrap();
    sns["Message"] = serde_json::json!({"not": "a string"});
    let reason = malformed(&sns.to_string());
    assert!(reason.contains("SNS notification"), "{reason}");

    let mut sns: serde_json::Value = serde_json::from_str(SNS_LOCALSTACK).unwrap();
    sns["MessageAttributes"]["bin"]["Value"] = "%%%".into();
    assert!(malformed(&sns.to_string()).contains("not base64"));

    let mut cloud: serde_json::Value = serde_json::from_str(CLOUDEVENT).unwrap();
    cloud.as_object_mut().unwrap().remove("type");
    assert!(malformed(&cloud.to_string()).contains("has no type"));

    let mut s3: serde_json::Value = serde_json::from_str(S3_EVENT).unwrap();
    s3["Records"][0]["s3"].as_object_mut().unwrap().remove("bucket");
    assert!(malformed(&s3.to_string()).contains("S3 event notification"));
}

#[test]
fn plain_json_that_merely_resembles_an_envelope_is_left_alone() {
    for body in [
        r#"{"source": "my.app", "detail-type": "Order Placed", "detail": {}}"#,
        r#"{"Type": "Notification", "Message": "hi"}"#,
        r#"{"Records": [{"eventSource": "aws:sqs"}]}"#,
        r#"{"type": "com.example", "id": "1"}"#,
        r#"["not", "an", "object"]"#,
        "not json",
        "",
    ] {
        assert!(matches!(open(&Message::new("m", body)), Ok(None)), "{body}");
    }
    // A Conveyor message (typed by its attribute) is never opened, whatever its body.
    let mut typed = Message::new("m", EVENTBRIDGE);
    typed
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.into(), AttributeValue::string("x"));
    assert!(matches!(open(&typed), Ok(None)));
}

#[test]
fn a_structured_cloudevent_gives_its_data() {
    let unwrapped = opened(CLOUDEVENT);
    assert_eq!(
        unwrapped.route,
        Route::CloudEvent {
            event_type: "com.example.someevent".into()
        }
    );
    let body: serde_json::Value = serde_json::from_str(&unwrapped.message.body).unwrap();
    assert_eq!(body["appinfoB"], 123);
    let [Envelope::CloudEvent(event)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    assert_eq!(event.time.as_deref(), Some("2018-04-05T17:31:00Z"));
    assert_eq!(event.data_content_type.as_deref(), Some("application/json"));
    assert_eq!(event.extensions["comexampleextension1"], "value");
    assert_eq!(event.extensions["comexampleothervalue"], "5");
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("cloudevents:/mycontext A234-1234-1234")
    );

    let mut base64: serde_json::Value = serde_json::from_str(CLOUDEVENT).unwrap();
    let object = base64.as_object_mut().unwrap();
    object.remove("data");
    object.insert("data_base64".into(), r#"eyJhIjoxfQ=="#.into());
    assert_eq!(opened(&base64.to_string()).message.body, r#"{"a":1}"#);
}

#[test]
fn a_binary_mode_cloudevent_is_read_from_its_attributes() {
    for prefix in ["ce_", "ce-"] {
        let mut message = Message::new("m", r#"{"a":1}"#);
        for (name, value) in [
            ("specversion", "1.0"),
            ("id", "e-1"),
            ("source", "/orders"),
            ("type", "com.example.order.created"),
            ("traceparent", "00-abc-def-01"),
        ] {
            message
                .attributes
                .insert(format!("{prefix}{name}"), AttributeValue::string(value));
        }
        message
            .attributes
            .insert("other".into(), AttributeValue::string("kept"));
        let unwrapped = open(&message).unwrap().unwrap();
        assert_eq!(unwrapped.message.body, r#"{"a":1}"#);
        assert_eq!(unwrapped.message.string_attribute("other"), Some("kept"));
        assert_eq!(
            unwrapped.message.idempotency_key(),
            Some("cloudevents:/orders e-1")
        );
        let [Envelope::CloudEvent(event)] = unwrapped.envelopes.as_slice() else {
            panic!("{:?}", unwrapped.envelopes)
        };
        assert_eq!(event.event_type, "com.example.order.created");
        assert_eq!(event.extensions["traceparent"], "00-abc-def-01");
    }
    let mut untyped = Message::new("m", "{}");
    untyped
        .attributes
        .insert("ce_specversion".into(), AttributeValue::string("1.0"));
    assert!(open(&untyped).unwrap_err().contains("id, source, type"));
}

#[test]
fn opening_is_bounded() {
    // SNS in SNS in SNS in SNS: the first three are opened, the rest stays the body.
    let mut body = r#"{"job": 1}"#.to_owned();
    for _ in 0..4 {
        let mut sns: serde_json::Value = serde_json::from_str(SNS_DOCS).unwrap();
        sns["Message"] = body.into();
        body = sns.to_string();
    }
    let unwrapped = opened(&body);
    assert_eq!(unwrapped.envelopes.len(), MAX_DEPTH);
    assert!(unwrapped.message.body.contains("Notification"));
}

#[derive(Debug, serde::Deserialize, serde::Serialize)]
struct Order {
    order: u64,
}

/// Records what it saw: the job and the envelopes.
struct PlaceOrder;

impl Handler for PlaceOrder {
    type Job = Order;
    type Output = (u64, Option<String>, Option<String>);
    const JOB_TYPE: &'static str = "place_order";

    async fn handle(&self, job: Order, ctx: Context) -> Result<Self::Output, HandlerError> {
        let source = ctx.event().map(|event| event.source.clone());
        let topic = ctx.sns().map(|sns| sns.topic_arn.clone());
        Ok((job.order, source, topic))
    }
}

struct Thumbnail;

impl Handler for Thumbnail {
    type Job = S3Event;
    type Output = Vec<String>;
    const JOB_TYPE: &'static str = "thumbnail";

    async fn handle(&self, job: S3Event, _ctx: Context) -> Result<Vec<String>, HandlerError> {
        Ok(job.records.into_iter().map(|record| record.key).collect())
    }
}

fn router() -> Router {
    Router::new()
        .event("my.app", "Order Placed", PlaceOrder)
        .s3_events(Thumbnail)
}

async fn process(body: &str) -> crate::pipeline::Processed {
    process_with(router(), body).await
}

/// `body` through a pipeline with `router`, as the runtimes call it.
pub(super) async fn process_with(router: Router, body: &str) -> crate::pipeline::Processed {
    let lease = Lease::new(Instant::now() + Duration::from_secs(30));
    Pipeline::new(router)
        .process(
            Arc::new(Message::new("sqs-1", body)),
            Arc::from("jobs"),
            &lease,
            Budget::default(),
        )
        .await
}

#[test]
fn the_router_names_an_events_handler_and_refuses_an_unrouted_event_as_an_unknown_type() {
    let router = router();
    let Ok(Opening::Opened { message, .. }) = router.open(&Message::new("m", EVENTBRIDGE)) else {
        panic!("not opened")
    };
    assert_eq!(message.job_type(), Some("place_order"));
    assert_eq!(message.string_attribute(SCHEMA_VERSION_ATTRIBUTE), None);
    assert_eq!(
        router.job_type_for(&Message::new("m", EVENTBRIDGE)),
        Some("place_order")
    );
    assert_eq!(router.job_type_for(&Message::new("m", SNS_S3)), Some("thumbnail"));

    let Err(error) = router.open(&Message::new("m", SCHEDULE)) else {
        panic!("an unrouted event opened")
    };
    assert!(!error.is_permanent());
    assert!(
        error
            .message()
            .contains(r#"source "aws.events", detail-type "Scheduled Event""#)
            && error.message().contains(r#"event "my.app"/"Order Placed""#),
        "{}",
        error.message()
    );
}

#[tokio::test]
async fn the_pipeline_runs_an_event_with_its_detail_and_metadata() {
    let processed = process(EVENTBRIDGE).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
    assert_eq!(processed.job_type, Some("place_order"));
    assert_eq!(processed.output.as_deref(), Some(r#"[7,"my.app",null]"#));

    let mut sns: serde_json::Value = serde_json::from_str(SNS_DOCS).unwrap();
    sns["Message"] = EVENTBRIDGE.trim().into();
    let processed = process(&sns.to_string()).await;
    assert_eq!(
        processed.output.as_deref(),
        Some(r#"[7,"my.app","arn:aws:sns:us-west-2:123456789012:MyTopic"]"#)
    );

    let processed = process(SNS_S3).await;
    assert_eq!(processed.output.as_deref(), Some(r#"["k"]"#));
}

#[tokio::test]
async fn the_pipeline_acknowledges_the_test_event_and_rejects_a_malformed_one_without_running() {
    let processed = process(S3_TEST).await;
    assert_eq!(processed.outcome, Outcome::Ack(AckReason::Ignored));
    assert!(!processed.ran());

    let mut event: serde_json::Value = serde_json::from_str(EVENTBRIDGE).unwrap();
    event.as_object_mut().unwrap().remove("detail-type");
    let processed = process(&event.to_string()).await;
    let Outcome::Reject(failure) = &processed.outcome else {
        panic!("expected a reject, got {:?}", processed.outcome)
    };
    assert!(failure.error.contains("no detail-type"), "{}", failure.error);
    assert!(!processed.ran());
}
