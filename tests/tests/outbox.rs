//! The transactional outbox end to end: the application's transactions on DynamoDB Local (each user and
//! two welcome emails), the relay as the `conveyor outbox relay` process (killed with SIGKILL
//! mid-backlog) and as a task inside the example `worker`, which takes the lease over and also consumes
//! the jobs from a FIFO queue with its idempotency table; one user's first job is poison (its queue does
//! not exist yet), parked and resent with `conveyor outbox resend` once the queue exists. LocalStack for
//! SQS.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{app_env, binaries, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_outbox::{Outbox, OutboxTable, create_outbox_table, is_sequence_conflict};
use conveyor_sqs::{NewJob, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;
use tokio::process::Command;

const USERS: u64 = 600;
/// The user whose first job is poison.
const POISONED: u64 = 13;

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

/// The user's `nth` welcome email; the name goes into the subject, so the effects show the order.
fn welcome(user_id: u64, nth: u32) -> NewJob<WelcomeEmail> {
    // No key of its own: the consumer settles it under the outbox's `outbox:<item id>`.
    NewJob::new(
        "welcome_email",
        WelcomeEmail {
            user_id,
            email: format!("user{user_id}@example.com"),
            name: format!("user {user_id} #{nth}"),
        },
    )
}

/// Per user, the numbers of the welcome emails sent, in the order they were sent.
fn emails_in_order(effects: &std::path::Path) -> anyhow::Result<BTreeMap<u64, Vec<u32>>> {
    let mut order: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for effect in conveyor_examples::outbox::Outbox::read_all(effects)? {
        let (Some(user), Some(subject)) = (effect["to_user"].as_u64(), effect["subject"].as_str()) else {
            continue;
        };
        let nth = subject
            .rsplit('#')
            .next()
            .and_then(|tail| tail.trim_end_matches('!').parse().ok())
            .unwrap_or(0);
        order.entry(user).or_default().push(nth);
    }
    Ok(order)
}

async fn cli(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let output = Command::new(binaries().path("conveyor")?)
        .args(args)
        .args(["--output", "json"])
        .envs(localstack::aws_env())
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "conveyor {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
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
async fn committed_jobs_run_once_in_order_per_user_across_a_killed_relay_and_a_parked_poison_job()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let idempotency = localstack::create_table(&dynamodb, "e2e-outbox").await?;
    let table = OutboxTable::new(localstack::unique_name("e2e-outbox-app"));
    create_outbox_table(&dynamodb, &table).await?;
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::fifo("e2e-outbox")
            .visibility_timeout_secs(10)
            .max_receive_count(5),
    )
    .await?;
    let outbox = Outbox::new(table.clone(), &queue.url);
    // The poison job's queue (a standard one): not created yet (a deploy that forgot it).
    let later_name = localstack::unique_name("e2e-outbox-later");
    let later_url = queue.url.replace(&queue.name, &later_name);
    let later = Outbox::new(table.clone(), &later_url);

    for user_id in 1..=USERS {
        let aggregate = format!("user#{user_id}");
        if user_id == POISONED {
            // Two transactions: the poison job first, then the user's second email.
            let first = later.put(&dynamodb, welcome(user_id, 1), &aggregate).await?;
            dynamodb
                .transact_write_items()
                .set_transact_items(Some(
                    std::iter::once(user_put(&table.name, user_id)?)
                        .chain(first)
                        .collect(),
                ))
                .send()
                .await?;
            let second = outbox.put(&dynamodb, welcome(user_id, 2), &aggregate).await?;
            dynamodb
                .transact_write_items()
                .set_transact_items(Some(second.transact_items()))
                .send()
                .await?;
            continue;
        }
        let head = outbox.head(&dynamodb, &aggregate).await?;
        let jobs = outbox.put_after(vec![welcome(user_id, 1), welcome(user_id, 2)], &aggregate, head)?;
        dynamodb
            .transact_write_items()
            .set_transact_items(Some(
                std::iter::once(user_put(&table.name, user_id)?)
                    .chain(jobs)
                    .collect(),
            ))
            .send()
            .await?;
    }
    // User 1 again: the user's condition fails, so the job written with it is not either.
    let again = outbox.put(&dynamodb, welcome(1, 3), "user#1").await?;
    let answer = dynamodb
        .transact_write_items()
        .set_transact_items(Some(
            std::iter::once(user_put(&table.name, 1)?).chain(again).collect(),
        ))
        .send()
        .await;
    let Err(error) = answer else {
        panic!("a second user#1 committed");
    };
    assert!(
        !is_sequence_conflict(&error),
        "the user's own condition failed, not the outbox's sequence: {error:?}"
    );

    // The relay as its own process, killed with SIGKILL once it has started sending.
    let committed = (USERS * 2) as usize;
    let mut relay = Command::new(binaries().path("conveyor")?)
        .args(["outbox", "relay", "--table", &table.name, "--lease-seconds", "5"])
        .envs(localstack::aws_env())
        .env("RUST_LOG", "warn")
        .env("CONVEYOR_OUTBOX_MAX_ATTEMPTS", "3")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    wait_until(Duration::from_secs(60), Duration::from_millis(20), async || {
        outbox_items(&dynamodb, &table.name)
            .await
            .is_ok_and(|left| left < committed - 50)
    })
    .await?;
    relay.start_kill()?;
    relay.wait().await?;
    let left_at_kill = outbox_items(&dynamodb, &table.name).await?;
    println!("relay killed with {left_at_kill} of {committed} outbox jobs left");
    assert!(left_at_kill > 0, "killed mid-backlog");

    // The worker relays the rest (taking the lease over once the killed relay's lapses) and runs the jobs.
    let emails = outbox_path("e2e-outbox");
    let mut env = app_env(&idempotency, &emails);
    env.push(("CONVEYOR_OUTBOX_TABLE".to_owned(), table.name.clone()));
    env.push(("CONVEYOR_OUTBOX_LEASE_SECONDS".to_owned(), "5".to_owned()));
    env.push(("CONVEYOR_OUTBOX_MAX_ATTEMPTS".to_owned(), "3".to_owned()));
    let mut worker = binaries().spawn_worker(&queue.url, None, &env, None)?;
    wait_until(Duration::from_secs(240), Duration::from_millis(500), async || {
        emails_in_order(&emails).is_ok_and(|order| {
            order.len() == (USERS - 1) as usize && order.values().all(|sent| sent.len() >= 2)
        })
    })
    .await?;
    let backlog = cli(&["outbox", "backlog", "--table", &table.name]).await?;
    let parked = backlog["parked"].as_array().cloned().unwrap_or_default();
    assert_eq!(parked.len(), 1, "{backlog}");
    assert_eq!(parked[0]["aggregate"], format!("user#{POISONED}"));
    assert_eq!(parked[0]["sequence"], 1);
    assert!(
        parked[0]["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("does not exist"),
        "{backlog}"
    );
    assert!(
        !emails_in_order(&emails)?.contains_key(&POISONED),
        "the poisoned user's second email waits behind the first"
    );

    // The operator creates the missing queue and resends.
    sqs.create_queue().queue_name(&later_name).send().await?;
    let resent = cli(&[
        "outbox",
        "resend",
        "--table",
        &table.name,
        "--aggregate",
        &format!("user#{POISONED}"),
    ])
    .await?;
    assert_eq!(resent["unparked"], 1);
    wait_until(Duration::from_secs(120), Duration::from_millis(500), async || {
        emails_in_order(&emails).is_ok_and(|order| order.contains_key(&POISONED))
    })
    .await?;
    let later_messages = sqs
        .receive_message()
        .queue_url(&later_url)
        .wait_time_seconds(5)
        .send()
        .await?;
    assert_eq!(
        later_messages.messages().len(),
        1,
        "the parked job reached its queue once it existed"
    );

    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    wait_until(Duration::from_secs(60), Duration::from_millis(500), async || {
        queue_is_empty(&sqs_queue).await
            && outbox_items(&dynamodb, &table.name)
                .await
                .is_ok_and(|left| left == 0)
    })
    .await?;
    terminate(&mut worker).await?;

    let order = emails_in_order(&emails)?;
    assert_eq!(order.len(), USERS as usize, "every user emailed");
    let wrong: Vec<(&u64, &Vec<u32>)> = order
        .iter()
        .filter(|(user, sent)| {
            let expected: &[u32] = if **user == POISONED { &[2] } else { &[1, 2] };
            sent.as_slice() != expected
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "users emailed out of order or more than once: {wrong:?}"
    );
    Ok(())
}
