//! Flows and job tracking end to end: the real example `worker` binaries against LocalStack and
//! DynamoDB Local, the flow sent with `FlowProducer` and the records read with `DynamoStore`.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::{
    port::{ChildEnd, FlowStore as _, IdempotencyStore},
    runtime::Failure,
    {ChildFailurePolicy, JobQuery, JobStatus},
};
use conveyor_demo::{queue_is_empty, terminate};
use conveyor_dynamodb::DynamoStore;
use conveyor_e2e::{app_env, binaries, outbox_path};
use conveyor_examples::jobs::chunked_report::{ReportChunk, RunReportChunk, chunked_report_flow};
use conveyor_examples::jobs::report::GenerateReport;
use conveyor_examples::outbox::Outbox;
use conveyor_sqs::{Flow, FlowProducer, NewJob, Producer, SqsQueue};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::{wait_for, wait_until};

fn queue_spec(prefix: &str) -> QueueSpec {
    QueueSpec {
        name_prefix: prefix.to_owned(),
        fifo: false,
        visibility_timeout_secs: 10,
        max_receive_count: Some(5),
    }
}

/// The assembled-report effects recorded for `report_id`.
fn assembled(outbox: &std::path::Path, report_id: &str) -> Vec<serde_json::Value> {
    Outbox::read_all(outbox)
        .unwrap_or_default()
        .into_iter()
        .filter(|effect| effect["effect"] == "chunked_report_assembled" && effect["report_id"] == report_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_of_100_children_on_two_workers_with_duplicates_and_a_killed_worker_runs_its_parent_once()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "e2e-flow").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-flow")).await?;
    let outbox = outbox_path("e2e-flow");
    let env = app_env(&table, &outbox);
    let store = Arc::new(DynamoStore::new(dynamodb, &table));

    // 100 chunks of 4 queries of 150 ms, 5 at a time per worker; the whole flow sent twice: every
    // child has a duplicate.
    let flow = chunked_report_flow("cr-100", 100, 150, &queue.url);
    let mut env = env;
    env.push(("CONVEYOR_MAX_IN_FLIGHT".to_owned(), "5".to_owned()));
    let producer = FlowProducer::new(sqs.clone(), store.clone());
    let sent = producer.send(&flow).await?;
    producer.send(&flow).await?;
    assert_eq!(sent.messages_sent, 100);

    let mut doomed = binaries().spawn_worker(&queue.url, None, &env, None)?;
    let mut survivor = binaries().spawn_worker(&queue.url, None, &env, None)?;
    let chunk_keys: Vec<String> = sent.children.values().cloned().collect();
    // One query of the jobs index (the table is this test's own).
    let succeeded = async |store: &DynamoStore| {
        let query = JobQuery {
            job_type: "report_chunk".to_owned(),
            status: Some(JobStatus::Succeeded),
            limit: 200,
        };
        store.jobs(&query).await.map_or(0, |jobs| jobs.len())
    };
    // Kill one worker mid-flow (SIGKILL: no drain, its claims lapse with their leases).
    wait_until(Duration::from_secs(120), Duration::from_millis(300), async || {
        succeeded(&store).await >= 20
    })
    .await?;
    doomed.start_kill()?;
    doomed.wait().await?;
    let at_kill = store.flow(&sent.flow).await?.expect("the flow's record");
    assert!(
        at_kill.pending() > 0,
        "the worker was killed mid-flow ({} of 100 done)",
        at_kill.succeeded
    );

    wait_until(Duration::from_secs(240), Duration::from_millis(500), async || {
        !assembled(&outbox, "cr-100").is_empty()
    })
    .await?;
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    wait_until(Duration::from_secs(120), Duration::from_millis(500), async || {
        queue_is_empty(&sqs_queue).await
    })
    .await?;
    terminate(&mut survivor).await?;

    let effects = assembled(&outbox, "cr-100");
    assert_eq!(effects.len(), 1, "the parent ran once: {effects:?}");
    assert_eq!(
        effects[0]["chunks"], 100,
        "the parent saw 100 outputs: {effects:?}"
    );
    // Every chunk's rows: (chunk + 1) * 10 per query, 4 queries.
    let rows: u64 = (0..100u64).map(|chunk| (chunk + 1) * 40).sum();
    assert_eq!(effects[0]["rows"], rows);

    let parent = store
        .job(&sent.parent_record)
        .await?
        .expect("the parent is tracked");
    assert_eq!(parent.status, JobStatus::Succeeded);
    assert_eq!(parent.attempts, 1, "the parent ran once: {parent:?}");
    let parent_started = parent
        .history
        .iter()
        .find(|(status, _)| *status == JobStatus::Running)
        .map(|(_, at)| at.0)
        .expect("the parent's run is in its history");
    for key in &chunk_keys {
        let chunk = store.job(key).await?.expect("every chunk is tracked");
        assert_eq!(chunk.status, JobStatus::Succeeded, "{chunk:?}");
        let done = chunk
            .history
            .iter()
            .find(|(status, _)| *status == JobStatus::Succeeded)
            .map(|(_, at)| at.0)
            .expect("a succeeded chunk has its time");
        assert!(
            done <= parent_started,
            "chunk {key} finished after the parent started"
        );
    }
    let flow_state = store.flow(&sent.flow).await?.expect("the flow's record");
    assert_eq!(
        (flow_state.succeeded, flow_state.failed, flow_state.pending()),
        (100, 0, 0)
    );
    assert!(flow_state.parent_sent_at.is_some());
    Ok(())
}

