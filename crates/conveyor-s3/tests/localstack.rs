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
    let store = S3PayloadStore::new(client.clone());
    payload_conformance::run_all(&store, &bucket, "conveyor-no-such-bucket").await?;

    // A reader with a limit (the console's, `dlq peek --fetch-payloads`) reads up to it and refuses a
    // larger object without reading past the limit.
    use conveyor_core::port::{PayloadError, PayloadStore as _};
    let body = vec![b'x'; 100 * 1024];
    store.put(&bucket, "big", body.clone()).await?;
    let limited = S3PayloadStore::new(client.clone()).with_max_read(10 * 1024);
    let refused = limited.get(&bucket, "big").await;
    assert!(
        matches!(&refused, Err(PayloadError::Misconfigured { message }) if message.contains("larger than the 10240 bytes")),
        "{refused:?}"
    );
    let roomy = S3PayloadStore::new(client).with_max_read(100 * 1024);
    assert_eq!(
        roomy.get(&bucket, "big").await?,
        body,
        "an object at the limit is read whole"
    );
    Ok(())
}
