//! `make demo`: the example application end to end on the local AWS stack.
//!
//! Creates a queue with its DLQ and the idempotency table, starts the real `worker` binary, sends a mix of
//! jobs (a duplicate send, a flaky webhook that succeeds on retry, two poison jobs, a report longer than
//! the visibility timeout, a chunked report flow whose chunks run on a second worker too, with their
//! progress followed live), waits until every job is accounted for, stops the workers with SIGTERM, then
//! runs more jobs through the real Lambda `bootstrap` under `conveyor lambda run`, sharing the table.
//! Prints per job what happened, and exits non-zero if any job was lost or doubled.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    JobStatus,
    port::{IdempotencyStore, Queue as _},
    runtime::Failure,
};
use conveyor_demo::{Binaries, terminate};
use conveyor_dynamodb::DynamoStore;
use conveyor_examples::jobs::chunked_report::chunked_report_flow;
use conveyor_examples::jobs::report::GenerateReport;
use conveyor_examples::jobs::webhook::WebhookDelivery;
use conveyor_examples::jobs::welcome_email::WelcomeEmail;
use conveyor_examples::outbox::Outbox;
use conveyor_examples::webhook_receiver::WebhookReceiver;
use conveyor_sqs::{FlowProducer, NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};

const SECRET: &str = "demo-signing-secret";
const VISIBILITY_SECS: u32 = 10;
const MAX_RECEIVE_COUNT: u32 = 3;
/// The chunked report's chunks (run by two workers).
const CHUNKS: u32 = 6;

/// One job the demo sent, and what it expects to happen.
struct Sent {
    label: String,
    runtime: &'static str,
    expect: Expect,
}

