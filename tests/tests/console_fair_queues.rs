//! The console's fair-queue view end to end, on a moto server of this file's own (`OwnMoto`, SQS and
//! CloudWatch on one port). SQS publishes the fair-queue metrics to CloudWatch only and no emulator
//! computes them, so the test puts datapoints in namespace `AWS/SQS` for one standard queue (as SQS
//! would) and reads the queues page through the console's HTTP server, whose `GetMetricData` is real.
//!
//! Why moto and not LocalStack: `aws-sdk-cloudwatch` speaks Smithy RPC v2 CBOR since 1.102, and
//! LocalStack 4.8.1 (botocore 1.40.30) serves CloudWatch in the `query` protocol only ("Missing Action in
//! request for query-protocol service"); moto 5.2.6 (botocore 1.44.18) answers the current SDK.
//!
//! Then the failures an operator meets: CloudWatch denying the console's role (moto's IAM checks on, a
//! user allowed `sqs:*` only) and CloudWatch not answering. Either way the queue list is there, and the
//! page says which it is: a permission to grant, or an outage to wait out.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum};
use conveyor_console::{Console, ConsoleConfig};
use conveyor_core::metric_names::FAIR_QUEUE_METRICS;
use conveyor_testing::localstack::{
    MotoUser, OwnMoto, QueueSpec, TestQueue, create_queue, dynamodb_client_at,
};
use conveyor_testing::{Fault, Faults, Rule};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";

/// A CloudWatch client for `endpoint`, signing with this key pair, its requests going through `faults`
/// (which counts them by operation, and can hold them up).
fn cloudwatch_client(
    endpoint: &str,
    access_key_id: &str,
    secret: &str,
    faults: &Faults,
) -> aws_sdk_cloudwatch::Client {
    let config = aws_sdk_cloudwatch::Config::builder()
        .http_client(faults.http_client())
        .behavior_version(aws_sdk_cloudwatch::config::BehaviorVersion::latest())
        .region(aws_sdk_cloudwatch::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_cloudwatch::config::Credentials::new(
            access_key_id,
            secret,
            None,
            None,
            "test",
        ))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_cloudwatch::Client::from_conf(config)
}

/// Serves a console showing `queues` with these clients on a loopback port.
async fn serve(
    queues: &[&TestQueue],
    sqs: aws_sdk_sqs::Client,
    cloudwatch: aws_sdk_cloudwatch::Client,
) -> (SocketAddr, Console, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ConsoleConfig::default()
        .with_listen(addr)
        .with_token(Some(TOKEN.to_owned()))
        .with_queues(queues.iter().map(|queue| queue.url.parse().unwrap()).collect());
    // The job lookup is not on the queues page: a DynamoDB client that reaches nothing.
    let console = Console::new(config, sqs, dynamodb_client_at("http://127.0.0.1:9"))
        .await
        .unwrap()
        .with_cloudwatch(cloudwatch);
    let stop = CancellationToken::new();
    tokio::spawn(console.clone().serve(listener, stop.clone()));
    (addr, console, stop)
}

/// The HTML at `path` of the console on `addr`.
async fn page(addr: SocketAddr, path: &str) -> String {
    let response = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{path}: {}", response.status());
    response.text().await.unwrap()
}

/// The part of `html` after the element with this `id`, up to the end of its table.
fn table<'a>(html: &'a str, id: &str) -> &'a str {
    let after = html
        .split(&format!("id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no #{id} on the page:\n{html}"));
    after.split("</table>").next().unwrap_or(after)
}

/// The row of `table` for `queue`.
fn row<'a>(table: &'a str, queue: &str) -> &'a str {
    table
        .split("<tr")
        .find(|row| row.contains(&format!("data-queue=\"{queue}\"")))
        .unwrap_or_else(|| panic!("no row for {queue}:\n{table}"))
}

