//! What AWS services put on a queue, end to end on a LocalStack of this file's own (SQS, SNS,
//! EventBridge and S3): an SNS topic's SQS subscription with raw delivery off and on, an EventBridge
//! rule's SQS target, S3 bucket notifications straight to SQS and through SNS, CloudEvents published
//! through SNS (structured, and binary mode through message attributes), malformed envelopes, and SNS
//! subscription confirmations (`confirmations.rs`). Each
//! runs through both runtimes: the long-poll `Worker`, and the Lambda adapter's `BatchProcessor` fed
//! the way an event source mapping feeds it (received from the real queue, records converted with
//! `to_record`, the records not reported as failures deleted afterwards). A third test runs the example
//! application's own event routes in its `bootstrap`, a process of its own under `conveyor lambda
//! run`, as `cargo lambda` would run it.
//!
//! Measured on LocalStack 4.8.1 (host mode, offline): every one of these deliveries arrives, with the
//! bodies AWS documents (SNS's JSON envelope with `MessageAttributes` and signature fields, the
//! EventBridge event, S3's `Records` and `s3:TestEvent`). LocalStack does not check the queue
//! policies AWS would require for SNS, EventBridge and S3 to send to the queue.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

#[path = "aws_events/confirmations.rs"]
mod confirmations;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_sns::types::MessageAttributeValue as SnsAttribute;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_core::events::{Envelope, S3Event};
use conveyor_core::message::{FAILURE_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE};
use conveyor_core::port::Queue;
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_lambda::{BatchProcessor, LambdaConfig, SqsEvent, SqsQueues, to_record};
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{self, OwnLocalStack, QueueSpec, Services, TestQueue, unique_name};
use conveyor_testing::wait_until;
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The emulator both tests share (started once; it dies with the test process).
static EMULATOR: OnceCell<OwnLocalStack> = OnceCell::const_new();
/// How long the deliveries and their runs may take.
const TIMEOUT: Duration = Duration::from_secs(90);

async fn emulator() -> &'static OwnLocalStack {
    EMULATOR
        .get_or_init(|| async { OwnLocalStack::start_with(Services::AWS_EVENTS).await.unwrap() })
        .await
}

/// What a handler saw: its job type, its job, the idempotency key the message carried, and the
/// envelopes it came in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    handler: &'static str,
    job: String,
    key: Option<String>,
    envelopes: Vec<String>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn record(log: &Log, handler: &'static str, job: String, ctx: &Context) {
    let key = ctx
        .attributes()
        .get(IDEMPOTENCY_KEY_ATTRIBUTE)
        .and_then(|value| value.string_value.clone());
    let envelopes = ctx.envelopes().iter().map(describe).collect();
    log.lock().unwrap().push(Seen {
        handler,
        job,
        key,
        envelopes,
    });
}

fn describe(envelope: &Envelope) -> String {
    match envelope {
        Envelope::Sns(sns) => {
            let signed =
                sns.signature.is_some() && sns.signing_cert_url.is_some() && sns.signature_version.is_some();
            format!(
                "sns {} subject={} signed={signed}",
                sns.topic_arn,
                sns.subject.as_deref().unwrap_or("-")
            )
        }
        Envelope::EventBridge(event) => {
            format!("eventbridge {} {} {}", event.id, event.source, event.detail_type)
        }
        Envelope::S3(event) => format!("s3 {} record(s)", event.records.len()),
        Envelope::CloudEvent(event) => format!("cloudevent {} {}", event.event_type, event.id),
        other => format!("{other:?}"),
    }
}

#[derive(Deserialize)]
struct Welcome {
    user_id: u64,
}

/// A Conveyor job (`conveyor.type = welcome`) published to SNS.
struct SendWelcome(Log);

impl Handler for SendWelcome {
    type Job = Welcome;
    type Output = ();
    const JOB_TYPE: &'static str = "welcome";

    async fn handle(&self, job: Welcome, ctx: Context) -> Result<(), HandlerError> {
        record(&self.0, Self::JOB_TYPE, job.user_id.to_string(), &ctx);
        Ok(())
    }
}

/// A handler whose job is any JSON (an EventBridge event's detail, a CloudEvent's data).
macro_rules! json_handler {
    ($name:ident, $job_type:literal) => {
        struct $name(Log);

        impl Handler for $name {
            type Job = Value;
            type Output = ();
            const JOB_TYPE: &'static str = $job_type;

            async fn handle(&self, job: Value, ctx: Context) -> Result<(), HandlerError> {
                record(&self.0, Self::JOB_TYPE, job.to_string(), &ctx);
                Ok(())
            }
        }
    };
}

