//! What a runtime does to the queue for a rejected message.

use std::time::Duration;

use crate::message::Message;
use crate::outcome::Failure;
use crate::queue::{DeadLetter, Queue};

/// How rejected (permanently failed) messages reach the DLQ.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectMode {
    /// Send a copy with the failure recorded to the DLQ now, then delete the original (the default).
    #[default]
    SendToDlq,
    /// Make the message visible again at once and let SQS's redrive move it after `maxReceiveCount`.
    LeaveToRedrive,
}

/// What to do with the original message after a reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Delete it: a copy is in the DLQ.
    Delete,
    /// Leave it in the queue, visible again after this delay.
    Visible(Duration),
}

/// Dead-letters a rejected message and says what to do with the original.
///
/// Safe in every branch: the original is deleted only after the DLQ accepted the copy; if the DLQ send
/// fails, or the queue has no DLQ, the message stays in the queue and comes back after `fallback_delay`
/// (its backoff) rather than looping at full speed. A crash between the send and the delete leaves a
/// second copy in the DLQ at worst, never none.
pub async fn reject(
    queue: &dyn Queue,
    message: &Message,
    failure: &Failure,
    mode: RejectMode,
    fallback_delay: Duration,
) -> Disposition {
    if mode == RejectMode::LeaveToRedrive {
        return Disposition::Visible(Duration::ZERO);
    }
    match queue.dead_letter(message, failure).await {
        Ok(DeadLetter::Sent(dlq)) => {
            tracing::info!(dlq = %dlq, reason = %failure.error, "message dead-lettered");
            Disposition::Delete
        }
        Ok(DeadLetter::NoDeadLetterQueue) => {
            tracing::warn!(
                queue = %queue.name(),
                reason = %failure.error,
                "permanent failure but the queue has no redrive policy: the message stays in the queue; \
                 add a DLQ (infra/modules/queue)"
            );
            Disposition::Visible(fallback_delay)
        }
        Err(error) => {
            tracing::warn!(%error, "dead-letter send failed; the message stays in the queue and comes back");
            Disposition::Visible(fallback_delay)
        }
    }
}
