//! The timer table's relay in a Lambda-only deployment, where no worker runs `TimerRelay`.
//!
//! An EventBridge schedule (`infra/modules/lambda-consumer`, `timer_relay = true`) invokes the consumer
//! function once a minute with [`TIMER_RELAY_EVENT`]; the function then runs one relay pass of its
//! pipeline's timers ([`conveyor_core::Pipeline::with_timers`]) instead of a batch: the jobs due within
//! [`LOOKAHEAD`] are sent with the rest of their wait as `DelaySeconds`, so each still starts on time to
//! the second. The lookahead is two schedule periods, so one missed invocation delays nothing.

use std::time::Duration;

use aws_lambda_events::sqs::SqsBatchResponse;
use conveyor_core::Pipeline;
use serde_json::Value;

use crate::error::InvocationError;

/// The payload of a relay invocation: `{"conveyor": "relay_timers"}`.
pub const TIMER_RELAY_EVENT: &str = r#"{"conveyor": "relay_timers"}"#;
/// How far ahead a pass sends: two minutes (the schedule runs every minute).
pub(crate) const LOOKAHEAD: Duration = Duration::from_secs(120);

/// Whether `payload` asks for a relay pass ([`TIMER_RELAY_EVENT`]).
pub fn is_timer_relay(payload: &Value) -> bool {
    payload.get("conveyor").and_then(Value::as_str) == Some("relay_timers")
}

/// One relay pass of the pipeline's timers. A pipeline without timers is a configuration mistake (the
/// schedule is set, timers are not), reported as such; a store that cannot be read fails the
/// invocation, and the next minute's pass tries again (nothing is lost: timers stay until sent).
pub(crate) async fn relay_timers(pipeline: &Pipeline) -> Result<SqsBatchResponse, InvocationError> {
    let Some(timers) = pipeline.timers() else {
        return Err(InvocationError::TimerRelay(
            "this function was invoked to relay timers, but its pipeline has none: turn them on \
             (Pipeline::with_timers) or remove the schedule (timer_relay = false in \
             infra/modules/lambda-consumer)"
                .to_owned(),
        ));
    };
    let relayed = timers.relay(LOOKAHEAD).await.map_err(|error| {
        InvocationError::TimerRelay(format!(
            "the timer relay could not read or write the store: {error}; the next scheduled pass tries again"
        ))
    })?;
    if relayed.sent + relayed.failed > 0 {
        tracing::info!(sent = relayed.sent, failed = relayed.failed, "due timers relayed");
    }
    Ok(SqsBatchResponse::default())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use conveyor_core::port::OutgoingMessage;
    use conveyor_core::{Router, Timers};
    use conveyor_testing::{MemoryQueue, MemoryTimers, QueueSender};

    use super::*;

    #[tokio::test]
    async fn a_pass_sends_the_timers_due_within_the_lookahead_only() -> anyhow::Result<()> {
        let queue = Arc::new(MemoryQueue::new("jobs"));
        let timers = Timers::new(
            Arc::new(MemoryTimers::new()),
            Arc::new(QueueSender(queue.clone())),
            "http://127.0.0.1:4566/000000000000/jobs",
        );
        let body = |text: &str| OutgoingMessage {
            body: text.to_owned(),
            ..OutgoingMessage::default()
        };
        let soon = timers
            .put(
                "report",
                SystemTime::now() + Duration::from_secs(60),
                body("soon"),
            )
            .await?;
        let later = timers
            .put(
                "report",
                SystemTime::now() + Duration::from_secs(3600),
                body("later"),
            )
            .await?;
        let pipeline = Pipeline::new(Router::new()).with_timers(timers.clone());

        relay_timers(&pipeline).await?;

        assert_eq!(
            queue.len(),
            1,
            "the timer due in a minute is sent (delayed), the other kept"
        );
        assert!(timers.get(&soon).await?.is_none());
        assert!(timers.get(&later).await?.is_some());
        Ok(())
    }

    #[tokio::test]
    async fn a_relay_without_timers_says_what_to_fix() {
        let error = relay_timers(&Pipeline::new(Router::new())).await.err();
        assert!(
            matches!(&error, Some(InvocationError::TimerRelay(message)) if message.contains("has none")),
            "{error:?}"
        );
    }

    #[test]
    fn only_the_relay_payload_is_a_relay() {
        let relay: Value = serde_json::from_str(TIMER_RELAY_EVENT).unwrap_or_default();
        assert!(is_timer_relay(&relay));
        assert!(!is_timer_relay(&serde_json::json!({"conveyor": "sweep_flows"})));
        assert!(!is_timer_relay(&serde_json::json!({"Records": []})));
    }
}