enum Expect {
    /// `count` outbox effects matching `field == value` (1: done once; the duplicate must not add one).
    Effect {
        field: &'static str,
        value: serde_json::Value,
    },
    /// A delivery id the webhook receiver must have answered 200 on the last attempt.
    Delivered(String),
    /// A DLQ message whose body contains this text must carry a failure reason.
    DeadLettered(&'static str),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let bin_dir = std::env::current_exe()?
        .parent()
        .context("the demo binary has no folder")?
        .to_path_buf();
    let work = localstack::repo_root()
        .canonicalize()?
        .join(".local")
        .join("demo");
    std::fs::create_dir_all(&work)?;
    let outbox_path = work.join(format!("outbox-{}.jsonl", std::process::id()));

    step("local AWS");
    localstack::ensure_local_aws().await?;
    println!(
        "  LocalStack (SQS) at {}, DynamoDB Local at {}",
        localstack::sqs_endpoint(),
        localstack::dynamodb_endpoint()
    );
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;

    step("queues and table");
    let spec = |prefix: &str| QueueSpec {
        name_prefix: prefix.to_owned(),
        fifo: false,
        visibility_timeout_secs: VISIBILITY_SECS,
        max_receive_count: Some(MAX_RECEIVE_COUNT),
    };
    let worker_queue = localstack::create_queue(&sqs, &spec("demo-jobs")).await?;
    let lambda_queue = localstack::create_queue(&sqs, &spec("demo-lambda-jobs")).await?;
    let table = localstack::create_table(&dynamodb, "demo-idempotency").await?;
    for queue in [&worker_queue, &lambda_queue] {
        println!(
            "  {} (visibility {VISIBILITY_SECS} s) -> DLQ {} after {MAX_RECEIVE_COUNT} receives",
            queue.name,
            queue.dlq_name.as_deref().unwrap_or("-")
        );
    }
    println!("  idempotency table {table}");

    let receiver = WebhookReceiver::start(SECRET.as_bytes().to_vec()).await?;
    println!("  webhook receiver at {}", receiver.url("/"));

    let app_env = conveyor_demo::local_app_env(&table, &outbox_path, SECRET, "warn,conveyor=info");
    let binaries = Binaries::in_dir(&bin_dir);

    step("worker (ECS runtime)");
    let metrics_port = free_port()?;
    let worker_log = work.join("worker.log");
    let listen_addr = format!("127.0.0.1:{metrics_port}");
    let worker_log_file = std::fs::File::create(&worker_log)?;
    let mut worker = binaries.spawn_worker(
        &worker_queue.url,
        Some(&listen_addr),
        &app_env,
        Some(worker_log_file),
    )?;
    println!(
        "  worker pid {} (logs: {})",
        worker.id().unwrap_or(0),
        worker_log.display()
    );

    let metrics_port_2 = free_port()?;
    let listen_addr_2 = format!("127.0.0.1:{metrics_port_2}");
    let worker_log_2 = work.join("worker-2.log");
    let mut worker_2 = binaries.spawn_worker(
        &worker_queue.url,
        Some(&listen_addr_2),
        &app_env,
        Some(std::fs::File::create(&worker_log_2)?),
    )?;
    println!(
        "  second worker pid {} (logs: {})",
        worker_2.id().unwrap_or(0),
        worker_log_2.display()
    );

    let producer = Producer::new(sqs.clone(), &worker_queue.url);
    let mut sent = send_worker_jobs(&producer, &receiver).await?;
    println!("  sent {} jobs (one of them twice)", sent.len() + 1);
    let store = Arc::new(DynamoStore::new(dynamodb.clone(), &table));
    let flow = chunked_report_flow("cr-1", CHUNKS, 700, &worker_queue.url);
    let flow_sent = FlowProducer::new(sqs.clone(), store.clone()).send(&flow).await?;
    println!(
        "  sent flow {}: {} chunk jobs now, the assembling parent when the last chunk succeeded",
        flow_sent.flow, flow_sent.messages_sent
    );
    sent.push(Sent {
        label: format!("chunked_report cr-1 ({CHUNKS} chunks, 2 workers)"),
        runtime: "worker",
        expect: Expect::Effect {
            field: "report_id",
            value: serde_json::json!("cr-1"),
        },
    });
    let watcher = tokio::spawn(watch_progress(
        store.clone(),
        flow_sent.children.values().cloned().collect(),
    ));

    let main_queue = SqsQueue::connect(sqs.clone(), &worker_queue.url).await?;
    wait_settled(
        &main_queue,
        &outbox_path,
        &receiver,
        &sent,
        Duration::from_secs(120),
    )
    .await?;
    let mut metrics = Vec::new();
    for port in [metrics_port, metrics_port_2] {
        let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await?
            .text()
            .await?;
        metrics.push(text);
    }
    watcher.abort();
    let status = terminate(&mut worker).await?;
    let status_2 = terminate(&mut worker_2).await?;
    println!("\n  SIGTERM -> workers drained and exited with {status} and {status_2}");

    step("conveyor jobs show (the chunked report's parent and its flow)");
    let shown = std::process::Command::new(binaries.path("conveyor")?)
        .envs(app_env.iter().cloned())
        .args(["jobs", "--table", &table, "show", &flow_sent.parent_record])
        .output()?;
    for line in String::from_utf8_lossy(&shown.stdout).lines() {
        println!("  {line}");
    }
    if !shown.status.success() {
        bail!(
            "conveyor jobs show failed: {}",
            String::from_utf8_lossy(&shown.stderr)
        );
    }

    step("Lambda runtime (conveyor lambda run + bootstrap)");
    let lambda_producer = Producer::new(sqs.clone(), &lambda_queue.url);
    sent.extend(send_lambda_jobs(&lambda_producer, &receiver).await?);
    let lambda_log = work.join("lambda.log");
    let log_file = std::fs::File::create(&lambda_log)?;
    binaries
        .run_lambda(&lambda_queue.url, &app_env, Some(log_file))
        .await
        .with_context(|| format!("see {}", lambda_log.display()))?;
    let runner_output = std::fs::read_to_string(&lambda_log)?;
    for line in runner_output
        .lines()
        .filter(|line| line.starts_with("batch") || line.starts_with("summary"))
    {
        println!("  {line}");
    }
    println!(
        "  (bootstrap logs and EMF metric lines: {})",
        lambda_log.display()
    );

    step("what happened");
    let dead = dead_lettered(&sqs, &[&worker_queue, &lambda_queue]).await?;
    let problems = report(&sent, &Outbox::read_all(&outbox_path)?, &receiver, &dead);
    step("worker metrics");
    // Both workers' counters: which of them took which jobs is up to SQS (LocalStack often hands a
    // burst to one poller). Queue-depth and DLQ gauges are sampled every 30 s, so they would show the
    // queues as they were at start-up: left out.
    for (number, text) in metrics.iter().enumerate() {
        println!("  worker {}:", number + 1);
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("conveyor_") && !line.contains("_bucket"))
            .filter(|line| !line.starts_with("conveyor_queue_") && !line.starts_with("conveyor_dlq_"))
            // Per-job-type counters that stayed at 0 say nothing here.
            .filter(|line| !(line.contains("job_type=") && line.ends_with(" 0")))
            .collect();
        lines.sort_unstable();
        for line in lines {
            println!("    {line}");
        }
    }
    println!(
        "\n{} in {:.1} s",
        if problems == 0 {
            "demo passed"
        } else {
            "demo FAILED"
        },
        started.elapsed().as_secs_f64()
    );
    if problems > 0 {
        bail!(
            "{problems} job(s) did not end as expected; see {}",
            worker_log.display()
        );
    }
    Ok(())
}

