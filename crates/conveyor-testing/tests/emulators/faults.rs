//! The fault layer against LocalStack (SQS) and DynamoDB Local: each fault really happens, and the
//! adapters see what they would see from AWS. Clients carry the production deadlines and retries
//! (`conveyor_sqs::timeout_config`, `conveyor_dynamodb::timeout_config`), so the hang tests also prove
//! those deadlines end a stuck call. Timing bounds are loose on purpose (2-core machines).

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use conveyor_core::port::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, OutgoingMessage, Queue, QueueError, StoreError,
};
use conveyor_dynamodb::DynamoStore;
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{
    QueueSpec, create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client,
};
use conveyor_testing::{Fault, Faults, Rule, faulty_dynamodb_client, faulty_sqs_client, wait_for};
use tokio::time::Instant;

/// Slack on top of every deadline: scheduling on a busy 2-core machine, backoff jitter.
const SLACK: Duration = Duration::from_secs(5);
const DELAY: Duration = Duration::from_millis(1500);

/// A queue reached through a faulty client, and a plain client for checking what the server holds.
struct Sqs {
    faults: Faults,
    queue: SqsQueue,
    plain: aws_sdk_sqs::Client,
    url: String,
}

async fn sqs(prefix: &str, seed: u64) -> anyhow::Result<Sqs> {
    ensure_local_aws().await?;
    let plain = sqs_client().await;
    let created = create_queue(&plain, &QueueSpec::standard(prefix)).await?;
    let faults = Faults::new(seed);
    let queue = SqsQueue::connect(faulty_sqs_client(&faults).await, &created.url).await?;
    Ok(Sqs {
        faults,
        queue,
        plain,
        url: created.url,
    })
}

/// A store reached through a faulty client, and one through a plain client.
struct Dynamo {
    faults: Faults,
    store: DynamoStore,
    plain: DynamoStore,
}

async fn dynamo(prefix: &str, seed: u64) -> anyhow::Result<Dynamo> {
    ensure_local_aws().await?;
    let plain = dynamodb_client().await;
    let table = create_table(&plain, prefix).await?;
    let faults = Faults::new(seed);
    let store = DynamoStore::new(faulty_dynamodb_client(&faults).await, &table);
    Ok(Dynamo {
        faults,
        store,
        plain: DynamoStore::new(plain, &table),
    })
}

fn message(body: &str) -> OutgoingMessage {
    OutgoingMessage {
        body: body.to_owned(),
        ..OutgoingMessage::default()
    }
}

