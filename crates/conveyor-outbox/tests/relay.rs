//! The outbox against DynamoDB Local (its table, stream and transactions) and LocalStack (SQS), with the
//! real SDK clients and the real stream reader.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_sdk_sqs::types::MessageSystemAttributeName;
use conveyor_outbox::{Outbox, OutboxTable, Relay, StreamRelay, StreamRelayOptions, create_outbox_table};
use conveyor_sqs::NewJob;
use conveyor_testing::faults::{Fault, Faults, Rule, with_faults_dynamodb, with_faults_sqs};
use conveyor_testing::localstack::{self, DUMMY_CREDENTIAL, QueueSpec, REGION};
use tokio_util::sync::CancellationToken;

fn streams_client() -> aws_sdk_dynamodbstreams::Client {
    use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodbstreams::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(localstack::dynamodb_endpoint())
        .credentials_provider(Credentials::new(
            DUMMY_CREDENTIAL,
            DUMMY_CREDENTIAL,
            None,
            None,
            "test",
        ))
        .build();
    aws_sdk_dynamodbstreams::Client::from_conf(config)
}

struct Setup {
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    table: OutboxTable,
    state_table: String,
}

async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    localstack::ensure_local_aws().await?;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name(prefix));
    create_outbox_table(&dynamodb, &table).await?;
    let state_table = localstack::create_table(&dynamodb, &format!("{prefix}-state")).await?;
    Ok(Setup {
        sqs: localstack::sqs_client().await,
        dynamodb,
        table,
        state_table,
    })
}

impl Setup {
    /// A stream relay that stops once it has read everything.
    fn relay(
        &self,
        sqs: aws_sdk_sqs::Client,
        relay_dynamodb: aws_sdk_dynamodb::Client,
        state: aws_sdk_dynamodb::Client,
    ) -> StreamRelay {
        let mut options = StreamRelayOptions::new(&self.state_table);
        options.exit_when_idle = true;
        options.idle_poll = Duration::from_millis(100);
        options.failure_pause = Duration::from_millis(200);
        StreamRelay::new(
            Relay::new(sqs, relay_dynamodb, self.table.clone()),
            streams_client(),
            state,
            options,
        )
    }

    async fn drain(&self) -> anyhow::Result<conveyor_outbox::ProgressSnapshot> {
        let relay = self.relay(self.sqs.clone(), self.dynamodb.clone(), self.dynamodb.clone());
        let progress = relay.progress();
        tokio::time::timeout(Duration::from_secs(60), relay.run(CancellationToken::new())).await??;
        Ok(progress.snapshot())
    }

    async fn outbox_items(&self) -> anyhow::Result<usize> {
        let output = self
            .dynamodb
            .scan()
            .table_name(&self.table.name)
            .filter_expression("attribute_exists(outbox_id)")
            .consistent_read(true)
            .send()
            .await?;
        Ok(output.items().len())
    }
}

/// The application's own write: an order, conditional on not existing yet.
fn order_put(table: &str, order: u64) -> anyhow::Result<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("order#{order}")))
        .item("sk", AttributeValue::S("order".to_owned()))
        .item("total", AttributeValue::N("42".to_owned()))
        .condition_expression("attribute_not_exists(pk)")
        .build()?;
    Ok(TransactWriteItem::builder().put(put).build())
}

/// Every message in the queue, received and deleted (a FIFO group's next messages come only once the
/// ones received are deleted).
async fn receive_all(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    expected: usize,
) -> anyhow::Result<Vec<aws_sdk_sqs::types::Message>> {
    let mut messages = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut empty_receives = 0;
    while tokio::time::Instant::now() < deadline {
        let output = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(300)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await?;
        let batch = output.messages.unwrap_or_default();
        if batch.is_empty() {
            empty_receives += 1;
            // Past the count expected, two empty long polls in a row mean nothing more is coming.
            if messages.len() >= expected && empty_receives >= 2 {
                break;
            }
            continue;
        }
        empty_receives = 0;
        for message in &batch {
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(message.receipt_handle().unwrap_or_default())
                .send()
                .await?;
        }
        messages.extend(batch);
    }
    Ok(messages)
}

