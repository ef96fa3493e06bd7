//! The outbox on DynamoDB Local (its table, index and transactions) and LocalStack (SQS), with the real
//! SDK clients: the store's conformance, per-aggregate order with two relays at once, parking and
//! resending, the lease's takeover, a backlog drained by the poller, and nothing skipped silently.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_sdk_sqs::types::MessageSystemAttributeName;
use conveyor_outbox::{
    DynamoOutboxStore, Lease, Outbox, OutboxStore, OutboxTable, Poller, PollerOptions, Relay, RelayOptions,
    SqsSink, Unfenced, conformance, create_outbox_table, is_sequence_conflict,
};
use conveyor_sqs::NewJob;
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;
use tokio_util::sync::CancellationToken;

struct Setup {
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    table: OutboxTable,
    store: Arc<DynamoOutboxStore>,
}

async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    localstack::ensure_local_aws().await?;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name(prefix));
    create_outbox_table(&dynamodb, &table).await?;
    Ok(Setup {
        sqs: localstack::sqs_client().await,
        store: Arc::new(DynamoOutboxStore::new(dynamodb.clone(), table.clone())),
        dynamodb,
        table,
    })
}

impl Setup {
    fn relay(&self, options: RelayOptions) -> Relay {
        Relay::new(self.store.clone(), Arc::new(SqsSink::new(self.sqs.clone()))).with_options(options)
    }