/// A flow of three chunks, chunk 1 poisoned (no queries: a permanent failure).
fn poisoned_flow(report_id: &str, queue_url: &str, policy: ChildFailurePolicy) -> Flow {
    let parent = conveyor_examples::jobs::chunked_report::AssembleReport {
        report_id: report_id.to_owned(),
        chunks: 3,
    };
    let mut flow = Flow::new(
        format!("report:{report_id}"),
        NewJob::new("chunked_report", parent),
        queue_url,
    )
    .on_child_failure(policy);
    for chunk in 0..3 {
        let job = ReportChunk {
            report_id: report_id.to_owned(),
            chunk,
            queries: if chunk == 1 { 0 } else { 2 },
            query_millis: 50,
        };
        flow = flow.child(
            NewJob::new(<RunReportChunk as conveyor_core::Handler>::JOB_TYPE, job),
            queue_url,
        );
    }
    flow
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_child_fails_the_parent_or_is_ignored_as_the_flow_says() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "e2e-flow-fail").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-flow-fail")).await?;
    let outbox = outbox_path("e2e-flow-fail");
    let env = app_env(&table, &outbox);
    let store = Arc::new(DynamoStore::new(dynamodb, &table));
    let producer = FlowProducer::new(sqs.clone(), store.clone());
    let failing = producer
        .send(&poisoned_flow(
            "cr-fail",
            &queue.url,
            ChildFailurePolicy::FailParent,
        ))
        .await?;
    let ignoring = producer
        .send(&poisoned_flow(
            "cr-ignore",
            &queue.url,
            ChildFailurePolicy::Ignore,
        ))
        .await?;
    let mut worker = binaries().spawn_worker(&queue.url, None, &env, None)?;

    // Ignore: the parent runs with the two good chunks and knows one failed.
    wait_until(Duration::from_secs(120), Duration::from_millis(300), async || {
        !assembled(&outbox, "cr-ignore").is_empty()
    })
    .await?;
    let effects = assembled(&outbox, "cr-ignore");
    assert_eq!(effects.len(), 1);
    assert_eq!(
        (
            effects[0]["chunks"].as_u64(),
            effects[0]["failed_chunks"].as_u64()
        ),
        (Some(2), Some(1))
    );
    let ignored = store.flow(&ignoring.flow).await?.expect("the flow's record");
    assert_eq!(ignored.failed, 1, "{ignored:?}");
    let children = store.children(&ignoring.flow).await?;
    assert!(
        matches!(
            &children[1].end,
            Some(ChildEnd::Failed(reason)) if reason.contains("has no queries")
        ),
        "the failed child and its reason are recorded: {children:?}"
    );

    // Fail parent: the parent reaches the DLQ with the child's reason, without running.
    let dlq = queue.dlq_url.clone().expect("the queue has a DLQ");
    let failure = wait_for(Duration::from_secs(120), Duration::from_millis(300), async || {
        let received = sqs
            .receive_message()
            .queue_url(&dlq)
            .max_number_of_messages(10)
            .visibility_timeout(1)
            .message_attribute_names("All")
            .send()
            .await
            .ok()?;
        received.messages().iter().find_map(|message| {
            let body = message.body()?;
            if !(body.contains("cr-fail") && body.contains("\"chunks\":3")) {
                return None;
            }
            let failure = message
                .message_attributes()?
                .get(FAILURE_ATTRIBUTE)?
                .string_value()?;
            serde_json::from_str::<Failure>(failure).ok()
        })
    })
    .await?;
    assert!(
        failure.error.contains("child 00001") && failure.error.contains("has no queries"),
        "{failure:?}"
    );
    assert!(
        assembled(&outbox, "cr-fail").is_empty(),
        "a failed flow's parent never runs"
    );
    let failed = store.flow(&failing.flow).await?.expect("the flow's record");
    assert_eq!(failed.failed, 1);
    // The tracked records tell the same story as the queues: the poisoned chunk dead-lettered after
    // one attempt with its reason, the others succeeded.
    for (child, key) in &failing.children {
        let record = store.job(key).await?.expect("every chunk is tracked");
        if child == "00001" {
            assert_eq!(
                (record.status, record.attempts),
                (JobStatus::DeadLettered, 1),
                "{record:?}"
            );
            assert!(
                record
                    .last_error
                    .as_deref()
                    .is_some_and(|error| error.contains("has no queries")),
                "{record:?}"
            );
        } else {
            assert_eq!(record.status, JobStatus::Succeeded, "{record:?}");
        }
    }
    terminate(&mut worker).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_jobs_progress_is_visible_from_another_process_while_it_runs() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "e2e-progress").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-progress")).await?;
    let outbox = outbox_path("e2e-progress");
    let env = app_env(&table, &outbox);
    let store = DynamoStore::new(dynamodb, &table);
    let report = GenerateReport {
        report_id: "long".into(),
        sections: 6,
        section_millis: 1_500,
    };
    Producer::new(sqs.clone(), &queue.url)
        .send_tracked(&NewJob::new("report", report).key("report:long"), &store)
        .await?;
    let key = conveyor_core::port::idempotency_key("report", Some("report:long"), "");
    let sent = store.job(&key).await?.expect("the producer recorded it as sent");
    assert_eq!((sent.status, sent.attempts), (JobStatus::Sent, 0));
    let mut worker = binaries().spawn_worker(&queue.url, None, &env, None)?;

    // Seen by this process while the worker's run is in progress.
    let mut seen = Vec::new();
    let finished = wait_for(Duration::from_secs(120), Duration::from_millis(200), async || {
        let job = store.job(&key).await.ok()??;
        if job.status == JobStatus::Running
            && let Some(progress) = &job.progress
            && seen.last() != Some(&progress.at)
        {
            seen.push(progress.at);
        }
        (job.status == JobStatus::Succeeded).then_some(job)
    })
    .await?;
    terminate(&mut worker).await?;
    assert!(
        seen.len() >= 2,
        "progress seen while running: {} distinct reports",
        seen.len()
    );
    let interval = conveyor_core::HandlerSettings::default().progress_interval;
    for pair in seen.windows(2) {
        let apart = pair[1].duration_since(pair[0]).unwrap_or_default();
        // Report times are the handler's; a write carries the latest, so writes are ≥ the interval apart
        // less a section's length at most.
        assert!(
            apart + Duration::from_millis(1_500) >= interval,
            "two progress writes {apart:?} apart, the throttle is {interval:?}"
        );
    }
    let last = finished.progress.expect("the last report lands with the end");
    assert_eq!((last.percent, last.message.as_str()), (100, "section 6 of 6"));
    assert_eq!(finished.attempts, 1);
    let statuses: Vec<JobStatus> = finished.history.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses,
        [JobStatus::Sent, JobStatus::Running, JobStatus::Succeeded]
    );
    Ok(())
}