/// Prints the report's and the chunks' status and progress each time they change (what
/// `conveyor jobs watch` shows for one job), until aborted.
async fn watch_progress(store: Arc<DynamoStore>, chunk_keys: Vec<String>) {
    let mut last = String::new();
    loop {
        let mut line = String::new();
        let mut statuses = std::collections::BTreeMap::<JobStatus, usize>::new();
        let mut percents = Vec::new();
        for key in &chunk_keys {
            if let Ok(Some(job)) = store.job(key).await {
                *statuses.entry(job.status).or_default() += 1;
                percents.push(job.progress.map_or(0, |progress| progress.percent));
            }
        }
        let sum: u32 = percents.iter().map(|percent| u32::from(*percent)).sum();
        let overall = sum / u32::try_from(chunk_keys.len().max(1)).unwrap_or(1);
        let counts: Vec<String> = statuses
            .iter()
            .map(|(status, count)| format!("{count} {status}"))
            .collect();
        line.push_str(&format!("chunks: {} (progress {overall}%)", counts.join(", ")));
        if line != last {
            println!("  {line}");
            last = line;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn step(title: &str) {
    println!("\n== {title}");
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn email(user_id: u64, email: &str) -> WelcomeEmail {
    WelcomeEmail {
        user_id,
        email: email.to_owned(),
        name: format!("user {user_id}"),
    }
}

fn webhook(receiver: &WebhookReceiver, id: &str, path: &str) -> WebhookDelivery {
    WebhookDelivery {
        delivery_id: id.to_owned(),
        url: receiver.url(path),
        event: "invoice.paid".to_owned(),
        payload: serde_json::json!({ "invoice": id }),
    }
}

async fn send_email(producer: &Producer, job: WelcomeEmail) -> anyhow::Result<String> {
    let key = job.idempotency_key();
    Ok(producer.send(&NewJob::new("welcome_email", job).key(key)).await?)
}

async fn send_webhook(producer: &Producer, job: WebhookDelivery) -> anyhow::Result<String> {
    Ok(producer.send(&NewJob::new("webhook", job)).await?)
}

async fn send_worker_jobs(producer: &Producer, receiver: &WebhookReceiver) -> anyhow::Result<Vec<Sent>> {
    let mut sent = Vec::new();
    let user_effect = |user: u64| Expect::Effect {
        field: "to_user",
        value: serde_json::json!(user),
    };
    send_email(producer, email(1, "ada@example.com")).await?;
    send_email(producer, email(1, "ada@example.com")).await?;
    sent.push(Sent {
        label: "welcome_email user:1 (sent twice)".into(),
        runtime: "worker",
        expect: user_effect(1),
    });
    send_email(producer, email(2, "grace@example.com")).await?;
    sent.push(Sent {
        label: "welcome_email user:2".into(),
        runtime: "worker",
        expect: user_effect(2),
    });
    send_webhook(producer, webhook(receiver, "wh-ok", "/ok")).await?;
    sent.push(Sent {
        label: "webhook wh-ok".into(),
        runtime: "worker",
        expect: Expect::Delivered("wh-ok".into()),
    });
    send_webhook(producer, webhook(receiver, "wh-flaky", "/flaky")).await?;
    sent.push(Sent {
        label: "webhook wh-flaky (503 first)".into(),
        runtime: "worker",
        expect: Expect::Delivered("wh-flaky".into()),
    });
    send_webhook(producer, webhook(receiver, "wh-gone", "/gone")).await?;
    sent.push(Sent {
        label: "webhook wh-gone (410)".into(),
        runtime: "worker",
        expect: Expect::DeadLettered("wh-gone"),
    });
    let poison = NewJob::new("welcome_email", serde_json::json!({ "user_id": "not-a-number" }));
    producer.send(&poison).await?;
    sent.push(Sent {
        label: "welcome_email, malformed body".into(),
        runtime: "worker",
        expect: Expect::DeadLettered("not-a-number"),
    });
    let report = GenerateReport {
        report_id: "r-1".into(),
        sections: 4,
        section_millis: 3_500,
    };
    producer.send(&NewJob::new("report", report)).await?;
    sent.push(Sent {
        label: format!("report r-1 (14 s, visibility {VISIBILITY_SECS} s)"),
        runtime: "worker",
        expect: Expect::Effect {
            field: "report_id",
            value: serde_json::json!("r-1"),
        },
    });
    Ok(sent)
}

async fn send_lambda_jobs(producer: &Producer, receiver: &WebhookReceiver) -> anyhow::Result<Vec<Sent>> {
    let mut sent = Vec::new();
    send_email(producer, email(1, "ada@example.com")).await?;
    sent.push(Sent {
        label: "welcome_email user:1 again (done by the worker)".into(),
        runtime: "lambda",
        expect: Expect::Effect {
            field: "to_user",
            value: serde_json::json!(1),
        },
    });
    send_email(producer, email(3, "linus@example.com")).await?;
    sent.push(Sent {
        label: "welcome_email user:3".into(),
        runtime: "lambda",
        expect: Expect::Effect {
            field: "to_user",
            value: serde_json::json!(3),
        },
    });
    send_webhook(producer, webhook(receiver, "wh-lambda-flaky", "/flaky")).await?;
    sent.push(Sent {
        label: "webhook wh-lambda-flaky (503 first)".into(),
        runtime: "lambda",
        expect: Expect::Delivered("wh-lambda-flaky".into()),
    });
    send_webhook(producer, webhook(receiver, "wh-lambda-gone", "/gone")).await?;
    sent.push(Sent {
        label: "webhook wh-lambda-gone (410)".into(),
        runtime: "lambda",
        expect: Expect::DeadLettered("wh-lambda-gone"),
    });
    Ok(sent)
}

/// Waits until the queue is empty (nothing visible, in flight or delayed) and every effect happened.
async fn wait_settled(
    queue: &SqsQueue,
    outbox: &Path,
    receiver: &WebhookReceiver,
    sent: &[Sent],
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        let depth = queue.depth().await?;
        let effects = Outbox::read_all(outbox)?;
        let delivered = receiver.attempts();
        let pending = sent
            .iter()
            .filter(|job| match &job.expect {
                Expect::Effect { field, value } => !effects.iter().any(|effect| &effect[field] == value),
                Expect::Delivered(id) => !delivered.contains_key(id),
                Expect::DeadLettered(_) => false,
            })
            .count();
        let in_queue = depth.visible + depth.in_flight + depth.delayed;
        if pending == 0 && in_queue == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "after {timeout:?}: {pending} job(s) without their effect, {in_queue} message(s) still in the queue"
            );
        }
        let state = (pending, in_queue);
        if last != Some(state) {
            println!(
                "  waiting: {pending} job(s) without their effect yet, {in_queue} message(s) in the queue"
            );
            last = Some(state);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// (body, failure) for everything in the queues' DLQs (peeked: they become visible again in 1 s).
async fn dead_lettered(
    sqs: &aws_sdk_sqs::Client,
    queues: &[&localstack::TestQueue],
) -> anyhow::Result<Vec<(String, Failure)>> {
    let mut dead = Vec::new();
    for queue in queues {
        let Some(dlq) = &queue.dlq_url else { continue };
        let received = sqs
            .receive_message()
            .queue_url(dlq)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(1)
            .message_attribute_names("All")
            .send()
            .await?;
        for message in received.messages() {
            let failure = message
                .message_attributes()
                .and_then(|attributes| attributes.get(FAILURE_ATTRIBUTE))
                .and_then(|value| value.string_value())
                .and_then(|json| serde_json::from_str::<Failure>(json).ok());
            if let Some(failure) = failure {
                dead.push((message.body().unwrap_or_default().to_owned(), failure));
            }
        }
    }
    Ok(dead)
}

/// Prints one line per job; returns how many did not end as expected.
fn report(
    sent: &[Sent],
    effects: &[serde_json::Value],
    receiver: &WebhookReceiver,
    dead: &[(String, Failure)],
) -> usize {
    let attempts = receiver.attempts();
    let mut problems = 0;
    println!("  {:<48} {:<7} result", "job", "runtime");
    for job in sent {
        let (ok, result) = match &job.expect {
            Expect::Effect { field, value } => {
                let count = effects.iter().filter(|effect| &effect[field] == value).count();
                let runs: Vec<String> = effects
                    .iter()
                    .filter(|effect| &effect[field] == value)
                    .map(|effect| match effect["queue"].as_str() {
                        Some(queue) if queue.contains("lambda") => "by the Lambda".to_owned(),
                        _ => "by the worker".to_owned(),
                    })
                    .collect();
                (
                    count == 1,
                    format!("done once ({count} effect; {})", runs.join(", ")),
                )
            }
            Expect::Delivered(id) => {
                let tries = attempts.get(id).copied().unwrap_or(0);
                let retries = tries.saturating_sub(1);
                (
                    tries >= 1,
                    format!("delivered on attempt {tries} (retried {retries} time(s))"),
                )
            }
            Expect::DeadLettered(text) => match dead.iter().find(|(body, _)| body.contains(text)) {
                Some((_, failure)) => (
                    true,
                    format!(
                        "dead-lettered after {} receive(s): {}",
                        failure.receive_count, failure.error
                    ),
                ),
                None => (false, "NOT in the DLQ".to_owned()),
            },
        };
        if !ok {
            problems += 1;
        }
        println!(
            "  {:<48} {:<7} {}{result}",
            job.label,
            job.runtime,
            if ok { "" } else { "UNEXPECTED: " }
        );
    }
    problems
}
