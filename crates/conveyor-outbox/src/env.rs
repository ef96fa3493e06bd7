//! The relay configured from the environment: the outbox table ([`crate::table::TABLE_ENV`] and its
//! companions), the lease ([`LEASE_SECONDS_ENV`]), the attempts before parking ([`MAX_ATTEMPTS_ENV`]), clients from the process's shared AWS configuration.

use std::sync::Arc;
use std::time::Duration;

use crate::dynamo::DynamoOutboxStore;
use crate::poller::{Poller, PollerOptions};
use crate::relay::{Relay, RelayOptions};
use crate::sink::SqsSink;
use crate::store::{MIN_LEASE, OutboxStore};
use crate::table::OutboxTable;

/// The environment variable holding the polling relay's lease in whole seconds (default 30, at least 3).
pub const LEASE_SECONDS_ENV: &str = "CONVEYOR_OUTBOX_LEASE_SECONDS";

/// The environment variable holding the permanent send failures after which a job is parked (default 8).
pub const MAX_ATTEMPTS_ENV: &str = "CONVEYOR_OUTBOX_MAX_ATTEMPTS";

/// The environment variable holding the Postgres URL of an outbox kept in Postgres (feature `postgres`):
/// when set, the relay reads that database's outbox tables instead of a DynamoDB table.
pub const POSTGRES_URL_ENV: &str = "CONVEYOR_OUTBOX_POSTGRES_URL";

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
    /// `CONVEYOR_OUTBOX_POSTGRES_URL` is set but cannot be used.
    #[error(
        "{POSTGRES_URL_ENV} is set, but {problem}: give a URL such as \
         postgres://user:password@host:5432/database (this build has the Postgres outbox only with \
         conveyor-outbox's `postgres` feature)"
    )]
    Postgres {
        /// What is wrong.
        problem: String,
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

/// The relay of `table`, with clients from the process's shared AWS configuration and
/// [`MAX_ATTEMPTS_ENV`] applied.
pub async fn relay_for(table: OutboxTable) -> Result<Relay, RelayConfigError> {
    let config = conveyor_aws::shared_config().await;
    let store = DynamoOutboxStore::new(dynamodb_client(config), table);
    let sink = SqsSink::new(conveyor_sqs::sqs_client_from_env().await);
    Ok(Relay::new(Arc::new(store), Arc::new(sink)).with_options(relay_options_from_env()?))
}

/// The relay's options: [`MAX_ATTEMPTS_ENV`] when set.
fn relay_options_from_env() -> Result<RelayOptions, RelayConfigError> {
    let mut options = RelayOptions::default();
    if let Ok(text) = std::env::var(MAX_ATTEMPTS_ENV) {
        options.max_attempts = text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|attempts| *attempts >= 1)
            .ok_or(RelayConfigError::InvalidMaxAttempts { value: text })?;
    }
    Ok(options)
}

/// The polling relay configured from the environment, or `None` when [`crate::table::TABLE_ENV`] is
/// unset.
pub async fn poller_from_env() -> Result<Option<Poller>, RelayConfigError> {
    let store = match std::env::var(POSTGRES_URL_ENV).ok().filter(|url| !url.is_empty()) {
        Some(url) => postgres_store(&url)?,
        None => {
            let Some(table) = OutboxTable::from_env() else {
                return Ok(None);
            };
            let config = conveyor_aws::shared_config().await;
            Arc::new(DynamoOutboxStore::new(dynamodb_client(config), table)) as Arc<dyn OutboxStore>
        }
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
    let relay_options = relay_options_from_env()?;
    let sink = Arc::new(SqsSink::new(conveyor_sqs::sqs_client_from_env().await));
    let relay = Relay::new(store, sink).with_options(relay_options);
    let owner = format!("{}-{}", hostname(), uuid::Uuid::new_v4());
    Ok(Some(Poller::new(relay, &owner, options)))
}

/// The Postgres store at `url` (its pool connects on first use, so a database that is down at start-up
/// is an outage the relay retries, not a start-up failure).
#[cfg(feature = "postgres")]
pub fn postgres_store(url: &str) -> Result<Arc<dyn OutboxStore>, RelayConfigError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(url)
        .map_err(|error| RelayConfigError::Postgres {
            problem: error.to_string(),
        })?;
    Ok(Arc::new(crate::postgres::PostgresOutboxStore::new(pool)))
}

/// Without the `postgres` feature, a Postgres URL is a configuration error.
#[cfg(not(feature = "postgres"))]
pub fn postgres_store(_url: &str) -> Result<Arc<dyn OutboxStore>, RelayConfigError> {
    Err(RelayConfigError::Postgres {
        problem: "this build has no Postgres support".to_owned(),
    })
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "relay".to_owned())
}
