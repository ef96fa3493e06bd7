//! An SQS client answered in this process: what a handler's producer sends is kept for the test to
//! read, and nothing leaves the machine.
//!
//! It speaks SQS's JSON protocol to the real `aws-sdk-sqs` client, so the code under test builds its
//! requests exactly as in production (the producer's batching, delays, attributes, FIFO fields). It
//! answers the calls a producer makes: `SendMessage`, `SendMessageBatch`, `GetQueueAttributes` (SQS's
//! defaults) and `GetQueueUrl`; any other call gets an `UnsupportedOperation` error naming it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use conveyor_core::message::{IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The account in the queue URLs [`MemorySqs::queue_url`] makes.
const ACCOUNT: &str = "000000000000";

/// SQS's defaults for a new queue, answered to `GetQueueAttributes` (4 days' retention; 1 MiB
/// messages, the default and the maximum since August 2025).
const DEFAULT_ATTRIBUTES: [(&str, &str); 5] = [
    ("MessageRetentionPeriod", "345600"),
    ("MaximumMessageSize", "1048576"),
    ("VisibilityTimeout", "30"),
    ("DelaySeconds", "0"),
    ("ReceiveMessageWaitTimeSeconds", "0"),
];

/// One message a client of [`MemorySqs`] sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    /// The queue URL it was sent to.
    pub queue_url: String,
    /// The body as sent.
    pub body: String,
    /// String and number message attributes by name (Conveyor's `conveyor.*` ones included).
    pub attributes: BTreeMap<String, String>,
    /// `DelaySeconds`, when set.
    pub delay: Option<Duration>,
    /// `MessageGroupId` (FIFO queues).
    pub group_id: Option<String>,
    /// `MessageDeduplicationId` (FIFO queues).
    pub deduplication_id: Option<String>,
}

impl SentMessage {
    /// The job type Conveyor's producer set (`conveyor.type`).
    pub fn job_type(&self) -> Option<&str> {
        self.attributes.get(JOB_TYPE_ATTRIBUTE).map(String::as_str)
    }

    /// The producer's idempotency key (`conveyor.key`).
    pub fn key(&self) -> Option<&str> {
        self.attributes.get(IDEMPOTENCY_KEY_ATTRIBUTE).map(String::as_str)
    }

    /// The body decoded as a job; a body that is not a `T` is an error naming the field.
    pub fn job<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.body)
    }
}

/// An in-process SQS: hand [`MemorySqs::client`] to the code under test, then read
/// [`MemorySqs::sent`].
///
/// ```
/// use conveyor_sqs::{NewJob, Producer};
/// use conveyor_testing::kit::MemorySqs;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let sqs = MemorySqs::new();
/// let producer = Producer::new(sqs.client(), sqs.queue_url("emails"));
/// producer
///     .send(&NewJob::new("welcome_email", serde_json::json!({"user_id": 42})).key("user:42"))
///     .await
///     .unwrap();
/// let sent = sqs.sent_of_type("welcome_email");
/// assert_eq!(sent.len(), 1);
/// assert_eq!(sent[0].key(), Some("user:42"));
/// assert_eq!(sent[0].job::<serde_json::Value>().unwrap()["user_id"], 42);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemorySqs {
    sent: Arc<Mutex<Vec<SentMessage>>>,
}

impl MemorySqs {
    /// An SQS with nothing sent.
    pub fn new() -> Self {
        Self::default()
    }

    /// A queue URL of this SQS for the queue `name` (any URL works; this one looks like AWS's).
    pub fn queue_url(&self, name: &str) -> String {
        format!("https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/{name}")
    }

