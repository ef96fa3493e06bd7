//! The global in-flight limit, shared by every queue's receive loops in priority order.
//!
//! A plain `tokio::sync::Semaphore` hands permits out first come, first served. Both priority modes
//! need to choose *which* queue gets the next free slot, so this is a small semaphore of its own:
//! `max_in_flight` permits, each held for one queue, handed out by these rules:
//!
//! - strict: a freed slot goes to the waiting queue with the highest weight (first come among equals).
//!   Urgent work gets every slot a finished job frees while it has messages; a backlog elsewhere
//!   cannot delay it beyond the jobs already running.
//! - weighted: each queue with a backlog is owed `max_in_flight × weight / Σ weights of the queues
//!   with a backlog (and itself)`. A queue above its share takes no slot while another backlogged queue
//!   is below its own; otherwise it may borrow whatever is free, so an idle queue's share is never
//!   wasted. Among waiters, the one holding the fewest slots per unit of weight goes first.
//!
//! "Backlog" is what the receive loop saw last: a receive that came back full. A queue that returns
//! less than it was asked for has no backlog and claims no share. Invariant: a permit stays free
//! while a queue waits only if that queue is above its share and another backlogged queue is owed it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use crate::config::PriorityMode;
use tokio::sync::oneshot;

/// The in-flight limit.
#[derive(Debug)]
pub(crate) struct Capacity {
    state: Mutex<State>,
    mode: PriorityMode,
    weights: Vec<u64>,
    max: u64,
}

