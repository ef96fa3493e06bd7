//! FIFO: at most one call in flight per message group, so a group's calls store its jobs in order.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::lock;

/// The groups with a call in flight.
#[derive(Debug, Default)]
pub(super) struct Gate {
    busy: Mutex<HashSet<String>>,
    released: Notify,
}

/// The groups a call holds; released when dropped (also when the call panics).
#[derive(Debug)]
pub(super) struct Held {
    gate: Arc<Gate>,
    groups: HashSet<String>,
}

impl Gate {
    /// Waits until no call holds any of `groups`, then holds them. Empty `groups` (standard queues)
    /// never wait.
    pub(super) async fn enter(self: &Arc<Self>, groups: HashSet<String>) -> Held {
        loop {
            // Registered before the check, so a release between the check and the wait is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut busy = lock(&self.busy);
                if busy.is_disjoint(&groups) {
                    busy.extend(groups.iter().cloned());
                    return Held {
                        gate: Arc::clone(self),
                        groups,
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.groups.is_empty() {
            return;
        }
        lock(&self.gate.busy).retain(|group| !self.groups.contains(group));
        self.gate.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn groups(names: &[&str]) -> HashSet<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_waits_for_its_call_and_other_groups_do_not() {
        let gate = Arc::new(Gate::default());
        let first = gate.enter(groups(&["a", "b"])).await;
        let _other = gate.enter(groups(&["c"])).await;
        let waiting = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move { gate.enter(groups(&["b"])).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "b is in flight: its next call waits");
        drop(first);
        let second = waiting.await.unwrap();
        assert_eq!(second.groups, groups(&["b"]));
    }
}
