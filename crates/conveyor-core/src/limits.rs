//! SQS and DynamoDB limits, checked before a request so the error can say what was wrong.

use std::time::Duration;

/// Entries per SQS batch call (`SendMessageBatch`, `DeleteMessageBatch`, `ChangeMessageVisibilityBatch`).
pub const MAX_BATCH_ENTRIES: usize = 10;
/// Messages per `ReceiveMessage`.
pub const MAX_RECEIVE_MESSAGES: usize = 10;
/// A message's size (body + attributes), and a batch's total size: 1 MiB since August 2025.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The longest long poll.
pub const MAX_WAIT_TIME: Duration = Duration::from_secs(20);
/// The longest visibility timeout, and the longest one receipt of a message may stay in flight
/// (SQS counts the 12 hours from each receive).
pub const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(12 * 3600);
/// The longest delivery delay.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// Message attributes per message.
pub const MAX_MESSAGE_ATTRIBUTES: usize = 10;
/// Message attributes a producer may set: one slot stays free for the failure record on dead-lettering.
pub const MAX_PRODUCER_ATTRIBUTES: usize = MAX_MESSAGE_ATTRIBUTES - 1;
/// A DynamoDB item's size.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
