//! The transactional outbox end to end, on DynamoDB Local and on Postgres: the application's
//! transactions (each user and two welcome emails), the relay as the `conveyor outbox relay` process
//! (killed with SIGKILL mid-backlog) and as a task inside the example `worker`, which takes the lease over
//! and also consumes the jobs from a FIFO queue with its idempotency table; one user's first job is poison
//! (its queue does not exist yet), parked and resent with `conveyor outbox resend` once the queue exists.
//! LocalStack for SQS.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{app_env, binaries, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_outbox::postgres::{PostgresOutbox, migrate};
use conveyor_outbox::{Outbox, OutboxTable, create_outbox_table, is_sequence_conflict};
use conveyor_sqs::{NewJob, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;
use sqlx::Connection;
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

/// Where the application keeps its outbox.
enum Source {
    Dynamo {
        dynamodb: aws_sdk_dynamodb::Client,
        table: OutboxTable,
    },
    Postgres {
        url: String,
        pool: sqlx::PgPool,
    },
}

impl Source {
    async fn dynamo() -> anyhow::Result<Self> {
        let dynamodb = localstack::dynamodb_client().await;
        let table = OutboxTable::new(localstack::unique_name("e2e-outbox-app"));
        create_outbox_table(&dynamodb, &table).await?;
        Ok(Self::Dynamo { dynamodb, table })
    }

    /// A database of the test's own on the Postgres `make local-aws` starts.
    async fn postgres() -> anyhow::Result<Self> {
        let admin = std::env::var("CONVEYOR_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:55432/conveyor".to_owned());
        let name = localstack::unique_name("e2e_outbox").replace('-', "_");
        let mut connection = sqlx::PgConnection::connect(&admin).await.map_err(|error| {
            anyhow::anyhow!("Postgres is not reachable at {admin}: {error}; run `make local-aws`")
        })?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut connection)
            .await?;
        let url = format!(
            "{}/{name}",
            admin.rsplit_once('/').map_or(admin.as_str(), |(base, _)| base)
        );
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await?;
        migrate(&pool).await?;
        sqlx::query("CREATE TABLE users (id BIGINT PRIMARY KEY)")
            .execute(&pool)
            .await?;
        Ok(Self::Postgres { url, pool })
    }

    /// `--table NAME` or `--postgres-url URL`.
    fn cli_args(&self) -> Vec<String> {
        match self {
            Self::Dynamo { table, .. } => vec!["--table".to_owned(), table.name.clone()],
            Self::Postgres { url, .. } => vec!["--postgres-url".to_owned(), url.clone()],
        }
    }

    fn worker_env(&self) -> (String, String) {
        match self {
            Self::Dynamo { table, .. } => ("CONVEYOR_OUTBOX_TABLE".to_owned(), table.name.clone()),
            Self::Postgres { url, .. } => ("CONVEYOR_OUTBOX_POSTGRES_URL".to_owned(), url.clone()),
        }
    }

    async fn unsent(&self) -> anyhow::Result<usize> {
        match self {
            Self::Dynamo { dynamodb, table } => outbox_items(dynamodb, &table.name).await,
            Self::Postgres { pool, .. } => {
                let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM conveyor_outbox")
                    .fetch_one(pool)
                    .await?;
                Ok(usize::try_from(count)?)
            }
        }
    }

    /// The user and `jobs` (queue URL, email number) in one transaction; false when the transaction
    /// failed on the user's own condition (the user exists).
    async fn commit_user(&self, user_id: u64, jobs: &[(&str, u32)]) -> anyhow::Result<bool> {
        let aggregate = format!("user#{user_id}");
        match self {
            Self::Dynamo { dynamodb, table } => loop {
                let mut items = vec![user_put(&table.name, user_id)?];
                // One put per queue (one transaction may update the aggregate's head once).
                let mut head = Outbox::new(table.clone(), jobs[0].0)
                    .head(dynamodb, &aggregate)
                    .await?;
                let mut by_queue: Vec<(&str, Vec<NewJob<WelcomeEmail>>)> = Vec::new();
                for (queue, nth) in jobs {
                    match by_queue.last_mut() {
                        Some((last, batch)) if last == queue => batch.push(welcome(user_id, *nth)),
                        _ => by_queue.push((queue, vec![welcome(user_id, *nth)])),
                    }
                }
                anyhow::ensure!(
                    by_queue.len() == 1,
                    "the DynamoDB outbox puts one queue's jobs per transaction"
                );
                for (queue, batch) in by_queue {
                    let count = batch.len() as u64;
                    items.extend(Outbox::new(table.clone(), queue).put_after(batch, &aggregate, head)?);
                    head += count;
                }
                match dynamodb
                    .transact_write_items()
                    .set_transact_items(Some(items))
                    .send()
                    .await
                {
                    Ok(_) => return Ok(true),
                    Err(error) if is_sequence_conflict(&error) => continue,
                    Err(_) => return Ok(false),
                }
            },
            Self::Postgres { pool, .. } => {
                let mut tx = pool.begin().await?;
                let user = sqlx::query("INSERT INTO users (id) VALUES ($1) ON CONFLICT DO NOTHING")
                    .bind(i64::try_from(user_id)?)
                    .execute(&mut *tx)
                    .await?;
                if user.rows_affected() == 0 {
                    tx.rollback().await?;
                    return Ok(false);
                }
                for (queue, nth) in jobs {
                    PostgresOutbox::new(*queue)
                        .put(&mut tx, welcome(user_id, *nth), &aggregate)
                        .await?;
                }
                tx.commit().await?;
                Ok(true)
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dynamodb_committed_jobs_run_once_in_order_per_user_across_a_killed_relay_and_a_poison_job()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    end_to_end(Source::dynamo().await?, "e2e-outbox").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_committed_jobs_run_once_in_order_per_user_across_a_killed_relay_and_a_poison_job()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    end_to_end(Source::postgres().await?, "e2e-outbox-pg").await
}

async fn end_to_end(source: Source, name: &str) -> anyhow::Result<()> {
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let idempotency = localstack::create_table(&dynamodb, name).await?;
    let queue = localstack::create_queue(
        &sqs,
        &QueueSpec::fifo(name)
            .visibility_timeout_secs(10)
            .max_receive_count(5),
    )
    .await?;
    // The poison job's queue (a standard one): not created yet (a deploy that forgot it).
    let later_name = localstack::unique_name(&format!("{name}-later"));
    let later_url = queue.url.replace(&queue.name, &later_name);

    for user_id in 1..=USERS {
        let jobs: Vec<(&str, u32)> = if user_id == POISONED {
            vec![(later_url.as_str(), 1), (queue.url.as_str(), 2)]
        } else {
            vec![(queue.url.as_str(), 1), (queue.url.as_str(), 2)]
        };
        if user_id == POISONED && matches!(source, Source::Dynamo { .. }) {
            // Two transactions on DynamoDB: one queue's jobs per put.
            anyhow::ensure!(source.commit_user(user_id, &jobs[..1]).await?);
            let Source::Dynamo { dynamodb, table } = &source else {
                continue;
            };
            let second = Outbox::new(table.clone(), &queue.url)
                .put(dynamodb, welcome(user_id, 2), &format!("user#{user_id}"))
                .await?;
            dynamodb
                .transact_write_items()
                .set_transact_items(Some(second.transact_items()))
                .send()
                .await?;
            continue;
        }
        anyhow::ensure!(
            source.commit_user(user_id, &jobs).await?,
            "user {user_id} not committed"
        );
    }
    // User 1 again: the user's own condition fails, so the job written with it is not either.
    assert!(
        !source.commit_user(1, &[(queue.url.as_str(), 3)]).await?,
        "a second user#1 committed"
    );

    // The relay as its own process, killed with SIGKILL once it has started sending.
    let committed = (USERS * 2) as usize;
    let mut relay = Command::new(binaries().path("conveyor")?)
        .args(["outbox", "relay", "--lease-secs", "5"])
        .args(source.cli_args())
        .envs(localstack::aws_env())
        .env("RUST_LOG", "warn")
        .env("CONVEYOR_OUTBOX_MAX_ATTEMPTS", "3")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    wait_until(Duration::from_secs(60), Duration::from_millis(20), async || {
        source.unsent().await.is_ok_and(|left| left < committed - 50)
    })
    .await?;
    relay.start_kill()?;
    relay.wait().await?;
    let left_at_kill = source.unsent().await?;
    println!("relay killed with {left_at_kill} of {committed} outbox jobs left");
    assert!(left_at_kill > 0, "killed mid-backlog");

    // The worker relays the rest (taking the lease over once the killed relay's lapses) and runs the jobs.
    let emails = outbox_path(name);
    let mut env = app_env(&idempotency, &emails);
    env.push(source.worker_env());
    env.push(("CONVEYOR_OUTBOX_LEASE_SECONDS".to_owned(), "5".to_owned()));
    env.push(("CONVEYOR_OUTBOX_MAX_ATTEMPTS".to_owned(), "3".to_owned()));
    let mut worker = binaries().spawn_worker(&queue.url, None, &env, None)?;
    wait_until(Duration::from_secs(240), Duration::from_millis(500), async || {
        emails_in_order(&emails).is_ok_and(|order| {
            order.len() == (USERS - 1) as usize && order.values().all(|sent| sent.len() >= 2)
        })
    })
    .await?;
    let mut backlog_args = vec!["outbox", "backlog"];
    let source_args = source.cli_args();
    backlog_args.extend(source_args.iter().map(String::as_str));
    let backlog = cli(&backlog_args).await?;
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

    // The operator creates the missing queue and resends: on DynamoDB the aggregate, on Postgres
    // everything parked on the queue (by its name).
    sqs.create_queue().queue_name(&later_name).send().await?;
    let aggregate = format!("user#{POISONED}");
    let mut resend_args = match &source {
        Source::Dynamo { .. } => vec!["outbox", "resend", "--aggregate", aggregate.as_str()],
        Source::Postgres { .. } => vec!["outbox", "resend", "--queue", later_name.as_str()],
    };
    resend_args.extend(source_args.iter().map(String::as_str));
    let resent = cli(&resend_args).await?;
    assert_eq!(resent["unparked"], 1, "{resent}");
    assert_eq!(resent["aggregates"], serde_json::json!([aggregate]), "{resent}");
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
        queue_is_empty(&sqs_queue).await && source.unsent().await.is_ok_and(|left| left == 0)
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
