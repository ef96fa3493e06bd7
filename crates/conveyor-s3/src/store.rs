//! [`S3PayloadStore`]: the payload store port on `aws-sdk-s3`.

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use conveyor_core::port::{PayloadError, PayloadStore};

use crate::classify::classify;

/// Large payloads in S3: `PutObject`, `GetObject`, `DeleteObject`, one request each.
#[derive(Debug, Clone)]
pub struct S3PayloadStore {
    client: Client,
}

impl S3PayloadStore {
    /// A store on `client` (build it with [`crate::s3_client_from_env`]).
    pub fn new(client: Client) -> Self {
        Self { client }
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
        let body = output
            .body
            .collect()
            .await
            .map_err(|error| PayloadError::Unavailable {
                message: format!("reading s3://{bucket}/{key} failed: {error}"),
            })?;
        Ok(body.into_bytes().to_vec())
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
