//! [`S3PayloadStore`]: the payload store port on `aws-sdk-s3`.

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use conveyor_core::port::{PayloadError, PayloadStore};

use crate::classify::classify;

/// Large payloads in S3: `PutObject`, `GetObject`, `DeleteObject`, one request each; a touch is a
/// `CopyObject` of the object onto itself with new metadata, which gives it a new `Last-Modified`, so
/// the bucket's lifecycle expiration counts from the touch (`conveyor-core/src/payload.rs`).
#[derive(Debug, Clone)]
pub struct S3PayloadStore {
    client: Client,
    /// The most bytes a `get` reads, when limited ([`S3PayloadStore::with_max_read`]).
    max_read: Option<u64>,
}

impl S3PayloadStore {
    /// A store on `client` (build it with [`crate::s3_client_from_env`]).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            max_read: None,
        }
    }

    /// Reads at most `bytes` of an object: a `get` of a larger one is refused
    /// ([`PayloadError::Misconfigured`], naming the limit) without reading past the limit (an object
    /// whose `Content-Length` says so is not read at all; the body is streamed and the read stops at
    /// the limit). For readers that show payloads to a person (the console, `conveyor dlq peek`), not
    /// for the runtimes, which must read the whole job.
    pub fn with_max_read(mut self, bytes: u64) -> Self {
        self.max_read = Some(bytes);
        self
    }

    /// `bucket`/`key` is larger than `limit`: nothing past it was read.
    fn too_large(bucket: &str, key: &str, limit: u64) -> PayloadError {
        PayloadError::Misconfigured {
            message: format!(
                "s3://{bucket}/{key} is larger than the {limit} bytes this reader reads at most; nothing past \
                 them was read (read it with `aws s3 cp`, or raise the limit)"
            ),
        }
    }
}

#[async_trait]
impl PayloadStore for S3PayloadStore {
    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PayloadError> {
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|error| classify(&error, bucket, key))?;
        Ok(())
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, PayloadError> {
        let output = self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|error| classify(&error, bucket, key))?;
        let failed = |error: &dyn std::fmt::Display| PayloadError::Unavailable {
            message: format!("reading s3://{bucket}/{key} failed: {error}"),
        };
        let Some(limit) = self.max_read else {
            let body = output.body.collect().await.map_err(|error| failed(&error))?;
            return Ok(body.into_bytes().to_vec());
        };
        let declared = output
            .content_length
            .and_then(|length| u64::try_from(length).ok());
        if declared.is_some_and(|length| length > limit) {
            return Err(Self::too_large(bucket, key, limit));
        }
        let mut body = output.body;
        let mut read = Vec::new();
        while let Some(chunk) = body.try_next().await.map_err(|error| failed(&error))? {
            let total = u64::try_from(read.len().saturating_add(chunk.len())).unwrap_or(u64::MAX);
            if total > limit {
                // Dropping the stream closes the connection: the rest of the object is not read.
                return Err(Self::too_large(bucket, key, limit));
            }
            read.extend_from_slice(&chunk);
        }
        Ok(read)
    }

    async fn touch(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        let touched = conveyor_core::runtime::epoch_millis(std::time::SystemTime::now()).to_string();
        self.client
            .copy_object()
            .bucket(bucket)
            .key(key)
            .copy_source(copy_source(bucket, key))
            // S3 refuses a copy onto itself that changes nothing: the metadata is replaced.
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .metadata(TOUCHED_METADATA, touched)
            .content_type("application/json")
            .send()
            .await
            .map_err(|error| classify(&error, bucket, key))?;
        Ok(())
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        self.client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|error| classify(&error, bucket, key))?;
        Ok(())
    }
}

/// The user metadata a touch writes (`x-amz-meta-conveyor-touched`, epoch milliseconds).
const TOUCHED_METADATA: &str = "conveyor-touched";

/// `CopySource`: `bucket/key`, the key URL-encoded except its slashes.
fn copy_source(bucket: &str, key: &str) -> String {
    let mut encoded = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("{bucket}/{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_source_keeps_slashes_and_encodes_the_rest() {
        assert_eq!(
            copy_source("b", "jobs/6b1d2a5e-0000 x+y"),
            "b/jobs/6b1d2a5e-0000%20x%2By"
        );
    }
}
