//! Queue administration: stats, DLQ peek and redrive, purge (used by the `conveyor` CLI).
//!
//! Plain async functions on an `aws_sdk_sqs::Client`; every error is an [`AdminError`] whose message says
//! what to do. Nothing here prints; progress reaches the caller through callbacks.
//!
//! | function | SQS calls | effect on the messages |
//! |---|---|---|
//! | [`describe`] | `GetQueueAttributes(All)` | none |
//! | [`resolve_dead_letter`] | `GetQueueAttributes`, `GetQueueUrl` or `ListDeadLetterSourceQueues` | none |
//! | [`stats()`] | `GetQueueAttributes` on the queue and its DLQ (+ a peek of each with `peek_age`) | none (a peek: see below) |
//! | [`stats_of`] | `GetQueueAttributes` per queue, plus the DLQ's when it is not among them | none |
//! | [`peek()`] | `ReceiveMessage` with a short visibility timeout, then `ChangeMessageVisibilityBatch(0)` | visible again at once; receive count + 1 |
//! | [`start_move_task`], [`wait_for_move_task`], [`cancel_move_task`] | `StartMessageMoveTask`, `ListMessageMoveTasks`, `CancelMessageMoveTask` | SQS moves every DLQ message, as is |
//! | [`move_messages`] | `ReceiveMessage`, `SendMessageBatch` to the source, then `DeleteMessageBatch` on the DLQ | matching messages move without `conveyor.failure`; the rest are made visible again |
//! | [`delete_messages`] | `ReceiveMessage`, then `DeleteMessageBatch` on the DLQ | matching messages deleted for good; the rest are made visible again |
//! | [`purge()`] | `PurgeQueue` | every message deleted (within 60 s) |
//! | [`ensure_queue_with_dlq`] | `GetQueueUrl`, `CreateQueue` (DLQ, then the queue with its redrive policy), `SetQueueAttributes` | none (creates queues) |
//! | [`list_queues`] | `ListQueues` with a name prefix | none |
//! | [`resolve_queue_url`] | `GetQueueUrl` when given a queue name (a URL is only checked for its shape) | none |
//!
//! Design notes sit beside the code whose correctness depends on them: why a peek holds then releases
//! ([`peek`](mod@peek)), why the move loop sends before it deletes and how it ends a scan
//! ([`move_loop`](mod@move_loop)), where the age of the oldest message comes from ([`stats`](mod@stats)),
//! and why a move task should name its destination ([`move_task`](mod@move_task)).
//!
//! A DLQ message's *failure reason* is the `error` of the [`Failure`](conveyor_core::runtime::Failure) a worker
//! recorded in the `conveyor.failure` attribute when it dead-lettered the message (a permanent failure).
//! Messages SQS's redrive moved after `maxReceiveCount` receives carry no record, but SQS marks them with
//! `DeadLetterQueueSourceArn`; [`Received::reason`] says which case applies.

pub mod create;
pub mod error;
pub mod move_loop;
pub mod move_task;
pub mod peek;
pub mod purge;
pub mod queue_info;
pub mod queue_ref;
pub mod receive;
pub mod stats;
#[cfg(test)]
mod tests;

pub use crate::errors::display_chain;
pub use create::{Created, QueueSetup, QueueSetupReport, ensure_queue_with_dlq};
pub use error::AdminError;
pub use move_loop::{
    Destinations, MoveFailure, MoveFilter, MoveOptions, MoveReport, delete_messages, move_messages,
    moved_copy,
};
pub use move_task::{
    MAX_MOVE_RATE, MoveTaskHandle, MoveTaskStatus, cancel_move_task, list_move_tasks, move_task_status,
    start_move_task, wait_for_move_task,
};
pub use peek::{PeekOptions, Peeked, peek};
pub use purge::purge;
pub use queue_info::{
    DeadLetterPair, QueueInfo, dead_letter_sources, describe, list_queues, resolve_dead_letter, url_for_arn,
};
pub(crate) use queue_ref::url_of_name;
pub use queue_ref::{BadQueueRef, QueueRef, is_queue_name, queue_url_region, resolve_queue_url};
pub use receive::{Received, receive_held, release};
pub use stats::{AGE_PEEK_MAX, OldestAge, QueueStats, Stats, stats, stats_of};
