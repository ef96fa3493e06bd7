//! SNS subscription confirmations end to end, on this file's LocalStack.
//!
//! LocalStack 4.8.1 confirms an SQS subscription at once, even one across accounts (measured: a topic
//! of account 111111111111 subscribing a queue of 000000000000 is `PendingConfirmation: false` at once
//! and puts nothing on the queue), and sends `SubscriptionConfirmation` and `UnsubscribeConfirmation`
//! only to HTTP(S) endpoints. So an HTTP endpoint of this test receives the real ones (LocalStack's
//! bodies, with the token it issued), and the test puts each on two queues, as SNS puts one on a queue
//! that another account's topic subscribes. The Lambda adapter without `Router::sns_subscription`
//! acknowledges both kinds, runs nothing and leaves the subscription pending; the worker with the
//! route hands them to a handler that confirms with `ConfirmSubscription` and the token it was given
//! (LocalStack accepts only the token it issued for that subscription).

use super::*;
use conveyor_core::events::{ConfirmationKind, SubscriptionConfirmation};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An HTTP endpoint that keeps the body of every POST it receives.
struct Endpoint {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl Endpoint {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/", listener.local_addr()?);
        let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = Arc::clone(&bodies);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    if let Ok(body) = read_post(stream).await {
                        kept.lock().unwrap().push(body);
                    }
                });
            }
        });
        Ok(Self { url, bodies })
    }

    /// The first body SNS sent of this `Type`.
    async fn received(&self, kind: &str) -> anyhow::Result<String> {
        let of_kind = || {
            self.bodies
                .lock()
                .unwrap()
                .iter()
                .find(|body| serde_json::from_str::<Value>(body).is_ok_and(|body| body["Type"] == kind))
                .cloned()
        };
        wait_until(TIMEOUT, Duration::from_millis(100), async || of_kind().is_some())
            .await
            .with_context(|| format!("LocalStack sent no {kind} to the endpoint"))?;
        of_kind().context("gone")
    }
}

/// One POST's body; answers 200.
async fn read_post(mut stream: tokio::net::TcpStream) -> anyhow::Result<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "closed before the headers ended");
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .context("no content-length")?
        .trim()
        .parse()?;
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "closed before the body ended");
        buffer.extend_from_slice(&chunk[..read]);
    }
    stream
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .await?;
    Ok(String::from_utf8(buffer[head_end..head_end + length].to_vec())?)
}

/// Confirms subscriptions to `topic` with SNS's `ConfirmSubscription`; records every confirmation it
/// is given.
struct ConfirmWithSns {
    sns: aws_sdk_sns::Client,
    topic: String,
    seen: Arc<Mutex<Vec<ConfirmationKind>>>,
}

impl Handler for ConfirmWithSns {
    type Job = SubscriptionConfirmation;
    type Output = ();
    const JOB_TYPE: &'static str = "sns_subscription";

    async fn handle(&self, job: SubscriptionConfirmation, _ctx: Context) -> Result<(), HandlerError> {
        self.seen.lock().unwrap().push(job.kind);
        if job.kind != ConfirmationKind::Subscribe || job.topic_arn != self.topic {
            return Ok(());
        }
        self.sns
            .confirm_subscription()
            .topic_arn(&job.topic_arn)
            .token(&job.token)
            .send()
            .await
            .map_err(|error| HandlerError::retryable(format!("ConfirmSubscription: {error:?}")))?;
        Ok(())
    }
}

async fn pending(sns: &aws_sdk_sns::Client, subscription: &str) -> anyhow::Result<String> {
    let attributes = sns
        .get_subscription_attributes()
        .subscription_arn(subscription)
        .send()
        .await?;
    attributes
        .attributes()
        .and_then(|attributes| attributes.get("PendingConfirmation"))
        .cloned()
        .context("no PendingConfirmation")
}

