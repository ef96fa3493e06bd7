//! Counting the AWS requests the console makes: an SDK interceptor on its SQS, DynamoDB and CloudWatch
//! clients, so each page can say what a refresh cost (retries count: each attempt is a request).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// The running count, shared by the interceptors of both clients.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestCounter(Arc<AtomicU64>);

impl RequestCounter {
    /// Requests sent so far.
    pub(crate) fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// `client` with this counter on it.
    pub(crate) fn sqs(&self, client: &aws_sdk_sqs::Client) -> aws_sdk_sqs::Client {
        let config = client.config().to_builder().interceptor(self.clone()).build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// `client` with this counter on it.
    pub(crate) fn dynamodb(&self, client: &aws_sdk_dynamodb::Client) -> aws_sdk_dynamodb::Client {
        let config = client.config().to_builder().interceptor(self.clone()).build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "ConsoleRequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
