//! A downstream write that the idempotency claim's fencing token protects.
//!
//! The claim stops two workers from *starting* the same job, but a worker whose lease lapsed (a long GC
//! pause, a partition, a lost heartbeat) may still be running when another worker takes the job over.
//! Its late write must not land after the new holder's. Every claim of a key carries a larger fencing
//! token than the one before ([`conveyor_core::Context::fencing_token`]), so the downstream store keeps
//! the largest token it has seen per key and refuses a smaller one, in the same conditional write:
//!
//! ```text
//! UpdateItem  SET #token = :token, #entry = :entry
//!             IF attribute_not_exists(#token) OR #token <= :token
//! ```
//!
//! `<=` lets the same holder retry its own write. In a handler:
//!
//! ```rust,no_run
//! # use conveyor_core::{Context, HandlerError};
//! # use conveyor_examples::fenced_ledger::{FencedLedger, LedgerError};
//! # async fn handle(ledger: &FencedLedger, ctx: &Context) -> Result<(), HandlerError> {
//! let (Some(key), Some(token)) = (ctx.idempotency_key(), ctx.fencing_token()) else {
//!     return Err(HandlerError::permanent("the ledger write needs an idempotency claim"));
//! };
//! match ledger.write(key, token, "charged 42 EUR").await {
//!     Ok(()) => Ok(()),
//!     // Another worker took the job over: its write stands, this run's must not.
//!     Err(error @ LedgerError::Stale { .. }) => Err(HandlerError::retryable(error.to_string())),
//!     Err(error) => Err(HandlerError::retryable(error.to_string())),
//! }
//! # }
//! ```

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
};

/// The write condition: no holder wrote yet, or the last one had this token or a smaller one.
pub const FENCE_CONDITION: &str = "attribute_not_exists(#token) OR #token <= :token";

/// A ledger write that failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A holder with a larger token wrote this key already: this run's claim was taken over.
    #[error(
        "ledger entry {key} was written by a newer holder (token {newer:?}); this run's token {token} is stale"
    )]
    Stale {
        /// The key.
        key: String,
        /// This run's token.
        token: u64,
        /// The token stored by the newer holder, when DynamoDB returned it.
        newer: Option<u64>,
    },
    /// DynamoDB failed or refused the request.
    #[error("ledger table {table}: {message}")]
    Store {
        /// The table.
        table: String,
        /// What happened.
        message: String,
    },
}

/// One DynamoDB table of entries, each written only by the newest holder of its key.
#[derive(Debug, Clone)]
pub struct FencedLedger {
    client: Client,
    table: String,
}

impl FencedLedger {
    /// The ledger in `table` (partition key `id`, a string).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// Creates the ledger table (on-demand, partition key `id`).
    pub async fn create_table(&self) -> Result<(), LedgerError> {
        let build_error = |error: aws_sdk_dynamodb::error::BuildError| self.error(error.to_string());
        self.client
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("id")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(build_error)?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("id")
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(build_error)?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string()))?;
        Ok(())
    }

    /// Writes `entry` for `key` as the holder of fencing token `token`, unless a holder with a larger
    /// token has written it already ([`LedgerError::Stale`]).
    pub async fn write(&self, key: &str, token: u64, entry: &str) -> Result<(), LedgerError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(key.to_owned()))
            .update_expression("SET #token = :token, #entry = :entry")
            .condition_expression(FENCE_CONDITION)
            .expression_attribute_names("#token", "fencing_token")
            .expression_attribute_names("#entry", "entry")
            .expression_attribute_values(":token", AttributeValue::N(token.to_string()))
            .expression_attribute_values(":entry", AttributeValue::S(entry.to_owned()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let error = match result {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        if let Some(UpdateItemError::ConditionalCheckFailedException(failure)) = error.as_service_error() {
            let newer = failure
                .item()
                .and_then(|item| item.get("fencing_token"))
                .and_then(|value| value.as_n().ok())
                .and_then(|text| text.parse().ok());
            tracing::warn!(
                key,
                token,
                ?newer,
                "ledger write refused: a newer holder wrote it"
            );
            return Err(LedgerError::Stale {
                key: key.to_owned(),
                token,
                newer,
            });
        }
        Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string()))
    }

    /// The entry written for `key` and the token of the holder that wrote it.
    pub async fn read(&self, key: &str) -> Result<Option<(u64, String)>, LedgerError> {
        let answer = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string()))?;
        let Some(item) = answer.item else {
            return Ok(None);
        };
        let token = item
            .get("fencing_token")
            .and_then(|value| value.as_n().ok())
            .and_then(|text| text.parse().ok());
        let entry = item.get("entry").and_then(|value| value.as_s().ok()).cloned();
        match (token, entry) {
            (Some(token), Some(entry)) => Ok(Some((token, entry))),
            _ => Err(self.error(format!("entry {key:?} lacks fencing_token (N) or entry (S)"))),
        }
    }

    fn error(&self, message: String) -> LedgerError {
        LedgerError::Store {
            table: self.table.clone(),
            message,
        }
    }
}
