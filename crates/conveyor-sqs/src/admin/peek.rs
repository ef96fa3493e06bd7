//! Looking at a queue's messages without consuming them.
//!
//! # Design note: hold, then release all at once
//!
//! SQS has no "peek": the only way to read a message is to receive it, which hides it for a visibility
//! timeout and counts one more receive. A peek therefore receives with a short visibility timeout (the
//! *hold*) and, when it has what it wants, sets the visibility of every receipt back to 0 with
//! `ChangeMessageVisibilityBatch`, so the messages are visible again at once.
//!
//! The release happens after the last receive, not after each one: a message released at once is the
//! first one the next receive returns (SQS has no cursor, and LocalStack 4.8.1 serves the oldest visible
//! message first), so releasing early would show the same messages again and never the rest. The hold is
//! short (30 s by default) so that if the process dies before releasing, the messages come back by
//! themselves soon.
//!
//! The release runs whatever happened during the receives: a receive that fails still releases what was
//! held before the error is returned.
//!
//! Side effect to know: each peek adds one to every peeked message's `ApproximateReceiveCount`. On a DLQ
//! that matters only if the DLQ itself has a redrive policy; on a source queue with a low
//! `maxReceiveCount` it can send messages to the DLQ sooner.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_sqs::Client;
use conveyor_core::{message::ReceiptHandle, port::EntryFailure};

use super::error::AdminError;
use super::receive::{Received, receive_held, release};

/// How a peek receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct PeekOptions {
    /// The most messages to return.
    pub max: usize,
    /// How long the peeked messages stay invisible if the release does not happen (the process dies).
    pub hold: Duration,
    /// Long-poll wait of each receive: the peek stops at the first receive that returns nothing new.
    pub wait: Duration,
}

impl Default for PeekOptions {
    fn default() -> Self {
        Self {
            max: 10,
            hold: Duration::from_secs(30),
            wait: Duration::from_secs(1),
        }
    }
}

/// What a peek saw.
#[derive(Debug, Clone)]
pub struct Peeked {
    /// The messages, in the order they were received.
    pub messages: Vec<Received>,
    /// Releases that failed (by index into `messages`): those messages come back when their hold ends.
    pub release_failures: Vec<EntryFailure>,
}

/// Receives up to `options.max` messages from `queue_url` and makes them all visible again.
pub async fn peek(client: &Client, queue_url: &str, options: PeekOptions) -> Result<Peeked, AdminError> {
    let mut messages: Vec<Received> = Vec::new();
    let gathered = gather(client, queue_url, options, &mut messages).await;
    let receipts: Vec<ReceiptHandle> = messages
        .iter()
        .map(|received| received.message.receipt_handle.clone())
        .collect();
    let released = release(client, queue_url, &receipts).await;
    gathered?;
    let release_failures = released?;
    for failure in &release_failures {
        tracing::warn!(index = failure.index, error = %failure.error, "could not make a peeked message visible again");
    }
    Ok(Peeked {
        messages,
        release_failures,
    })
}

/// Receives until `max` messages are held or a receive brings nothing new.
async fn gather(
    client: &Client,
    queue_url: &str,
    options: PeekOptions,
    messages: &mut Vec<Received>,
) -> Result<(), AdminError> {
    let mut seen: HashSet<String> = HashSet::new();
    while messages.len() < options.max {
        let batch = receive_held(
            client,
            queue_url,
            options.max - messages.len(),
            options.hold,
            options.wait,
        )
        .await?;
        let mut new = 0;
        for received in batch {
            if seen.insert(received.message.id.clone()) {
                new += 1;
                messages.push(received);
            } else {
                // Held twice (its first hold ran out): keep the newest receipt so the release works.
                if let Some(known) = messages
                    .iter_mut()
                    .find(|known| known.message.id == received.message.id)
                {
                    known.message.receipt_handle = received.message.receipt_handle;
                }
            }
        }
        if new == 0 {
            return Ok(());
        }
    }
    Ok(())
}
