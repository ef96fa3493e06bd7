//! The outbox relay's Lambda handler, fed DynamoDB stream events in the JSON Lambda delivers (keys only)
//! and scheduled sweeps, with real SQS (LocalStack) and DynamoDB (DynamoDB Local) clients.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_lambda::outbox::{SWEEP_AFTER, backlog_emf, relay_stream_event, sweep};
use conveyor_outbox::{
    DynamoOutboxStore, Outbox, OutboxStore, OutboxTable, Relay, SqsSink, create_outbox_table,
};
use conveyor_sqs::NewJob;
use conveyor_testing::localstack::{self, QueueSpec};
use serde_json::{Value, json};

fn key_json(item: &HashMap<String, AttributeValue>) -> Value {
    let keys: serde_json::Map<String, Value> = item
        .iter()
        .filter(|(name, _)| *name == "pk" || *name == "sk")
        .filter_map(|(name, value)| Some((name.clone(), json!({ "S": value.as_s().ok()? }))))
        .collect();
    Value::Object(keys)
}

/// A keys-only stream record as Lambda delivers it (the shape of AWS's sample event).
fn record(sequence: u32, event: &str, item: &HashMap<String, AttributeValue>) -> Value {
    json!({
        "eventID": format!("event-{sequence}"),
        "eventName": event,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1_700_000_000,
            "Keys": key_json(item),
            "SequenceNumber": format!("{sequence:021}"),
            "SizeBytes": 100,
            "StreamViewType": "KEYS_ONLY",
        },
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/outbox/stream/2024-01-01T00:00:00.000",
    })
}

async fn bodies(sqs: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<Vec<String>> {
    let output = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await?;
    let mut bodies: Vec<String> = output
        .messages()
        .iter()
        .filter_map(|message| message.body().map(str::to_owned))
        .collect();
    bodies.sort();
    Ok(bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_records_name_aggregates_and_a_sweep_sends_what_no_record_brought() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name("lambda-outbox"));
    create_outbox_table(&dynamodb, &table).await?;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("lambda-outbox")).await?;
    let outbox = Outbox::new(table.clone(), &queue.url);
    let store = Arc::new(DynamoOutboxStore::new(dynamodb.clone(), table.clone()));
    let relay = Relay::new(store.clone(), Arc::new(SqsSink::new(sqs.clone())));

    // A's two jobs in one transaction; B's job committed 10 minutes ago, its record long gone.
    let a = outbox.put_after(vec![NewJob::new("t", "a1"), NewJob::new("t", "a2")], "A", 0)?;
    dynamodb
        .transact_write_items()
        .set_transact_items(Some(a.transact_items()))
        .send()
        .await?;
    let b = outbox.put_after(vec![NewJob::new("t", "b1")], "B", 0)?;
    let (mut old, mut head) = (b.items()[0].clone(), b.head_item().cloned().unwrap_or_default());
    let ten_minutes_ago = SystemTime::now() - Duration::from_secs(600);
    let millis = ten_minutes_ago
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_millis();
    old.insert(
        "outbox_created_at".to_owned(),
        AttributeValue::N(millis.to_string()),
    );
    head.insert(
        "outbox_created_at".to_owned(),
        AttributeValue::N(millis.to_string()),
    );
    conveyor_outbox::backlog::write_items(&dynamodb, &table.name, &[old, head]).await?;

    let business = HashMap::from([
        ("pk".to_owned(), AttributeValue::S("order#1".to_owned())),
        ("sk".to_owned(), AttributeValue::S("order".to_owned())),
    ]);
    let event: aws_lambda_events::event::dynamodb::Event = serde_json::from_value(json!({
        "Records": [
            record(1, "INSERT", &business),
            record(2, "INSERT", &a.items()[0]),
            record(3, "INSERT", &a.items()[1]),
            record(4, "MODIFY", &business),
        ]
    }))?;
    let response = relay_stream_event(&relay, &table, &event).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        bodies(&sqs, &queue.url).await?,
        ["\"a1\"", "\"a2\""],
        "A's jobs, not B's"
    );
    assert!(store.jobs("A", 10).await?.is_empty(), "sent jobs removed");

    let deadline = SystemTime::now() + Duration::from_secs(60);
    let report = sweep(&relay, SWEEP_AFTER, deadline).await;
    assert_eq!(report.sent, 1, "{report:?}");
    assert_eq!(bodies(&sqs, &queue.url).await?, ["\"b1\""]);

    let backlog = store.backlog(10).await?;
    let line: Value = serde_json::from_str(&backlog_emf(&backlog, SystemTime::now()))?;
    assert_eq!(line["OldestUnsentSeconds"], 0);
    assert_eq!(
        line["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "Conveyor/Outbox"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_read_reports_the_batch_for_retry() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    // A table that does not exist: the relay's role or table name is wrong.
    let table = OutboxTable::new(localstack::unique_name("lambda-outbox-missing"));
    let store = Arc::new(DynamoOutboxStore::new(dynamodb.clone(), table.clone()));
    let relay = Relay::new(store, Arc::new(SqsSink::new(sqs)));
    let item = HashMap::from([
        ("pk".to_owned(), AttributeValue::S("outbox#A".to_owned())),
        (
            "sk".to_owned(),
            AttributeValue::S("outbox#job#00000000000000000001".to_owned()),
        ),
    ]);
    let event: aws_lambda_events::event::dynamodb::Event =
        serde_json::from_value(json!({ "Records": [record(7, "INSERT", &item)] }))?;
    let response = relay_stream_event(&relay, &table, &event).await;
    let reported: Vec<Option<String>> = response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect();
    assert_eq!(reported, [Some(format!("{:021}", 7))]);
    Ok(())
}
