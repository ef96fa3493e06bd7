//! The IAM actions behind the DynamoDB calls the idempotency store makes.
//!
//! The one place that says which DynamoDB operation needs which IAM permission: the consumer policy
//! in `infra/modules/consumer-permissions` grants exactly these actions on the table, and the test
//! `tests/tests/infra.rs` checks every SDK call of the store against this list and the list against
//! the policy.

/// What [`DynamoStore`](crate::DynamoStore) calls: claim, complete, release and extend are all
/// conditional `UpdateItem`s (a claim creates the record when it is free), and a record is read with
/// `GetItem`. Flows add a child's count (`TransactWriteItems` of two updates: IAM checks `UpdateItem`
/// on each), a parent's children (`BatchGetItem`), the deadline sweep's listing (`Query` on the jobs
/// index) and, for a handler that sends a flow, its items (`PutItem`). Each entry is the
/// `aws_sdk_dynamodb::Client` method and the IAM action it needs. Creating the table
/// ([`create_idempotency_table`](crate::create_idempotency_table)) is for the local emulators and tests
/// only and not listed.
pub const CONSUMER_TABLE: &[(&str, &str)] = &[
    ("update_item", "dynamodb:UpdateItem"),
    ("get_item", "dynamodb:GetItem"),
    ("transact_write_items", "dynamodb:UpdateItem"),
    ("batch_get_item", "dynamodb:BatchGetItem"),
    ("query", "dynamodb:Query"),
    ("put_item", "dynamodb:PutItem"),
];

/// What a producer calls on the idempotency table beside sending: `Producer::send_tracked` writes the
/// job's `sent` record and `Producer::cancel` its cancel marker (conditional `UpdateItem`s; the cancel
/// reads the record back, `GetItem`), and `FlowProducer` writes a flow's items where none exist
/// (conditional `PutItem`; a re-send reads the head, `GetItem`). The table module's
/// `producer_policy_json` grants exactly this.
pub const PRODUCER_TABLE: &[(&str, &str)] = &[
    ("update_item", "dynamodb:UpdateItem"),
    ("get_item", "dynamodb:GetItem"),
    ("put_item", "dynamodb:PutItem"),
];

/// What an operator's commands call on the idempotency table: `conveyor jobs show|watch` read a
/// record (`GetItem`) and a flow's children (`BatchGetItem`), `conveyor jobs list` queries the `conveyor-jobs-sharded` index (`Query`, granted on
/// the index), and `conveyor schedules pause|resume|trigger` and cancelling a job write (`UpdateItem`).
/// The table module's `operator_policy_json` grants exactly this.
pub const OPERATOR_TABLE: &[(&str, &str)] = &[
    ("batch_get_item", "dynamodb:BatchGetItem"),
    ("get_item", "dynamodb:GetItem"),
    ("query", "dynamodb:Query"),
    ("update_item", "dynamodb:UpdateItem"),
];