json_handler!(PlaceOrder, "place_order");
json_handler!(OrderCreated, "order_created");

/// S3 event notifications.
struct Thumbnail(Log);

impl Handler for Thumbnail {
    type Job = S3Event;
    type Output = ();
    const JOB_TYPE: &'static str = "thumbnail";

    async fn handle(&self, job: S3Event, ctx: Context) -> Result<(), HandlerError> {
        let keys: Vec<String> = job
            .records
            .iter()
            .map(|record| format!("{} {}/{}", record.event_name, record.bucket, record.key))
            .collect();
        record(&self.0, Self::JOB_TYPE, keys.join(","), &ctx);
        Ok(())
    }
}

/// The event type of the CloudEvents route.
const ORDER_CREATED: &str = "com.example.order.created";

/// One runtime's queue and the sources wired to it. Names are unique per runtime, so the two
/// runtimes' rules, topics and buckets never deliver to each other's queue.
struct Wiring {
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
    events: aws_sdk_eventbridge::Client,
    s3: aws_sdk_s3::Client,
    queue: TestQueue,
    /// Subscribed with raw delivery off; S3 notifications of `via_sns_bucket` go here too.
    topic: String,
    /// Subscribed with raw delivery on.
    raw_topic: String,
    /// The EventBridge `source` the rule matches (and the router routes).
    source: String,
    /// Notifies the queue directly.
    bucket: String,
    /// Notifies `topic`.
    via_sns_bucket: String,
}

async fn wire(name: &str) -> anyhow::Result<Wiring> {
    wire_for(name, &format!("my.app.{name}")).await
}

/// [`wire`], with the EventBridge rule matching `source`.
async fn wire_for(name: &str, source: &str) -> anyhow::Result<Wiring> {
    let emulator = emulator().await;
    let config = sdk_config(&emulator.endpoint());
    let sqs = emulator.sqs_client();
    let sns = aws_sdk_sns::Client::new(&config);
    let events = aws_sdk_eventbridge::Client::new(&config);
    let s3 = emulator.s3_client();
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::standard(name)
            .visibility_timeout_secs(30)
            .max_receive_count(3),
    )
    .await?;

    let topic = subscribed_topic(&sns, &format!("{name}-topic"), &queue.arn, false).await?;
    let raw_topic = subscribed_topic(&sns, &format!("{name}-raw"), &queue.arn, true).await?;

    let source = source.to_owned();
    let rule = unique_name(&format!("{name}-rule"));
    events
        .put_rule()
        .name(&rule)
        .event_pattern(json!({ "source": [source] }).to_string())
        .send()
        .await?;
    events
        .put_targets()
        .rule(&rule)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("queue")
                .arn(&queue.arn)
                .build()?,
        )
        .send()
        .await?;

    let bucket = bucket_name(&format!("{name}-direct"));
    let via_sns_bucket = bucket_name(&format!("{name}-via-sns"));
    for bucket in [&bucket, &via_sns_bucket] {
        s3.create_bucket().bucket(bucket).send().await?;
    }
    use aws_sdk_s3::types::{Event, NotificationConfiguration, QueueConfiguration, TopicConfiguration};
    // Each configuration makes S3 send its `s3:TestEvent` (to the queue, and through the topic).
    s3.put_bucket_notification_configuration()
        .bucket(&bucket)
        .notification_configuration(
            NotificationConfiguration::builder()
                .queue_configurations(
                    QueueConfiguration::builder()
                        .queue_arn(&queue.arn)
                        .events(Event::S3ObjectCreated)
                        .build()?,
                )
                .build(),
        )
        .send()
        .await?;
    s3.put_bucket_notification_configuration()
        .bucket(&via_sns_bucket)
        .notification_configuration(
            NotificationConfiguration::builder()
                .topic_configurations(
                    TopicConfiguration::builder()
                        .topic_arn(&topic)
                        .events(Event::S3ObjectCreated)
                        .build()?,
                )
                .build(),
        )
        .send()
        .await?;
    Ok(Wiring {
        sqs,
        sns,
        events,
        s3,
        queue,
        topic,
        raw_topic,
        source,
        bucket,
        via_sns_bucket,
    })
}

