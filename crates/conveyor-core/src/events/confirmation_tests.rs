//! SNS subscription and unsubscribe confirmations on the documented shape. Sources of the fixtures
//! (taken 2026-12-06): the JSON documents of AWS's "HTTP/HTTPS subscription confirmation JSON format"
//! and "HTTP/HTTPS unsubscribe confirmation JSON format" (SNS developer guide), which SNS also puts on
//! a queue a topic of another account subscribes.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::*;
use crate::outcome::{AckReason, Outcome};
use crate::{Context, Handler, HandlerError, Router};

const SUBSCRIBE: &str = include_str!("fixtures/sns-subscription-confirmation-aws-docs.json");
const UNSUBSCRIBE: &str = include_str!("fixtures/sns-unsubscribe-confirmation-aws-docs.json");
const TOPIC: &str = "arn:aws:sns:us-west-2:123456789012:MyTopic";

fn token_of(body: &str) -> String {
    let body: Value = serde_json::from_str(body).unwrap();
    body["Token"].as_str().unwrap().to_owned()
}

fn confirmation_in(body: &str) -> (SubscriptionConfirmation, Unwrapped) {
    let unwrapped = match open(&Message::new("sqs-1", body)) {
        Ok(Some(unwrapped)) => unwrapped,
        other => panic!("expected an opened confirmation, got {other:?}"),
    };
    let [Envelope::SnsConfirmation(confirmation)] = unwrapped.envelopes.as_slice() else {
        panic!("{:?}", unwrapped.envelopes)
    };
    (confirmation.clone(), unwrapped)
}

#[test]
fn both_confirmations_are_recognised_with_what_confirming_needs() {
    let (confirmation, unwrapped) = confirmation_in(SUBSCRIBE);
    assert_eq!(confirmation.kind, ConfirmationKind::Subscribe);
    assert_eq!(confirmation.topic_arn, TOPIC);
    assert_eq!(confirmation.message_id, "165545c9-2a5c-472c-8df2-7ff2be2b3b1b");
    assert_eq!(confirmation.token, token_of(SUBSCRIBE));
    assert!(
        confirmation
            .subscribe_url
            .starts_with("https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription")
    );
    assert_eq!(confirmation.timestamp, "2012-04-26T20:45:04.751Z");
    assert_eq!(confirmation.signature_version.as_deref(), Some("1"));
    assert!(confirmation.signature.is_some() && confirmation.signing_cert_url.is_some());
    assert!(matches!(
        &unwrapped.route,
        Route::SnsConfirmation(Notice::SnsConfirmation { kind: ConfirmationKind::Subscribe, topic_arn, .. })
            if topic_arn == TOPIC
    ));
    assert_eq!(
        unwrapped.message.idempotency_key(),
        Some("sns:165545c9-2a5c-472c-8df2-7ff2be2b3b1b")
    );
    // The job is the message itself, as a handler decodes it.
    let job: SubscriptionConfirmation = serde_json::from_str(&unwrapped.message.body).unwrap();
    assert_eq!(job, confirmation);

    let (confirmation, _) = confirmation_in(UNSUBSCRIBE);
    assert_eq!(confirmation.kind, ConfirmationKind::Unsubscribe);
    assert_eq!(confirmation.token, token_of(UNSUBSCRIBE));
}

#[test]
fn debug_hides_the_token_and_the_url() {
    let (confirmation, unwrapped) = confirmation_in(SUBSCRIBE);
    for shown in [format!("{confirmation:?}"), format!("{:?}", unwrapped.envelopes)] {
        assert!(shown.contains(TOPIC), "{shown}");
        assert!(!shown.contains(&token_of(SUBSCRIBE)), "{shown}");
        assert!(!shown.contains("Action=ConfirmSubscription"), "{shown}");
    }
}

