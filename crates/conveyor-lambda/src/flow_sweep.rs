//! The flows' deadline sweep in a Lambda-only deployment, where no worker runs `FlowSweeper`.
//!
//! An EventBridge schedule (`infra/modules/lambda-consumer`, `flow_sweep = true`) invokes the consumer
//! function once a minute with [`FLOW_SWEEP_EVENT`]; the function then runs one pass of
//! [`conveyor_core::sweep_overdue_flows`] instead of a batch: flows past their deadline count their
//! unfinished children (dead-lettered by SQS's redrive, never sent) and end by their policy. Only that
//! exact payload is a sweep, so an event wired to the function by mistake still fails with what it is.

use std::time::SystemTime;

use aws_lambda_events::sqs::SqsBatchResponse;
use conveyor_core::Pipeline;
use serde_json::Value;

use crate::error::InvocationError;

/// The payload of a sweep invocation: `{"conveyor": "sweep_flows"}`.
pub const FLOW_SWEEP_EVENT: &str = r#"{"conveyor": "sweep_flows"}"#;

/// Whether `payload` asks for a flow sweep ([`FLOW_SWEEP_EVENT`]).
pub fn is_flow_sweep(payload: &Value) -> bool {
    payload.get("conveyor").and_then(Value::as_str) == Some("sweep_flows")
}

/// One sweep pass with the pipeline's flows and store. A pipeline without flows is a configuration
/// mistake (the schedule is set, flows are not), reported as such; a store that cannot be read fails
/// the invocation, and the next minute's sweep tries again.
pub(crate) async fn sweep_flows(pipeline: &Pipeline) -> Result<SqsBatchResponse, InvocationError> {
    let (Some(flows), Some(store)) = (pipeline.flows(), pipeline.store()) else {
        return Err(InvocationError::FlowSweep(
            "this function was invoked to sweep flows, but its pipeline has no flows: turn them on \
             (Pipeline::with_flows with an idempotency store) or remove the schedule (flow_sweep = false \
             in infra/modules/lambda-consumer)"
                .to_owned(),
        ));
    };
    let report = conveyor_core::sweep_overdue_flows(flows, store.as_ref(), SystemTime::now())
        .await
        .map_err(|error| {
            InvocationError::FlowSweep(format!(
                "the flow sweep could not read or write the store: {error}; the next scheduled sweep tries again"
            ))
        })?;
    if report.overdue > 0 || report.failed > 0 {
        tracing::warn!(
            overdue = report.overdue,
            recovered = report.recovered,
            counted_out = report.counted_out,
            failed = report.failed,
            "flows swept past their deadline"
        );
    }
    Ok(SqsBatchResponse::default())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use conveyor_core::port::FlowStore as _;
    use conveyor_core::{ChildFailurePolicy, Flows, Router};
    use conveyor_testing::{MemoryFlows, MemoryIdempotencyStore, MemoryQueue, QueueSender};

    use super::*;

    #[tokio::test]
    async fn a_sweep_ends_an_overdue_flow_by_its_policy() -> anyhow::Result<()> {
        let store = Arc::new(MemoryFlows::new());
        let queue = Arc::new(MemoryQueue::new("jobs"));
        let mut flow = conveyor_testing::flow_conformance::new_flow("sweep", 2, ChildFailurePolicy::Ignore);
        flow.deadline = SystemTime::now() - Duration::from_secs(1);
        store.create_flow(&flow).await?;
        let pipeline = Pipeline::new(Router::new())
            .with_store(Arc::new(MemoryIdempotencyStore::new()))
            .with_flows(Flows {
                store: store.clone(),
                sender: Arc::new(QueueSender(queue.clone())),
            });

        sweep_flows(&pipeline).await?;

        let state = store
            .flow(&flow.id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the flow is gone"))?;
        assert_eq!((state.succeeded, state.failed), (0, 2), "{state:?}");
        assert!(
            state.parent_sent_at.is_some(),
            "the policy sent the parent: {state:?}"
        );
        assert_eq!(queue.len(), 1, "the parent is on its queue");
        Ok(())
    }

    /// Refuses every send to one queue URL (a deleted queue, or one the role may not send to).
    struct Refusing {
        refused: String,
        inner: QueueSender,
    }

    #[async_trait::async_trait]
    impl conveyor_core::port::FlowSender for Refusing {
        async fn send_to(
            &self,
            queue_url: &str,
            message: conveyor_core::port::OutgoingMessage,
        ) -> Result<String, conveyor_core::port::QueueError> {
            if queue_url == self.refused {
                return Err(conveyor_core::port::QueueError::AccessDenied {
                    queue: queue_url.to_owned(),
                    message: "not authorized to perform sqs:SendMessage".to_owned(),
                });
            }
            self.inner.send_to(queue_url, message).await
        }
    }

    #[tokio::test]
    async fn a_flow_whose_parent_cannot_be_sent_does_not_stop_the_sweep_of_the_others() -> anyhow::Result<()>
    {
        let store = Arc::new(MemoryFlows::new());
        let queue = Arc::new(MemoryQueue::new("jobs"));
        let now = SystemTime::now();
        // The refused flow is the most overdue: it comes first in every listing.
        let mut refused =
            conveyor_testing::flow_conformance::new_flow("refused", 1, ChildFailurePolicy::Ignore);
        refused.parent.queue_url = "http://sim.invalid/deleted".to_owned();
        refused.deadline = now - Duration::from_secs(120);
        store.create_flow(&refused).await?;
        let mut others = Vec::new();
        for _ in 0..3 {
            let mut flow =
                conveyor_testing::flow_conformance::new_flow("other", 1, ChildFailurePolicy::Ignore);
            flow.deadline = now - Duration::from_secs(60);
            store.create_flow(&flow).await?;
            others.push(flow.id);
        }
        let flows = Flows {
            store: store.clone(),
            sender: Arc::new(Refusing {
                refused: refused.parent.queue_url.clone(),
                inner: QueueSender(queue.clone()),
            }),
        };

        let report = conveyor_core::sweep_overdue_flows(&flows, &MemoryIdempotencyStore::new(), now).await?;

        assert_eq!((report.overdue, report.failed), (3, 1), "{report:?}");
        for id in &others {
            let state = store
                .flow(id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("flow {id} is gone"))?;
            assert!(
                state.parent_sent_at.is_some(),
                "flow {id} ended by its policy: {state:?}"
            );
        }
        assert_eq!(queue.len(), 3, "the three other parents are on their queue");
        let listed = store.overdue(now, 10).await?;
        assert_eq!(
            listed,
            vec![refused.id.clone()],
            "the refused flow stays overdue for the next pass"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_sweep_without_flows_says_what_to_fix() {
        let error = sweep_flows(&Pipeline::new(Router::new())).await.err();
        assert!(
            matches!(&error, Some(InvocationError::FlowSweep(message)) if message.contains("has no flows")),
            "{error:?}"
        );
    }

    #[test]
    fn only_the_sweep_payload_is_a_sweep() {
        let sweep: Value = serde_json::from_str(FLOW_SWEEP_EVENT).unwrap_or_default();
        assert!(is_flow_sweep(&sweep));
        assert!(!is_flow_sweep(&serde_json::json!({"conveyor_outbox": "sweep"})));
        assert!(!is_flow_sweep(&serde_json::json!({"Records": []})));
        assert!(!is_flow_sweep(&serde_json::json!({"conveyor": "something else"})));
    }
}
