//! One `SendMessageBatch` call of the batching producer, and its answers.

use std::sync::Arc;

use tracing::Instrument as _;

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
        // The call's producer span links to each job's context, taken when its caller encoded it.
        let span = conveyor_core::trace::send_span(shared.producer.name(), count);
        conveyor_core::trace::link_to_messages(&span, pending.iter().map(|entry| &entry.message.attributes));
        // A fatal error (queue missing, access denied) has answered every entry of the call too.
        let _ = shared
            .producer
            .send_chunk(pending, &mut results)
            .instrument(span.clone())
            .await;
        if let Some(Err(first)) = results.iter().flatten().find(|result| result.is_err()) {
            conveyor_core::trace::record_send_error(&span, first.error_type(), &first.to_string());
        }
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
