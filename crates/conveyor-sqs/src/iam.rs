//! The IAM actions behind the SQS calls Conveyor makes, one list per role.
//!
//! These lists are the one place that says which SQS operation needs which IAM permission. The
//! policies in `infra/` (the consumer's, the producer's and the operator's) grant exactly these
//! actions, and the test `tests/tests/infra.rs` holds both sides to them: every SDK call in the
//! consumer, producer and admin code must be listed here, and every listed action must be what the
//! Terraform policy grants.
//!
//! Each entry is an `aws_sdk_sqs::Client` method and the IAM action it needs (batch calls need the
//! single action: `delete_message_batch` needs `sqs:DeleteMessage`).

/// What a consumer (the worker, the Lambda adapter) calls on the queue it consumes: receive, delete
/// (Ack), change visibility (heartbeats, Retry), read attributes (visibility timeout, redrive policy,
/// depth), resolve the URL (the Lambda adapter, from the event source ARN), and send a deferral's
/// delayed copy back to the same queue.
pub const CONSUMER_QUEUE: &[(&str, &str)] = &[
    ("receive_message", "sqs:ReceiveMessage"),
    ("delete_message_batch", "sqs:DeleteMessage"),
    ("change_message_visibility_batch", "sqs:ChangeMessageVisibility"),
    ("get_queue_attributes", "sqs:GetQueueAttributes"),
    ("get_queue_url", "sqs:GetQueueUrl"),
    ("send_message", "sqs:SendMessage"),
];

/// What a consumer calls on the dead-letter queue: resolve its URL from the redrive policy's ARN,
/// send a permanent failure's copy, read its depth.
pub const CONSUMER_DEAD_LETTER_QUEUE: &[(&str, &str)] = &[
    ("get_queue_url", "sqs:GetQueueUrl"),
    ("send_message", "sqs:SendMessage"),
    ("get_queue_attributes", "sqs:GetQueueAttributes"),
];

/// What a producer calls: [`Producer::send`](crate::Producer::send) and `send_batch`, resolving a
/// queue name to its URL (`conveyor send --queue-url NAME`), and reading the queue's retention once
/// before the first job delayed past 15 minutes and its `MaximumMessageSize` once when large payloads
/// are on (`Producer::with_large_payloads`; the S3 side is `conveyor_s3::iam::PRODUCER`).
pub const PRODUCER: &[(&str, &str)] = &[
    ("send_message", "sqs:SendMessage"),
    ("send_message_batch", "sqs:SendMessage"),
    ("get_queue_url", "sqs:GetQueueUrl"),
    ("get_queue_attributes", "sqs:GetQueueAttributes"),
];

/// What an operator's commands call on a queue and its DLQ ([`crate::admin`]: `stats`, `dlq peek`,
/// `dlq redrive` with `StartMessageMoveTask` or the filtered move loop, `dlq tasks --cancel`, `purge`). Creating queues
/// (`conveyor local init`) is for the local emulators only and not listed.
pub const OPERATOR: &[(&str, &str)] = &[
    ("get_queue_attributes", "sqs:GetQueueAttributes"),
    ("get_queue_url", "sqs:GetQueueUrl"),
    ("list_dead_letter_source_queues", "sqs:ListDeadLetterSourceQueues"),
    ("receive_message", "sqs:ReceiveMessage"),
    ("change_message_visibility_batch", "sqs:ChangeMessageVisibility"),
    ("send_message_batch", "sqs:SendMessage"),
    ("delete_message_batch", "sqs:DeleteMessage"),
    ("start_message_move_task", "sqs:StartMessageMoveTask"),
    ("list_message_move_tasks", "sqs:ListMessageMoveTasks"),
    ("cancel_message_move_task", "sqs:CancelMessageMoveTask"),
    ("purge_queue", "sqs:PurgeQueue"),
];

/// What an operator calls that IAM cannot scope to a queue: listing queues by name prefix (`conveyor
/// console --queue-prefix`). IAM grants `sqs:ListQueues` only on resource `*`, which the project's
/// policies never use, so `infra/`'s operator policy leaves it out: grant it yourself to use
/// `--queue-prefix`, or name the queues with `--queue-url`.
pub const OPERATOR_ACCOUNT: &[(&str, &str)] = &[("list_queues", "sqs:ListQueues")];
