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

/// An `OwnLocalStack` runs beside the shared emulator: its queues are its own, restarting it leaves the
/// shared one's queues alone, and dropping it frees its port and removes its state folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_localstack_runs_beside_the_shared_one_and_goes_away_on_drop() -> anyhow::Result<()> {
    use conveyor_testing::localstack::OwnLocalStack;

    ensure_local_aws().await?;
    let shared = sqs_client().await;
    let shared_queue = create_queue(&shared, &QueueSpec::standard("beside-shared")).await?;

    let mut own = OwnLocalStack::start().await?;
    assert_ne!(own.endpoint(), conveyor_testing::localstack::sqs_endpoint());
    let own_queue = create_queue(&own.sqs_client(), &QueueSpec::standard("beside-own")).await?;
    assert!(
        own_queue.url.contains(&format!(":{}/", own.port())),
        "{}",
        own_queue.url
    );
    let shared_names = queue_names(&shared).await?;
    assert!(shared_names.contains(&shared_queue.name));
    assert!(
        !shared_names.contains(&own_queue.name),
        "the shared emulator has the own one's queue"
    );

    own.restart(true).await?;
    assert!(
        queue_names(&own.sqs_client()).await?.is_empty(),
        "a restart starts empty"
    );
    assert!(
        queue_names(&shared).await?.contains(&shared_queue.name),
        "restarting the own emulator wiped the shared one"
    );

    let (port, state_dir) = (own.port(), own.state_dir().to_owned());
    drop(own);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still answers after drop"
    );
    assert!(!state_dir.exists(), "{} was left behind", state_dir.display());
    Ok(())
}

/// An `OwnMoto` serves on a port of its own and is gone when dropped (its process group killed through
/// the guard); its log stays under `.local/logs`.
#[tokio::test]
async fn an_own_moto_answers_on_its_port_and_goes_away_on_drop() -> anyhow::Result<()> {
    use conveyor_testing::localstack::OwnMoto;

    let moto = OwnMoto::start().await?;
    let queue = create_queue(&moto.sqs_client(), &QueueSpec::standard("own-moto")).await?;
    assert!(queue.url.contains(&format!(":{}/", moto.port())), "{}", queue.url);
    let (port, log) = (moto.port(), moto.log_path().to_owned());
    drop(moto);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still answers after drop"
    );
    assert!(log.is_file(), "{} is gone", log.display());
    Ok(())
}

async fn queue_names(client: &aws_sdk_sqs::Client) -> anyhow::Result<Vec<String>> {
    let urls = client
        .list_queues()
        .queue_name_prefix("beside-")
        .max_results(1000)
        .send()
        .await?
        .queue_urls
        .unwrap_or_default();
    Ok(urls
        .iter()
        .filter_map(|url| url.rsplit('/').next().map(str::to_owned))
        .collect())
}
