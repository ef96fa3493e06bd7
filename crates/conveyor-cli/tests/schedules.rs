//! `conveyor schedules` against LocalStack and DynamoDB Local: list, pause, resume and trigger the
//! schedules of an exported file, with their state in the idempotency table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;
use conveyor_schedule::{Schedule, TickStore};
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
        .unwrap();
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

    conveyor(&[&["schedules", "pause", "nightly-report"][..], &source].concat())
        .await
        .assert_ok();
    let store = TickStore::new(dynamodb.clone(), &table);
    assert!(store.state("nightly-report").await.unwrap().paused);
    conveyor(&[&["schedules", "resume", "nightly-report"][..], &source].concat())
        .await
        .assert_ok();
    assert!(!store.state("nightly-report").await.unwrap().paused);

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

    let unknown = conveyor(&[&["schedules", "pause", "weekly"][..], &source].concat()).await;
    unknown.assert_failed_with(1, &["no schedule named \"weekly\"", "nightly-report"]);
}
