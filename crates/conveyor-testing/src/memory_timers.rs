//! `MemoryTimers`: an in-memory [`TimerStore`] with the DynamoDB store's conditions (tests and the
//! simulator).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use conveyor_core::TimerChange;
use conveyor_core::port::{ClaimedTimer, NewTimer, OutgoingMessage, StoreError, Timer, TimerStore};

/// One timer as kept.
#[derive(Debug, Clone)]
struct Kept {
    timer: Timer,
    message: OutgoingMessage,
    token: Option<String>,
}

/// Timers in memory: each call is one atomic step, as each conditional DynamoDB write is.
#[derive(Debug, Default)]
pub struct MemoryTimers {
    /// (queue URL, timer id) → the timer.
    timers: Mutex<BTreeMap<(String, String), Kept>>,
    requests: AtomicU64,
}

impl MemoryTimers {
    /// No timers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls made so far (one per method call, as the DynamoDB store makes one request per call).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// How many timers are kept (any queue); not a request.
    pub fn len(&self) -> usize {
        self.kept().len()
    }

    /// True when no timer is kept; not a request.
    pub fn is_empty(&self) -> bool {
        self.kept().is_empty()
    }

    /// The timers, for one store call (counted as a request).
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Kept>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.kept()
    }

    fn kept(&self) -> MutexGuard<'_, BTreeMap<(String, String), Kept>> {
        self.timers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn key(queue_url: &str, id: &str) -> (String, String) {
    (queue_url.to_owned(), id.to_owned())
}

#[async_trait]
impl TimerStore for MemoryTimers {
    async fn put_timer(&self, timer: &NewTimer, now: SystemTime) -> Result<bool, StoreError> {
        let mut timers = self.lock();
        let slot = key(&timer.queue_url, &timer.id);
        if timers.contains_key(&slot) {
            return Ok(false);
        }
        let kept = Kept {
            timer: Timer {
                id: timer.id.clone(),
                queue_url: timer.queue_url.clone(),
                due: timer.due,
                job_type: timer.job_type.clone(),
                created: now,
                claimed_until: None,
            },
            message: timer.message.clone(),
            token: None,
        };
        timers.insert(slot, kept);
        Ok(true)
    }

    async fn timers(
        &self,
        queue_url: &str,
        before: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let mut listed: Vec<Timer> = self
            .lock()
            .values()
            .filter(|kept| kept.timer.queue_url == queue_url)
            .filter(|kept| before.is_none_or(|before| kept.timer.due <= before))
            .map(|kept| kept.timer.clone())
            .collect();
        listed.sort_by(|a, b| (a.due, &a.id).cmp(&(b.due, &b.id)));
        listed.truncate(limit);
        Ok(listed)
    }

    async fn timer(&self, queue_url: &str, id: &str) -> Result<Option<Timer>, StoreError> {
        Ok(self
            .lock()
            .get(&key(queue_url, id))
            .map(|kept| kept.timer.clone()))
    }

    async fn reschedule_timer(
        &self,
        queue_url: &str,
        id: &str,
        due: SystemTime,
    ) -> Result<TimerChange, StoreError> {
        let mut timers = self.lock();
        let Some(kept) = timers.get_mut(&key(queue_url, id)) else {
            return Ok(TimerChange::NotFound);
        };
        if kept.token.is_some() {
            return Ok(TimerChange::Sending);
        }
        kept.timer.due = due;
        Ok(TimerChange::Changed)
    }

    async fn cancel_timer(&self, queue_url: &str, id: &str) -> Result<TimerChange, StoreError> {
        let mut timers = self.lock();
        let slot = key(queue_url, id);
        let Some(kept) = timers.get(&slot) else {
            return Ok(TimerChange::NotFound);
        };
        if kept.token.is_some() {
            return Ok(TimerChange::Sending);
        }
        timers.remove(&slot);
        Ok(TimerChange::Changed)
    }

    async fn claim_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
        until: SystemTime,
    ) -> Result<Option<ClaimedTimer>, StoreError> {
        let mut timers = self.lock();
        let Some(kept) = timers.get_mut(&key(queue_url, id)) else {
            return Ok(None);
        };
        if kept.timer.claimed_until.is_some_and(|held| held > now) {
            return Ok(None);
        }
        kept.token = Some(token.to_owned());
        kept.timer.claimed_until = Some(until);
        Ok(Some(ClaimedTimer {
            timer: kept.timer.clone(),
            message: kept.message.clone(),
        }))
    }

    async fn release_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
    ) -> Result<(), StoreError> {
        let mut timers = self.lock();
        if let Some(kept) = timers.get_mut(&key(queue_url, id))
            && kept.token.as_deref() == Some(token)
        {
            kept.timer.claimed_until = Some(now);
        }
        Ok(())
    }

    async fn finish_timer(&self, queue_url: &str, id: &str, token: &str) -> Result<(), StoreError> {
        let mut timers = self.lock();
        let slot = key(queue_url, id);
        if timers
            .get(&slot)
            .is_some_and(|kept| kept.token.as_deref() == Some(token))
        {
            timers.remove(&slot);
        }
        Ok(())
    }
}
