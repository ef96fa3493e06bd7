//! One batch of a FIFO group at a time per process (a worker, or a Lambda execution environment that
//! runs several invocations at once), whatever the queue hands out.
//!
//! # Design note: why, and what it keeps
//!
//! SQS hands out nothing more of a FIFO group while any of its messages is in flight, so one worker
//! never holds two batches of a group at once. Emulators do not all keep that: LocalStack unlocks a
//! group as soon as any of its messages is visible again, and a redrive or a mistake can do the same.
//! Measured under the worker: two messages of one group ran at the same time and out of order. So each
//! group has a gate: a batch runs only while it holds the gate, in the order the receives answered
//! (tokio's mutex is fair). And when a batch of the group put messages back (a failure that could not
//! wait in flight, a lost lease, shutdown), every batch of the group received before that and still
//! waiting goes back too, in order, unrun: its messages come after the ones that went back.
//!
//! The cost on SQS itself is nothing: there the gate is never contended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A FIFO group's gate.
#[derive(Debug, Default)]
pub struct GroupGate {
    turn: tokio::sync::Mutex<()>,
    /// How many times a batch of the group put messages back.
    returns: AtomicU64,
}

impl GroupGate {
    /// Counts a batch of the group putting messages back.
    pub fn returned(&self) {
        self.returns.fetch_add(1, Ordering::AcqRel);
    }
}

/// A batch's place at its group's gate, taken when the receive answered.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<GroupGate>,
    returns_at_receive: u64,
}

/// What a batch may do once it holds its group's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Turn {
    /// Run, in order.
    Run,
    /// An earlier batch of the group put messages back after this one was received: go back unrun.
    GoBack,
}

impl Ticket {
    /// Waits for the group's turn; the guard holds it until dropped.
    pub async fn wait(&self) -> (tokio::sync::MutexGuard<'_, ()>, Turn) {
        let guard = self.gate.turn.lock().await;
        let turn = if self.gate.returns.load(Ordering::Acquire) == self.returns_at_receive {
            Turn::Run
        } else {
            Turn::GoBack
        };
        (guard, turn)
    }

    /// The group's gate.
    pub fn gate(&self) -> &GroupGate {
        &self.gate
    }
}

/// The gates of the groups a worker holds batches of, per queue.
#[derive(Debug, Default)]
pub struct GroupGates {
    gates: Mutex<HashMap<(String, String), Arc<GroupGate>>>,
}

impl GroupGates {
    /// A ticket for a batch of `group` on queue `queue`, just received.
    pub fn ticket(&self, queue: &str, group: &str) -> Ticket {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = Arc::clone(gates.entry((queue.to_owned(), group.to_owned())).or_default());
        let returns_at_receive = gate.returns.load(Ordering::Acquire);
        Ticket {
            gate,
            returns_at_receive,
        }
    }

    /// Forgets the gate of `group` when no batch holds a ticket for it any more.
    pub fn done(&self, queue: &str, group: &str, ticket: Ticket) {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (queue.to_owned(), group.to_owned());
        drop(ticket);
        if gates.get(&key).is_some_and(|gate| Arc::strong_count(gate) == 1) {
            gates.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_received_before_an_earlier_one_went_back_goes_back_too() {
        let gates = GroupGates::default();
        let first = gates.ticket("q", "g");
        let second = gates.ticket("q", "g");
        {
            let (_guard, turn) = first.wait().await;
            assert!(matches!(turn, Turn::Run));
            first.gate().returned();
        }
        let (_guard, turn) = second.wait().await;
        assert!(
            matches!(turn, Turn::GoBack),
            "its messages come after the ones that went back"
        );
        drop(_guard);
        let later = gates.ticket("q", "g");
        let (_guard, turn) = later.wait().await;
        assert!(
            matches!(turn, Turn::Run),
            "a batch received after the return runs"
        );
    }

    #[tokio::test]
    async fn gates_are_forgotten_when_no_batch_holds_a_ticket() {
        let gates = GroupGates::default();
        let ticket = gates.ticket("q", "g");
        let other = gates.ticket("q", "g");
        gates.done("q", "g", ticket);
        assert_eq!(
            gates.gates.lock().unwrap().len(),
            1,
            "another batch still holds one"
        );
        gates.done("q", "g", other);
        assert!(gates.gates.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_batch_of_a_group_at_a_time() {
        let gates = Arc::new(GroupGates::default());
        let first = gates.ticket("q", "g");
        let (guard, _) = first.wait().await;
        let second = gates.ticket("q", "g");
        let waiting = tokio::spawn(async move {
            let (_guard, _) = second.wait().await;
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second batch waits for the first");
        drop(guard);
        waiting.await.unwrap();
    }
}
