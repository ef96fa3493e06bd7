//! The stream reader's state in DynamoDB: one lease per stream (so one relay process reads it at a time)
//! and one checkpoint per shard (so a restart resumes where the last relay stopped instead of sending the
//! stream's 24 hours again).
//!
//! The state lives in a table whose partition key is a string named `id`, such as Conveyor's idempotency
//! table; items are named `conveyor-outbox#lease#<stream ARN>` and
//! `conveyor-outbox#checkpoint#<stream ARN>#<shard id>`, and carry no TTL attribute.
//!
//! Design note: the lease is a conditional `PutItem` (not held, expired, or held by us). Two relays
//! can overlap only when a holder stalls past its lease without noticing (a paused process): both send
//! the same records, and the consumer settles the duplicates once. No record is lost either way, because
//! a checkpoint only ever moves past records whose jobs SQS accepted.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::runtime::epoch_millis;

/// A failed state read or write.
#[derive(Debug, Clone, thiserror::Error)]
#[error("outbox relay state in table {table}: {message}")]
pub struct StateError {
    table: String,
    message: String,
}

/// Where one shard was left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// The sequence number of the last record relayed (everything up to it is done).
    pub sequence_number: Option<String>,
    /// The shard is closed and read to its end.
    pub finished: bool,
}

/// The lease and checkpoints of one stream.
#[derive(Debug, Clone)]
pub(crate) struct RelayState {
    client: Client,
    table: String,
    stream_arn: String,
    owner: String,
}

impl RelayState {
    /// The state of `stream_arn` in `table`, for a relay process that calls itself `owner`.
    pub(crate) fn new(
        client: Client,
        table: impl Into<String>,
        stream_arn: impl Into<String>,
        owner: impl Into<String>,
    ) -> Self {
        Self {
            client,
            table: table.into(),
            stream_arn: stream_arn.into(),
            owner: owner.into(),
        }
    }

    /// The stream's ARN.
    pub(crate) fn stream_arn(&self) -> &str {
        &self.stream_arn
    }

    fn error(&self, error: impl std::fmt::Display) -> StateError {
        StateError {
            table: self.table.clone(),
            message: error.to_string(),
        }
    }

    fn lease_id(&self) -> String {
        format!("conveyor-outbox#lease#{}", self.stream_arn)
    }

    fn checkpoint_id(&self, shard_id: &str) -> String {
        format!("conveyor-outbox#checkpoint#{}#{shard_id}", self.stream_arn)
    }

    /// Takes or renews the lease for `length`: `Ok(true)` when this process holds it now, `Ok(false)` when
    /// another one does.
    pub(crate) async fn acquire(&self, length: Duration) -> Result<bool, StateError> {
        let now = epoch_millis(SystemTime::now());
        let expires = now + u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
        // UpdateItem (not PutItem): the checkpoints are PutItems, and tests fail those alone.
        let answer = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(self.lease_id()))
            .update_expression("SET #owner = :me, lease_expires_at = :expires")
            .condition_expression("attribute_not_exists(id) OR lease_expires_at < :now OR #owner = :me")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
            .expression_attribute_values(":expires", AttributeValue::N(expires.to_string()))
            .expression_attribute_values(":me", AttributeValue::S(self.owner.clone()))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(true),
            Err(error)
                if error.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    /// Gives the lease up (when this process holds it), so a standby relay takes over at once.
    pub(crate) async fn release(&self) -> Result<(), StateError> {
        let answer = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(self.lease_id()))
            .condition_expression("#owner = :me")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":me", AttributeValue::S(self.owner.clone()))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(error)
                if error.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::delete_item::DeleteItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    /// The shard's checkpoint (default when none was written).
    pub(crate) async fn checkpoint(&self, shard_id: &str) -> Result<Checkpoint, StateError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(self.checkpoint_id(shard_id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        let Some(item) = output.item else {
            return Ok(Checkpoint::default());
        };
        Ok(Checkpoint {
            sequence_number: item
                .get("sequence_number")
                .and_then(|value| value.as_s().ok())
                .cloned(),
            finished: item
                .get("finished")
                .and_then(|value| value.as_bool().ok())
                .copied()
                .unwrap_or(false),
        })
    }

    /// Writes the shard's checkpoint.
    pub(crate) async fn save(&self, shard_id: &str, checkpoint: &Checkpoint) -> Result<(), StateError> {
        let mut item = HashMap::from([
            ("id".to_owned(), AttributeValue::S(self.checkpoint_id(shard_id))),
            ("finished".to_owned(), AttributeValue::Bool(checkpoint.finished)),
            ("owner".to_owned(), AttributeValue::S(self.owner.clone())),
            (
                "updated_at".to_owned(),
                AttributeValue::N(epoch_millis(SystemTime::now()).to_string()),
            ),
        ]);
        if let Some(sequence_number) = &checkpoint.sequence_number {
            item.insert(
                "sequence_number".to_owned(),
                AttributeValue::S(sequence_number.clone()),
            );
        }
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }
}
