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
