//! A dead letter whose body is a large payload's pointer (SQS Extended Client format): the page shows
//! the pointer and the object it names, and the payload itself only when asked, read from the store
//! without deleting it. The store is the in-memory double (S3's store passes the same conformance
//! suite in `conveyor-s3`); the queue is LocalStack's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use conveyor_console::{Console, ConsoleConfig};
use conveyor_sqs::admin::QueueRef;
use conveyor_sqs::{NewJob, Producer};
use conveyor_testing::MemoryPayloadStore;
use conveyor_testing::localstack::{self, QueueSpec};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";

/// The log lines written so far, as the CLI's `fmt` subscriber writes them (no colours).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs a `warn` subscriber writing here, for this test binary's one test.
    fn install() -> Self {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per test binary");
        captured
    }

    /// The one line holding `message`.
    #[track_caller]
    fn line_with(&self, message: &str) -> String {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        let lines: Vec<&str> = text.lines().filter(|line| line.contains(message)).collect();
        assert_eq!(lines.len(), 1, "one {message:?} line in:\n{text}");
        lines[0].to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_payloads_pointer_is_shown_and_its_payload_fetched_on_request() -> anyhow::Result<()> {
    let logs = Captured::install();
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

    // The message back to its queue, then the queue purged: each action on the record like each read.
    let redriven = http
        .post(format!("http://{addr}/dlq/act"))
        .bearer_auth(TOKEN)
        .form(&[
            ("csrf", csrf.as_str()),
            ("queue", queue.url.as_str()),
            ("action", "redrive_selected"),
            ("id", id.as_str()),
        ])
        .send()
        .await?;
    assert!(redriven.status().is_success(), "{}", redriven.status());
    let purged = http
        .post(format!("http://{addr}/queues/purge"))
        .bearer_auth(TOKEN)
        .form(&[
            ("csrf", csrf.as_str()),
            ("queue", queue.url.as_str()),
            ("confirm", "yes"),
        ])
        .send()
        .await?;
    assert!(purged.status().is_success(), "{}", purged.status());

    // The audit lines (issue 54): a body read or an action, at warn, with the role and the client's address.
    for message in [
        "console: peeked at dead letters",
        "console: a dead letter's payload was read",
        "console: redrive dead letters",
        "console: purge",
    ] {
        let line = logs.line_with(message);
        println!("{line}");
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains("role=\"operator\""), "{line}");
        assert!(line.contains("client=127.0.0.1:"), "{line}");
    }
    stop.cancel();
    Ok(())
}
