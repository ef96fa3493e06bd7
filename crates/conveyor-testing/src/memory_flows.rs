//! `MemoryFlows`: an in-memory [`FlowStore`] with the DynamoDB store's conditions, and
//! `QueueSender`, a [`FlowSender`] that sends every parent to one [`Queue`] (tests and the simulator).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use conveyor_core::port::to_epoch_millis;
use conveyor_core::port::{ChildEnd, Count, Created, FlowChild, FlowState, NewFlow, ParentMessage};
use conveyor_core::port::{FlowSender, FlowStore, OutgoingMessage, Queue, QueueError, StoreError};

/// One flow's records.
#[derive(Debug, Clone)]
struct Records {
    head: FlowState,
    fingerprint: String,
    parent: ParentMessage,
    children: BTreeMap<String, FlowChild>,
    notice: Option<String>,
    closed: bool,
}

/// Flows in memory. Each call is one atomic step, as each DynamoDB request (or transaction) is.
#[derive(Debug, Default)]
pub struct MemoryFlows {
    flows: Mutex<HashMap<String, Records>>,
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

    /// Forgets a flow's records, as their expiry would (tests and the simulator).
    pub fn forget(&self, flow_id: &str) {
        self.lock().remove(flow_id);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Records>> {
        self.flows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl FlowStore for MemoryFlows {
    async fn create_flow(&self, flow: &NewFlow) -> Result<Created, StoreError> {
        let fingerprint = flow.fingerprint();
        let mut flows = self.lock();
        if let Some(existing) = flows.get(&flow.id) {
            return Ok(if existing.fingerprint == fingerprint {
                Created::Written
            } else {
                Created::Conflict
            });
        }
        let head = FlowState {
            id: flow.id.clone(),
            parent_record: flow.parent_record.clone(),
            policy: flow.policy,
            children: u64::try_from(flow.children.len()).unwrap_or(u64::MAX),
            succeeded: 0,
            failed: 0,
            first_failure: None,
            deadline: to_epoch_millis(flow.deadline),
            parent_sent_at: None,
            failure_sent_at: None,
            parent_ran_at: None,
            parent_refusals: 0,
            parent_error: None,
            parent_failed_at: None,
        };
        let children = flow
            .children
            .iter()
            .map(|(id, key)| {
                let child = FlowChild {
                    id: id.clone(),
                    key: key.clone(),
                    end: None,
                };
                (id.clone(), child)
            })
            .collect();
        let records = Records {
            head,
            fingerprint,
            parent: flow.parent.clone(),
            children,
            notice: None,
            closed: false,
        };
        flows.insert(flow.id.clone(), records);
        Ok(Created::Written)
    }

    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Count, StoreError> {
        self.counts.fetch_add(1, Ordering::Relaxed);
        let mut flows = self.lock();
        let Some(records) = flows.get_mut(flow_id) else {
            return Ok(Count::NotInFlow);
        };
        let Some(child) = records.children.get_mut(child_id) else {
            return Ok(Count::NotInFlow);
        };
        let head = &mut records.head;
        match (&child.end, end) {
            (None, ChildEnd::Succeeded { .. }) => head.succeeded += 1,
            (None, ChildEnd::Failed(reason)) => {
                head.failed += 1;
                head.first_failure
                    .get_or_insert_with(|| format!("child {child_id}: {reason}"));
            }
            // Once the parent was sent it saw the failure: the flow keeps it.
            (Some(ChildEnd::Failed(_)), ChildEnd::Succeeded { .. })
                if head.parent_sent_at.is_none() && head.parent_ran_at.is_none() =>
            {
                head.failed -= 1;
                head.succeeded += 1;
            }
            _ => return Ok(Count::Before(head.clone())),
        }
        child.end = Some(end.clone());
        Ok(Count::Counted(head.clone()))
    }

    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        if let Some(records) = self.lock().get_mut(flow_id) {
            records.head.parent_sent_at.get_or_insert(to_epoch_millis(at));
            records.closed = true;
        }
        Ok(())
    }

    async fn mark_failure_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        if let Some(records) = self.lock().get_mut(flow_id) {
            records.head.failure_sent_at.get_or_insert(to_epoch_millis(at));
        }
        Ok(())
    }

    async fn mark_parent_ran(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        if let Some(records) = self.lock().get_mut(flow_id) {
            records.head.parent_ran_at.get_or_insert(to_epoch_millis(at));
            records.closed = true;
        }
        Ok(())
    }

    async fn parent_refused(&self, flow_id: &str, reason: &str) -> Result<Option<u64>, StoreError> {
        let mut flows = self.lock();
        let Some(records) = flows.get_mut(flow_id) else {
            return Ok(None);
        };
        records.head.parent_refusals += 1;
        records.head.parent_error = Some(reason.to_owned());
        Ok(Some(records.head.parent_refusals))
    }

    async fn mark_parent_failed(
        &self,
        flow_id: &str,
        reason: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        if let Some(records) = self.lock().get_mut(flow_id) {
            if records.head.parent_failed_at.is_none() {
                records.head.parent_failed_at = Some(to_epoch_millis(at));
                records.head.parent_error = Some(reason.to_owned());
            }
            records.closed = true;
        }
        Ok(())
    }

    async fn claim_failure_notice(&self, flow_id: &str, message_id: &str) -> Result<bool, StoreError> {
        let mut flows = self.lock();
        let Some(records) = flows.get_mut(flow_id) else {
            return Ok(false);
        };
        let holder = records.notice.get_or_insert_with(|| message_id.to_owned());
        Ok(holder == message_id)
    }

    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        Ok(self.lock().get(flow_id).map(|records| records.head.clone()))
    }

    async fn parent(&self, flow_id: &str) -> Result<Option<ParentMessage>, StoreError> {
        Ok(self.lock().get(flow_id).map(|records| records.parent.clone()))
    }

    async fn children(&self, flow_id: &str) -> Result<Vec<FlowChild>, StoreError> {
        Ok(self
            .lock()
            .get(flow_id)
            .map(|records| records.children.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn overdue(&self, now: SystemTime, limit: usize) -> Result<Vec<String>, StoreError> {
        let now = to_epoch_millis(now);
        let mut overdue: Vec<(u64, String)> = self
            .lock()
            .values()
            .filter(|records| !records.closed && records.head.deadline < now)
            .map(|records| (records.head.deadline, records.head.id.clone()))
            .collect();
        overdue.sort();
        Ok(overdue.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    async fn close(&self, flow_id: &str) -> Result<(), StoreError> {
        if let Some(records) = self.lock().get_mut(flow_id) {
            records.closed = true;
        }
        Ok(())
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
