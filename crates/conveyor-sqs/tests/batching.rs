//! `BatchingProducer` against LocalStack, plain and through the fault layer: 1,000 concurrent single
//! sends against plain `send` (figures: requests per job, jobs per second, in one run); a slow, then
//! failing, then throttling SQS where every caller is told the truth and nothing is stored twice; a
//! shutdown in the middle of sends that loses nothing; FIFO groups kept in order under throttling.
//!
//! The truth check: after the sends, the queue is drained and the bodies stored must be exactly those
//! whose caller was told `Ok`, each once. `Fault::DropResponse` is left out on purpose: SQS stores the
//! call, and the SDK's own retry of the lost answer stores it again (the at-least-once send consumers
//! are idempotent for), which is not the buffer's doing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_sqs::Client;
use conveyor_sqs::{BatchingConfig, BatchingProducer, NewJob, ProduceError, Producer};
use conveyor_testing::localstack::{QueueSpec, create_queue, ensure_local_aws, sqs_client};
use conveyor_testing::{Fault, Faults, Rule, faulty_sqs_client};

/// Every body in the queue at `url`, with how many times each is stored; deletes what it reads.
async fn drain(client: &Client, url: &str, expected: usize) -> anyhow::Result<HashMap<String, usize>> {
    let mut stored: HashMap<String, usize> = HashMap::new();
    let mut empty_receives = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Until everything expected is in, then two empty long polls in a row (nothing more arrives).
    while empty_receives < 2 {
        anyhow::ensure!(Instant::now() < deadline, "draining {url} took over 60 s");
        let wait = if stored.values().sum::<usize>() >= expected {
            1
        } else {
            2
        };
        let output = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait)
            .send()
            .await?;
        let messages = output.messages.unwrap_or_default();
        if messages.is_empty() {
            if stored.values().sum::<usize>() >= expected {
                empty_receives += 1;
            }
            continue;
        }
        empty_receives = 0;
        let mut delete = client.delete_message_batch().queue_url(url);
        for (n, message) in messages.iter().enumerate() {
            *stored
                .entry(message.body().unwrap_or_default().to_owned())
                .or_default() += 1;
            delete = delete.entries(
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(n.to_string())
                    .receipt_handle(message.receipt_handle().unwrap_or_default())
                    .build()?,
            );
        }
        delete.send().await?;
    }
    Ok(stored)
}

/// The queue holds exactly the jobs whose caller was told `Ok`, each once.
fn assert_truthful(results: &[(String, Result<String, ProduceError>)], stored: &HashMap<String, usize>) {
    let doubled: Vec<_> = stored.iter().filter(|(_, count)| **count > 1).collect();
    assert!(doubled.is_empty(), "stored twice: {doubled:?}");
    for (body, result) in results {
        assert_eq!(
            stored.contains_key(body),
            result.is_ok(),
            "job {body}: the caller was told {result:?}"
        );
    }
    assert_eq!(
        stored.len(),
        results.iter().filter(|(_, result)| result.is_ok()).count(),
        "nothing stored that no caller sent"
    );
}

