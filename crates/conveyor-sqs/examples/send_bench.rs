//! Jobs sent per second with `Producer::send_batch` against one `Producer::send` per job, and many tasks
//! each sending single jobs with `Producer::send` against the same tasks sharing a `BatchingProducer`, in
//! the same run, against LocalStack (started through `localstack/start.sh` if it is not running).
//!
//! ```text
//! cargo run --release -p conveyor-sqs --example send_bench            # N = 2000 jobs per mode
//! cargo run --release -p conveyor-sqs --example send_bench -- 500     # another N
//! ```
//!
//! Figures, not pass/fail: LocalStack runs on the same 2 cores as this program, so they say how many
//! requests each mode makes and how that shows in throughput, not what SQS itself would do.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use conveyor_core::port::Queue;
use std::sync::Arc;

use conveyor_sqs::{BatchingConfig, BatchingProducer, NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use serde::Serialize;

#[derive(Serialize)]
struct Payload {
    user_id: u64,
    template: &'static str,
}

/// Tasks sending single jobs at once in the concurrent modes (a web service's request handlers).
const TASKS: usize = 100;

struct Row {
    mode: &'static str,
    jobs: usize,
    requests: u64,
    elapsed: Duration,
}

fn jobs(n: usize) -> Vec<NewJob<Payload>> {
    (0..n)
        .map(|i| {
            NewJob::new(
                "welcome_email",
                Payload {
                    user_id: i as u64,
                    template: "welcome-v3",
                },
            )
            .key(format!("welcome_email:user:{i}"))
        })
        .collect()
}

/// Sends `jobs` from [`TASKS`] tasks at once, each sending its share one job after another.
async fn in_tasks<F, R>(jobs: Vec<NewJob<Payload>>, send: F) -> anyhow::Result<()>
where
    F: Fn(NewJob<Payload>) -> R + Clone + Send + 'static,
    R: std::future::Future<Output = Result<String, conveyor_sqs::ProduceError>> + Send,
{
    let mut shares: Vec<Vec<NewJob<Payload>>> = (0..TASKS).map(|_| Vec::new()).collect();
    for (i, job) in jobs.into_iter().enumerate() {
        shares[i % TASKS].push(job);
    }
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let send = send.clone();
            tokio::spawn(async move {
                for job in share {
                    send(job).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(text) => text
            .parse()
            .context("the argument is the number of jobs per mode")?,
        None => 2000,
    };
    ensure_local_aws().await?;
    let client = sqs_client().await;
    let mut rows = Vec::new();

    for mode in [
        "send_batch",
        "send",
        "send, 100 tasks",
        "BatchingProducer, 100 tasks",
    ] {
        let created = create_queue(&client, &QueueSpec::standard("bench-send")).await?;
        let producer = Producer::new(client.clone(), &created.url);
        let jobs = jobs(n);
        let started = Instant::now();
        let requests = match mode {
            "send_batch" => {
                let report = producer.send_batch(&jobs).await;
                anyhow::ensure!(report.all_sent(), "{} jobs were not sent", n - report.sent());
                producer.requests()
            }
            "send" => {
                for job in &jobs {
                    producer.send(job).await?;
                }
                producer.requests()
            }
            "send, 100 tasks" => {
                let producer = Arc::new(producer);
                in_tasks(jobs, {
                    let producer = Arc::clone(&producer);
                    move |job| {
                        let producer = Arc::clone(&producer);
                        async move { producer.send(&job).await }
                    }
                })
                .await?;
                producer.requests()
            }
            _ => {
                let batching = BatchingProducer::new(producer, BatchingConfig::default())?;
                in_tasks(jobs, {
                    let batching = batching.clone();
                    move |job| {
                        let batching = batching.clone();
                        async move { batching.send(&job).await }
                    }
                })
                .await?;
                batching.shutdown().await;
                batching.producer().requests()
            }
        };
        let elapsed = started.elapsed();
        let queue = SqsQueue::connect(client.clone(), &created.url).await?;
        let depth = queue.depth().await?;
        anyhow::ensure!(
            depth.visible as usize == n,
            "{mode}: {} of {n} jobs are in the queue",
            depth.visible
        );
        rows.push(Row {
            mode,
            jobs: n,
            requests,
            elapsed,
        });
        client.delete_queue().queue_url(&created.url).send().await?;
    }

    println!("| mode | jobs | requests | requests/job | seconds | jobs/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    for row in &rows {
        let seconds = row.elapsed.as_secs_f64();
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.0} |",
            row.mode,
            row.jobs,
            row.requests,
            row.requests as f64 / row.jobs as f64,
            seconds,
            row.jobs as f64 / seconds
        );
    }
    Ok(())
}