#[test]
fn only_the_whole_shape_is_a_confirmation() {
    let full: Value = serde_json::from_str(SUBSCRIBE).unwrap();
    for field in sns::CONFIRMATION_FIELDS {
        let mut partial = full.clone();
        partial.as_object_mut().unwrap().remove(field);
        let body = partial.to_string();
        assert!(
            matches!(open(&Message::new("m", &body)), Ok(None)),
            "without {field}: {body}"
        );
    }
    let mut other_type = full.clone();
    other_type["Type"] = "Confirmation".into();
    assert!(matches!(
        open(&Message::new("m", other_type.to_string())),
        Ok(None)
    ));
    // The signature fields are not needed (a FIFO topic's messages have none).
    let mut unsigned = full.clone();
    for field in ["SignatureVersion", "Signature", "SigningCertURL"] {
        unsigned.as_object_mut().unwrap().remove(field);
    }
    let (confirmation, _) = confirmation_in(&unsigned.to_string());
    assert_eq!(confirmation.signature, None);
}

#[test]
fn a_malformed_confirmation_is_permanent_and_says_why() {
    let mut body: Value = serde_json::from_str(SUBSCRIBE).unwrap();
    body["TopicArn"] = json!(42);
    let Err(reason) = open(&Message::new("m", body.to_string())) else {
        panic!("a confirmation with a numeric TopicArn opened")
    };
    assert!(reason.contains("SNS subscription confirmation"), "{reason}");
    assert!(!reason.contains(&token_of(SUBSCRIBE)), "{reason}");
}

/// Confirms what it is given, as a handler would with SNS's `ConfirmSubscription`.
struct Confirm(Arc<Mutex<Vec<(ConfirmationKind, String, String)>>>);

impl Handler for Confirm {
    type Job = SubscriptionConfirmation;
    type Output = ();
    const JOB_TYPE: &'static str = "sns_subscription";

    async fn handle(&self, job: SubscriptionConfirmation, ctx: Context) -> Result<(), HandlerError> {
        assert!(matches!(ctx.envelopes(), [Envelope::SnsConfirmation(_)]));
        self.0.lock().unwrap().push((job.kind, job.topic_arn, job.token));
        Ok(())
    }
}

#[tokio::test]
async fn without_a_route_a_confirmation_is_acknowledged_with_a_warning_that_keeps_the_token_out() {
    let (lines, _guard) = crate::test_logs::capture();
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    // A consumer with a default route: the confirmation must not reach it either.
    let router = Router::new().default_route(Confirm(Arc::clone(&confirmed)));
    for body in [SUBSCRIBE, UNSUBSCRIBE] {
        let processed = super::tests::process_with(router.clone(), body).await;
        assert_eq!(processed.outcome, Outcome::Ack(AckReason::Ignored));
        assert!(!processed.ran());
    }
    assert!(confirmed.lock().unwrap().is_empty());
    assert_eq!(router.job_type_for(&Message::new("m", SUBSCRIBE)), None);
    let text = lines.text();
    let warnings: Vec<&str> = text.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "{text}");
    assert!(
        warnings[0].contains(&format!("topic_arn={TOPIC}"))
            && warnings[0].contains("SubscriptionConfirmation acknowledged without confirming")
            && warnings[0].contains("Router::sns_subscription"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[1].contains("UnsubscribeConfirmation") && warnings[1].contains(TOPIC),
        "{}",
        warnings[1]
    );
    for secret in [token_of(SUBSCRIBE), token_of(UNSUBSCRIBE)] {
        assert!(!text.contains(&secret), "{text}");
    }
    assert!(!text.contains("Action=ConfirmSubscription"), "{text}");
}

#[tokio::test]
async fn the_route_gives_a_handler_the_topic_and_the_token() {
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let router = Router::new().sns_subscription(Confirm(Arc::clone(&confirmed)));
    assert_eq!(
        router.job_type_for(&Message::new("m", SUBSCRIBE)),
        Some("sns_subscription")
    );
    for body in [SUBSCRIBE, UNSUBSCRIBE] {
        let processed = super::tests::process_with(router.clone(), body).await;
        assert_eq!(processed.outcome, Outcome::Ack(AckReason::Completed));
        assert_eq!(processed.job_type, Some("sns_subscription"));
    }
    assert_eq!(
        *confirmed.lock().unwrap(),
        [
            (ConfirmationKind::Subscribe, TOPIC.to_owned(), token_of(SUBSCRIBE)),
            (
                ConfirmationKind::Unsubscribe,
                TOPIC.to_owned(),
                token_of(UNSUBSCRIBE)
            ),
        ]
    );
}
