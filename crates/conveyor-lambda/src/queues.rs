//! The queue behind each record: the [`Queue`] the adapter uses for visibility changes and the DLQ.
//!
//! An event source mapping reads one queue, so a batch normally names one `eventSourceARN`; the adapter
//! still resolves per ARN. On AWS, [`SqsQueues`] turns the ARN into a queue URL with `GetQueueUrl` (name
//! and owner account from the ARN) once per ARN for the life of the execution environment; tests give
//! a [`FixedQueue`].

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use conveyor_core::port::Queue;
use conveyor_sqs::QueueArn;
use conveyor_sqs::endpoint::{UnreachableEndpoint, env_var};
use tokio::sync::Mutex;

/// The queue's name from its ARN, or the whole text when it is not an ARN.
pub fn queue_name(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}

/// Why the queue behind an ARN is unknown.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Not an SQS queue ARN.
    #[error("{0:?} is not an SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>)")]
    InvalidArn(String),
    /// `GetQueueUrl` (or reading the queue's redrive policy) failed.
    #[error(
        "cannot resolve queue {arn}: {message}; the function's role needs sqs:GetQueueUrl and \
         sqs:GetQueueAttributes on it (infra/modules/lambda-consumer)"
    )]
    Sqs {
        /// The ARN.
        arn: String,
        /// What SQS said.
        message: String,
    },
    /// The request never reached the SQS endpoint that a variable set (nothing listens there, or its
    /// host does not resolve): a configuration error, not an outage.
    #[error(
        "cannot resolve queue {arn}: {endpoint}; the records that need the queue (retries, dead letters) are \
         listed as batch failures and come back after their visibility timeout, and the function keeps \
         taking batches: {fix} in the function's environment",
        fix = endpoint.fix()
    )]
    Unreachable {
        /// The ARN.
        arn: String,
        /// The endpoint, its address and the variable that set it.
        endpoint: UnreachableEndpoint,
    },
}

/// Finds the [`Queue`] for a record's `eventSourceARN`.
#[async_trait]
pub trait QueueResolver: Send + Sync {
    /// The queue behind `arn`.
    async fn resolve(&self, arn: &str) -> Result<Arc<dyn Queue>, ResolveError>;
}

/// Every ARN maps to one given queue: for tests and for callers that already hold the queue.
#[derive(Clone)]
pub struct FixedQueue(pub Arc<dyn Queue>);

impl std::fmt::Debug for FixedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FixedQueue").field(&self.0.name()).finish()
    }
}

#[async_trait]
impl QueueResolver for FixedQueue {
    async fn resolve(&self, _arn: &str) -> Result<Arc<dyn Queue>, ResolveError> {
        Ok(Arc::clone(&self.0))
    }
}

/// Resolves ARNs with `GetQueueUrl` and caches the connected [`conveyor_sqs::SqsQueue`] per ARN.
pub struct SqsQueues {
    client: aws_sdk_sqs::Client,
    cache: Mutex<HashMap<String, Arc<dyn Queue>>>,
}

impl std::fmt::Debug for SqsQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsQueues").finish_non_exhaustive()
    }
}

impl SqsQueues {
    /// A resolver on `client` (built once per cold start).
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl QueueResolver for SqsQueues {
    async fn resolve(&self, arn: &str) -> Result<Arc<dyn Queue>, ResolveError> {
        // Held across the calls: concurrent first lookups of one ARN make one GetQueueUrl.
        let mut cache = self.cache.lock().await;
        if let Some(queue) = cache.get(arn) {
            return Ok(Arc::clone(queue));
        }
        let parsed = QueueArn::parse(arn).ok_or_else(|| ResolveError::InvalidArn(arn.to_owned()))?;
        let sqs_error = |message: String| ResolveError::Sqs {
            arn: arn.to_owned(),
            message,
        };
        let unreachable = |endpoint: UnreachableEndpoint| ResolveError::Unreachable {
            arn: arn.to_owned(),
            endpoint,
        };
        let output = self
            .client
            .get_queue_url()
            .queue_name(&parsed.name)
            .queue_owner_aws_account_id(&parsed.account)
            .send()
            .await
            .map_err(
                |error| match UnreachableEndpoint::from_sdk_error(&error, env_var) {
                    Some(endpoint) => unreachable(endpoint),
                    None => sqs_error(aws_sdk_sqs::error::DisplayErrorContext(error).to_string()),
                },
            )?;
        let Some(url) = output.queue_url else {
            return Err(sqs_error("GetQueueUrl returned no URL".to_owned()));
        };
        let queue = conveyor_sqs::SqsQueue::connect(self.client.clone(), &url)
            .await
            .map_err(
                |error| match UnreachableEndpoint::from_queue_error(&error, env_var) {
                    Some(endpoint) => unreachable(endpoint),
                    None => sqs_error(error.to_string()),
                },
            )?;
        tracing::info!(queue = %parsed.name, %url, "resolved source queue");
        let queue: Arc<dyn Queue> = Arc::new(queue);
        cache.insert(arn.to_owned(), Arc::clone(&queue));
        Ok(queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arns_split_into_account_and_name() {
        let arn = QueueArn::parse("arn:aws:sqs:us-east-2:123456789012:fifo.fifo").unwrap();
        assert_eq!(
            (arn.account.as_str(), arn.name.as_str()),
            ("123456789012", "fifo.fifo")
        );
        assert!(QueueArn::parse("arn:aws-cn:sqs:cn-north-1:1:q").is_some());
        assert!(QueueArn::parse("arn:aws:sns:us-east-1:1:topic").is_none());
        assert!(QueueArn::parse("https://sqs.us-east-1.amazonaws.com/1/q").is_none());
        assert_eq!(
            queue_name("arn:aws:sqs:us-east-2:123456789012:my-queue"),
            "my-queue"
        );
    }
}
