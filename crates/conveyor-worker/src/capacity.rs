//! The global in-flight limit, shared by every queue's receive loops in priority order.
//!
//! A plain `tokio::sync::Semaphore` hands permits out first come, first served. Both priority modes
//! need to choose *which* waiting queue gets the next free slot, so this is a small semaphore of its
//! own: `max_in_flight` permits, each tagged with the queue it serves, and a release hands a freed
//! permit to the waiting queue that deserves it:
//!
//! - strict: the waiting queue with the highest weight (first come among equals). Urgent work gets
//!   every slot a finished job frees while it has messages; a backlog elsewhere cannot delay it.
//! - weighted: the waiting queue holding the fewest permits per unit of weight, so backlogged queues
//!   share the slots in proportion to their weights, and an idle queue's share goes to the others.
//!
//! Invariant: a queue waits only while no permit is free, so a free permit never sits next to a waiter.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use conveyor_core::config::PriorityMode;
use tokio::sync::oneshot;

/// The in-flight limit.
#[derive(Debug)]
pub(crate) struct Capacity {
    state: Mutex<State>,
    mode: PriorityMode,
    weights: Vec<u64>,
}

#[derive(Debug)]
struct State {
    free: usize,
    held: Vec<usize>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    queue: usize,
    grant: oneshot::Sender<()>,
}

/// One in-flight slot, held for one message of one queue; freed on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    capacity: Arc<Capacity>,
    queue: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.capacity.release(self.queue);
    }
}

impl Capacity {
    /// `max_in_flight` slots shared by queues with these weights.
    pub(crate) fn new(max_in_flight: usize, weights: &[u32], mode: PriorityMode) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: max_in_flight,
                held: vec![0; weights.len()],
                waiters: VecDeque::new(),
            }),
            mode,
            weights: weights.iter().map(|weight| u64::from((*weight).max(1))).collect(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for one slot for `queue`. Cancel-safe: dropping the future loses no permit.
    pub(crate) async fn acquire(self: &Arc<Self>, queue: usize) -> Permit {
        let receiver = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                state.held[queue] += 1;
                return self.permit(queue);
            }
            let (grant, receiver) = oneshot::channel();
            state.waiters.push_back(Waiter { queue, grant });
            receiver
        };
        Grant {
            capacity: Arc::clone(self),
            queue,
            receiver,
        }
        .await
    }

    /// Takes up to `count` free slots for `queue` without waiting.
    pub(crate) fn try_acquire(self: &Arc<Self>, queue: usize, count: usize) -> Vec<Permit> {
        let taken = {
            let mut state = self.lock();
            let taken = count.min(state.free);
            state.free -= taken;
            state.held[queue] += taken;
            taken
        };
        (0..taken).map(|_| self.permit(queue)).collect()
    }

    /// Slots held for `queue` now.
    #[cfg(test)]
    pub(crate) fn held(&self, queue: usize) -> usize {
        self.lock().held[queue]
    }

    fn permit(self: &Arc<Self>, queue: usize) -> Permit {
        Permit {
            capacity: Arc::clone(self),
            queue,
        }
    }

    fn release(&self, queue: usize) {
        let mut state = self.lock();
        state.held[queue] = state.held[queue].saturating_sub(1);
        while let Some(index) = self.next_waiter(&state) {
            let Some(waiter) = state.waiters.remove(index) else {
                break;
            };
            state.held[waiter.queue] += 1;
            if waiter.grant.send(()).is_ok() {
                return;
            }
            // The waiter gave up before it was served: the slot goes to the next one.
            state.held[waiter.queue] -= 1;
        }
        state.free += 1;
    }

    /// The waiter that deserves the next free slot.
    fn next_waiter(&self, state: &State) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (index, waiter) in state.waiters.iter().enumerate() {
            let better = match best {
                None => true,
                Some((_, best_queue)) => self.prefers(state, waiter.queue, best_queue),
            };
            if better {
                best = Some((index, waiter.queue));
            }
        }
        best.map(|(index, _)| index)
    }

    /// True when `candidate` should be served before `current` (ties keep the earlier waiter).
    fn prefers(&self, state: &State, candidate: usize, current: usize) -> bool {
        let (candidate_weight, current_weight) = (self.weights[candidate], self.weights[current]);
        match self.mode {
            PriorityMode::Strict => candidate_weight > current_weight,
            PriorityMode::Weighted => {
                // held / weight, compared without division.
                (state.held[candidate] as u64) * current_weight < (state.held[current] as u64) * candidate_weight
            }
        }
    }
}

/// A pending grant; returns the slot if it was granted after the waiter gave up.
struct Grant {
    capacity: Arc<Capacity>,
    queue: usize,
    receiver: oneshot::Receiver<()>,
}

impl Future for Grant {
    type Output = Permit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        match Pin::new(&mut self.receiver).poll(cx) {
            Poll::Ready(Ok(())) => {
                // Mark as consumed so Drop does not give it back.
                let (_, closed) = oneshot::channel();
                self.receiver = closed;
                Poll::Ready(self.capacity.permit(self.queue))
            }
            // The capacity never drops a sender without sending, except when it is dropped itself.
            Poll::Ready(Err(_)) => Poll::Pending,
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.receiver.close();
        if self.receiver.try_recv().is_ok() {
            self.capacity.release(self.queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn strict_serves_the_highest_weight_first() {
        let capacity = Capacity::new(1, &[10, 1], PriorityMode::Strict);
        let held = capacity.acquire(1).await;
        let low = tokio::spawn({
            let capacity = Arc::clone(&capacity);
            async move { capacity.acquire(1).await }
        });
        tokio::task::yield_now().await;
        let high = tokio::spawn({
            let capacity = Arc::clone(&capacity);
            async move { capacity.acquire(0).await }
        });
        tokio::task::yield_now().await;
        drop(held);
        let high = tokio::time::timeout(Duration::from_secs(1), high).await.unwrap().unwrap();
        assert!(!low.is_finished(), "the low queue waited first but must be served second");
        drop(high);
        tokio::time::timeout(Duration::from_secs(1), low).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn weighted_serves_the_queue_furthest_below_its_share() {
        let capacity = Capacity::new(4, &[3, 1], PriorityMode::Weighted);
        let mut high: Vec<Permit> = capacity.try_acquire(0, 2);
        let mut low: Vec<Permit> = capacity.try_acquire(1, 2);
        // Both queues wait; high holds 2/3 per weight, low 2/1: high is further below its share.
        let waiting_low = tokio::spawn({
            let capacity = Arc::clone(&capacity);
            async move { capacity.acquire(1).await }
        });
        tokio::task::yield_now().await;
        let waiting_high = tokio::spawn({
            let capacity = Arc::clone(&capacity);
            async move { capacity.acquire(0).await }
        });
        tokio::task::yield_now().await;
        low.pop();
        let granted = tokio::time::timeout(Duration::from_secs(1), waiting_high).await.unwrap().unwrap();
        assert_eq!(capacity.held(0), 3);
        assert!(!waiting_low.is_finished());
        high.push(granted);
        drop(high);
        tokio::time::timeout(Duration::from_secs(1), waiting_low).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_slot() {
        let capacity = Capacity::new(1, &[1], PriorityMode::Weighted);
        let held = capacity.acquire(0).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), capacity.acquire(0)).await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!(capacity.try_acquire(0, 5).len(), 1, "the freed slot is free again");
    }
}
