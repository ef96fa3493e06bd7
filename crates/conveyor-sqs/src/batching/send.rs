//! One `SendMessageBatch` call of the batching producer, and its answers.

use std::sync::Arc;

use crate::fifo_order;
use crate::job::ProduceError;
use crate::producer::{Pending, no_result};

use super::gate::Held;
use super::{Entry, Shared};

/// Sends `entries` (holding back those of FIFO groups with an earlier failure), answers each caller,
/// and releases the groups `held`: after the failures are recorded, so a group's next call sees them.
pub(super) async fn call(shared: Arc<Shared>, entries: Vec<Entry>, held: Held) {
    let mut results: Vec<Option<Result<String, ProduceError>>> = vec![None; entries.len()];
    let mut replies = Vec::with_capacity(entries.len());
    let mut pending = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        if let Some(group) = shared.held_back(&entry) {
            results[index] = Some(Err(ProduceError::GroupHeld { group }));
        }
        replies.push(entry.reply);
        if results[index].is_none() {
            pending.push(Pending {
                index,
                message: entry.message,
                size: entry.size,
            });
        }
    }
    // FIFO only: the groups whose failures hold back their later jobs (a standard queue's group ids
    // are tenants, with no order to keep).
    let groups = if shared.fifo {
        fifo_order::groups_of(&pending)
    } else {
        Vec::new()
    };
    let count = pending.len();
    if !pending.is_empty() {
        // A fatal error (queue missing, access denied) has answered every entry of the call too.
        let _ = shared.producer.send_chunk(pending, &mut results).await;
    }
    if shared.fifo {
        shared.hold_failed(&groups, &results);
    }
    drop(held);
    let failed = results
        .iter()
        .filter(|result| matches!(result, Some(Err(_))))
        .count();
    tracing::debug!(jobs = count, failed, "batch sent");
    for (reply, result) in replies.into_iter().zip(results) {
        // A caller that stopped waiting has no one to tell.
        let _ = reply.send(result.unwrap_or_else(|| Err(no_result())));
    }
}
