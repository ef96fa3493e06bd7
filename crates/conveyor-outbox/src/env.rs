//! The relay configured from the environment: the outbox table ([`crate::table::TABLE_ENV`] and its
//! companions), the lease ([`LEASE_SECONDS_ENV`]), the attempts before parking ([`MAX_ATTEMPTS_ENV`]), clients from the process's shared AWS configuration.

use std::sync::Arc;
use std::time::Duration;

use crate::dynamo::DynamoOutboxStore;
use crate::poller::{Poller, PollerOptions};
use crate::relay::{Relay, RelayOptions};
use crate::sink::SqsSink;
use crate::store::MIN_LEASE;
use crate::table::OutboxTable;

/// The environment variable holding the polling relay's lease in whole seconds (default 30, at least 3).
pub const LEASE_SECONDS_ENV: &str = "CONVEYOR_OUTBOX_LEASE_SECONDS";

/// The environment variable holding the permanent send failures after which a job is parked (default 8).
pub const MAX_ATTEMPTS_ENV: &str = "CONVEYOR_OUTBOX_MAX_ATTEMPTS";

/// A relay configuration error: the value, what is wrong, and what to set.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RelayConfigError {
    /// `CONVEYOR_OUTBOX_LEASE_SECONDS` does not hold a whole number of at least 3.
    #[error("{LEASE_SECONDS_ENV}={value:?} is invalid: give whole seconds, at least 3 (default 30)")]
    InvalidLease {
        /// The variable's value.
        value: String,
    },
    /// `CONVEYOR_OUTBOX_MAX_ATTEMPTS` does not hold a whole number of at least 1.
    #[error("{MAX_ATTEMPTS_ENV}={value:?} is invalid: give a whole number of at least 1 (default 8)")]
    InvalidMaxAttempts {
        /// The variable's value.
        value: String,
    },
}

/// Deadlines for the relay's DynamoDB calls (those of `conveyor_dynamodb`'s clients).
fn timeouts() -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(2))
        .operation_attempt_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(15))
        .build()
}

/// A DynamoDB client from a loaded configuration, with the relay's deadlines.
pub fn dynamodb_client(config: &aws_config::SdkConfig) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::config::Builder::from(config)
        .timeout_config(timeouts())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The relay of `table`, with clients from the process's shared AWS configuration.
pub async fn relay_for(table: OutboxTable) -> Relay {
    let config = conveyor_aws::shared_config().await;
    let store = DynamoOutboxStore::new(dynamodb_client(config), table);
    Relay::new(
        Arc::new(store),
        Arc::new(SqsSink::new(conveyor_sqs::sqs_client_from_env().await)),
    )
}

/// The polling relay configured from the environment, or `None` when [`crate::table::TABLE_ENV`] is
/// unset.
pub async fn poller_from_env() -> Result<Option<Poller>, RelayConfigError> {
    let Some(table) = OutboxTable::from_env() else {
        return Ok(None);
    };
    let mut options = PollerOptions::default();
    if let Ok(text) = std::env::var(LEASE_SECONDS_ENV) {
        let seconds = text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|seconds| Duration::from_secs(*seconds) >= MIN_LEASE)
            .ok_or(RelayConfigError::InvalidLease { value: text })?;
        options.lease = Duration::from_secs(seconds);
    }
    let mut relay_options = RelayOptions::default();
    if let Ok(text) = std::env::var(MAX_ATTEMPTS_ENV) {
        relay_options.max_attempts = text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|attempts| *attempts >= 1)
            .ok_or(RelayConfigError::InvalidMaxAttempts { value: text })?;
    }
    let relay = relay_for(table).await.with_options(relay_options);
    let owner = format!("{}-{}", hostname(), uuid::Uuid::new_v4());
    Ok(Some(Poller::new(relay, &owner, options)))
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "relay".to_owned())
}
