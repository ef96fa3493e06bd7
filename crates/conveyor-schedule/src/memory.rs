//! [`MemoryScheduleStore`]: the [`ScheduleStore`] in memory, with the same conditions as [`TickStore`]
//! (tests, figures and the simulator).
//!
//! [`TickStore`]: crate::TickStore

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;

use crate::store::{Advance, LeaseRecord, ScheduleState, ScheduleStore, StoreError, from_millis, millis};

#[derive(Debug, Default)]
struct Inner {
    leases: HashMap<String, LeaseRecord>,
    states: HashMap<String, ScheduleState>,
    definitions: HashMap<String, HashMap<String, String>>,
    code_definitions: HashMap<String, HashMap<String, String>>,
}

/// Schedules' lease, state and definitions in memory.
#[derive(Debug, Default)]
pub struct MemoryScheduleStore {
    inner: Mutex<Inner>,
    requests: AtomicU64,
}

impl MemoryScheduleStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lease record of `set` now, without counting a request (checks).
    pub fn peek_lease(&self, set: &str) -> Option<LeaseRecord> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.leases.get(set).cloned()
    }

    /// The state of `name` now, without counting a request (checks).
    pub fn peek_state(&self, name: &str) -> ScheduleState {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.states.get(name).cloned().unwrap_or_default()
    }
}

#[async_trait]
impl ScheduleStore for MemoryScheduleStore {
    async fn read_lease(&self, set: &str) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.lock().leases.get(set).cloned())
    }

    async fn write_lease(
        &self,
        set: &str,
        expected: Option<&LeaseRecord>,
        record: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        if inner.leases.get(set) != expected {
            return Ok(false);
        }
        inner.leases.insert(set.to_owned(), record.clone());
        Ok(true)
    }

    async fn state(&self, name: &str) -> Result<ScheduleState, StoreError> {
        Ok(self.lock().states.get(name).cloned().unwrap_or_default())
    }

    async fn advance(
        &self,
        name: &str,
        advance: &Advance,
        max_runs: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let state = inner.states.entry(name.to_owned()).or_default();
        // Whole milliseconds, as DynamoDB's items hold them.
        let tick = from_millis(millis(advance.tick));
        if state.last_tick.is_some_and(|last| last >= tick) {
            return Ok(false);
        }
        if advance.count_run && max_runs.is_some_and(|max| state.runs >= max) {
            return Ok(false);
        }
        state.last_tick = Some(tick);
        state.last_outcome = Some(advance.outcome.clone());
        state.history.clone_from(&advance.history);
        if let Some(fired) = advance.fired_at {
            state.last_fire = Some(fired);
            state.last_sent = Some(tick);
        }
        if advance.count_run {
            state.runs += 1;
        }
        Ok(true)
    }

    async fn note(&self, name: &str, outcome: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.states.entry(name.to_owned()).or_default().last_outcome = Some(outcome.to_owned());
        Ok(())
    }

    async fn pause(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let state = inner.states.entry(name.to_owned()).or_default();
        if !state.paused {
            state.paused = true;
            state.paused_at = Some(at);
        }
        Ok(())
    }

    async fn resume(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let state = inner.states.entry(name.to_owned()).or_default();
        if state.paused {
            state.pauses = state.pauses_after_resume(at);
            state.paused = false;
            state.resumed_at = Some(at);
        }
        Ok(())
    }

    async fn definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError> {
        Ok(self.lock().definitions.get(set).cloned().unwrap_or_default())
    }

    async fn put_definition(&self, set: &str, name: &str, definition: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let replaced = inner
            .definitions
            .entry(set.to_owned())
            .or_default()
            .insert(name.to_owned(), definition.to_owned());
        if replaced.is_none() {
            inner.states.remove(name);
        }
        Ok(())
    }

    async fn remove_definition(&self, set: &str, name: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let removed = inner
            .definitions
            .get_mut(set)
            .and_then(|definitions| definitions.remove(name));
        if removed.is_some() {
            inner.states.remove(name);
        }
        Ok(())
    }

    async fn record_code_definitions(
        &self,
        set: &str,
        definitions: &HashMap<String, String>,
        _by: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        self.lock()
            .code_definitions
            .insert(set.to_owned(), definitions.clone());
        Ok(())
    }

    async fn code_definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError> {
        Ok(self.lock().code_definitions.get(set).cloned().unwrap_or_default())
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}
