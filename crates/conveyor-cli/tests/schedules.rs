//! `conveyor schedules` against LocalStack and DynamoDB Local: list, pause, resume and trigger the
//! schedules of an exported file, with their state in the idempotency table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;
use conveyor_schedule::{MissedTicks, Schedule, ScheduleStore, TickStore};
use conveyor_testing::localstack::{self, QueueSpec, create_queue, unique_name};

mod common;
use common::{conveyor, setup};

#[tokio::test]
async fn list_pause_resume_and_trigger_an_exported_schedule() {
    let sqs = setup().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "cli-sched").await.unwrap();
    let queue = create_queue(&sqs, &QueueSpec::standard("cli-sched"))
        .await
        .unwrap();
    let schedule = Schedule::cron("nightly-report", "0 2 * * *", "Europe/Berlin")
        .unwrap()
        .job_of("report", 1, &serde_json::json!({"report_id": "nightly"}))
        .unwrap()
        .missed_ticks(MissedTicks::All);
    let file = std::env::temp_dir().join(format!("{}.json", unique_name("schedules")));
    std::fs::write(&file, conveyor_schedule::export(&[schedule]).unwrap()).unwrap();
    let file = file.to_str().unwrap();
    let source = ["--file", file, "--table", &table];

    let list = conveyor(&[&["schedules", "list"][..], &source, &["--output", "json"]].concat()).await;
    list.assert_ok();
    let listed = &list.json()["schedules"][0];
    assert_eq!(listed["name"], "nightly-report");
    assert_eq!(listed["next"].as_array().unwrap().len(), 3);
    assert_eq!(listed["paused"], false);
    assert_eq!(listed["last_fire"], serde_json::Value::Null);

    let by_table = ["--table", table.as_str()];
    let pause = conveyor(
        &[
            &["schedules", "pause", "nightly-report"][..],
            &by_table,
            &["--output", "json"],
        ]
        .concat(),
    )
    .await;
    pause.assert_ok();
    assert_eq!(pause.json()["paused"], true, "{}", pause.stdout);
    assert_eq!(pause.json()["schedule"], "nightly-report");
    let store = TickStore::new(dynamodb.clone(), &table);
    let paused = store.state("nightly-report").await.unwrap();
    assert!(paused.paused && paused.paused_at.is_some());
    conveyor(&[&["schedules", "resume", "nightly-report"][..], &by_table].concat())
        .await
        .assert_ok();
    let resumed = store.state("nightly-report").await.unwrap();
    assert!(!resumed.paused);
    assert!(
        resumed.resumed_at >= resumed.paused_at,
        "the pause is recorded, so it is never replayed"
    );

    let trigger = conveyor(
        &[
            &["schedules", "trigger", "nightly-report"][..],
            &source,
            &["--queue-url", &queue.url],
        ]
        .concat(),
    )
    .await;
    trigger.assert_ok();
    let received = sqs
        .receive_message()
        .queue_url(&queue.url)
        .wait_time_seconds(5)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(received.len(), 1);
    let key = received[0].message_attributes.as_ref().unwrap()[IDEMPOTENCY_KEY_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    assert!(key.starts_with("schedule:nightly-report@manual-"), "{key}");
    let outcome = store.state("nightly-report").await.unwrap().last_outcome.unwrap();
    assert!(outcome.contains("triggered by hand"), "{outcome}");

    let history = conveyor(
        &[
            &["schedules", "history", "nightly-report"][..],
            &by_table,
            &["--output", "json"],
        ]
        .concat(),
    )
    .await;
    history.assert_ok();
    assert_eq!(history.json()["schedule"], "nightly-report");

    let add = conveyor(
        &[
            &[
                "schedules",
                "add",
                "cleanup",
                "--every",
                "300",
                "--start",
                "2026-12-01T00:00:00Z",
            ][..],
            &[
                "--job-type",
                "cleanup",
                "--payload",
                "{\"days\":30}",
                "--missed",
                "all",
            ],
            &by_table,
        ]
        .concat(),
    )
    .await;
    add.assert_ok();
    let stored = store.definitions(conveyor_schedule::DEFAULT_SET).await.unwrap();
    let cleanup = conveyor_schedule::from_definition_json("cleanup", &stored["cleanup"]).unwrap();
    assert_eq!(cleanup.job.job_type, "cleanup");
    assert_eq!(cleanup.missed, MissedTicks::All);
    assert!(cleanup.start.is_some());
    conveyor(&[&["schedules", "remove", "cleanup"][..], &by_table].concat())
        .await
        .assert_ok();
    assert!(
        store
            .definitions(conveyor_schedule::DEFAULT_SET)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Schedules given in code with their default policies are listed (and triggered) straight from the
/// table, with no export step: the workers' leading scheduler records what it serves (issue 55).
#[tokio::test]
async fn code_schedules_with_default_policies_are_listed_without_an_export() {
    use std::sync::Arc;
    use std::time::Duration;

    let sqs = setup().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "cli-sched-code")
        .await
        .unwrap();
    let queue = create_queue(&sqs, &QueueSpec::standard("cli-sched-code"))
        .await
        .unwrap();
    let by_table = ["--table", table.as_str()];

    // Before any scheduler ran, the table holds nothing to list, and the error says why.
    conveyor(&[&["schedules", "list"][..], &by_table].concat())
        .await
        .assert_failed_with(1, &["no schedules recorded", "--file"]);

    // The defaults: LatestOnce, no run limit (the export used to refuse LatestOnce); and a run limit.
    let hourly = Schedule::cron("hourly-cleanup", "0 * * * *", "UTC")
        .unwrap()
        .job_of("cleanup", 1, &serde_json::json!({"days": 30}))
        .unwrap();
    let limited = Schedule::every("warm-cache", Duration::from_secs(300))
        .unwrap()
        .job_of("warm", 1, &serde_json::json!({}))
        .unwrap()
        .max_runs(5);
    let store = TickStore::new(dynamodb.clone(), &table);
    let producer = conveyor_sqs::Producer::new(sqs.clone(), &queue.url);
    let scheduler =
        conveyor_schedule::Scheduler::new(vec![hourly, limited], store.clone(), Arc::new(producer)).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(scheduler.run(stop.clone()));
    conveyor_testing::wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        store
            .code_definitions(conveyor_schedule::DEFAULT_SET)
            .await
            .is_ok_and(|recorded| recorded.len() == 2)
    })
    .await
    .expect("the leading scheduler records the code's schedules");
    stop.cancel();
    running.await.unwrap();

    let list = conveyor(&[&["schedules", "list"][..], &by_table, &["--output", "json"]].concat()).await;
    list.assert_ok();
    let listed = list.json();
    let schedules = listed["schedules"].as_array().unwrap();
    assert_eq!(schedules.len(), 2, "{listed}");
    let hourly = &schedules[0];
    assert_eq!(hourly["name"], "hourly-cleanup", "{listed}");
    assert_eq!(hourly["source"], "code");
    assert_eq!(hourly["missed_ticks"], "latest_once");
    assert_eq!(hourly["timing"], "cron 0 * * * * UTC");
    assert_eq!(hourly["next"].as_array().unwrap().len(), 3);
    assert_eq!(schedules[1]["name"], "warm-cache");
    assert_eq!(schedules[1]["max_runs"], 5);
    assert_eq!(schedules[1]["timing"], "every 300s");

    let text = conveyor(&[&["schedules", "list"][..], &by_table].concat()).await;
    text.assert_ok();
    assert!(
        text.stdout.contains("hourly-cleanup") && text.stdout.contains("latest_once"),
        "{}",
        text.stdout
    );

    // Trigger finds the code's schedule in the table too.
    conveyor(
        &[
            &["schedules", "trigger", "hourly-cleanup"][..],
            &by_table,
            &["--queue-url", &queue.url],
        ]
        .concat(),
    )
    .await
    .assert_ok();
}