fn key_of(message: &aws_sdk_sqs::types::Message) -> String {
    message
        .message_attributes()
        .and_then(|attributes| attributes.get("conveyor.key"))
        .and_then(|value| value.string_value())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transaction_sends_nothing_and_a_committed_one_is_sent_once_and_removed()
-> anyhow::Result<()> {
    let setup = setup("outbox-tx").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-tx")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);

    let committed = outbox.put(NewJob::new("invoice", serde_json::json!({"order": 1})), "order#1")?;
    let committed_key = committed.idempotency_key().to_owned();
    setup
        .dynamodb
        .transact_write_items()
        .transact_items(order_put(&setup.table.name, 1)?)
        .transact_items(committed.into())
        .send()
        .await?;
    // The same order again: its condition fails, so the whole transaction, job included, is not written.
    let refused = outbox.put(
        NewJob::new("invoice", serde_json::json!({"order": 1, "again": true})),
        "order#1",
    )?;
    let answer = setup
        .dynamodb
        .transact_write_items()
        .transact_items(order_put(&setup.table.name, 1)?)
        .transact_items(refused.into())
        .send()
        .await;
    assert!(
        answer.is_err(),
        "the second order's condition fails the transaction"
    );

    let progress = setup.drain().await?;
    assert_eq!(progress.relayed, 1, "{progress:?}");
    let messages = receive_all(&setup.sqs, &queue.url, 1).await?;
    assert_eq!(messages.len(), 1, "one job for one committed transaction");
    assert_eq!(messages[0].body(), Some(r#"{"order":1}"#));
    assert_eq!(key_of(&messages[0]), committed_key);
    assert!(committed_key.starts_with("outbox:"));
    assert_eq!(setup.outbox_items().await?, 0, "the sent item is removed");

    // A second relay resumes from the checkpoint and sends nothing again.
    let again = setup.drain().await?;
    assert_eq!(again.relayed, 0, "{again:?}");
    assert!(receive_all(&setup.sqs, &queue.url, 0).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_dies_between_sending_and_removing_leaves_only_a_duplicate_with_the_same_key()
-> anyhow::Result<()> {
    let setup = setup("outbox-crash").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-crash")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    for order in 1..=3 {
        let item = outbox.put(
            NewJob::new("invoice", order).key(format!("invoice:{order}")),
            &format!("order#{order}"),
        )?;
        setup
            .dynamodb
            .transact_write_items()
            .transact_items(order_put(&setup.table.name, order)?)
            .transact_items(item.into())
            .send()
            .await?;
    }
    // The first relay's deletes and checkpoint writes fail: what a relay killed right after its sends
    // leaves behind (jobs in the queue, items in the table, no checkpoint).
    let faults = Faults::new(7);
    faults.add(Rule::new(Fault::ServerError).on("BatchWriteItem").on("PutItem"));
    let broken = with_faults_dynamodb(&setup.dynamodb, &faults);
    let first = setup.relay(setup.sqs.clone(), broken.clone(), broken);
    let progress = first.progress();
    tokio::time::timeout(Duration::from_secs(60), first.run(CancellationToken::new())).await??;
    let first_run = progress.snapshot();
    assert_eq!(first_run.relayed, 3, "{first_run:?}");
    assert_eq!(first_run.delete_failures, 3, "{first_run:?}");
    assert_eq!(setup.outbox_items().await?, 3);

    let second = setup.drain().await?;
    assert_eq!(second.relayed, 3, "the next relay sends again: {second:?}");
    assert_eq!(setup.outbox_items().await?, 0);
    let messages = receive_all(&setup.sqs, &queue.url, 6).await?;
    let mut keys: BTreeMap<String, usize> = BTreeMap::new();
    for message in &messages {
        *keys.entry(key_of(message)).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = (1..=3).map(|order| (format!("invoice:{order}"), 2)).collect();
    assert_eq!(keys, expected, "each job twice, under its own idempotency key");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_each_aggregate_reach_a_fifo_queue_in_commit_order_through_send_failures()
-> anyhow::Result<()> {
    let setup = setup("outbox-fifo").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::fifo("outbox-fifo")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    let aggregates = 5;
    let per_aggregate = 12;
    for step in 0..per_aggregate {
        for aggregate in 0..aggregates {
            let item = outbox.put(
                NewJob::new("step", serde_json::json!({"aggregate": aggregate, "step": step})),
                &format!("account-{aggregate}"),
            )?;
            setup
                .dynamodb
                .transact_write_items()
                .transact_items(item.into())
                .send()
                .await?;
        }
    }
    // Sends fail now and then (every SDK attempt of a call, so the relay sees the failure).
    let faults = Faults::new(11);
    faults.add(
        Rule::new(Fault::ServerError)
            .on("SendMessageBatch")
            .probability(0.3),
    );
    let sqs = with_faults_sqs(&setup.sqs, &faults);
    let relay = setup.relay(sqs, setup.dynamodb.clone(), setup.dynamodb.clone());
    let progress = relay.progress();
    tokio::time::timeout(Duration::from_secs(90), relay.run(CancellationToken::new())).await??;
    let snapshot = progress.snapshot();
    assert!(faults.injected("SendMessageBatch") > 0, "the faults fired");
    assert_eq!(setup.outbox_items().await?, 0, "{snapshot:?}");

    let messages = receive_all(&setup.sqs, &queue.url, aggregates * per_aggregate).await?;
    let mut steps: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in &messages {
        let body: serde_json::Value = serde_json::from_str(message.body().unwrap_or_default())?;
        let group = message
            .attributes()
            .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId))
            .cloned()
            .unwrap_or_default();
        assert_eq!(group, format!("account-{}", body["aggregate"]));
        steps
            .entry(group)
            .or_default()
            .push(body["step"].as_u64().unwrap_or(u64::MAX));
    }
    assert_eq!(steps.len(), aggregates);
    for (group, seen) in &steps {
        let expected: Vec<u64> = (0..per_aggregate as u64).collect();
        assert_eq!(
            seen, &expected,
            "group {group}: in order, each once (FIFO deduplicates re-sends)"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_two_thousand_drains_with_every_job_sent_and_every_item_removed() -> anyhow::Result<()> {
    let setup = setup("outbox-backlog").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-backlog")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    let count = 2_000;
    let items = (0..count)
        .map(|n| outbox.put(NewJob::new("invoice", n), &format!("order#{}", n % 200)))
        .collect::<Result<Vec<_>, _>>()?;
    conveyor_outbox::backlog::write_backlog(&setup.dynamodb, &setup.table.name, &items).await?;
    let progress = setup.drain().await?;
    assert_eq!(progress.relayed, count as u64, "{progress:?}");
    assert_eq!(progress.failures, 0);
    assert_eq!(setup.outbox_items().await?, 0);
    // Sends of 10, deletes of 25, reads of 1000: well under one request per job.
    assert!(progress.requests < count as u64 / 5, "{progress:?}");
    let attributes = setup
        .sqs
        .get_queue_attributes()
        .queue_url(&queue.url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await?;
    let visible = attributes
        .attributes()
        .and_then(|map| map.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .cloned()
        .unwrap_or_default();
    assert_eq!(visible, count.to_string());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_reads_at_a_time_and_a_standby_takes_over_when_it_stops() -> anyhow::Result<()> {
    let setup = setup("outbox-lease").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-lease")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    let relay = |lease: u64| {
        let mut options = StreamRelayOptions::new(&setup.state_table);
        options.idle_poll = Duration::from_millis(100);
        options.lease = Duration::from_secs(lease);
        StreamRelay::new(
            Relay::new(setup.sqs.clone(), setup.dynamodb.clone(), setup.table.clone()),
            streams_client(),
            setup.dynamodb.clone(),
            options,
        )
    };
    let first = relay(3);
    let second = relay(3);
    let (first_progress, second_progress) = (first.progress(), second.progress());
    let (stop_first, stop_second) = (CancellationToken::new(), CancellationToken::new());
    let first_run = tokio::spawn(first.run(stop_first.clone()));
    conveyor_testing::wait_until(Duration::from_secs(10), Duration::from_millis(50), async || {
        first_progress.snapshot().leader
    })
    .await?;
    let second_run = tokio::spawn(second.run(stop_second.clone()));
    let write = async |n: u64| -> anyhow::Result<()> {
        let item = outbox.put(NewJob::new("invoice", n), &format!("order#{n}"))?;
        setup
            .dynamodb
            .transact_write_items()
            .transact_items(item.into())
            .send()
            .await?;
        Ok(())
    };
    write(1).await?;
    conveyor_testing::wait_until(Duration::from_secs(10), Duration::from_millis(50), async || {
        first_progress.snapshot().relayed == 1
    })
    .await?;
    assert!(!second_progress.snapshot().leader, "the second relay stands by");
    assert_eq!(second_progress.snapshot().relayed, 0);

    // The first stops (giving the lease up); the second takes over and resumes at the checkpoint.
    stop_first.cancel();
    first_run.await??;
    write(2).await?;
    conveyor_testing::wait_until(Duration::from_secs(15), Duration::from_millis(50), async || {
        second_progress.snapshot().relayed == 1
    })
    .await?;
    assert!(second_progress.snapshot().leader);
    stop_second.cancel();
    second_run.await??;
    assert_eq!(
        receive_all(&setup.sqs, &queue.url, 2).await?.len(),
        2,
        "each job once"
    );
    Ok(())
}