/// Children of the large flow: `CONVEYOR_E2E_FLOW_CHILDREN`, else this (`make flow-soak` runs 10,000).
const LARGE_FLOW_CHILDREN: u32 = 2_000;
/// Chunks sent to the queue whose consumer crashes on every receive (SQS's redrive dead-letters them).
const REDRIVEN_CHUNKS: u32 = 3;

fn large_flow_children() -> u32 {
    std::env::var("CONVEYOR_E2E_FLOW_CHILDREN")
        .ok()
        .and_then(|children| children.parse().ok())
        .filter(|children| *children > REDRIVEN_CHUNKS * 10)
        .unwrap_or(LARGE_FLOW_CHILDREN)
}

/// The large flow: `children` one-query chunks, `REDRIVEN_CHUNKS` of them (spread out) on
/// `crash_queue_url`, policy `Ignore`.
fn large_flow(children: u32, queue_url: &str, crash_queue_url: &str, deadline: Duration) -> (Flow, Vec<u32>) {
    let report_id = "cr-large";
    let parent = conveyor_examples::jobs::chunked_report::AssembleReport {
        report_id: report_id.to_owned(),
        chunks: children,
    };
    let redriven: Vec<u32> = (0..REDRIVEN_CHUNKS)
        .map(|n| (n * 2 + 1) * children / (REDRIVEN_CHUNKS * 2))
        .collect();
    let mut flow = Flow::new(
        format!("report:{report_id}"),
        NewJob::new("chunked_report", parent),
        queue_url,
    )
    .on_child_failure(ChildFailurePolicy::Ignore)
    .deadline(deadline);
    for chunk in 0..children {
        let job = ReportChunk {
            report_id: report_id.to_owned(),
            chunk,
            queries: 1,
            query_millis: 20,
        };
        let queue = if redriven.contains(&chunk) {
            crash_queue_url
        } else {
            queue_url
        };
        flow = flow.child(
            NewJob::new(<RunReportChunk as conveyor_core::Handler>::JOB_TYPE, job),
            queue,
        );
    }
    (flow, redriven)
}

