//! The LocalStack helpers against the real emulators: queues with their redrive policy, tables.

use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_testing::localstack::{
    QueueSpec, create_queue, create_table, dynamodb_client, ensure_local_aws, sqs_client,
};

#[tokio::test]
async fn create_queue_wires_the_dlq_by_arn() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = sqs_client().await;
    let spec = QueueSpec::standard("helpers")
        .visibility_timeout_secs(7)
        .max_receive_count(3);
    let queue = create_queue(&client, &spec).await?;
    assert!(queue.name.starts_with("helpers-"));
    assert!(queue.arn.ends_with(&queue.name), "{}", queue.arn);
    let dlq_arn = queue.dlq_arn.clone().expect("a DLQ was asked for");
    assert_eq!(
        queue.dlq_name.as_deref(),
        Some(format!("{}-dlq", queue.name).as_str())
    );

    let attributes = client
        .get_queue_attributes()
        .queue_url(&queue.url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await?
        .attributes
        .unwrap_or_default();
    assert_eq!(attributes[&QueueAttributeName::VisibilityTimeout], "7");
    let policy: serde_json::Value = serde_json::from_str(&attributes[&QueueAttributeName::RedrivePolicy])?;
    assert_eq!(policy["deadLetterTargetArn"], dlq_arn.as_str());
    assert_eq!(policy["maxReceiveCount"].to_string().trim_matches('"'), "3");
    Ok(())
}

#[tokio::test]
async fn fifo_queues_get_a_fifo_dlq() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = sqs_client().await;
    let queue = create_queue(&client, &QueueSpec::fifo("helpers").max_receive_count(2)).await?;
    assert!(queue.name.ends_with(".fifo"));
    assert!(
        queue
            .dlq_name
            .as_deref()
            .is_some_and(|name| name.ends_with("-dlq.fifo"))
    );
    let plain = create_queue(&client, &QueueSpec::standard("helpers")).await?;
    assert_eq!(plain.dlq_url, None);
    Ok(())
}

#[tokio::test]
async fn create_table_makes_an_active_powertools_table() -> anyhow::Result<()> {
    ensure_local_aws().await?;
    let client = dynamodb_client().await;
    let table = create_table(&client, "helpers").await?;
    let described = client.describe_table().table_name(&table).send().await?;
    let schema = described
        .table
        .and_then(|table| table.key_schema)
        .unwrap_or_default();
    assert_eq!(schema.len(), 1);
    assert_eq!(schema[0].attribute_name, "id");
    Ok(())
}
