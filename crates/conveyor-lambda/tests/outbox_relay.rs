//! The outbox relay's Lambda handler, fed a DynamoDB stream event in the JSON Lambda delivers, with real
//! SQS (LocalStack) and DynamoDB (DynamoDB Local) clients.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_lambda::outbox::relay_stream_event;
use conveyor_outbox::{Outbox, OutboxItem, OutboxTable, Relay, create_outbox_table};
use conveyor_sqs::NewJob;
use conveyor_testing::localstack::{self, QueueSpec};
use serde_json::{Value, json};

fn dynamodb_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(text) => json!({ "S": text }),
        AttributeValue::N(text) => json!({ "N": text }),
        AttributeValue::M(map) => {
            json!({ "M": map.iter().map(|(k, v)| (k.clone(), dynamodb_json(v))).collect::<serde_json::Map<_, _>>() })
        }
        other => panic!("not in outbox items: {other:?}"),
    }
}

fn image(item: &HashMap<String, AttributeValue>) -> Value {
    Value::Object(item.iter().map(|(k, v)| (k.clone(), dynamodb_json(v))).collect())
}

/// A stream record as Lambda delivers it (the shape of AWS's sample event, 2024).
fn record(sequence: u32, event: &str, item: &HashMap<String, AttributeValue>) -> Value {
    let keys: HashMap<String, AttributeValue> = item
        .iter()
        .filter(|(k, _)| *k == "pk" || *k == "sk")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut change = json!({
        "ApproximateCreationDateTime": 1_700_000_000,
        "Keys": image(&keys),
        "SequenceNumber": format!("{sequence:021}"),
        "SizeBytes": 100,
        "StreamViewType": "NEW_IMAGE",
    });
    if event == "INSERT" {
        change["NewImage"] = image(item);
    }
    json!({
        "eventID": format!("event-{sequence}"),
        "eventName": event,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": change,
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/outbox/stream/2024-01-01T00:00:00.000",
    })
}

async fn write(
    client: &aws_sdk_dynamodb::Client,
    item: OutboxItem,
) -> anyhow::Result<HashMap<String, AttributeValue>> {
    let fields = item.item().clone();
    client
        .transact_write_items()
        .transact_items(item.into())
        .send()
        .await?;
    Ok(fields)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_record_not_relayed_and_all_after_it_are_reported_and_the_rest_sent_and_removed()
-> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = OutboxTable::new(localstack::unique_name("lambda-outbox"));
    create_outbox_table(&dynamodb, &table).await?;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("lambda-outbox")).await?;
    let missing = format!("{}-missing", queue.url);
    let good = Outbox::new(table.clone(), &queue.url);
    let bad = Outbox::new(table.clone(), &missing);

    let a1 = write(&dynamodb, good.put(NewJob::new("t", "a1"), "A")?).await?;
    let b1 = write(&dynamodb, bad.put(NewJob::new("t", "b1"), "B")?).await?;
    let a2 = write(&dynamodb, good.put(NewJob::new("t", "a2"), "A")?).await?;
    let b2 = write(&dynamodb, good.put(NewJob::new("t", "b2"), "B")?).await?;
    let business = HashMap::from([
        ("pk".to_owned(), AttributeValue::S("order#1".to_owned())),
        ("sk".to_owned(), AttributeValue::S("order".to_owned())),
    ]);
    let event: aws_lambda_events::event::dynamodb::Event = serde_json::from_value(json!({
        "Records": [
            record(1, "INSERT", &business),
            record(2, "INSERT", &a1),
            record(3, "INSERT", &b1),
            record(4, "MODIFY", &business),
            record(5, "INSERT", &a2),
            record(6, "INSERT", &b2),
        ]
    }))?;
    let relay = Relay::new(sqs.clone(), dynamodb.clone(), table.clone());
    let response = relay_stream_event(&relay, &event).await;
    let reported: Vec<String> = response
        .batch_item_failures
        .iter()
        .filter_map(|failure| failure.item_identifier.clone())
        .collect();
    let expected: Vec<String> = (3..=6).map(|n| format!("{n:021}")).collect();
    assert_eq!(reported, expected, "from B's failed record on");

    let output = sqs
        .receive_message()
        .queue_url(&queue.url)
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
    assert_eq!(
        bodies,
        vec!["\"a1\"", "\"a2\""],
        "A's jobs sent; B's second waits behind its first"
    );

    let left = dynamodb
        .scan()
        .table_name(&table.name)
        .consistent_read(true)
        .send()
        .await?;
    let mut left_bodies: Vec<String> = left
        .items()
        .iter()
        .filter_map(|item| item.get("outbox_body"))
        .filter_map(|body| body.as_s().ok().cloned())
        .collect();
    left_bodies.sort();
    assert_eq!(
        left_bodies,
        vec!["\"b1\"", "\"b2\""],
        "sent items removed, the others kept"
    );
    Ok(())
}
