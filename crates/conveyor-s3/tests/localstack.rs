//! The payload store conformance suite against S3 on a LocalStack of this test's own (`sqs,s3`, its own
//! port, so its buckets stay apart from the shared emulator's).

use conveyor_s3::S3PayloadStore;
use conveyor_testing::localstack::{OwnLocalStack, Services, unique_name};
use conveyor_testing::payload_conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_passes_the_payload_suite() -> anyhow::Result<()> {
    let emulator = OwnLocalStack::start_with(Services::SQS_S3).await?;
    let client = emulator.s3_client();
    let bucket = unique_name("payloads").to_lowercase().replace('_', "-");
    client.create_bucket().bucket(&bucket).send().await?;
    let store = S3PayloadStore::new(client);
    payload_conformance::run_all(&store, &bucket, "conveyor-no-such-bucket").await?;
    Ok(())
}
