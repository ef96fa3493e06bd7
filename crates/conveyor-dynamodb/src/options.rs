//! What a [`DynamoStore`](crate::DynamoStore) can be told: attribute names, the oversized-output policy
//! and the completed-record cache.

use crate::defaults;

/// The item's attribute names. The defaults are AWS Lambda Powertools' names (plus Conveyor's
/// `fencing_token`), so a table can be shared with Powertools consumers; change them only to match a
/// Powertools consumer configured with other names.
#[derive(Debug, Clone, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
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
    /// Conveyor's fencing token, a number (N) every claim increases (`fence`); Powertools ignores it.
    pub fencing_token: String,
    /// Conveyor's run count, a number (N) every claim increases (`runs`); Powertools ignores it.
    pub runs: String,
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
            runs: defaults::RUNS_ATTRIBUTE.to_owned(),
        }
    }
}

/// What `complete` does when the output would make the item larger than DynamoDB's 400 KB.
#[non_exhaustive]
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

/// How `complete` writes the output into `data`. Reading accepts both, always.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataFormat {
    /// A string holding the output's JSON text, as Powertools for Python writes it (and reads it back
    /// with `json.loads`).
    #[default]
    JsonString,
    /// The output as a native DynamoDB value (a map for a JSON object), as Powertools for TypeScript
    /// writes it (and reads it back with `unmarshall`). Outputs that are not JSON stay strings.
    Native,
}

/// A table whose primary key has a sort key, as Powertools' `sort_key_attr` (Python) / `sortKeyAttr`
/// (TypeScript) uses it: every record has the same partition key value and the record id in the sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// The sort key attribute (a string), e.g. `sk`.
    pub attribute: String,
    /// The partition key value of every record: Powertools' `static_pk_value` / `staticPkValue`,
    /// by default `idempotency#<AWS_LAMBDA_FUNCTION_NAME>` (Python) or
    /// `idempotency#<key prefix>` (TypeScript).
    pub partition_value: String,
}

/// Options for a [`DynamoStore`](crate::DynamoStore).
#[derive(Debug, Clone, Default, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct StoreOptions {
    /// The item's attribute names.
    pub attributes: AttributeNames,
    /// What to do with outputs that do not fit in one item.
    pub oversized_output: OversizedOutput,
    /// Keep up to this many COMPLETED records in process, so a duplicate of a job this process has
    /// seen completed is answered without a request (until the record's expiry). In-progress records
    /// are never cached. `None` or `Some(0)`: no cache.
    pub completed_cache: Option<usize>,
    /// How outputs are written into `data`: a JSON string (Python's way, the default) or a native
    /// DynamoDB value (TypeScript's way). Pick the one of the Powertools consumer that shares the keys.
    pub data_format: DataFormat,
    /// The table's sort key, for tables laid out with Powertools' `sort_key_attr`; `None`: the record
    /// id is the partition key (`id`).
    pub sort_key: Option<SortKey>,
}