    /// An `aws-sdk-sqs` client answered by this SQS (no network, no credentials needed).
    pub fn client(&self) -> aws_sdk_sqs::Client {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "conveyor-testing"))
            .http_client(SharedHttpClient::new(self.clone()))
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// Every message sent so far, in order.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.lock().clone()
    }

    /// The messages sent so far whose job type is `job_type`, in order.
    pub fn sent_of_type(&self, job_type: &str) -> Vec<SentMessage> {
        self.lock()
            .iter()
            .filter(|message| message.job_type() == Some(job_type))
            .cloned()
            .collect()
    }

    /// Forgets what was sent.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SentMessage>> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers one request.
    fn answer(&self, operation: &str, request: &Value) -> (u16, Value) {
        let queue_url = request["QueueUrl"].as_str().unwrap_or_default();
        match operation {
            "SendMessage" => {
                let id = self.keep(queue_url, request);
                (
                    200,
                    json!({ "MessageId": id, "MD5OfMessageBody": MD5_PLACEHOLDER }),
                )
            }
            "SendMessageBatch" => {
                let entries = request["Entries"].as_array().cloned().unwrap_or_default();
                let successful: Vec<Value> = entries
                    .iter()
                    .map(|entry| {
                        let id = self.keep(queue_url, entry);
                        json!({ "Id": entry["Id"], "MessageId": id, "MD5OfMessageBody": MD5_PLACEHOLDER })
                    })
                    .collect();
                (200, json!({ "Successful": successful, "Failed": [] }))
            }
            "GetQueueAttributes" => {
                let attributes: BTreeMap<&str, &str> = DEFAULT_ATTRIBUTES.into_iter().collect();
                (200, json!({ "Attributes": attributes }))
            }
            "GetQueueUrl" => {
                let name = request["QueueName"].as_str().unwrap_or_default();
                (200, json!({ "QueueUrl": self.queue_url(name) }))
            }
            other => (
                400,
                json!({
                    "__type": "com.amazonaws.sqs#UnsupportedOperation",
                    "message": format!(
                        "conveyor-testing's MemorySqs answers SendMessage, SendMessageBatch, GetQueueAttributes \
                         and GetQueueUrl, not {other}: test this code against LocalStack (make local-aws)"
                    ),
                }),
            ),
        }
    }

    /// Keeps one sent message (a `SendMessage` request or a batch entry); returns its new id.
    fn keep(&self, queue_url: &str, entry: &Value) -> String {
        let attributes = entry["MessageAttributes"]
            .as_object()
            .map(|attributes| {
                attributes
                    .iter()
                    .filter_map(|(name, value)| {
                        Some((name.clone(), value["StringValue"].as_str()?.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let text = |field: &str| entry[field].as_str().map(str::to_owned);
        self.lock().push(SentMessage {
            queue_url: queue_url.to_owned(),
            body: text("MessageBody").unwrap_or_default(),
            attributes,
            delay: entry["DelaySeconds"].as_u64().map(Duration::from_secs),
            group_id: text("MessageGroupId"),
            deduplication_id: text("MessageDeduplicationId"),
        });
        uuid::Uuid::new_v4().to_string()
    }
}

/// The SDK does not check SQS's body digests; the field is required in the response's shape.
const MD5_PLACEHOLDER: &str = "00000000000000000000000000000000";

impl HttpClient for MemorySqs {
    fn http_connector(&self, _: &HttpConnectorSettings, _: &RuntimeComponents) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

impl HttpConnector for MemorySqs {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|target| target.rsplit_once('.'))
            .map_or_else(String::new, |(_, operation)| operation.to_owned());
        let body: Value = request
            .body()
            .bytes()
            .and_then(|bytes| serde_json::from_slice(bytes).ok())
            .unwrap_or(Value::Null);
        let (status, answer) = self.answer(&operation, &body);
        let status = match StatusCode::try_from(status) {
            Ok(status) => status,
            Err(error) => return HttpConnectorFuture::ready(Err(ConnectorError::other(error.into(), None))),
        };
        let failed = status.as_u16() != 200;
        let mut response = HttpResponse::new(status, SdkBody::from(answer.to_string()));
        response
            .headers_mut()
            .insert("content-type", "application/x-amz-json-1.0");
        if failed {
            response.headers_mut().insert(
                "x-amzn-query-error",
                "AWS.SimpleQueueService.UnsupportedOperation;Sender",
            );
        }
        HttpConnectorFuture::ready(Ok(response))
    }
}