#[tokio::test]
async fn the_queues_page_shows_a_fair_queues_noisy_tenants_and_quiet_backlog() {
    let moto = OwnMoto::start().await.unwrap();
    let sqs = moto.sqs_client();
    let fair = create_queue(&sqs, &QueueSpec::standard("fair")).await.unwrap();
    let plain = create_queue(&sqs, &QueueSpec::standard("plain")).await.unwrap();
    let cloudwatch = cloudwatch_client(&moto.endpoint(), "test", "test", &Faults::new(0));
    // What SQS publishes for a fair queue: 2 noisy tenants, 7 quiet messages visible, 3 in flight, 0
    // delayed, the oldest quiet one 41 s old.
    let mut put = cloudwatch.put_metric_data().namespace("AWS/SQS");
    for (metric, value) in FAIR_QUEUE_METRICS.iter().zip([2.0, 7.0, 3.0, 0.0, 41.0]) {
        put = put.metric_data(
            MetricDatum::builder()
                .metric_name(*metric)
                .dimensions(Dimension::builder().name("QueueName").value(&fair.name).build())
                .value(value)
                .timestamp(std::time::SystemTime::now().into())
                .build(),
        );
    }
    put.send().await.unwrap();

    let faults = Faults::new(0);
    let console_cloudwatch = cloudwatch_client(&moto.endpoint(), "test", "test", &faults);
    let (addr, _console, stop) = serve(&[&fair, &plain], sqs, console_cloudwatch).await;
    let html = page(addr, "/").await;
    let fair_queues = table(&html, "fair-queues");
    let fair_row = row(fair_queues, &fair.name);
    for value in [">2<", ">7<", ">3<", ">0<", ">41<"] {
        assert!(fair_row.contains(value), "{value} in {fair_row}");
    }
    assert!(
        !fair_queues.contains(&plain.name),
        "a queue without datapoints is left out: {fair_queues}"
    );
    // Both queues are still listed above, from SQS.
    let queues = table(&html, "queues");
    row(queues, &fair.name);
    row(queues, &plain.name);
    assert_eq!(
        faults.calls("GetMetricData"),
        1,
        "one GetMetricData for both queues"
    );
    // A second refresh within the minute reuses the read, and still shows it.
    let live = page(addr, "/live").await;
    assert_eq!(
        faults.calls("GetMetricData"),
        1,
        "the second refresh asked CloudWatch again"
    );
    assert!(
        row(table(&live, "fair-queues"), &fair.name).contains(">41<"),
        "{live}"
    );
    stop.cancel();
}

/// The queues page of a console over `queue` whose CloudWatch fails as `cloudwatch_at` and `faults`
/// make it, signing as `operator`: the queue is listed, and the fair-queue view is an error. Returns the
/// error's element (from its `data-cause`) and how long the page took.
async fn fair_queue_error(
    moto: &OwnMoto,
    queue: &TestQueue,
    operator: &MotoUser,
    cloudwatch_at: &str,
    faults: &Faults,
) -> (String, Duration) {
    let cloudwatch = cloudwatch_client(
        cloudwatch_at,
        &operator.access_key_id,
        &operator.secret_access_key,
        faults,
    );
    let (addr, _console, stop) = serve(&[queue], moto.sqs_client_as(operator), cloudwatch).await;
    let started = Instant::now();
    let html = page(addr, "/").await;
    let took = started.elapsed();
    stop.cancel();
    row(table(&html, "queues"), &queue.name);
    assert!(
        !html.contains("id=\"fair-queues\""),
        "no table without a read: {html}"
    );
    (table(&html, "fair-queues-error").to_owned(), took)
}

#[tokio::test]
async fn a_denied_or_silent_cloudwatch_is_named_and_the_queues_stay() {
    let moto = OwnMoto::start().await.unwrap();
    let queue = create_queue(&moto.sqs_client(), &QueueSpec::standard("fair"))
        .await
        .unwrap();
    // The console's role as a mistaken policy would leave it: every SQS action, no CloudWatch.
    let operator = moto.create_user("console-operator", &["sqs:*"]).await.unwrap();
    moto.enforce_iam().await.unwrap();

    let (denied, _) = fair_queue_error(&moto, &queue, &operator, &moto.endpoint(), &Faults::new(0)).await;
    assert!(denied.starts_with(" data-cause=\"denied\""), "{denied}");
    assert!(denied.contains("cloudwatch:GetMetricData"), "{denied}");
    // moto's own words, from an error body in XML that the CBOR client cannot read.
    assert!(denied.contains("is not authorized to perform"), "{denied}");

    // Nothing listens on the port CloudWatch is said to be on: an outage, not a permission.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (silent, _) = fair_queue_error(
        &moto,
        &queue,
        &operator,
        &format!("http://{closed}"),
        &Faults::new(0),
    )
    .await;
    assert!(silent.starts_with(" data-cause=\"unavailable\""), "{silent}");
    assert!(silent.contains("CloudWatch is unavailable"), "{silent}");
    assert!(
        !silent.contains("GetMetricData"),
        "an outage is not a permission problem: {silent}"
    );

    // CloudWatch takes the request and never answers: the console's own deadline (5 s) ends the read,
    // and the page comes with the queue and says so.
    let faults = Faults::new(0);
    faults.add(Rule::new(Fault::Hang).on("GetMetricData"));
    let (hung, took) = fair_queue_error(&moto, &queue, &operator, &moto.endpoint(), &faults).await;
    assert!(hung.starts_with(" data-cause=\"unavailable\""), "{hung}");
    assert!(took < Duration::from_secs(10), "the page took {took:?}");
    assert!(
        faults.calls("GetMetricData") >= 1,
        "the read went through the hang"
    );
}