/// Puts `body` on `queue` as SNS would, then waits until the queue is empty.
async fn delivered(sqs: &aws_sdk_sqs::Client, queue: &TestQueue, body: &str) -> anyhow::Result<()> {
    sqs.send_message()
        .queue_url(&queue.url)
        .message_body(body)
        .send()
        .await?;
    wait_until(TIMEOUT, Duration::from_millis(100), async || {
        depth(sqs, &queue.url).await == 0
    })
    .await
    .with_context(|| format!("{} never emptied", queue.url))
}

#[tokio::test]
async fn sns_confirmations_are_acknowledged_by_default_and_confirmed_by_their_route() -> anyhow::Result<()> {
    let emulator = emulator().await;
    let sqs = emulator.sqs_client();
    let sns = aws_sdk_sns::Client::new(&sdk_config(&emulator.endpoint()));
    let spec = |name: &str| {
        QueueSpec::standard(name)
            .visibility_timeout_secs(30)
            .max_receive_count(3)
    };
    let lambda_queue = localstack::create_queue(&sqs, &spec("confirm-lambda")).await?;
    let worker_queue = localstack::create_queue(&sqs, &spec("confirm-worker")).await?;

    let endpoint = Endpoint::start().await?;
    let topic = sns
        .create_topic()
        .name(unique_name("confirm-topic"))
        .send()
        .await?
        .topic_arn
        .context("no topic ARN")?;
    let subscription = sns
        .subscribe()
        .topic_arn(&topic)
        .protocol("http")
        .endpoint(&endpoint.url)
        .return_subscription_arn(true)
        .send()
        .await?
        .subscription_arn
        .context("no subscription ARN")?;
    let subscribe = endpoint.received("SubscriptionConfirmation").await?;
    assert_eq!(pending(&sns, &subscription).await?, "true");

    // The Lambda adapter without the route: a default route that would take any plain body.
    let plain: Log = Arc::default();
    let processor = BatchProcessor::new(
        Pipeline::new(Router::new().default_route(PlaceOrder(Arc::clone(&plain)))),
        LambdaConfig::default(),
        Arc::new(SqsQueues::new(sqs.clone())),
    )
    .without_metrics();
    let stop = CancellationToken::new();
    let mapping = tokio::spawn(event_source_mapping(
        processor,
        SqsQueue::connect(sqs.clone(), &lambda_queue.url).await?,
        lambda_queue.arn.clone(),
        stop.clone(),
    ));
    // The worker with the route.
    let seen = Arc::default();
    let confirm = ConfirmWithSns {
        sns: sns.clone(),
        topic: topic.clone(),
        seen: Arc::clone(&seen),
    };
    let (shutdown, running) =
        start_worker(&sqs, &worker_queue.url, Router::new().sns_subscription(confirm)).await?;

    delivered(&sqs, &lambda_queue, &subscribe).await?;
    assert_eq!(
        pending(&sns, &subscription).await?,
        "true",
        "acknowledged without confirming"
    );
    delivered(&sqs, &worker_queue, &subscribe).await?;
    assert_eq!(
        pending(&sns, &subscription).await?,
        "false",
        "confirmed by the handler"
    );

    sns.unsubscribe().subscription_arn(&subscription).send().await?;
    let unsubscribe = endpoint.received("UnsubscribeConfirmation").await?;
    delivered(&sqs, &lambda_queue, &unsubscribe).await?;
    delivered(&sqs, &worker_queue, &unsubscribe).await?;

    stop.cancel();
    mapping.await??;
    shutdown.cancel();
    running.await??;
    assert!(
        plain.lock().unwrap().is_empty(),
        "no confirmation reached the default route"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [ConfirmationKind::Subscribe, ConfirmationKind::Unsubscribe]
    );
    for queue in [&lambda_queue, &worker_queue] {
        let dlq = queue.dlq_url.clone().unwrap();
        assert_eq!(
            depth(&sqs, &dlq).await,
            0,
            "nothing dead-lettered from {}",
            queue.url
        );
    }
    Ok(())
}