/// A new topic whose SQS subscription delivers to `queue_arn`, raw or in SNS's JSON envelope.
async fn subscribed_topic(
    sns: &aws_sdk_sns::Client,
    prefix: &str,
    queue_arn: &str,
    raw: bool,
) -> anyhow::Result<String> {
    let topic = sns
        .create_topic()
        .name(unique_name(prefix))
        .send()
        .await?
        .topic_arn
        .context("no topic ARN")?;
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(queue_arn)
        .attributes("RawMessageDelivery", raw.to_string())
        .send()
        .await?;
    Ok(topic)
}

fn bucket_name(prefix: &str) -> String {
    unique_name(prefix).to_lowercase().replace('_', "-")
}

fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    use aws_sdk_sns::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "aws-events",
        )))
        .build()
}

fn string_attribute(value: &str) -> SnsAttribute {
    SnsAttribute::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

impl Wiring {
    fn router(&self, log: &Log) -> Router {
        Router::new()
            .route(SendWelcome(Arc::clone(log)))
            .event(&self.source, "Order Placed", PlaceOrder(Arc::clone(log)))
            .cloud_event(ORDER_CREATED, OrderCreated(Arc::clone(log)))
            .s3_events(Thumbnail(Arc::clone(log)))
    }

    async fn publish(
        &self,
        topic: &str,
        message: &str,
        attributes: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let mut publish = self.sns.publish().topic_arn(topic).message(message);
        for (name, value) in attributes {
            publish = publish.message_attributes(*name, string_attribute(value));
        }
        publish.send().await?.message_id.context("no SNS message id")
    }

    /// Sends every kind of message; returns what the handlers must see, sorted, and the reasons the
    /// two malformed ones must reach the DLQ with.
    async fn send_all(&self) -> anyhow::Result<(Vec<Seen>, Vec<&'static str>)> {
        let welcome = [("conveyor.type", "welcome")];
        let first_id = self
            .sns
            .publish()
            .topic_arn(&self.topic)
            .message(r#"{"user_id": 1}"#)
            .subject("Welcome")
            .message_attributes("conveyor.type", string_attribute("welcome"))
            .send()
            .await?
            .message_id
            .context("no SNS message id")?;
        self.publish(&self.raw_topic, r#"{"user_id": 2}"#, &welcome)
            .await?;
        let keyed = [("conveyor.type", "welcome"), ("conveyor.key", "welcome:user:3")];
        self.publish(&self.topic, r#"{"user_id": 3}"#, &keyed).await?;

        let put = self
            .events
            .put_events()
            .entries(
                aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .source(&self.source)
                    .detail_type("Order Placed")
                    .detail(r#"{"order": 7}"#)
                    .build(),
            )
            .send()
            .await?;
        let event_id = put.entries()[0].event_id.clone().context("no event id")?;

        let structured = json!({
            "specversion": "1.0", "type": ORDER_CREATED, "source": "/orders", "id": "ce-1",
            "datacontenttype": "application/json", "data": {"order": 8}
        });
        self.publish(&self.topic, &structured.to_string(), &[]).await?;
        let binary = [
            ("ce_specversion", "1.0"),
            ("ce_type", ORDER_CREATED),
            ("ce_source", "/orders"),
            ("ce_id", "ce-2"),
        ];
        self.publish(&self.raw_topic, r#"{"order": 9}"#, &binary).await?;

        for (bucket, key) in [(&self.bucket, "photos/a b.jpg"), (&self.via_sns_bucket, "c.jpg")] {
            self.s3
                .put_object()
                .bucket(bucket)
                .key(key)
                .body(b"jpeg".to_vec().into())
                .send()
                .await?;
        }

        // Malformed: a Conveyor job whose body does not decode, and an event without detail-type.
        self.publish(&self.topic, r#"{"user_id": "one"}"#, &welcome)
            .await?;
        let no_detail_type = json!({
            "version": "0", "id": "e-bad", "source": self.source, "account": "000000000000",
            "time": "2026-12-05T00:00:00Z", "region": "us-east-1", "resources": [], "detail": {}
        });
        self.publish(&self.topic, &no_detail_type.to_string(), &[])
            .await?;

        let sns = |subject: &str| format!("sns {} subject={subject} signed=true", self.topic);
        let mut expected = vec![
            Seen {
                handler: "welcome",
                job: "1".into(),
                key: Some(format!("sns:{first_id}")),
                envelopes: vec![sns("Welcome")],
            },
            Seen {
                handler: "welcome",
                job: "2".into(),
                key: None,
                envelopes: vec![],
            },
            Seen {
                handler: "welcome",
                job: "3".into(),
                key: Some("welcome:user:3".into()),
                envelopes: vec![sns("-")],
            },
            Seen {
                handler: "place_order",
                job: r#"{"order":7}"#.into(),
                key: Some(format!("eventbridge:{event_id}")),
                envelopes: vec![format!("eventbridge {event_id} {} Order Placed", self.source)],
            },
            Seen {
                handler: "order_created",
                job: r#"{"order":8}"#.into(),
                key: Some("cloudevents:/orders ce-1".into()),
                envelopes: vec![sns("-"), format!("cloudevent {ORDER_CREATED} ce-1")],
            },
            Seen {
                handler: "order_created",
                job: r#"{"order":9}"#.into(),
                key: Some("cloudevents:/orders ce-2".into()),
                envelopes: vec![format!("cloudevent {ORDER_CREATED} ce-2")],
            },
        ];
        expected.sort();
        let reasons = vec!["welcome", "no detail-type"];
        Ok((expected, reasons))
    }

    /// The `conveyor.failure` reasons of every message in the DLQ (read without deleting).
    async fn dead_letter_reasons(&self) -> Vec<String> {
        let url = self.queue.dlq_url.clone().unwrap();
        let output = self
            .sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
        output
            .messages()
            .iter()
            .map(|message| {
                let failure = message
                    .message_attributes()
                    .and_then(|attributes| attributes.get(FAILURE_ATTRIBUTE))
                    .and_then(|value| value.string_value())
                    .unwrap_or("no failure attribute");
                let failure: Value = serde_json::from_str(failure).unwrap_or(Value::Null);
                failure["error"].as_str().unwrap_or("").to_owned()
            })
            .collect()
    }

    /// Waits until every expected job ran, the DLQ holds the two malformed messages and the queue is
    /// empty (the two S3 test events acknowledged); then checks what ran and why the DLQ has what it has.
    async fn settled(&self, log: &Log, expected: &[Seen], reasons: &[&str]) -> anyhow::Result<()> {
        let s3_jobs = 2;
        let dlq = self.queue.dlq_url.clone().unwrap();
        wait_until(TIMEOUT, Duration::from_millis(200), async || {
            // Not held across the awaits: the handlers record on this runtime's thread.
            let seen = log.lock().unwrap().len();
            seen >= expected.len() + s3_jobs
                && depth(&self.sqs, &dlq).await == reasons.len()
                && depth(&self.sqs, &self.queue.url).await == 0
        })
        .await
        .with_context(|| format!("not settled; the handlers saw {:#?}", log.lock().unwrap()))?;
        let mut seen = log.lock().unwrap().clone();
        let s3: Vec<Seen> = seen
            .iter()
            .filter(|seen| seen.handler == "thumbnail")
            .cloned()
            .collect();
        seen.retain(|seen| seen.handler != "thumbnail");
        seen.sort();
        assert_eq!(seen, expected);
        self.check_s3(&s3);

        let dead = self.dead_letter_reasons().await;
        assert_eq!(dead.len(), reasons.len(), "{dead:?}");
        for reason in reasons {
            assert!(
                dead.iter().any(|dead| dead.contains(reason)),
                "no DLQ message says {reason:?}: {dead:?}"
            );
        }
        Ok(())
    }

    /// The two objects' notifications, one straight from S3 and one through SNS, each run once and
    /// keyed by its object (the sequencer is S3's).
    fn check_s3(&self, s3: &[Seen]) {
        assert_eq!(s3.len(), 2, "{s3:#?}");
        let direct = s3.iter().find(|seen| seen.envelopes.len() == 1).unwrap();
        assert_eq!(
            direct.job,
            format!("ObjectCreated:Put {}/photos/a b.jpg", self.bucket)
        );
        assert!(
            direct
                .key
                .as_deref()
                .is_some_and(|key| key.starts_with(&format!("s3:{}/photos/a b.jpg@", self.bucket))),
            "{direct:?}"
        );
        assert_eq!(direct.envelopes, vec!["s3 1 record(s)".to_owned()]);
        let via_sns = s3.iter().find(|seen| seen.envelopes.len() == 2).unwrap();
        assert_eq!(
            via_sns.job,
            format!("ObjectCreated:Put {}/c.jpg", self.via_sns_bucket)
        );
        assert!(via_sns.envelopes[0].starts_with(&format!("sns {} ", self.topic)));
        assert_eq!(via_sns.envelopes[1], "s3 1 record(s)");
    }
}

#[tokio::test]
async fn aws_events_run_unwrapped_in_the_worker() -> anyhow::Result<()> {
    let wiring = wire("events-worker").await?;
    let (expected, reasons) = wiring.send_all().await?;
    let log: Log = Arc::default();
    let (shutdown, running) = start_worker(&wiring.sqs, &wiring.queue.url, wiring.router(&log)).await?;
    let settled = wiring.settled(&log, &expected, &reasons).await;
    shutdown.cancel();
    running.await??;
    settled
}

#[tokio::test]
async fn aws_events_run_unwrapped_in_the_lambda_adapter() -> anyhow::Result<()> {
    let wiring = wire("events-lambda").await?;
    let (expected, reasons) = wiring.send_all().await?;
    let log: Log = Arc::default();
    let processor = BatchProcessor::new(
        Pipeline::new(wiring.router(&log)),
        LambdaConfig::default(),
        Arc::new(SqsQueues::new(wiring.sqs.clone())),
    )
    .without_metrics();
    let queue = SqsQueue::connect(wiring.sqs.clone(), &wiring.queue.url).await?;
    let stop = CancellationToken::new();
    let mapping = event_source_mapping(processor, queue, wiring.queue.arn.clone(), stop.clone());
    let mapping = tokio::spawn(mapping);
    let settled = wiring.settled(&log, &expected, &reasons).await;
    stop.cancel();
    mapping.await??;
    settled
}

/// The example application's `bootstrap` under `conveyor lambda run` (another process, the runner
/// playing the event source mapping): a `welcome_email` job published to SNS, an EventBridge billing
/// event, an S3 upload (and both buckets' test events), a CloudEvent through SNS, and a billing event
/// whose detail does not decode. The example's outbox file says what each handler did.
#[tokio::test]
async fn aws_events_run_in_the_example_bootstrap() -> anyhow::Result<()> {
    use conveyor_examples::jobs::events::{BILLING_SOURCE, INVOICE_PAID, USER_SIGNED_UP};
    let wiring = wire_for("events-bootstrap", BILLING_SOURCE).await?;
    let welcome = r#"{"user_id": 41, "email": "ada@example.com", "name": "Ada"}"#;
    let sns_id = wiring
        .publish(&wiring.topic, welcome, &[("conveyor.type", "welcome_email")])
        .await?;
    let put_event = async |detail: &str| -> anyhow::Result<String> {
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .source(BILLING_SOURCE)
            .detail_type(INVOICE_PAID)
            .detail(detail)
            .build();
        let put = wiring.events.put_events().entries(entry).send().await?;
        put.entries()[0].event_id.clone().context("no event id")
    };
    let paid = put_event(r#"{"invoice_id": "inv-1", "amount_cents": 1200}"#).await?;
    put_event(r#"{"amount_cents": 5}"#).await?;
    wiring
        .s3
        .put_object()
        .bucket(&wiring.bucket)
        .key("uploads/contacts.csv")
        .body(b"email\nada@example.com\n".to_vec().into())
        .send()
        .await?;
    let signed_up = json!({
        "specversion": "1.0", "type": USER_SIGNED_UP, "source": "/identity", "id": "ce-41",
        "datacontenttype": "application/json", "data": {"user_id": 41}
    });
    wiring.publish(&wiring.topic, &signed_up.to_string(), &[]).await?;
    // SNS, two billing events, the upload and both buckets' test events (one through SNS), the
    // CloudEvent: all delivered before the runner starts, so `--until-empty` cannot stop early.
    let delivered = 7;
    wait_until(TIMEOUT, Duration::from_millis(200), async || {
        depth(&wiring.sqs, &wiring.queue.url).await == delivered
    })
    .await
    .context("the services did not deliver the 7 messages")?;

    let emulator = emulator().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "events-bootstrap").await?;
    let outbox = conveyor_e2e::outbox_path("events-bootstrap");
    let mut env = conveyor_e2e::app_env(&table, &outbox);
    env.retain(|(name, _)| name != "AWS_ENDPOINT_URL_SQS");
    env.push(("AWS_ENDPOINT_URL_SQS".to_owned(), emulator.endpoint()));
    let output = conveyor_e2e::lambda_run_until_empty(&wiring.queue.url, &env, TIMEOUT).await?;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();

    let mut effects: Vec<String> = conveyor_examples::outbox::Outbox::read_all(&outbox)?
        .iter()
        .map(|effect| match effect["effect"].as_str().unwrap_or_default() {
            "email_sent" => format!("email_sent to_user={}", effect["to_user"]),
            "payment_recorded" => format!(
                "payment_recorded {} {} event={} key={}",
                effect["invoice_id"], effect["amount_cents"], effect["event_id"], effect["key"]
            ),
            "upload_indexed" => format!(
                "upload_indexed {} {}/{} size={}",
                effect["event"], effect["bucket"], effect["object"], effect["size"]
            ),
            "onboarding_started" => format!(
                "onboarding_started user={} {} key={}",
                effect["user_id"], effect["cloud_event"], effect["key"]
            ),
            other => format!("unexpected effect {other}: {effect}"),
        })
        .collect();
    effects.sort();
    let mut expected = vec![
        "email_sent to_user=41".to_owned(),
        format!(r#"payment_recorded "inv-1" 1200 event="{paid}" key="conveyor:record_payment#eventbridge:{paid}""#),
        format!(
            r#"upload_indexed "ObjectCreated:Put" "{}"/"uploads/contacts.csv" size=22"#,
            wiring.bucket
        ),
        r#"onboarding_started user=41 "/identity ce-41" key="conveyor:start_onboarding#cloudevents:/identity ce-41""#
            .to_owned(),
    ];
    expected.sort();
    assert_eq!(
        effects, expected,
        "SNS message {sns_id}; the runner printed:\n{printed}"
    );

    let dead = wiring.dead_letter_reasons().await;
    assert_eq!(
        dead.len(),
        1,
        "only the undecodable billing event: {dead:?}\n{printed}"
    );
    assert!(
        dead[0].contains("invoice_id"),
        "the reason names the missing field: {dead:?}"
    );
    assert_eq!(depth(&wiring.sqs, &wiring.queue.url).await, 0, "{printed}");
    Ok(())
}

/// Messages in the queue at `url`, visible or in flight.
async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> usize {
    let Ok(output) = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
    else {
        return usize::MAX;
    };
    output
        .attributes()
        .map(|attributes| {
            attributes
                .values()
                .filter_map(|count| count.parse::<usize>().ok())
                .sum()
        })
        .unwrap_or(usize::MAX)
}

/// A worker consuming `url` with `router`, until its token is cancelled.
async fn start_worker(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    router: Router,
) -> anyhow::Result<(
    CancellationToken,
    tokio::task::JoinHandle<Result<conveyor_worker::WorkerReport, conveyor_worker::WorkerError>>,
)> {
    let queue = Arc::new(SqsQueue::connect(sqs.clone(), url).await?);
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(url)])
        .with_listen_addr(None)
        .with_drain_deadline(Some(Duration::from_secs(10)));
    let worker = Worker::new(config, Pipeline::new(router), vec![queue as Arc<dyn Queue>])?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    Ok((shutdown, running))
}

/// The event source mapping: receive, invoke, delete what the response does not list as failed, until
/// `stop`.
async fn event_source_mapping(
    processor: BatchProcessor,
    queue: SqsQueue,
    arn: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    while !stop.is_cancelled() {
        let messages = queue.receive(10, Duration::from_secs(1)).await?;
        if messages.is_empty() {
            continue;
        }
        let mut event = SqsEvent::default();
        event.records = messages.iter().map(|message| to_record(message, &arn)).collect();
        let response = processor
            .process_batch(event, Instant::now() + Duration::from_secs(30))
            .await
            .map_err(|error| anyhow::anyhow!("invocation failed: {error:?}"))?;
        let failed: Vec<String> = response
            .batch_item_failures
            .iter()
            .map(|failure| failure.item_identifier.clone())
            .collect();
        let done: Vec<_> = messages
            .iter()
            .filter(|message| !failed.contains(&message.id))
            .map(|message| message.receipt_handle.clone())
            .collect();
        queue.delete_batch(&done).await?;
    }
    Ok(())
}