/// A consumer that crashes on every message it receives (an out-of-memory kill before its handler
/// ran): receives each message of `queue_url` without deleting it until SQS's redrive policy moves
/// them all to the DLQ. Returns the DLQ's messages.
async fn crash_on_every_receive(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    dlq_url: &str,
    expected: usize,
) -> anyhow::Result<Vec<conveyor_demo::DeadLetter>> {
    wait_for(Duration::from_secs(120), Duration::from_millis(100), async || {
        // Visibility 1 s: each crashed receive's message is back a second later.
        sqs.receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(1)
            .wait_time_seconds(1)
            .send()
            .await
            .ok()?;
        let attributes = sqs
            .get_queue_attributes()
            .queue_url(dlq_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .ok()?;
        let in_dlq: usize = attributes
            .attributes()?
            .get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)?
            .parse()
            .ok()?;
        (in_dlq >= expected).then_some(())
    })
    .await?;
    conveyor_demo::read_dlq(sqs, dlq_url).await
}

/// Per status entered by the children (one index write each), how many fell on each of the jobs
/// index's partitions for `job_type`, read from the table (every item's `job_shard` and `job_*_at`).
async fn index_writes_per_partition(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    job_type: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut writes = std::collections::BTreeMap::new();
    let mut pages = dynamodb.scan().table_name(table).into_paginator().items().send();
    while let Some(item) = pages.next().await {
        let item = item?;
        let Some(shard) = item
            .get(conveyor_dynamodb::jobs::JOB_SHARD)
            .and_then(|shard| shard.as_s().ok())
        else {
            continue;
        };
        if !shard.starts_with(&format!("{job_type}#")) {
            continue;
        }
        let entered = item
            .keys()
            .filter(|name| name.starts_with("job_") && name.ends_with("_at"))
            .count();
        *writes.entry(shard.clone()).or_insert(0) += u64::try_from(entered)?;
    }
    Ok(writes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_flow_on_three_workers_with_a_killed_worker_and_redriven_children_runs_its_parent_once()
-> anyhow::Result<()> {
    use conveyor_demo::chaos::proxy::FaultProxy;
    localstack::ensure_local_aws().await?;
    let children = large_flow_children();
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "e2e-flow-large").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-flow-large")).await?;
    let crash_queue = localstack::create_queue(
        &sqs,
        &QueueSpec {
            max_receive_count: Some(2),
            ..queue_spec("e2e-flow-crash")
        },
    )
    .await?;
    let crash_dlq = crash_queue.dlq_url.clone().expect("the queue has a DLQ");
    let outbox = outbox_path("e2e-flow-large");
    let store = Arc::new(DynamoStore::new(dynamodb.clone(), &table));
    // The workers reach the emulators through proxies that count their requests by operation.
    let sqs_proxy = FaultProxy::in_front_of(&localstack::sqs_endpoint()).await?;
    let dynamodb_proxy = FaultProxy::in_front_of(&localstack::dynamodb_endpoint()).await?;
    let mut env = app_env(&table, &outbox);
    env.push(("AWS_ENDPOINT_URL_SQS".to_owned(), sqs_proxy.endpoint()));
    env.push(("AWS_ENDPOINT_URL_DYNAMODB".to_owned(), dynamodb_proxy.endpoint()));

    // The deadline leaves the good children ample time on a loaded 2-core machine (created at 180/s and
    // counted at 89/s with a `make test` running beside: 17 ms a child); the redriven ones are counted
    // out by a worker's sweep (every 30 to 60 s) past it.
    let deadline = Duration::from_secs(60) + Duration::from_millis(30) * children;
    let (flow, redriven) = large_flow(children, &queue.url, &crash_queue.url, deadline);
    let created = std::time::Instant::now();
    let sent = FlowProducer::new(sqs.clone(), store.clone()).send(&flow).await?;
    let creation = created.elapsed();
    assert_eq!(sent.messages_sent, usize::try_from(children)?);
    let dead_letters = crash_on_every_receive(&sqs, &crash_queue.url, &crash_dlq, redriven.len()).await?;
    assert_eq!(dead_letters.len(), redriven.len(), "{dead_letters:?}");
    assert!(
        dead_letters.iter().all(|letter| letter.failure.is_none()),
        "moved by SQS's redrive, not by a Conveyor consumer"
    );

    let started = std::time::Instant::now();
    let spawn = || binaries().spawn_worker(&queue.url, None, &env, None);
    let mut doomed = spawn()?;
    let mut workers = vec![spawn()?, spawn()?];
    let good = u64::from(children - REDRIVEN_CHUNKS);
    let succeeded = async || {
        store
            .flow(&sent.flow)
            .await
            .ok()
            .flatten()
            .map_or(0, |flow| flow.succeeded)
    };
    wait_until(Duration::from_secs(600), Duration::from_millis(500), async || {
        succeeded().await >= good / 3
    })
    .await?;
    doomed.start_kill()?;
    doomed.wait().await?;
    let at_kill = succeeded().await;
    assert!(
        at_kill < good,
        "the worker was killed mid-flow ({at_kill} of {good} counted)"
    );

    // Waits for the good children, or for the deadline: past it the sweep would count the rest out.
    let deadline_at = std::time::UNIX_EPOCH
        + Duration::from_millis(store.flow(&sent.flow).await?.expect("the flow's record").deadline);
    wait_until(
        Duration::from_secs(1_200),
        Duration::from_millis(500),
        async || succeeded().await == good || std::time::SystemTime::now() >= deadline_at,
    )
    .await?;
    let counted = started.elapsed();
    let counted_at = std::time::SystemTime::now();
    let flow_state = store.flow(&sent.flow).await?.expect("the flow's record");
    assert!(
        counted_at < deadline_at && flow_state.succeeded == good,
        "{} of {good} good children counted after {counted:?}, at the flow's deadline ({deadline:?} after its \
         creation): the machine is too slow for this test's deadline",
        flow_state.succeeded
    );
    assert_eq!(
        (flow_state.failed, flow_state.parent_sent_at),
        (0, None),
        "nothing failed and the parent waits for the redriven children: {flow_state:?}"
    );

    // Past the deadline a worker's sweep counts the redriven children out; the policy sends the parent.
    let effects = wait_for(
        deadline + Duration::from_secs(240),
        Duration::from_secs(1),
        async || {
            let effects = assembled(&outbox, "cr-large");
            (!effects.is_empty()).then_some(effects)
        },
    )
    .await?;
    let assembled_in = started.elapsed();
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    wait_until(Duration::from_secs(120), Duration::from_millis(500), async || {
        queue_is_empty(&sqs_queue).await
    })
    .await?;
    for worker in &mut workers {
        terminate(worker).await?;
    }

    // Still once: the effect is recorded before the parent's record completes, so a second run would show.
    let effects_after = assembled(&outbox, "cr-large");
    assert_eq!(effects_after.len(), 1, "the parent ran once: {effects_after:?}");
    assert_eq!(effects[0]["chunks"], good);
    assert_eq!(effects[0]["failed_chunks"], REDRIVEN_CHUNKS);
    let rows: u64 = (0..children)
        .filter(|chunk| !redriven.contains(chunk))
        .map(|chunk| u64::from(chunk + 1) * 10)
        .sum();
    assert_eq!(effects[0]["rows"], rows);
    let flow_state = store.flow(&sent.flow).await?.expect("the flow's record");
    assert_eq!(
        (flow_state.succeeded, flow_state.failed, flow_state.pending()),
        (good, u64::from(REDRIVEN_CHUNKS), 0)
    );
    let parent = store
        .job(&sent.parent_record)
        .await?
        .expect("the parent is tracked");
    assert_eq!(
        (parent.status, parent.attempts),
        (JobStatus::Succeeded, 1),
        "{parent:?}"
    );
    let ends = store.children(&sent.flow).await?;
    let failed: Vec<&str> = ends
        .iter()
        .filter(|child| matches!(&child.end, Some(ChildEnd::Failed(reason)) if reason.contains("deadline")))
        .map(|child| child.id.as_str())
        .collect();
    let expected: Vec<String> = redriven.iter().map(|chunk| format!("{chunk:05}")).collect();
    assert_eq!(
        failed, expected,
        "exactly the redriven children failed, at the deadline"
    );
    let dlq = queue.dlq_url.clone().expect("the queue has a DLQ");
    assert!(
        conveyor_demo::read_dlq(&sqs, &dlq).await?.is_empty(),
        "no good child and not the parent was dead-lettered"
    );

    // Figures (`make flow-soak` for 10,000 children).
    let per_child = |count: u64| count as f64 / f64::from(children);
    println!(
        "flow of {children} children ({} redriven), 3 workers, one SIGKILLed at {at_kill} counted",
        REDRIVEN_CHUNKS
    );
    println!(
        "created in {:.1} s ({:.0} children/s); all good children counted {:.1} s after the workers started \
         ({:.0} children/s); parent assembled {:.1} s after start (deadline {:.0} s after creation)",
        creation.as_secs_f64(),
        f64::from(children) / creation.as_secs_f64(),
        counted.as_secs_f64(),
        good as f64 / counted.as_secs_f64(),
        assembled_in.as_secs_f64(),
        deadline.as_secs_f64()
    );
    for (service, proxy) in [("DynamoDB", &dynamodb_proxy), ("SQS", &sqs_proxy)] {
        let operations = proxy.state().operations();
        let total: u64 = operations.values().sum();
        let listed: Vec<String> = operations
            .iter()
            .map(|(operation, count)| format!("{operation} {:.3}", per_child(*count)))
            .collect();
        println!(
            "workers' {service} requests per child: {:.3} ({})",
            per_child(total),
            listed.join(", ")
        );
    }
    let index = index_writes_per_partition(&dynamodb, &table, "report_chunk").await?;
    let busiest = index.values().copied().max().unwrap_or(0);
    println!(
        "jobs index: {} partitions for report_chunk, {} status writes, the busiest partition {busiest} \
         ({:.1} writes/s over the run; DynamoDB takes about 1,000 per partition key)",
        index.len(),
        index.values().sum::<u64>(),
        busiest as f64 / counted.as_secs_f64()
    );
    assert_eq!(
        index.len(),
        usize::try_from(conveyor_dynamodb::defaults::JOBS_INDEX_SHARDS)?,
        "a busy type's transitions spread over every partition"
    );
    assert!(
        busiest * u64::from(conveyor_dynamodb::defaults::JOBS_INDEX_SHARDS) < index.values().sum::<u64>() * 2,
        "no partition takes twice its share: {index:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conveyor_jobs_sweep_flows_ends_a_flow_past_its_deadline_by_its_policy() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "e2e-flow-sweep").await?;
    let queue = localstack::create_queue(&sqs, &queue_spec("e2e-flow-sweep")).await?;
    let store = Arc::new(DynamoStore::new(dynamodb, &table));
    // Nobody consumes the children: past its deadline the sweep counts a flow's children as failed,
    // and the policy (FailParent) sends the parent's failure notice. A second flow, whose deadline is
    // an hour away, is in the same table when the sweep runs: it is left alone. (A sweep before the
    // first flow's deadline would race the clock on a loaded machine.)
    let flow = poisoned_flow("cr-sweep", &queue.url, ChildFailurePolicy::FailParent)
        .deadline(Duration::from_secs(2));
    let later = poisoned_flow("cr-later", &queue.url, ChildFailurePolicy::FailParent)
        .deadline(Duration::from_secs(3600));
    let producer = FlowProducer::new(sqs.clone(), store.clone());
    let sent = producer.send(&flow).await?;
    let sent_later = producer.send(&later).await?;
    let state = store.flow(&sent.flow).await?.expect("the flow's record");
    let deadline = std::time::UNIX_EPOCH + Duration::from_millis(state.deadline);
    wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        std::time::SystemTime::now() > deadline
    })
    .await?;
    let swept = tokio::process::Command::new(binaries().path("conveyor")?)
        .envs(localstack::aws_env())
        .args(["jobs", "--table", &table, "--output", "json", "sweep-flows"])
        .output()
        .await?;
    assert!(swept.status.success(), "{swept:?}");
    let report: serde_json::Value = serde_json::from_slice(&swept.stdout)?;
    assert_eq!(
        (&report["overdue"], &report["counted_out"], &report["recovered"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(3),
            &serde_json::json!(0)
        ),
        "{report}"
    );
    let state = store.flow(&sent.flow).await?.expect("the flow's record");
    assert_eq!((state.succeeded, state.failed), (0, 3), "{state:?}");
    assert!(
        state.failure_sent_at.is_some(),
        "the failure notice was sent: {state:?}"
    );
    let untouched = store
        .flow(&sent_later.flow)
        .await?
        .expect("the later flow's record");
    assert_eq!(
        (untouched.succeeded, untouched.failed, untouched.failure_sent_at),
        (0, 0, None),
        "a flow before its deadline is left alone: {untouched:?}"
    );
    let sqs_queue = SqsQueue::connect(sqs.clone(), &queue.url).await?;
    let depth = conveyor_core::port::Queue::depth(&sqs_queue).await?;
    assert_eq!(
        depth.visible, 7,
        "both flows' three children and the swept flow's failure notice"
    );
    Ok(())
}
