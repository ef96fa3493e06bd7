//! The IAM actions behind the DynamoDB calls the idempotency store makes.
//!
//! The one place that says which DynamoDB operation needs which IAM permission: the consumer policy
//! in `infra/modules/consumer-permissions` grants exactly these actions on the table, and the test
//! `tests/tests/infra.rs` checks every SDK call of the store against this list and the list against
//! the policy.

/// What [`DynamoStore`](crate::DynamoStore) calls: claim, complete, release and extend are all
/// conditional `UpdateItem`s (a claim creates the record when it is free), and a record is read with
/// `GetItem`. Each entry is the `aws_sdk_dynamodb::Client` method and the IAM action it needs.
/// Creating the table ([`create_idempotency_table`](crate::create_idempotency_table)) is for the local
/// emulators and tests only and not listed.
pub const CONSUMER_TABLE: &[(&str, &str)] = &[
    ("update_item", "dynamodb:UpdateItem"),
    ("get_item", "dynamodb:GetItem"),
];
