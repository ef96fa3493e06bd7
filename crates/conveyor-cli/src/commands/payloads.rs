//! Large payloads (SQS Extended Client pointers) in the CLI's output: what a pointer says, and its
//! object fetched from S3 on request (`dlq peek --fetch-payloads`). Fetching never deletes.

use conveyor_core::port::{PayloadPointer, declared_size, resolve};
use conveyor_core::{message::Message, port::PayloadStore};
use conveyor_s3::S3PayloadStore;
use conveyor_sqs::admin::Received;

use crate::aws::Aws;

/// One message's fetched payload: `None` when it is not a pointer; `Err` says why it could not be read.
pub(crate) type Fetched = Option<Result<String, String>>;

/// `pointer → s3://bucket/key (N bytes)` for a pointer message, `None` for any other.
pub(crate) fn describe(message: &Message) -> Option<String> {
    match PayloadPointer::of(message)? {
        Ok(pointer) => {
            let size = declared_size(&message.attributes)
                .map_or_else(|| "size unknown".to_owned(), |n| format!("{n} bytes"));
            Some(format!("pointer → {pointer} ({size})"))
        }
        Err(error) => Some(format!("not readable: {error}")),
    }
}

/// Every pointer message's payload, in order, read through S3 with the command's AWS settings: only
/// pointers into `buckets` are followed (any other is left a pointer, `None`), and each read stops at
/// `max_bytes`.
pub(crate) async fn fetch_all(
    aws: &Aws,
    messages: &[Received],
    buckets: &[String],
    max_bytes: u64,
) -> Vec<Fetched> {
    let store = S3PayloadStore::new(aws.s3_client()).with_max_read(max_bytes);
    let mut fetched = Vec::with_capacity(messages.len());
    for received in messages {
        fetched.push(fetch(&store, &received.message, buckets).await);
    }
    fetched
}

async fn fetch(store: &dyn PayloadStore, message: &Message, buckets: &[String]) -> Fetched {
    let pointer = match PayloadPointer::of(message)? {
        Ok(pointer) => pointer,
        Err(error) => return Some(Err(error.to_string())),
    };
    if !buckets.contains(&pointer.bucket) {
        tracing::warn!(bucket = %pointer.bucket, key = %pointer.key, message_id = %message.id,
            "a payload pointer into a bucket not given with --payload-bucket was not followed");
        return None;
    }
    tracing::warn!(bucket = %pointer.bucket, key = %pointer.key, message_id = %message.id,
        "reading a dead letter's payload");
    Some(
        resolve(store, message, &pointer)
            .await
            .map(|resolved| resolved.body)
            .map_err(|error| error.to_string()),
    )
}

/// `payloads` lined up with `count` messages (all `None` when nothing was fetched).
pub(crate) fn padded(payloads: &[Fetched], count: usize) -> Vec<Option<&Result<String, String>>> {
    (0..count)
        .map(|index| payloads.get(index).and_then(Option::as_ref))
        .collect()
}
