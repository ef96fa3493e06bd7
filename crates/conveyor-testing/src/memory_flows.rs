//! `MemoryFlows`: an in-memory [`FlowStore`] with the DynamoDB store's conditions, and
//! `QueueSender`, a [`FlowSender`] that sends every parent to one [`Queue`] (tests and the simulator).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use conveyor_core::port::to_epoch_millis;
use conveyor_core::port::{ChildEnd, Counted, FlowState, NewFlow, unknown_flow};
use conveyor_core::port::{FlowSender, FlowStore, OutgoingMessage, Queue, QueueError, StoreError};

/// Flows in memory. Each call is one atomic step, as each DynamoDB request is.
#[derive(Debug, Default)]
pub struct MemoryFlows {
    flows: Mutex<HashMap<String, FlowState>>,
    counts: AtomicU64,
}

impl MemoryFlows {
    /// No flows.
    pub fn new() -> Self {
        Self::default()
    }

    /// `child_finished` calls made so far.
    pub fn count_calls(&self) -> u64 {
        self.counts.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, FlowState>> {
        self.flows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl FlowStore for MemoryFlows {
    async fn create_flow(&self, flow: &NewFlow) -> Result<(), StoreError> {
        self.lock().entry(flow.id.clone()).or_insert_with(|| FlowState {
            id: flow.id.clone(),
            parent: flow.parent.clone(),
            parent_record: flow.parent_record.clone(),
            children: flow.children.clone(),
            done: Vec::new(),
            failed: Default::default(),
            policy: flow.policy,
            parent_sent_at: None,
        });
        Ok(())
    }

    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Counted, StoreError> {
        self.counts.fetch_add(1, Ordering::Relaxed);
        let mut flows = self.lock();
        let flow = flows.get_mut(flow_id).ok_or_else(|| unknown_flow(flow_id))?;
        let counted_before =
            flow.done.iter().any(|done| done == child_id) || flow.failed.contains_key(child_id);
        if !counted_before {
            match end {
                ChildEnd::Succeeded => flow.done.push(child_id.to_owned()),
                ChildEnd::Failed(reason) => {
                    flow.failed.insert(child_id.to_owned(), reason.clone());
                }
            }
        }
        Ok(Counted {
            first_time: !counted_before,
            flow: flow.clone(),
        })
    }

    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        let mut flows = self.lock();
        let flow = flows.get_mut(flow_id).ok_or_else(|| unknown_flow(flow_id))?;
        flow.parent_sent_at.get_or_insert(to_epoch_millis(at));
        Ok(())
    }

    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        Ok(self.lock().get(flow_id).cloned())
    }
}

/// Sends every parent to one queue, whatever its queue URL.
#[derive(Clone)]
pub struct QueueSender(pub Arc<dyn Queue>);

impl std::fmt::Debug for QueueSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSender").finish_non_exhaustive()
    }
}

#[async_trait]
impl FlowSender for QueueSender {
    async fn send_to(&self, _queue_url: &str, message: OutgoingMessage) -> Result<String, QueueError> {
        self.0.send(message).await
    }
}
