//! Figures for the README: what a claim-checked 5 MiB job adds, in requests and latency, over a small
//! job sent inline, on a LocalStack of its own (SQS and S3 on the same machine, so the latencies are
//! the local stack's, not AWS's).
//!
//! ```text
//! cargo run --release -p conveyor-s3 --example claim_check
//! ```
//!
//! Per job, in order: the producer's send (`PutObject` + `SendMessage` for the large job, `SendMessage`
//! for the small one), the consumer's receive, the pointer's resolution (`GetObject`) and the object's
//! delete after success (`DeleteObject`). Medians of 20 jobs each.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conveyor_core::port::{PayloadError, PayloadPointer, PayloadStore, resolve};
use conveyor_core::{
    message::Message,
    {Payloads, Pipeline, Router},
};
use conveyor_s3::S3PayloadStore;
use conveyor_sqs::{NewJob, Producer};
use conveyor_testing::localstack::{OwnLocalStack, QueueSpec, Services, create_queue, unique_name};

const JOBS: usize = 20;

/// Counts the S3 requests.
struct Counting {
    inner: S3PayloadStore,
    requests: AtomicU64,
}

#[async_trait]
impl PayloadStore for Counting {
    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PayloadError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.put(bucket, key, body).await
    }
    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, PayloadError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.get(bucket, key).await
    }
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(bucket, key).await
    }
}

#[derive(Default)]
struct Times {
    send: Vec<Duration>,
    receive: Vec<Duration>,
    fetch: Vec<Duration>,
    delete: Vec<Duration>,
}

fn median(values: &mut [Duration]) -> String {
    if values.is_empty() {
        return "-".to_owned();
    }
    values.sort();
    format!("{:.1} ms", values[values.len() / 2].as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let emulator = OwnLocalStack::start_with(Services::SQS_S3).await?;
    let sqs = emulator.sqs_client();
    let s3 = emulator.s3_client();
    let bucket = unique_name("figures").to_lowercase().replace('_', "-");
    s3.create_bucket().bucket(&bucket).send().await?;
    let queue = create_queue(&sqs, &QueueSpec::standard("claim-check")).await?;
    let store = Arc::new(Counting {
        inner: S3PayloadStore::new(s3),
        requests: AtomicU64::new(0),
    });
    let pipeline = Pipeline::new(Router::new()).with_payloads(Payloads::new(store.clone()));

    let large = "x".repeat(5 * 1024 * 1024);
    let small = "x".repeat(1024);
    for (label, body, offload) in [
        ("1 KiB job, inline", &small, false),
        ("5 MiB job, claim-checked", &large, true),
    ] {
        let mut producer = Producer::new(sqs.clone(), &queue.url);
        if offload {
            producer = producer.with_large_payloads(store.clone(), &bucket);
        }
        // The producer reads the queue's MaximumMessageSize once; not counted per job.
        producer.send(&NewJob::new("figure", "warm-up")).await?;
        drain(&sqs, &queue.url).await;
        let (sqs_before, s3_before) = (producer.requests(), store.requests.load(Ordering::Relaxed));
        let mut times = Times::default();
        for _ in 0..JOBS {
            let started = Instant::now();
            producer.send(&NewJob::new("figure", body.as_str())).await?;
            times.send.push(started.elapsed());

            let started = Instant::now();
            let message = receive(&sqs, &queue.url).await;
            times.receive.push(started.elapsed());
            if let Some(Ok(pointer)) = PayloadPointer::of(&message) {
                let started = Instant::now();
                let resolved = resolve(store.as_ref(), &message, &pointer).await?;
                times.fetch.push(started.elapsed());
                assert_eq!(resolved.body.len(), body.len() + 2);
                let started = Instant::now();
                pipeline.discard_payload(&message).await;
                times.delete.push(started.elapsed());
            }
            sqs.delete_message()
                .queue_url(&queue.url)
                .receipt_handle(message.receipt_handle.as_str())
                .send()
                .await?;
        }
        let sqs_requests = (producer.requests() - sqs_before) as f64 / JOBS as f64;
        let s3_requests = (store.requests.load(Ordering::Relaxed) - s3_before) as f64 / JOBS as f64;
        println!(
            "{label}: send {}, receive {}, fetch {}, delete object {}; per job {sqs_requests:.1} producer SQS \
             request(s) and {s3_requests:.1} S3 requests",
            median(&mut times.send),
            median(&mut times.receive),
            median(&mut times.fetch),
            median(&mut times.delete),
        );
    }
    Ok(())
}

async fn receive(sqs: &aws_sdk_sqs::Client, url: &str) -> Message {
    loop {
        let output = sqs
            .receive_message()
            .queue_url(url)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        if let Some(message) = output.messages.unwrap_or_default().into_iter().next() {
            let mut converted = Message::new(
                message.message_id.unwrap_or_default(),
                message.body.unwrap_or_default(),
            );
            converted.receipt_handle =
                conveyor_core::message::ReceiptHandle(message.receipt_handle.unwrap_or_default());
            for (name, value) in message.message_attributes.unwrap_or_default() {
                converted.attributes.insert(
                    name,
                    conveyor_core::message::AttributeValue {
                        data_type: value.data_type,
                        string_value: value.string_value,
                        binary_value: None,
                    },
                );
            }
            return converted;
        }
    }
}

async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) {
    let message = receive(sqs, url).await;
    sqs.delete_message()
        .queue_url(url)
        .receipt_handle(message.receipt_handle.as_str())
        .send()
        .await
        .unwrap();
}