fn claim_request(key: &str) -> ClaimRequest {
    let now = SystemTime::now();
    ClaimRequest {
        key: key.to_owned(),
        lease_until: now + Duration::from_secs(60),
        expires_at: now + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

/// Every body in the queue, read through the plain client (waits until `expected` arrived).
async fn bodies(sqs: &Sqs, expected: usize) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    wait_for(Duration::from_secs(10), Duration::from_millis(50), async || {
        let output = sqs
            .plain
            .receive_message()
            .queue_url(&sqs.url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .send()
            .await
            .ok()?;
        seen.extend(
            output
                .messages()
                .iter()
                .filter_map(|m| m.body().map(str::to_owned)),
        );
        (seen.len() >= expected).then_some(())
    })
    .await
    .with_context(|| format!("expected {expected} messages, saw {seen:?}"))?;
    Ok(seen)
}

fn assert_between(elapsed: Duration, low: Duration, high: Duration, what: &str) {
    assert!(
        elapsed >= low && elapsed <= high,
        "{what} took {elapsed:?}, expected between {low:?} and {high:?}"
    );
}

#[tokio::test]
async fn a_delay_makes_the_call_slower_by_the_delay() -> anyhow::Result<()> {
    let (sqs, dynamo) = tokio::try_join!(sqs("faults-delay", 1), dynamo("faults-delay", 1))?;
    let send = sqs
        .faults
        .add(Rule::new(Fault::Delay(DELAY)).on("SendMessage").times(1));
    let put = dynamo
        .faults
        .add(Rule::new(Fault::Delay(DELAY)).on("UpdateItem").times(1));

    let sending = async {
        let start = Instant::now();
        sqs.queue.send(message("delayed")).await?;
        anyhow::Ok(start.elapsed())
    };
    let claiming = async {
        let start = Instant::now();
        let outcome = dynamo.store.claim(&claim_request("faults:delay#1")).await?;
        assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
        anyhow::Ok(start.elapsed())
    };
    let (sent, claimed) = tokio::try_join!(sending, claiming)?;
    assert_between(sent, DELAY, DELAY + SLACK, "a delayed SendMessage");
    assert_between(claimed, DELAY, DELAY + SLACK, "a delayed claim (UpdateItem)");
    assert_eq!(sqs.faults.stats(send).injected, 1);
    assert_eq!(dynamo.faults.stats(put).injected, 1);
    assert_eq!(bodies(&sqs, 1).await?, vec!["delayed".to_owned()]);

    // The rule is spent: the next call is not delayed.
    let start = Instant::now();
    sqs.queue.send(message("on time")).await?;
    assert!(start.elapsed() < DELAY, "{:?}", start.elapsed());
    assert_eq!(sqs.faults.calls("SendMessage"), 2);
    Ok(())
}

#[tokio::test]
async fn a_hang_is_cut_by_the_clients_deadlines_and_is_retryable() -> anyhow::Result<()> {
    let (sqs, dynamo, once) = tokio::try_join!(
        sqs("faults-hang", 2),
        dynamo("faults-hang", 2),
        sqs("faults-hang-once", 3)
    )?;
    let send = sqs.faults.add(Rule::new(Fault::Hang).on("SendMessage"));
    let put = dynamo.faults.add(Rule::new(Fault::Hang).on("UpdateItem"));
    // Only the first attempt hangs: the attempt timeout ends it and the SDK's retry succeeds.
    let depth = once
        .faults
        .add(Rule::new(Fault::Hang).on("GetQueueAttributes").times(1));
    let depth_calls = once.faults.calls("GetQueueAttributes");

    let sending = async {
        let start = Instant::now();
        let result = sqs.queue.send(message("never sent")).await;
        (result, start.elapsed())
    };
    let claiming = async {
        let start = Instant::now();
        let result = dynamo.store.claim(&claim_request("faults:hang#1")).await;
        (result, start.elapsed())
    };
    let measuring = async {
        let start = Instant::now();
        let result = once.queue.depth().await;
        (result, start.elapsed())
    };
    let ((sent, send_took), (claimed, claim_took), (measured, depth_took)) =
        tokio::join!(sending, claiming, measuring);

    match sent {
        Err(error @ QueueError::Unavailable { .. }) => assert!(error.is_retryable()),
        other => panic!("a hung SendMessage must be Unavailable, got {other:?}"),
    }
    assert_between(
        send_took,
        conveyor_sqs::ATTEMPT_TIMEOUT,
        conveyor_sqs::OPERATION_TIMEOUT + SLACK,
        "a hung SendMessage",
    );
    assert!(
        sqs.faults.stats(send).injected >= 2,
        "the attempt timeout ends each attempt and the SDK retries: {:?}",
        sqs.faults.stats(send)
    );

    assert!(
        matches!(claimed, Err(StoreError::Unavailable { .. })),
        "a hung claim (UpdateItem) must be Unavailable, got {claimed:?}"
    );
    assert_between(
        claim_took,
        conveyor_dynamodb::ATTEMPT_TIMEOUT,
        conveyor_dynamodb::OPERATION_TIMEOUT + SLACK,
        "a hung claim (UpdateItem)",
    );
    assert!(
        dynamo.faults.stats(put).injected >= 2,
        "{:?}",
        dynamo.faults.stats(put)
    );
    let record = dynamo.plain.get("faults:hang#1").await?;
    assert!(record.is_none(), "a hung request never reached the table");

    measured.context("one hung attempt is retried")?;
    assert_between(
        depth_took,
        conveyor_sqs::ATTEMPT_TIMEOUT,
        conveyor_sqs::ATTEMPT_TIMEOUT + SLACK,
        "GetQueueAttributes with one hung attempt",
    );
    assert_eq!(once.faults.stats(depth).injected, 1);
    assert_eq!(
        once.faults.calls("GetQueueAttributes"),
        depth_calls + 2,
        "the hung attempt and its retry"
    );
    Ok(())
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_then_unavailable() -> anyhow::Result<()> {
    let (sqs, dynamo) = tokio::try_join!(sqs("faults-errors", 4), dynamo("faults-errors", 4))?;

    for fault in [Fault::Throttle, Fault::ServerError] {
        let rule = sqs.faults.add(Rule::new(fault).on("SendMessage"));
        let result = sqs.queue.send(message("refused")).await;
        assert!(
            matches!(&result, Err(error @ QueueError::Unavailable { .. }) if error.is_retryable()),
            "{fault:?} on SendMessage must be Unavailable, got {result:?}"
        );
        // Every attempt was answered by the layer: the SDK classified the answer as retryable.
        assert_eq!(
            sqs.faults.stats(rule).injected,
            u64::from(conveyor_sqs::MAX_ATTEMPTS),
            "{fault:?}"
        );
        assert!(sqs.faults.remove(rule));

        let rule = dynamo.faults.add(Rule::new(fault).on("UpdateItem"));
        let key = format!("faults:errors#{fault:?}");
        let result = dynamo.store.claim(&claim_request(&key)).await;
        assert!(
            matches!(result, Err(StoreError::Unavailable { .. })),
            "{fault:?} on the claim (UpdateItem) must be Unavailable, got {result:?}"
        );
        assert_eq!(
            dynamo.faults.stats(rule).injected,
            u64::from(conveyor_dynamodb::MAX_ATTEMPTS),
            "{fault:?}"
        );
        let record = dynamo.plain.get(&key).await?;
        assert!(record.is_none(), "the service never saw {fault:?}");
        dynamo.faults.clear();
    }

    // One throttled attempt is absorbed by the SDK's retry; the rules changed while the clients lived.
    let rule = sqs
        .faults
        .add(Rule::new(Fault::Throttle).on("SendMessage").times(1));
    sqs.queue.send(message("after one throttle")).await?;
    assert_eq!(sqs.faults.stats(rule).injected, 1);
    let rule = dynamo
        .faults
        .add(Rule::new(Fault::ServerError).on("UpdateItem").times(1));
    let outcome = dynamo.store.claim(&claim_request("faults:errors#once")).await?;
    assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
    assert_eq!(dynamo.faults.stats(rule).injected, 1);
    assert_eq!(bodies(&sqs, 1).await?, vec!["after one throttle".to_owned()]);
    Ok(())
}

#[tokio::test]
async fn a_dropped_response_was_applied_though_the_caller_saw_an_error() -> anyhow::Result<()> {
    let (sqs, dynamo) = tokio::try_join!(sqs("faults-drop", 5), dynamo("faults-drop", 5))?;
    let attempts = u64::from(conveyor_sqs::MAX_ATTEMPTS);
    let send = sqs
        .faults
        .add(Rule::new(Fault::DropResponse).on("SendMessage").times(attempts));
    let result = sqs.queue.send(message("sent in the dark")).await;
    assert!(
        matches!(&result, Err(error @ QueueError::Unavailable { .. }) if error.is_retryable()),
        "a dropped SendMessage response must be Unavailable, got {result:?}"
    );
    assert_eq!(sqs.faults.stats(send).injected, attempts);
    // Each attempt reached SQS and was applied: the SDK's retries duplicated the message.
    let seen = bodies(&sqs, attempts as usize).await?;
    assert_eq!(seen, vec!["sent in the dark".to_owned(); attempts as usize]);

    let put = dynamo.faults.add(
        Rule::new(Fault::DropResponse)
            .on("UpdateItem")
            .times(u64::from(conveyor_dynamodb::MAX_ATTEMPTS)),
    );
    let result = dynamo.store.claim(&claim_request("faults:drop#1")).await;
    assert!(
        matches!(result, Err(StoreError::Unavailable { .. })),
        "a dropped claim (UpdateItem) response must be Unavailable, got {result:?}"
    );
    assert_eq!(
        dynamo.faults.stats(put).injected,
        u64::from(conveyor_dynamodb::MAX_ATTEMPTS)
    );
    let record = dynamo.plain.get("faults:drop#1").await?;
    assert!(
        record.is_some(),
        "the claim was written though its caller saw an error"
    );
    Ok(())
}