#[derive(Debug)]
struct State {
    free: usize,
    held: Vec<usize>,
    /// Queues whose last receive came back full.
    backlogged: Vec<bool>,
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
                backlogged: vec![false; weights.len()],
                waiters: VecDeque::new(),
            }),
            mode,
            weights: weights.iter().map(|weight| u64::from((*weight).max(1))).collect(),
            max: max_in_flight as u64,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for one slot for `queue`. Cancel-safe: dropping the future loses no permit.
    pub(crate) async fn acquire(self: &Arc<Self>, queue: usize) -> Permit {
        let receiver = {
            let mut state = self.lock();
            if state.free > 0 && self.eligible(&state, queue) {
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

    /// Takes up to `count` free slots for `queue` without waiting (within its share, in weighted mode).
    pub(crate) fn try_acquire(self: &Arc<Self>, queue: usize, count: usize) -> Vec<Permit> {
        let mut taken = 0;
        {
            let mut state = self.lock();
            while taken < count && state.free > 0 && self.eligible(&state, queue) {
                state.free -= 1;
                state.held[queue] += 1;
                taken += 1;
            }
        }
        (0..taken).map(|_| self.permit(queue)).collect()
    }

    /// Records whether `queue`'s last receive came back full.
    pub(crate) fn set_backlogged(&self, queue: usize, backlogged: bool) {
        let mut state = self.lock();
        if state.backlogged.get(queue) == Some(&backlogged) {
            return;
        }
        if let Some(flag) = state.backlogged.get_mut(queue) {
            *flag = backlogged;
        }
        self.grant(&mut state);
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
        state.free += 1;
        self.grant(&mut state);
    }

    /// Hands free slots to the waiters that deserve them.
    fn grant(&self, state: &mut State) {
        while state.free > 0 {
            let Some(index) = self.next_waiter(state) else {
                return;
            };
            let Some(waiter) = state.waiters.remove(index) else {
                return;
            };
            state.free -= 1;
            state.held[waiter.queue] += 1;
            if waiter.grant.send(()).is_err() {
                // The waiter gave up before it was served: the slot stays free for the next one.
                state.free += 1;
                state.held[waiter.queue] -= 1;
            }
        }
    }

    /// The eligible waiter that deserves the next free slot.
    fn next_waiter(&self, state: &State) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (index, waiter) in state.waiters.iter().enumerate() {
            if !self.eligible(state, waiter.queue) {
                continue;
            }
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

    /// May `queue` take a free slot now?
    fn eligible(&self, state: &State, queue: usize) -> bool {
        if self.mode == PriorityMode::Strict || state.held[queue] < self.share(state, queue) {
            return true;
        }
        // Above its share: it may borrow only what no backlogged queue is owed.
        !(0..self.weights.len()).any(|other| {
            other != queue && state.backlogged[other] && state.held[other] < self.share(state, other)
        })
    }

    /// `queue`'s share of all slots among the backlogged queues and itself.
    fn share(&self, state: &State, queue: usize) -> usize {
        let competing: u64 = (0..self.weights.len())
            .filter(|other| *other == queue || state.backlogged[*other])
            .map(|other| self.weights[other])
            .sum();
        (self.max * self.weights[queue]).div_ceil(competing.max(1)) as usize
    }

    /// True when `candidate` should be served before `current` (ties keep the earlier waiter).
    fn prefers(&self, state: &State, candidate: usize, current: usize) -> bool {
        let (candidate_weight, current_weight) = (self.weights[candidate], self.weights[current]);
        match self.mode {
            PriorityMode::Strict => candidate_weight > current_weight,
            // Fewer held per unit of weight, compared without division.
            PriorityMode::Weighted => {
                (state.held[candidate] as u64) * current_weight
                    < (state.held[current] as u64) * candidate_weight
            }
        }
    }
}

/// A pending grant; gives the slot back if it was granted after the waiter gave up.
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
                // Consumed: swap in a closed receiver so Drop does not give the slot back.
                let (_, closed) = oneshot::channel();
                self.receiver = closed;
                Poll::Ready(self.capacity.permit(self.queue))
            }
            // The capacity never drops a waiter's sender without sending while the waiter exists.
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
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

    async fn served(task: tokio::task::JoinHandle<Permit>) -> Permit {
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap()
    }

    fn waiting(capacity: &Arc<Capacity>, queue: usize) -> tokio::task::JoinHandle<Permit> {
        let capacity = Arc::clone(capacity);
        tokio::spawn(async move { capacity.acquire(queue).await })
    }

    #[tokio::test]
    async fn strict_serves_the_highest_weight_first() {
        let capacity = Capacity::new(1, &[10, 1], PriorityMode::Strict);
        let held = capacity.acquire(1).await;
        let low = waiting(&capacity, 1);
        tokio::task::yield_now().await;
        let high = waiting(&capacity, 0);
        tokio::task::yield_now().await;
        drop(held);
        let high = served(high).await;
        assert!(
            !low.is_finished(),
            "the low queue waited first but must be served second"
        );
        drop(high);
        served(low).await;
    }

    #[tokio::test]
    async fn weighted_serves_the_queue_furthest_below_its_share() {
        let capacity = Capacity::new(4, &[3, 1], PriorityMode::Weighted);
        let mut high: Vec<Permit> = capacity.try_acquire(0, 2);
        let mut low: Vec<Permit> = capacity.try_acquire(1, 2);
        let waiting_low = waiting(&capacity, 1);
        tokio::task::yield_now().await;
        let waiting_high = waiting(&capacity, 0);
        tokio::task::yield_now().await;
        low.pop();
        high.push(served(waiting_high).await);
        assert_eq!(capacity.held(0), 3);
        assert!(!waiting_low.is_finished());
        drop(high);
        served(waiting_low).await;
    }

    #[tokio::test]
    async fn weighted_keeps_a_backlogged_queues_share_from_a_greedy_one() {
        let capacity = Capacity::new(20, &[3, 1], PriorityMode::Weighted);
        capacity.set_backlogged(0, true);
        capacity.set_backlogged(1, true);
        let light = capacity.try_acquire(1, 20);
        assert_eq!(light.len(), 5, "1/4 of 20");
        let heavy = capacity.try_acquire(0, 20);
        assert_eq!(heavy.len(), 15);
        drop(heavy);
        // The heavy queue has no backlog any more: the light one may borrow everything.
        capacity.set_backlogged(0, false);
        assert_eq!(capacity.try_acquire(1, 20).len(), 15);
        drop(light);
    }

    #[tokio::test]
    async fn a_waiter_over_its_share_is_served_when_the_other_queue_drains() {
        let capacity = Capacity::new(4, &[1, 1], PriorityMode::Weighted);
        capacity.set_backlogged(0, true);
        capacity.set_backlogged(1, true);
        let first = capacity.try_acquire(0, 4);
        assert_eq!(first.len(), 2);
        let borrowed = waiting(&capacity, 0);
        tokio::task::yield_now().await;
        assert!(!borrowed.is_finished(), "queue 1 is owed the two free slots");
        capacity.set_backlogged(1, false);
        served(borrowed).await;
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_slot() {
        let capacity = Capacity::new(1, &[1], PriorityMode::Weighted);
        let held = capacity.acquire(0).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), capacity.acquire(0)).await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!(
            capacity.try_acquire(0, 5).len(),
            1,
            "the freed slot is free again"
        );
    }
}
