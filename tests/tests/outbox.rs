//! The transactional outbox end to end: the application's transactions on DynamoDB Local, the relay as
//! the `conveyor outbox relay` process (killed with SIGKILL mid-backlog) and as a task inside the example
//! `worker`, which also consumes the jobs with its idempotency table; LocalStack for SQS.

use std::process::Stdio;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{app_env, binaries, emails_per_user, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_outbox::{Outbox, OutboxTable, create_outbox_table};
use conveyor_sqs::{NewJob, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;
use tokio::process::Command;

const USERS: u64 = 600;

/// The application's own write: a user, created once.
fn user_put(table: &str, user_id: u64) -> anyhow::Result<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("user#{user_id}")))
        .item("sk", AttributeValue::S("profile".to_owned()))
        .condition_expression("attribute_not_exists(pk)")
        .build()?;
    Ok(TransactWriteItem::builder().put(put).build())
}

fn welcome(user_id: u64) -> NewJob<WelcomeEmail> {
    // No key of its own: the consumer settles it under the outbox's `outbox:<item id>`.
    NewJob::new(
        "welcome_email",
        WelcomeEmail {
            user_id,
            email: format!("user{user_id}@example.com"),
            name: format!("user {user_id}"),
        },
    )
}

async fn outbox_items(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<usize> {
    let mut count = 0;
    let mut start = None;
    loop {
        let output = dynamodb
            .scan()
            .table_name(table)
            .filter_expression("attribute_exists(outbox_version)")
            .select(aws_sdk_dynamodb::types::Select::Count)
            .set_exclusive_start_key(start)
            .send()
            .await?;
        count += usize::try_from(output.count).unwrap_or(0);
        start = output.last_evaluated_key;
        if start.is_none() {
            return Ok(count);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_committed_through_the_outbox_run_once_across_a_killed_relay() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let idempotency = localstack::create_table(&dynamodb, "e2e-outbox").await?;
    let table = OutboxTable::new(localstack::unique_name("e2e-outbox-app"));
    create_outbox_table(&dynamodb, &table).await?;
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::standard("e2e-outbox")
            .visibility_timeout_secs(10)
            .max_receive_count(5),
    )
    .await?;
    let outbox = Outbox::new(table.clone(), &queue.url);
    for user_id in 1..=USERS {
        dynamodb
            .transact_write_items()
            .transact_items(user_put(&table.name, user_id)?)
            .transact_items(outbox.put(welcome(user_id), &format!("user#{user_id}"))?.into())
            .send()
            .await?;
    }
    // User 1 again: the user's condition fails, so the job written with it is not either.
    let again = dynamodb
        .transact_write_items()
        .transact_items(user_put(&table.name, 1)?)
        .transact_items(outbox.put(welcome(1), "user#1")?.into())
        .send()
        .await;
    assert!(again.is_err());

    // The relay as its own process, killed with SIGKILL once it has started sending.
    let mut relay = Command::new(binaries().path("conveyor")?)
        .args([
            "outbox",
            "relay",
            "--table",
            &table.name,
            "--state-table",
            &idempotency,
            "--lease-seconds",
            "5",
        ])
        .envs(localstack::aws_env())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    wait_until(Duration::from_secs(60), Duration::from_millis(20), async || {
        outbox_items(&dynamodb, &table.name)
            .await
            .is_ok_and(|left| left < USERS as usize)
    })
    .await?;
    relay.start_kill()?;
    relay.wait().await?;
    let left_at_kill = outbox_items(&dynamodb, &table.name).await?;
    println!("relay killed with {left_at_kill} of {USERS} outbox items left");

    // The worker relays the rest (taking the lease over once the killed relay's lapses) and runs the jobs.
    let emails = outbox_path("e2e-outbox");
    let mut env = app_env(&idempotency, &emails);
    env.push(("CONVEYOR_OUTBOX_TABLE".to_owned(), table.name.clone()));
    env.push(("CONVEYOR_OUTBOX_LEASE_SECONDS".to_owned(), "5".to_owned()));
    let mut worker = binaries().spawn_worker(&queue.url, None, &env, None)?;
    wait_until(Duration::from_secs(180), Duration::from_millis(500), async || {
        emails_per_user(&emails).is_ok_and(|counts| counts.len() == USERS as usize)
    })
    .await?;
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    wait_until(Duration::from_secs(60), Duration::from_millis(500), async || {
        queue_is_empty(&sqs_queue).await
            && outbox_items(&dynamodb, &table.name)
                .await
                .is_ok_and(|left| left == 0)
    })
    .await?;
    terminate(&mut worker).await?;

    let counts = emails_per_user(&emails)?;
    let doubled: Vec<(&u64, &usize)> = counts.iter().filter(|(_, count)| **count != 1).collect();
    assert_eq!(counts.len(), USERS as usize, "every committed job ran");
    assert!(doubled.is_empty(), "users emailed more than once: {doubled:?}");
    Ok(())
}