/// Sends `count` jobs (bodies `"<tag>-<n>"`) at once through `batching`; each job's body and result.
async fn send_all(
    batching: &BatchingProducer,
    tag: &str,
    count: usize,
) -> Vec<(String, Result<String, ProduceError>)> {
    let tasks: Vec<_> = (0..count)
        .map(|n| {
            let batching = batching.clone();
            let payload = format!("{tag}-{n}");
            tokio::spawn(async move {
                let result = batching.send(&NewJob::new("n", payload.clone())).await;
                (serde_json::to_string(&payload).unwrap(), result)
            })
        })
        .collect();
    let mut results = Vec::with_capacity(count);
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_single_sends_against_plain_send() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = sqs_client().await;
    const JOBS: usize = 1_000;

    let plain_queue = create_queue(&client, &QueueSpec::standard("batching-plain")).await?;
    let plain = Arc::new(Producer::new(client.clone(), &plain_queue.url));
    let started = Instant::now();
    let tasks: Vec<_> = (0..JOBS)
        .map(|n| {
            let plain = Arc::clone(&plain);
            tokio::spawn(async move { plain.send(&NewJob::new("n", n)).await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let plain_elapsed = started.elapsed();

    let queue = create_queue(&client, &QueueSpec::standard("batching")).await?;
    let batching = BatchingProducer::new(
        Producer::new(client.clone(), &queue.url),
        BatchingConfig::default(),
    )?;
    let started = Instant::now();
    let results = send_all(&batching, "job", JOBS).await;
    let elapsed = started.elapsed();
    batching.shutdown().await;
    let requests = batching.producer().requests();

    println!(
        "figure: {JOBS} concurrent single sends, plain send: {} requests ({:.2} per job), {:.0} jobs/s",
        plain.requests(),
        plain.requests() as f64 / JOBS as f64,
        JOBS as f64 / plain_elapsed.as_secs_f64()
    );
    println!(
        "figure: {JOBS} concurrent single sends, BatchingProducer (defaults): {requests} requests ({:.2} per job), {:.0} jobs/s",
        requests as f64 / JOBS as f64,
        JOBS as f64 / elapsed.as_secs_f64()
    );
    assert!(results.iter().all(|(_, result)| result.is_ok()), "every job sent");
    assert!(
        requests <= (JOBS / 4) as u64,
        "concurrent sends share calls: {requests} requests for {JOBS} jobs"
    );
    let stored = drain(&client, &queue.url, JOBS).await?;
    assert_truthful(&results, &stored);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_then_failing_then_throttling_sqs_every_caller_is_told_the_truth() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let faults = Faults::new(29);
    let client = faulty_sqs_client(&faults).await;
    let queue = create_queue(&sqs_client().await, &QueueSpec::standard("batching-faults")).await?;
    let config = BatchingConfig::default()
        .with_buffer(20)
        .with_max_calls_in_flight(2);
    let batching = BatchingProducer::new(Producer::new(client.clone(), &queue.url), config)?;
    let mut results = Vec::new();

    // Slow: every call takes 300 ms. The buffer fills to its 20 and callers wait; it never holds more.
    let slow = faults.add(Rule::new(Fault::Delay(Duration::from_millis(300))).on("SendMessageBatch"));
    let watching = Arc::new(AtomicBool::new(true));
    let most = Arc::new(AtomicUsize::new(0));
    let watcher = tokio::spawn({
        let (batching, watching, most) = (batching.clone(), Arc::clone(&watching), Arc::clone(&most));
        async move {
            while watching.load(Ordering::SeqCst) {
                most.fetch_max(batching.buffered(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let started = Instant::now();
    results.extend(send_all(&batching, "slow", 200).await);
    watching.store(false, Ordering::SeqCst);
    watcher.await?;
    println!(
        "figure: 200 sends with every call 300 ms late, 2 calls at once: {:.0} jobs/s, at most {} jobs buffered (limit 20)",
        200.0 / started.elapsed().as_secs_f64(),
        most.load(Ordering::SeqCst)
    );
    assert!(most.load(Ordering::SeqCst) <= 20);
    assert!(faults.stats(slow).injected > 0);
    faults.remove(slow);

    // Failing: every call answers 500, through the SDK's and the producer's retries.
    let failing = faults.add(Rule::new(Fault::ServerError).on("SendMessageBatch"));
    let failed = send_all(&batching, "down", 30).await;
    assert!(
        failed
            .iter()
            .all(|(_, result)| matches!(result, Err(ProduceError::Queue(_)))),
        "every caller is told SQS failed: {:?}",
        failed.iter().find(|(_, result)| result.is_ok())
    );
    results.extend(failed);
    faults.remove(failing);

    // Throttling: half the calls throttled; whatever each caller is told is what happened.
    let throttle = faults.add(Rule::new(Fault::Throttle).on("SendMessageBatch").probability(0.5));
    results.extend(send_all(&batching, "throttled", 200).await);
    assert!(faults.stats(throttle).injected > 0);
    faults.clear();
    batching.shutdown().await;

    let sent = results.iter().filter(|(_, result)| result.is_ok()).count();
    let stored = drain(&sqs_client().await, &queue.url, sent).await?;
    assert_truthful(&results, &stored);
    assert!(
        stored.len() >= 200,
        "the slow phase's jobs and most throttled ones are stored"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_in_the_middle_of_sends_loses_nothing() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let faults = Faults::new(3);
    let client = faulty_sqs_client(&faults).await;
    let queue = create_queue(&sqs_client().await, &QueueSpec::standard("batching-shutdown")).await?;
    faults.add(Rule::new(Fault::Delay(Duration::from_millis(50))).on("SendMessageBatch"));
    let batching = BatchingProducer::new(
        Producer::new(client, &queue.url),
        BatchingConfig::default()
            .with_buffer(100)
            .with_max_calls_in_flight(1),
    )?;
    let sending = tokio::spawn({
        let batching = batching.clone();
        async move { send_all(&batching, "job", 500).await }
    });
    // Shut down once some jobs are in the buffer: part of the 500 are buffered, part not yet.
    conveyor_testing::wait_until(Duration::from_secs(20), Duration::from_millis(1), async || {
        batching.buffered() >= 50
    })
    .await
    .context("the buffer never filled")?;
    batching.shutdown().await;
    let results = sending.await?;

    let sent = results.iter().filter(|(_, result)| result.is_ok()).count();
    let refused = results
        .iter()
        .filter(|(_, result)| matches!(result, Err(ProduceError::ShutDown)))
        .count();
    println!("shutdown after the buffer held 50: {sent} sent, {refused} refused as not buffered");
    assert_eq!(
        sent + refused,
        500,
        "every caller is answered: sent, or refused as not buffered"
    );
    assert!(sent >= 50, "what was buffered is sent: {sent}");
    let stored = drain(&sqs_client().await, &queue.url, sent).await?;
    assert_truthful(&results, &stored);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_reach_the_queue_in_the_order_they_were_handed_over_under_throttling()
-> anyhow::Result<()> {
    ensure_local_aws().await?;
    let faults = Faults::new(11);
    let client = faulty_sqs_client(&faults).await;
    let queue = create_queue(&sqs_client().await, &QueueSpec::fifo("batching-fifo")).await?;
    faults.add(Rule::new(Fault::Throttle).on("SendMessageBatch").probability(0.3));
    let batching = BatchingProducer::new(Producer::new(client, &queue.url), BatchingConfig::default())?;
    const GROUPS: usize = 5;
    const PER_GROUP: usize = 40;
    // Each group's jobs handed over in order from one task (join_all polls them in order); the groups
    // at the same time.
    let tasks: Vec<_> = (0..GROUPS)
        .map(|group| {
            let batching = batching.clone();
            tokio::spawn(async move {
                let jobs: Vec<NewJob<String>> = (0..PER_GROUP)
                    .map(|n| {
                        NewJob::new("n", format!("g{group}-{n:03}"))
                            .group_id(format!("g{group}"))
                            .deduplication_id(format!("g{group}-{n}"))
                    })
                    .collect();
                let results = futures_util::future::join_all(jobs.iter().map(|job| batching.send(job))).await;
                (0..PER_GROUP)
                    .zip(results)
                    .filter(|(_, result)| result.is_ok())
                    .map(|(n, _)| format!("g{group}-{n:03}"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (group, task) in tasks.into_iter().enumerate() {
        expected.insert(format!("g{group}"), task.await?);
    }
    batching.shutdown().await;

    // Received in the queue's order per group (a FIFO receive returns a group's messages in order,
    // and a group's next messages only after these are deleted).
    let plain = sqs_client().await;
    let mut received: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let total: usize = expected.values().map(Vec::len).sum();
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while count < total {
        anyhow::ensure!(Instant::now() < deadline, "only {count} of {total} received");
        let output = plain
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await?;
        for message in output.messages.unwrap_or_default() {
            let body: String = serde_json::from_str(message.body().unwrap_or_default())?;
            let group = body.split('-').next().unwrap_or_default().to_owned();
            received.entry(group).or_default().push(body);
            count += 1;
            plain
                .delete_message()
                .queue_url(&queue.url)
                .receipt_handle(message.receipt_handle().unwrap_or_default())
                .send()
                .await?;
        }
    }
    expected.retain(|_, jobs| !jobs.is_empty());
    assert_eq!(
        received, expected,
        "each group holds exactly its sent jobs, in order"
    );
    Ok(())
}
