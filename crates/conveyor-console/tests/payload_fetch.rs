//! A dead letter whose body is a large payload's pointer (SQS Extended Client format): the page shows
//! the pointer and the object it names, and the payload itself only when asked, read from the store
//! without deleting it. The store is the in-memory double (S3's store passes the same conformance
//! suite in `conveyor-s3`); the queue is LocalStack's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use conveyor_console::{Console, ConsoleConfig};
use conveyor_sqs::admin::QueueRef;
use conveyor_sqs::{NewJob, Producer};
use conveyor_testing::MemoryPayloadStore;
use conveyor_testing::localstack::{self, QueueSpec};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_payloads_pointer_is_shown_and_its_payload_fetched_on_request() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let queue =
        localstack::create_queue(&sqs, &QueueSpec::standard("console-payload").max_receive_count(3)).await?;
    let dlq_url = queue.dlq_url.clone().expect("a DLQ");
    let store = Arc::new(MemoryPayloadStore::with_bucket("payloads"));
    let producer = Producer::new(sqs.clone(), &dlq_url)
        .with_large_payloads(store.clone(), "payloads")
        .with_payload_threshold(64 * 1024);
    let payload = json!({ "rows": "r".repeat(100 * 1024) });
    let id = producer.send(&NewJob::new("report", payload)).await?;
    assert_eq!(
        store.len("payloads"),
        1,
        "the body went to the store, a pointer to SQS"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = ConsoleConfig::default()
        .with_listen(addr)
        .with_token(Some(TOKEN.to_owned()))
        .with_queues(vec![QueueRef::parse(&queue.name)?])
        .with_payload_buckets(vec!["payloads".to_owned()]);
    let console = Console::new(config, sqs.clone(), localstack::dynamodb_client().await)
        .await?
        .with_payloads(store.clone());
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));

    let http = reqwest::Client::new();
    let page = format!("http://{addr}/dlq?queue={}", common::query(&queue.url));
    let page_of = |extra: String| {
        let http = http.clone();
        let url = format!("{page}{extra}");
        async move { http.get(url).bearer_auth(TOKEN).send().await?.text().await }
    };
    let first = page_of(String::new()).await?;
    let csrf = common::csrf_of(&first);
    let peeked = http
        .post(format!("http://{addr}/dlq/peek"))
        .bearer_auth(TOKEN)
        .form(&[("csrf", csrf.as_str()), ("queue", queue.url.as_str())])
        .send()
        .await?;
    assert!(peeked.status().is_success(), "{}", peeked.status());

    let shown = page_of(format!("&show={id}")).await?;
    assert!(
        shown.contains("Large payload"),
        "the pointer is described: {shown}"
    );
    assert!(shown.contains("payloads"), "the bucket is named: {shown}");
    assert!(shown.contains("id=\"fetch-payload\""), "a fetch link: {shown}");
    assert!(!shown.contains("id=\"payload\""), "not fetched unasked");

    let fetched = page_of(format!("&show={id}&fetch=1")).await?;
    let body = fetched
        .split("id=\"payload\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_default();
    assert!(
        body.contains(&"r".repeat(1000)),
        "the payload is shown: {}",
        &fetched[..fetched.len().min(2000)]
    );
    assert_eq!(store.len("payloads"), 1, "fetching deletes nothing");
    stop.cancel();
    Ok(())
}
