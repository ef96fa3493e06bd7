//! The console does only what the operator meant, against LocalStack and DynamoDB Local, with the
//! operator's own token and CSRF value (so only the server's own checks stand between a request and
//! the damage):
//!
//! - a malformed filter is refused naming its field and never widens an action (`older=-1` once
//!   deleted every dead letter);
//! - numbers past what a clock can count are answered with 400, not a dropped connection;
//! - a queue the console does not show gets one answer whether or not it exists, and no request
//!   naming it reaches SQS or DynamoDB (a test interceptor on the clients the console is given counts
//!   them);
//! - a dead letter's large-payload pointer into a bucket the console was not started with is shown as
//!   a pointer and never read; one into its bucket is read only up to its size limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use conveyor_console::{Console, ConsoleConfig};
use conveyor_core::port::{PayloadPointer, SIZE_ATTRIBUTE};
use conveyor_sqs::admin::{QueueRef, describe};
use conveyor_testing::MemoryPayloadStore;
use conveyor_testing::localstack::{self, QueueSpec, TestQueue};
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";

/// Counts the requests whose address or body names `needle` (a queue's name).
#[derive(Debug, Clone)]
struct Naming {
    needle: String,
    hits: Arc<AtomicU64>,
}

impl Naming {
    fn new(needle: &str) -> Self {
        Self {
            needle: needle.to_owned(),
            hits: Arc::default(),
        }
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Intercept for Naming {
    fn name(&self) -> &'static str {
        "TestNaming"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let body = request
            .body()
            .bytes()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        if request.uri().contains(&self.needle) || body.contains(&self.needle) {
            self.hits.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A console showing `queue` (by URL, resolved at start), with `config`'s other settings.
async fn serve(
    queue: &TestQueue,
    config: ConsoleConfig,
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    payloads: Option<Arc<MemoryPayloadStore>>,
    stop: &CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = config
        .with_listen(addr)
        .with_token(Some(TOKEN.to_owned()))
        .with_queues(vec![QueueRef::parse(&queue.url)?]);
    let mut console = Console::new(config, sqs, dynamodb).await?;
    if let Some(payloads) = payloads {
        console = console.with_payloads(payloads);
    }
    tokio::spawn(console.serve(listener, stop.child_token()));
    Ok(addr)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(StatusCode, String)> {
    let answer = http()
        .get(format!("http://{addr}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    Ok((answer.status(), answer.text().await?))
}

async fn post(addr: SocketAddr, path: &str, form: &[(&str, &str)]) -> anyhow::Result<(StatusCode, String)> {
    let answer = http()
        .post(format!("http://{addr}{path}"))
        .bearer_auth(TOKEN)
        .form(form)
        .send()
        .await?;
    Ok((answer.status(), answer.text().await?))
}

/// The messages in `url`: visible and in flight.
async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<u64> {
    let queue = describe(sqs, url).await?;
    Ok(queue.depth.visible + queue.depth.in_flight)
}

/// The page's problem text (`id="problem"`), its quotes unescaped.
fn problem_of(page: &str) -> String {
    page.split("id=\"problem\">")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_default()
        .replace("&quot;", "\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_filter_is_refused_and_deletes_nothing() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let queue =
        localstack::create_queue(&sqs, &QueueSpec::standard("console-filter").max_receive_count(3)).await?;
    let dlq = queue.dlq_url.clone().expect("a DLQ");
    for index in 0..4 {
        sqs.send_message()
            .queue_url(&dlq)
            .message_body(format!("{{\"n\":{index}}}"))
            .send()
            .await?;
    }
    let stop = CancellationToken::new();
    let addr = serve(
        &queue,
        ConsoleConfig::default(),
        sqs.clone(),
        localstack::dynamodb_client().await,
        None,
        &stop,
    )
    .await?;
    let page = format!("/dlq?queue={}", common::query(&queue.url));
    let (status, first) = get(addr, &page).await?;
    assert_eq!(status, StatusCode::OK, "{first}");
    let csrf = common::csrf_of(&first);
    let (status, _) = post(addr, "/dlq/peek", &[("csrf", &csrf), ("queue", &queue.url)]).await?;
    assert_eq!(status, StatusCode::SEE_OTHER);

    for (action, older) in [
        ("delete_filter", "-1"),
        ("delete_filter", "x"),
        ("redrive_filter", "-1"),
    ] {
        let (status, answer) = post(
            addr,
            "/dlq/act",
            &[
                ("csrf", &csrf),
                ("queue", &queue.url),
                ("action", action),
                ("older", older),
                ("confirm", "yes"),
            ],
        )
        .await?;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{action} older={older}: {answer}"
        );
        assert!(
            problem_of(&answer).contains("\"older\""),
            "the field is named: {answer}"
        );
    }
    assert_eq!(depth(&sqs, &dlq).await?, 4, "every dead letter is still there");

    // Numbers past what the clock counts: 400 naming the field, not a dropped connection.
    for field in ["newer", "older"] {
        let (status, answer) = get(addr, &format!("{page}&{field}=200000000000000000")).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {answer}");
        assert!(problem_of(&answer).contains(&format!("\"{field}\"")), "{answer}");
    }
    let (status, answer) = post(
        addr,
        "/dlq/peek",
        &[("csrf", &csrf), ("queue", &queue.url), ("max", "-5")],
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(problem_of(&answer).contains("\"max\""), "{answer}");
    // A filter that parses still works: nothing failed 100 minutes ago.
    let (status, answer) = get(addr, &format!("{page}&older=100")).await?;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.contains("No dead letters match."), "{answer}");
    stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_delays_are_answered_with_400_naming_the_field() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("console-numbers")).await?;
    let table = localstack::create_table(&dynamodb, "console-numbers").await?;
    let stop = CancellationToken::new();
    let config = ConsoleConfig::default()
        .with_job_types(vec!["report".to_owned()])
        .with_table(Some(table));
    let addr = serve(&queue, config, sqs.clone(), dynamodb, None, &stop).await?;
    let (_, form) = get(addr, "/send").await?;
    let csrf = common::csrf_of(&form);
    let (status, answer) = post(
        addr,
        "/send",
        &[
            ("csrf", &csrf),
            ("queue", &queue.url),
            ("job_type", "report"),
            ("payload", "{}"),
            ("delay_secs", "18446744073709551615"),
        ],
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer.contains("delay_secs"), "{answer}");
    assert_eq!(depth(&sqs, &queue.url).await?, 0, "nothing was sent");
    let (status, answer) = post(
        addr,
        "/delays/act",
        &[
            ("csrf", &csrf),
            ("queue", &queue.url),
            ("id", "some-timer"),
            ("action", "reschedule"),
            ("in_secs", "18446744073709551615"),
        ],
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(problem_of(&answer).contains("\"in_secs\""), "{answer}");
    stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unshown_queue_gets_one_answer_and_no_request_names_it() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let plain_sqs = localstack::sqs_client().await;
    let shown = localstack::create_queue(
        &plain_sqs,
        &QueueSpec::standard("console-shown").max_receive_count(3),
    )
    .await?;
    let other = localstack::create_queue(
        &plain_sqs,
        &QueueSpec::standard("console-other").max_receive_count(3),
    )
    .await?;
    let missing = other.url.replace("console-other", "console-never-made");
    let missing_name = missing.rsplit('/').next().unwrap_or_default().to_owned();
    let watch_other = Naming::new(&other.name);
    let watch_missing = Naming::new(&missing_name);
    let sqs = aws_sdk_sqs::Client::from_conf(
        plain_sqs
            .config()
            .to_builder()
            .interceptor(watch_other.clone())
            .interceptor(watch_missing.clone())
            .build(),
    );
    let plain_dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&plain_dynamodb, "console-confined").await?;
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        plain_dynamodb
            .config()
            .to_builder()
            .interceptor(watch_other.clone())
            .interceptor(watch_missing.clone())
            .build(),
    );
    let stop = CancellationToken::new();
    let config = ConsoleConfig::default().with_table(Some(table));
    let addr = serve(&shown, config, sqs, dynamodb, None, &stop).await?;
    let (_, first) = get(addr, &format!("/dlq?queue={}", common::query(&shown.url))).await?;
    let csrf = common::csrf_of(&first);

    let probes = |url: &str| {
        let query = common::query(url);
        let url = url.to_owned();
        let shown_url = shown.url.clone();
        let csrf = csrf.clone();
        async move {
            let mut answers = Vec::new();
            answers.push(get(addr, &format!("/dlq?queue={query}")).await?);
            answers.push(get(addr, &format!("/delays?queue={query}")).await?);
            answers.push(post(addr, "/dlq/peek", &[("csrf", &csrf), ("queue", &url)]).await?);
            answers.push(
                post(
                    addr,
                    "/delays/act",
                    &[
                        ("csrf", &csrf),
                        ("queue", &url),
                        ("id", "t"),
                        ("action", "cancel"),
                    ],
                )
                .await?,
            );
            // A redrive of a shown queue's DLQ to the unshown queue.
            answers.push(
                post(
                    addr,
                    "/dlq/act",
                    &[
                        ("csrf", &csrf),
                        ("queue", &shown_url),
                        ("action", "redrive_selected"),
                        ("id", "m-1"),
                        ("to_other", &url),
                    ],
                )
                .await?,
            );
            anyhow::Ok(answers)
        }
    };
    let existing = probes(&other.url).await?;
    let absent = probes(&missing).await?;
    for ((status, page), (absent_status, absent_page)) in existing.iter().zip(&absent) {
        assert_eq!(*status, StatusCode::BAD_REQUEST, "{page}");
        assert_eq!(
            (status, problem_of(page)),
            (absent_status, problem_of(absent_page)),
            "one answer whether or not the queue exists"
        );
        assert!(problem_of(page).contains(" show"), "{page}");
    }
    assert_eq!(watch_other.hits(), 0, "no request named the unshown queue");
    assert_eq!(
        watch_missing.hits(),
        0,
        "no request named the queue that does not exist"
    );
    stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_into_another_bucket_stays_a_pointer_and_reads_stop_at_the_limit() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let queue =
        localstack::create_queue(&sqs, &QueueSpec::standard("console-deputy").max_receive_count(3)).await?;
    let dlq = queue.dlq_url.clone().expect("a DLQ");
    let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
    store.put_now("secrets", "db.json", r#"{"password":"hunter2"}"#);
    store.put_now("payloads", "big.json", &format!("\"{}\"", "b".repeat(5000)));
    let mut ids = Vec::new();
    for pointer in [
        PayloadPointer::new("secrets", "db.json"),
        PayloadPointer::new("payloads", "big.json"),
    ] {
        let sent = sqs
            .send_message()
            .queue_url(&dlq)
            .message_body(pointer.to_body())
            .message_attributes(
                SIZE_ATTRIBUTE,
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("Number")
                    .string_value("5002")
                    .build()?,
            )
            .send()
            .await?;
        ids.push(sent.message_id.unwrap_or_default());
    }
    let stop = CancellationToken::new();
    let config = ConsoleConfig::default()
        .with_payload_buckets(vec!["payloads".to_owned()])
        .with_max_payload_bytes(1000);
    let addr = serve(
        &queue,
        config,
        sqs.clone(),
        localstack::dynamodb_client().await,
        Some(store.clone()),
        &stop,
    )
    .await?;
    let page = format!("/dlq?queue={}", common::query(&queue.url));
    let (_, first) = get(addr, &page).await?;
    let csrf = common::csrf_of(&first);
    let (status, _) = post(addr, "/dlq/peek", &[("csrf", &csrf), ("queue", &queue.url)]).await?;
    assert_eq!(status, StatusCode::SEE_OTHER);

    let (status, foreign) = get(addr, &format!("{page}&show={}&fetch=1", ids[0])).await?;
    assert_eq!(status, StatusCode::OK, "{foreign}");
    assert!(
        !foreign.contains("hunter2"),
        "the foreign object was not read: {foreign}"
    );
    assert!(
        foreign.contains("s3://secrets/db.json"),
        "shown as a pointer: {foreign}"
    );
    assert!(foreign.contains("id=\"payload-not-followed\""), "{foreign}");
    assert!(
        !foreign.contains("id=\"fetch-payload\""),
        "no link to fetch it: {foreign}"
    );

    let (status, big) = get(addr, &format!("{page}&show={}&fetch=1", ids[1])).await?;
    assert_eq!(status, StatusCode::OK, "{big}");
    assert!(big.contains("id=\"payload-error\""), "{big}");
    assert!(big.contains("larger than the 1000 bytes"), "{big}");
    assert!(!big.contains(&"b".repeat(1001)), "not shown past the limit");
    stop.cancel();
    Ok(())
}
