//! What a [`DynamoStore`](crate::DynamoStore) can be told: attribute names, the oversized-output policy
//! and the completed-record cache.

use conveyor_core::defaults;

/// The item's attribute names. The defaults are AWS Lambda Powertools' names (plus Conveyor's
/// `fencing_token`), so a table can be shared with Powertools consumers; change them only to match a
/// Powertools consumer configured with other names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributeNames {
    /// The partition key, a string (`id`).
    pub id: String,
    /// `INPROGRESS` or `COMPLETED` (`status`).
    pub status: String,
    /// The record's expiry in epoch seconds, also the table's TTL attribute (`expiration`).
    pub expiration: String,
    /// The in-progress lease's end in epoch milliseconds (`in_progress_expiration`).
    pub in_progress_expiration: String,
    /// The handler's output as JSON text (`data`).
    pub data: String,
    /// The payload hash when payload validation is on (`validation`).
    pub validation: String,
    /// Conveyor's fencing token (`fencing_token`); Powertools ignores it.
    pub fencing_token: String,
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            id: defaults::IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            status: defaults::STATUS_ATTRIBUTE.to_owned(),
            expiration: defaults::EXPIRATION_ATTRIBUTE.to_owned(),
            in_progress_expiration: defaults::IN_PROGRESS_EXPIRATION_ATTRIBUTE.to_owned(),
            data: defaults::DATA_ATTRIBUTE.to_owned(),
            validation: defaults::VALIDATION_ATTRIBUTE.to_owned(),
            fencing_token: defaults::TOKEN_ATTRIBUTE.to_owned(),
        }
    }
}

/// What `complete` does when the output would make the item larger than DynamoDB's 400 KB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OversizedOutput {
    /// Store the record completed without `data`, and log a warning. Duplicates are still suppressed;
    /// they just get no stored output.
    #[default]
    Omit,
    /// Refuse with `StoreError::OutputTooLarge` and change nothing; the pipeline then completes the
    /// record without output itself.
    Error,
}

/// Options for a [`DynamoStore`](crate::DynamoStore).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// The item's attribute names.
    pub attributes: AttributeNames,
    /// What to do with outputs that do not fit in one item.
    pub oversized_output: OversizedOutput,
    /// Keep up to this many COMPLETED records in process, so a duplicate of a job this process has
    /// seen completed is answered without a request (until the record's expiry). In-progress records
    /// are never cached. `None` or `Some(0)`: no cache.
    pub completed_cache: Option<usize>,
}
