//! A job's effect happens once, across deliveries, duplicate sends, several workers and both runtimes.
//!
//! Real binaries against LocalStack and DynamoDB Local: the example `worker` (the ECS runtime), and the
//! example `bootstrap` under `conveyor lambda run` (the Lambda runtime), sharing one idempotency table.

use std::time::Duration;

use conveyor_demo::{queue_is_empty, terminate};
use conveyor_e2e::{app_env, binaries, emails_per_user, outbox_path};
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;

fn welcome(user_id: u64) -> NewJob<WelcomeEmail> {
    let job = WelcomeEmail {
        user_id,
        email: format!("user{user_id}@example.com"),
        name: format!("user {user_id}"),
    };
    let key = job.idempotency_key();
    NewJob::new("welcome_email", job).key(key)
}

fn queue_spec(prefix: &str) -> QueueSpec {
    QueueSpec {
        name_prefix: prefix.to_owned(),
        fifo: false,
        visibility_timeout_secs: 10,
        max_receive_count: Some(5),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_and_a_thousand_jobs_each_sent_twice_have_each_effect_once() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "e2e-twice").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-twice")).await?;
    let outbox = outbox_path("e2e-twice");
    let env = app_env(&table, &outbox);

    let producer = Producer::new(sqs.clone(), &queue.url);
    let jobs: Vec<NewJob<WelcomeEmail>> = (1..=1000).map(welcome).collect();
    for round in 0..2 {
        let report = producer.send_batch(&jobs).await;
        assert!(report.all_sent(), "round {round}: {} of 1000 sent", report.sent());
    }
    let mut first = binaries().spawn_worker(&queue.url, None, &env, None)?;
    let mut second = binaries().spawn_worker(&queue.url, None, &env, None)?;

    wait_until(Duration::from_secs(240), Duration::from_millis(500), async || {
        emails_per_user(&outbox).is_ok_and(|counts| counts.len() == 1000)
    })
    .await?;
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    wait_until(Duration::from_secs(60), Duration::from_millis(500), async || {
        queue_is_empty(&sqs_queue).await
    })
    .await?;
    terminate(&mut first).await?;
    terminate(&mut second).await?;

    let counts = emails_per_user(&outbox)?;
    let doubled: Vec<(&u64, &usize)> = counts.iter().filter(|(_, count)| **count != 1).collect();
    assert_eq!(counts.len(), 1000, "every user got an email");
    assert!(doubled.is_empty(), "users emailed more than once: {doubled:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_done_by_one_runtime_is_skipped_by_the_other() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let table = localstack::create_table(&localstack::dynamodb_client().await, "e2e-cross").await?;
    let worker_queue = localstack::create_queue(&sqs, &queue_spec("e2e-cross-worker")).await?;
    let lambda_queue = localstack::create_queue(&sqs, &queue_spec("e2e-cross-lambda")).await?;
    let outbox = outbox_path("e2e-cross");
    let env = app_env(&table, &outbox);
    let to_worker = Producer::new(sqs.clone(), &worker_queue.url);
    let to_lambda = Producer::new(sqs.clone(), &lambda_queue.url);

    // Worker first, then the same key through the Lambda.
    to_worker.send(&welcome(77)).await?;
    let mut worker = binaries().spawn_worker(&worker_queue.url, None, &env, None)?;
    wait_until(Duration::from_secs(60), Duration::from_millis(200), async || {
        emails_per_user(&outbox).is_ok_and(|counts| counts.contains_key(&77))
    })
    .await?;
    to_lambda.send(&welcome(77)).await?;
    // Lambda first, then the same key through the (still running) worker.
    to_lambda.send(&welcome(78)).await?;
    binaries().run_lambda(&lambda_queue.url, &env, None).await?;
    assert_eq!(
        emails_per_user(&outbox)?.get(&78),
        Some(&1),
        "the Lambda sent user 78's email"
    );
    to_worker.send(&welcome(78)).await?;

    let worker_queue_port = SqsQueue::connect(sqs.clone(), &worker_queue.url).await?;
    wait_until(Duration::from_secs(60), Duration::from_millis(200), async || {
        queue_is_empty(&worker_queue_port).await
    })
    .await?;
    terminate(&mut worker).await?;

    let counts = emails_per_user(&outbox)?;
    assert_eq!(
        counts.get(&77),
        Some(&1),
        "worker did 77; the Lambda must have skipped it: {counts:?}"
    );
    assert_eq!(
        counts.get(&78),
        Some(&1),
        "the Lambda did 78; the worker must have skipped it: {counts:?}"
    );
    Ok(())
}
