//! The SDK side of the emulator helpers (feature `aws`): clients that point at LocalStack and DynamoDB
//! Local, per-test queues and tables. Re-exported from [`crate::localstack`].

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;

use super::{DUMMY_CREDENTIAL, QueueSpec, REGION, TestQueue, dynamodb_endpoint, sqs_endpoint, unique_name};

/// An SQS client for LocalStack (no I/O; call [`ensure_local_aws`](super::ensure_local_aws) first).
pub async fn sqs_client() -> aws_sdk_sqs::Client {
    sqs_client_at(&sqs_endpoint())
}

/// An SQS client for the emulator at `endpoint` (no I/O), e.g. an [`OwnLocalStack`](super::OwnLocalStack).
pub fn sqs_client_at(endpoint: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            DUMMY_CREDENTIAL,
            DUMMY_CREDENTIAL,
            None,
            None,
            "conveyor-testing",
        ))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// An S3 client for the shared LocalStack, which serves S3 beside SQS (no I/O; call
/// [`ensure_local_aws`](super::ensure_local_aws) first).
pub fn s3_client() -> aws_sdk_s3::Client {
    s3_client_at(&sqs_endpoint())
}

/// An S3 client for the emulator at `endpoint` (no I/O; path-style addresses, as LocalStack on
/// `127.0.0.1` needs), e.g. an [`OwnLocalStack`](super::OwnLocalStack) started with S3.
pub(crate) fn s3_client_at(endpoint: &str) -> aws_sdk_s3::Client {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            DUMMY_CREDENTIAL,
            DUMMY_CREDENTIAL,
            None,
            None,
            "conveyor-testing",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A DynamoDB client for DynamoDB Local (no I/O; call [`ensure_local_aws`](super::ensure_local_aws) first).
pub async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    dynamodb_client_at(&dynamodb_endpoint())
}

/// A DynamoDB client for the emulator at `endpoint` (no I/O; dummy credentials, `us-east-1`).
pub fn dynamodb_client_at(endpoint: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            DUMMY_CREDENTIAL,
            DUMMY_CREDENTIAL,
            None,
            None,
            "conveyor-testing",
        ))
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// Creates a queue as `spec` says: the DLQ first (same FIFO-ness, named `<name>-dlq`), then the main
/// queue with its `VisibilityTimeout` and a `RedrivePolicy` naming the DLQ's ARN (read back from
/// `GetQueueAttributes`, never built from an account id).
pub async fn create_queue(client: &aws_sdk_sqs::Client, spec: &QueueSpec) -> anyhow::Result<TestQueue> {
    let base = unique_name(&spec.name_prefix);
    let suffix = if spec.fifo { ".fifo" } else { "" };
    let mut attributes = vec![(
        QueueAttributeName::VisibilityTimeout,
        spec.visibility_timeout_secs.to_string(),
    )];
    if spec.fifo {
        attributes.push((QueueAttributeName::FifoQueue, "true".to_owned()));
        attributes.push((QueueAttributeName::ContentBasedDeduplication, "true".to_owned()));
    }
    let mut dlq = None;
    if let Some(max_receive_count) = spec.max_receive_count {
        let name = format!("{base}-dlq{suffix}");
        let fifo_only: Vec<_> = attributes
            .iter()
            .filter(|(attribute, _)| *attribute != QueueAttributeName::VisibilityTimeout)
            .cloned()
            .collect();
        let url = create_one(client, &name, fifo_only).await?;
        let arn = queue_arn(client, &url).await?;
        let policy = serde_json::json!({
            "deadLetterTargetArn": arn,
            "maxReceiveCount": max_receive_count.to_string(),
        });
        attributes.push((QueueAttributeName::RedrivePolicy, policy.to_string()));
        dlq = Some((url, name, arn));
    }
    let name = format!("{base}{suffix}");
    let url = create_one(client, &name, attributes).await?;
    let arn = queue_arn(client, &url).await?;
    let (dlq_url, dlq_name, dlq_arn) = match dlq {
        Some((url, name, arn)) => (Some(url), Some(name), Some(arn)),
        None => (None, None, None),
    };
    Ok(TestQueue {
        url,
        name,
        arn,
        dlq_url,
        dlq_name,
        dlq_arn,
    })
}

async fn create_one(
    client: &aws_sdk_sqs::Client,
    name: &str,
    attributes: Vec<(QueueAttributeName, String)>,
) -> anyhow::Result<String> {
    let mut request = client.create_queue().queue_name(name);
    for (attribute, value) in attributes {
        request = request.attributes(attribute, value);
    }
    let output = request
        .send()
        .await
        .with_context(|| format!("CreateQueue {name} at {}", sqs_endpoint()))?;
    output
        .queue_url
        .with_context(|| format!("CreateQueue {name} returned no URL"))
}

/// The queue's ARN, from `GetQueueAttributes`.
pub async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<String> {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .with_context(|| format!("GetQueueAttributes QueueArn of {url}"))?;
    output
        .attributes
        .and_then(|mut attributes| attributes.remove(&QueueAttributeName::QueueArn))
        .with_context(|| format!("GetQueueAttributes returned no QueueArn for {url}"))
}

/// Creates an idempotency table laid out like Powertools' (partition key `id` of type S, on-demand
/// billing, TTL on `expiration`) under a unique name starting with `prefix`, waits until it is active,
/// and returns its name.
pub async fn create_table(client: &aws_sdk_dynamodb::Client, prefix: &str) -> anyhow::Result<String> {
    let name = unique_name(prefix);
    create_idempotency_table(client, &name).await?;
    Ok(name)
}

/// Creates the idempotency table `name` with the layout of `infra/modules/idempotency-table` and waits
/// until it is active: [`conveyor_dynamodb::create_idempotency_table`], with the endpoint in the error.
pub async fn create_idempotency_table(client: &aws_sdk_dynamodb::Client, name: &str) -> anyhow::Result<()> {
    conveyor_dynamodb::create_idempotency_table(client, name)
        .await
        .with_context(|| format!("creating table {name} at {}", dynamodb_endpoint()))
}
