//! [`MemoryOutboxStore`]: the outbox in memory, for tests of code that writes jobs in a transaction and
//! for the simulator. It keeps [`OutboxStore`]'s contract as the DynamoDB and Postgres stores do (the
//! conformance suite checks all three).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use conveyor_sqs::NewJob;
use serde::Serialize;

use crate::encode::{EncodedJob, encode};
use crate::item::OutboxError;
use crate::store::{Backlog, JobRef, LeaseRecord, OutboxStore, StoreError, StoredJob};

#[derive(Debug, Default)]
struct State {
    /// Unsent jobs by aggregate, then sequence.
    jobs: BTreeMap<String, BTreeMap<u64, StoredJob>>,
    /// The last sequence number allocated per aggregate (kept after its jobs are sent).
    heads: HashMap<String, u64>,
    leases: HashMap<String, LeaseRecord>,
    /// When set, every call fails as unavailable (an outage).
    unavailable: bool,
}

/// An in-memory outbox store. Clones share the same jobs.
#[derive(Debug, Clone, Default)]
pub struct MemoryOutboxStore {
    state: Arc<Mutex<State>>,
}

impl MemoryOutboxStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, state: &State) -> Result<(), StoreError> {
        if state.unavailable {
            return Err(StoreError::Unavailable {
                store: "memory".to_owned(),
                message: "the store is down (set by the test)".to_owned(),
            });
        }
        Ok(())
    }

    /// Commits `job` for the queue at `queue_url` as the next job of `aggregate` (what a transaction with
    /// the outbox item does), at `now_millis`; returns its reference.
    pub fn put<J: Serialize>(
        &self,
        job: NewJob<J>,
        queue_url: &str,
        aggregate: &str,
        now_millis: u64,
    ) -> Result<JobRef, OutboxError> {
        let id = uuid::Uuid::new_v4().to_string();
        let encoded = encode(job, queue_url, aggregate, &id)?;
        Ok(self.commit(encoded, queue_url, aggregate, &id, now_millis))
    }

    /// Commits an encoded job (the simulator builds its own).
    pub(crate) fn commit(
        &self,
        encoded: EncodedJob,
        queue_url: &str,
        aggregate: &str,
        id: &str,
        now_millis: u64,
    ) -> JobRef {
        let mut state = self.state();
        let head = state.heads.entry(aggregate.to_owned()).or_insert(0);
        *head += 1;
        let sequence = *head;
        let job = StoredJob {
            aggregate: aggregate.to_owned(),
            sequence,
            id: id.to_owned(),
            queue_url: queue_url.to_owned(),
            job_type: encoded.job_type,
            message: encoded.message,
            created_at_millis: now_millis,
            attempts: 0,
            last_error: None,
            parked_at_millis: None,
        };
        let reference = job.reference();
        state
            .jobs
            .entry(aggregate.to_owned())
            .or_default()
            .insert(sequence, job);
        reference
    }

    /// Makes every call fail as unavailable (`true`) or work again (`false`).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    /// Every unsent job, by aggregate then sequence (for assertions).
    pub fn unsent(&self) -> Vec<StoredJob> {
        self.state()
            .jobs
            .values()
            .flat_map(|jobs| jobs.values().cloned())
            .collect()
    }
}

#[async_trait]
impl OutboxStore for MemoryOutboxStore {
    fn name(&self) -> &str {
        "memory"
    }

    async fn jobs(&self, aggregate: &str, limit: usize) -> Result<Vec<StoredJob>, StoreError> {
        let state = self.state();
        self.check(&state)?;
        Ok(state
            .jobs
            .get(aggregate)
            .map(|jobs| jobs.values().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn pending(&self, limit: usize, committed_before_millis: u64) -> Result<Vec<String>, StoreError> {
        let state = self.state();
        self.check(&state)?;
        let mut oldest: Vec<(u64, &String)> = state
            .jobs
            .iter()
            .filter_map(|(aggregate, jobs)| {
                // Only the jobs before the first parked one can be sent (as in the Postgres store).
                let first = jobs
                    .values()
                    .take_while(|job| job.parked_at_millis.is_none())
                    .map(|job| job.created_at_millis)
                    .min()?;
                (first < committed_before_millis).then_some((first, aggregate))
            })
            .collect();
        oldest.sort();
        Ok(oldest
            .into_iter()
            .take(limit)
            .map(|(_, aggregate)| aggregate.clone())
            .collect())
    }

    async fn remove_sent(&self, jobs: &[JobRef]) -> Result<Vec<bool>, StoreError> {
        let mut state = self.state();
        self.check(&state)?;
        Ok(jobs
            .iter()
            .map(|job| {
                let Some(aggregate) = state.jobs.get_mut(&job.aggregate) else {
                    return false;
                };
                let removed = aggregate.remove(&job.sequence).is_some();
                if aggregate.is_empty() {
                    state.jobs.remove(&job.aggregate);
                }
                removed
            })
            .collect())
    }

    async fn record_failure(
        &self,
        job: &JobRef,
        reason: &str,
        parked_at_millis: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        self.check(&state)?;
        let stored = state
            .jobs
            .get_mut(&job.aggregate)
            .and_then(|jobs| jobs.get_mut(&job.sequence));
        if let Some(stored) = stored {
            stored.attempts += 1;
            stored.last_error = Some(reason.to_owned());
            if parked_at_millis.is_some() {
                stored.parked_at_millis = parked_at_millis;
            }
        }
        Ok(())
    }

    async fn unpark(&self, aggregate: &str) -> Result<usize, StoreError> {
        let mut state = self.state();
        self.check(&state)?;
        let mut count = 0;
        for job in state
            .jobs
            .get_mut(aggregate)
            .into_iter()
            .flat_map(BTreeMap::values_mut)
        {
            if job.parked_at_millis.take().is_some() {
                job.attempts = 0;
                count += 1;
            }
        }
        Ok(count)
    }

    async fn backlog(&self, limit: usize) -> Result<Backlog, StoreError> {
        let pending = self.pending(limit, u64::MAX).await?;
        let state = self.state();
        let all = || state.jobs.values().flat_map(BTreeMap::values);
        let mut parked: Vec<StoredJob> = all()
            .filter(|job| job.parked_at_millis.is_some())
            .cloned()
            .collect();
        parked.sort_by_key(|job| job.created_at_millis);
        parked.truncate(limit);
        Ok(Backlog {
            oldest_pending_millis: all()
                .filter(|job| job.parked_at_millis.is_none())
                .map(|job| job.created_at_millis)
                .min(),
            pending_aggregates: pending,
            parked,
        })
    }

    async fn read_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let state = self.state();
        self.check(&state)?;
        Ok(state.leases.get(name).cloned())
    }

    async fn write_lease(
        &self,
        name: &str,
        expected: Option<&LeaseRecord>,
        lease: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        let mut state = self.state();
        self.check(&state)?;
        if state.leases.get(name) != expected {
            return Ok(false);
        }
        state.leases.insert(name.to_owned(), lease.clone());
        Ok(true)
    }
}
