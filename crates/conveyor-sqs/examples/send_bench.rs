//! Jobs sent per second with `Producer::send_batch` against one `Producer::send` per job, in the same run,
//! against LocalStack (started through `localstack/start.sh` if it is not running).
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
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use serde::Serialize;

#[derive(Serialize)]
struct Payload {
    user_id: u64,
    template: &'static str,
}

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

    for mode in ["send_batch", "send"] {
        let created = create_queue(&client, &QueueSpec::standard(&format!("bench-{mode}"))).await?;
        let producer = Producer::new(client.clone(), &created.url);
        let jobs = jobs(n);
        let started = Instant::now();
        if mode == "send_batch" {
            let report = producer.send_batch(&jobs).await;
            anyhow::ensure!(report.all_sent(), "{} jobs were not sent", n - report.sent());
        } else {
            for job in &jobs {
                producer.send(job).await?;
            }
        }
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
            requests: producer.requests(),
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