    /// Commits `job` as `aggregate`'s next job beside the application's own row, running the transaction
    /// again when another writer took the sequence first (as an application does).
    async fn commit(&self, outbox: &Outbox, aggregate: &str, body: serde_json::Value) -> anyhow::Result<()> {
        loop {
            let write = outbox
                .put(&self.dynamodb, NewJob::new("invoice", body.clone()), aggregate)
                .await?;
            let answer = self
                .dynamodb
                .transact_write_items()
                .set_transact_items(Some(
                    std::iter::once(row_put(
                        &self.table.name,
                        &format!("row#{}", uuid::Uuid::new_v4()),
                    )?)
                    .chain(write)
                    .collect(),
                ))
                .send()
                .await;
            match answer {
                Ok(_) => return Ok(()),
                Err(error) if is_sequence_conflict(&error) => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Relays until a pass finds nothing to send.
    async fn drain(&self, relay: &Relay) -> usize {
        let mut sent = 0;
        loop {
            let report = relay.sweep(Duration::ZERO, 100, &Unfenced).await;
            sent += report.sent;
            if report.sent == 0 && report.raced == 0 {
                return sent;
            }
        }
    }

    async fn items(&self) -> anyhow::Result<usize> {
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

/// The application's own write.
fn row_put(table: &str, key: &str) -> anyhow::Result<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(key.to_owned()))
        .item("sk", AttributeValue::S("row".to_owned()))
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
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

struct DynamoWriter<'a> {
    setup: &'a Setup,
}

#[async_trait]
impl conformance::Writer for DynamoWriter<'_> {
    async fn commit(&self, queue_url: &str, aggregate: &str, body: &str) {
        let outbox = Outbox::new(self.setup.table.clone(), queue_url);
        let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        if let Err(error) = self.setup.commit(&outbox, aggregate, value).await {
            panic!("committing a job failed: {error:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dynamodb_store_passes_the_conformance_suite() -> anyhow::Result<()> {
    let setup = setup("outbox-conformance").await?;
    conformance::run(setup.store.clone(), &DynamoWriter { setup: &setup }, "c-").await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregates_jobs_reach_a_fifo_queue_in_commit_order_with_two_relays_at_once()
-> anyhow::Result<()> {
    const AGGREGATES: usize = 20;
    const JOBS: usize = 10;
    let setup = setup("outbox-order").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::fifo("outbox-order")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    // Aggregates written concurrently, each one's jobs one after another (its commit order).
    let writers = (0..AGGREGATES).map(|aggregate| {
        let setup = &setup;
        let outbox = &outbox;
        async move {
            for job in 1..=JOBS {
                setup
                    .commit(
                        outbox,
                        &format!("order#{aggregate}"),
                        serde_json::json!({ "job": job }),
                    )
                    .await?;
            }
            anyhow::Ok(())
        }
    });
    futures_util::future::try_join_all(writers).await?;
    // Two relays at once, as two Lambda invocations on two shards or a sweep beside a stream batch.
    let first = setup.relay(RelayOptions::default());
    let second = setup.relay(RelayOptions::default());
    let (sent_first, sent_second) = tokio::join!(setup.drain(&first), setup.drain(&second));
    assert_eq!(
        sent_first + sent_second,
        AGGREGATES * JOBS,
        "each job removed once"
    );
    assert_eq!(setup.items().await?, 0);

    let messages = receive_all(&setup.sqs, &queue.url, AGGREGATES * JOBS).await?;
    let mut by_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in &messages {
        let group = message
            .attributes()
            .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId))
            .cloned()
            .unwrap_or_default();
        let body: serde_json::Value = serde_json::from_str(message.body().unwrap_or_default())?;
        let job = body["job"].as_u64().unwrap_or_default();
        let seen = by_group.entry(group).or_default();
        if !seen.contains(&job) {
            seen.push(job);
        }
    }
    assert_eq!(by_group.len(), AGGREGATES);
    let expected: Vec<u64> = (1..=JOBS as u64).collect();
    for (group, jobs) in &by_group {
        assert_eq!(
            jobs, &expected,
            "group {group} received its jobs out of commit order"
        );
    }
    println!(
        "{} messages for {} jobs ({} duplicates from the race), {} DynamoDB requests",
        messages.len(),
        AGGREGATES * JOBS,
        messages.len() - AGGREGATES * JOBS,
        setup.store.requests()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_that_read_the_same_head_conflict_and_the_retry_commits_after() -> anyhow::Result<()> {
    let setup = setup("outbox-conflict").await?;
    let outbox = Outbox::new(setup.table.clone(), "http://localhost:4566/000000000000/any");
    let first = outbox
        .put(&setup.dynamodb, NewJob::new("t", 1), "order#1")
        .await?;
    let second = outbox
        .put(&setup.dynamodb, NewJob::new("t", 2), "order#1")
        .await?;
    setup
        .dynamodb
        .transact_write_items()
        .set_transact_items(Some(first.transact_items()))
        .send()
        .await?;
    let Err(conflict) = setup
        .dynamodb
        .transact_write_items()
        .set_transact_items(Some(second.transact_items()))
        .send()
        .await
    else {
        panic!("two transactions on one head both committed");
    };
    assert!(is_sequence_conflict(&conflict), "{conflict:?}");
    let again = outbox
        .put(&setup.dynamodb, NewJob::new("t", 2), "order#1")
        .await?;
    setup
        .dynamodb
        .transact_write_items()
        .set_transact_items(Some(again.transact_items()))
        .send()
        .await?;
    let jobs = setup.store.jobs("order#1", 10).await?;
    let bodies: Vec<(u64, &str)> = jobs
        .iter()
        .map(|job| (job.sequence, job.message.body.as_str()))
        .collect();
    assert_eq!(bodies, [(1, "1"), (2, "2")]);
    assert_eq!(outbox.head(&setup.dynamodb, "order#1").await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_job_is_parked_its_aggregate_waits_and_a_resend_after_the_fix_sends_it() -> anyhow::Result<()>
{
    let setup = setup("outbox-poison").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-poison")).await?;
    let missing_name = localstack::unique_name("outbox-poison-later");
    let missing_url = queue.url.replace(&queue.name, &missing_name);
    setup
        .commit(
            &Outbox::new(setup.table.clone(), &missing_url),
            "user#13",
            serde_json::json!({"job": 1}),
        )
        .await?;
    let good = Outbox::new(setup.table.clone(), &queue.url);
    setup
        .commit(&good, "user#13", serde_json::json!({"job": 2}))
        .await?;
    setup
        .commit(&good, "user#14", serde_json::json!({"job": 1}))
        .await?;

    let mut options = RelayOptions::default();
    options.max_attempts = 3;
    options.backoff = Duration::from_millis(50);
    let relay = setup.relay(options);
    wait_until(Duration::from_secs(30), Duration::from_millis(20), async || {
        relay.sweep(Duration::ZERO, 100, &Unfenced).await;
        setup
            .store
            .backlog(10)
            .await
            .is_ok_and(|backlog| !backlog.parked.is_empty())
    })
    .await?;
    let backlog = setup.store.backlog(10).await?;
    assert_eq!(backlog.parked.len(), 1);
    let parked = &backlog.parked[0];
    assert_eq!(
        (parked.aggregate.as_str(), parked.sequence, parked.attempts),
        ("user#13", 1, 3)
    );
    assert!(
        parked
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("does not exist"),
        "the reason is kept: {:?}",
        parked.last_error
    );
    let delivered = receive_all(&setup.sqs, &queue.url, 1).await?;
    assert_eq!(
        delivered.len(),
        1,
        "user#14 goes on; user#13's second job waits behind the parked one"
    );
    assert_eq!(setup.store.jobs("user#13", 10).await?.len(), 2);

    // The operator creates the queue, then resends the aggregate.
    setup.sqs.create_queue().queue_name(&missing_name).send().await?;
    assert_eq!(setup.store.unpark("user#13").await?, 1);
    wait_until(Duration::from_secs(30), Duration::from_millis(50), async || {
        relay.sweep(Duration::ZERO, 100, &Unfenced).await;
        setup
            .store
            .jobs("user#13", 10)
            .await
            .is_ok_and(|jobs| jobs.is_empty())
    })
    .await?;
    let resent = receive_all(&setup.sqs, &missing_url, 1).await?;
    assert_eq!(resent.len(), 1, "the parked job reached its queue once fixed");
    let behind = receive_all(&setup.sqs, &queue.url, 1).await?;
    assert_eq!(behind.len(), 1, "and the job behind it followed");
    assert_eq!(behind[0].body(), Some(r#"{"job":2}"#));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_a_whole_lease_and_the_old_holder_stops_sending() -> anyhow::Result<()> {
    let setup = setup("outbox-lease").await?;
    let length = Duration::from_secs(3);
    let store: Arc<dyn OutboxStore> = setup.store.clone();
    let mut holder = Lease::new(store.clone(), "relay", "holder", length);
    let mut taker = Lease::new(store.clone(), "relay", "taker", length);
    let holder_fence = holder.fence();
    assert!(holder.acquire().await?);
    use conveyor_outbox::Fence;
    assert!(holder_fence.holds());
    assert!(!taker.acquire().await?, "held by another");
    let first_look = tokio::time::Instant::now();
    // The holder stops renewing (a paused or killed process); the taker keeps trying.
    wait_until(Duration::from_secs(20), Duration::from_millis(100), async || {
        taker.acquire().await.unwrap_or(false)
    })
    .await?;
    assert!(
        first_look.elapsed() >= length,
        "taken over after {:?}, before a whole lease",
        first_look.elapsed()
    );
    assert!(
        !holder_fence.holds(),
        "the old holder's own deadline passed before the takeover"
    );
    assert!(
        !holder.acquire().await?,
        "the old holder's renewal fails: it was taken over"
    );
    assert_eq!(taker.epoch(), Some(2), "the takeover raised the epoch");
    // A released lease is taken at once.
    taker.release().await?;
    assert!(holder.acquire().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_2000_jobs_drains_through_the_poller_and_a_standby_waits() -> anyhow::Result<()> {
    const AGGREGATES: usize = 100;
    const JOBS: usize = 20;
    let setup = setup("outbox-backlog").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-backlog")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    let mut writes = Vec::new();
    for aggregate in 0..AGGREGATES {
        let jobs = (0..JOBS).map(|job| NewJob::new("t", job)).collect();
        writes.push(outbox.put_after(jobs, &format!("a{aggregate}"), 0)?);
    }
    conveyor_outbox::backlog::write_backlog(&setup.dynamodb, &setup.table.name, &writes).await?;
    let mut options = PollerOptions::default();
    options.exit_when_idle = true;
    let poller = Poller::new(setup.relay(RelayOptions::default()), "poller", options);
    let progress = poller.progress();
    tokio::time::timeout(Duration::from_secs(300), poller.run(CancellationToken::new())).await?;
    assert_eq!(progress.snapshot().sent, (AGGREGATES * JOBS) as u64);
    assert_eq!(setup.items().await?, 0);
    let messages = receive_all(&setup.sqs, &queue.url, AGGREGATES * JOBS).await?;
    assert_eq!(
        messages.len(),
        AGGREGATES * JOBS,
        "each job once: one relay, no race"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_of_a_newer_format_blocks_its_aggregate_instead_of_being_skipped() -> anyhow::Result<()> {
    let setup = setup("outbox-format").await?;
    let queue = localstack::create_queue(&setup.sqs, &QueueSpec::standard("outbox-format")).await?;
    let outbox = Outbox::new(setup.table.clone(), &queue.url);
    let write = outbox.put_after(vec![NewJob::new("t", 1), NewJob::new("t", 2)], "order#9", 0)?;
    let mut newer = write.items().to_vec();
    newer[0].insert("outbox_version".to_owned(), AttributeValue::N("3".to_owned()));
    newer.extend(write.head_item().cloned());
    conveyor_outbox::backlog::write_items(&setup.dynamodb, &setup.table.name, &newer).await?;
    let relay = setup.relay(RelayOptions::default());
    let report = relay.sweep(Duration::ZERO, 100, &Unfenced).await;
    assert_eq!((report.sent, report.blocked), (0, 1), "{report:?}");
    assert_eq!(setup.items().await?, 2, "nothing skipped, nothing removed");
    Ok(())
}
