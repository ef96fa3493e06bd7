//! `MemoryIdempotencyStore`: an in-memory [`IdempotencyStore`] with DynamoDB's conditions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use conveyor_core::limits::MAX_ITEM_BYTES;
use conveyor_core::port::{EXPIRY_PAST_LEASE, next_token};
use conveyor_core::{
    port::{
        Claim, ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, JobChange, RecordStatus,
        StoreError,
    },
    {JobQuery, JobRecord, JobStatus, Progress},
};

/// Store calls made so far, one per DynamoDB request the real store would make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreRequests {
    /// `claim` calls (a conditional `UpdateItem`).
    pub claim: u64,
    /// `complete` calls (a conditional `UpdateItem`).
    pub complete: u64,
    /// `release` calls (a conditional `UpdateItem`).
    pub release: u64,
    /// `extend_lease` calls (a conditional `UpdateItem`).
    pub extend_lease: u64,
    /// `get` calls (`GetItem`).
    pub get: u64,
    /// `record_progress` calls (a conditional `UpdateItem`).
    pub progress: u64,
    /// `mark_sent` calls (a conditional `UpdateItem`).
    pub sent: u64,
}

impl StoreRequests {
    /// All calls.
    pub fn total(&self) -> u64 {
        self.claim + self.complete + self.release + self.extend_lease + self.get + self.progress + self.sent
    }
}

#[derive(Debug, Default)]
struct Counters {
    claim: AtomicU64,
    complete: AtomicU64,
    release: AtomicU64,
    extend_lease: AtomicU64,
    get: AtomicU64,
    progress: AtomicU64,
    sent: AtomicU64,
}

/// An in-memory idempotency store that keeps the DynamoDB store's conditions exactly.
///
/// - A key is free when its record is absent, when its `expiration` (epoch seconds) is before now, or
///   when it is in progress with an `in_progress_expiration` (epoch milliseconds) before now, compared
///   with `SystemTime::now()` at the call, at the same granularity DynamoDB stores (so records read back
///   carry times truncated to seconds and milliseconds, as they would from the table).
/// - A claim's fencing token is the replaced record's + 1, or the clock's epoch milliseconds + 1 on a
///   fresh record (`conveyor_core::port::next_token`), as the DynamoDB store's update computes it.
/// - `complete`, `release` and `extend_lease` are fenced on the claim's token; `extend_lease` also
///   requires the record to be in progress (a completed record's lease is never moved).
/// - [`MemoryIdempotencyStore::set_unavailable`] makes every call fail with
///   [`StoreError::Unavailable`]; [`MemoryIdempotencyStore::set_misconfigured`] with
///   [`StoreError::Misconfigured`] (as a table that does not exist answers); [`MemoryIdempotencyStore::with_max_output_bytes`] makes large outputs
///   fail with [`StoreError::OutputTooLarge`] (default: DynamoDB's 400 KB item limit).
#[derive(Debug)]
pub struct MemoryIdempotencyStore {
    records: Mutex<HashMap<String, IdempotencyRecord>>,
    /// Each key's run count ([`Claim::run`]); always locked after `records`, as the claim's one write.
    runs: Mutex<HashMap<String, u32>>,
    /// Tracked jobs' records, by key; always locked after `records` (claims update both at once).
    jobs: Mutex<HashMap<String, JobRecord>>,
    unavailable: AtomicBool,
    misconfigured: AtomicBool,
    max_output_bytes: usize,
    counters: Counters,
}

impl Default for MemoryIdempotencyStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryIdempotencyStore {
    /// An empty, available store.
    pub fn new() -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            jobs: Mutex::new(HashMap::new()),
            unavailable: AtomicBool::new(false),
            misconfigured: AtomicBool::new(false),
            max_output_bytes: MAX_ITEM_BYTES,
            counters: Counters::default(),
        }
    }

    /// Refuses outputs longer than `limit` bytes with [`StoreError::OutputTooLarge`].
    pub fn with_max_output_bytes(mut self, limit: usize) -> Self {
        self.max_output_bytes = limit;
        self
    }

    /// Makes every call fail with [`StoreError::Unavailable`] (or work again).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Makes every call fail with [`StoreError::Misconfigured`] (or work again): a table that does not
    /// exist, or access denied.
    pub fn set_misconfigured(&self, misconfigured: bool) {
        self.misconfigured.store(misconfigured, Ordering::SeqCst);
    }

    /// Writes a record as is (a Powertools record, a claim held "elsewhere", an old completed record).
    pub fn insert(&self, record: IdempotencyRecord) {
        let record = stored(record);
        self.lock().insert(record.key.clone(), record);
    }

    /// Every record, expired or not, sorted by key.
    pub fn records(&self) -> Vec<IdempotencyRecord> {
        let mut records: Vec<IdempotencyRecord> = self.lock().values().cloned().collect();
        records.sort_by(|a, b| a.key.cmp(&b.key));
        records
    }

    /// The calls made so far.
    pub fn requests(&self) -> StoreRequests {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StoreRequests {
            claim: load(&self.counters.claim),
            complete: load(&self.counters.complete),
            release: load(&self.counters.release),
            extend_lease: load(&self.counters.extend_lease),
            get: load(&self.counters.get),
            progress: load(&self.counters.progress),
            sent: load(&self.counters.sent),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, IdempotencyRecord>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn jobs(&self) -> MutexGuard<'_, HashMap<String, JobRecord>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to the job record of `key`, creating it when absent.
    fn track(&self, key: &str, change: &JobChange) {
        self.jobs()
            .entry(key.to_owned())
            .and_modify(|job| job.apply(change))
            .or_insert_with(|| JobRecord::first(key, change));
    }

    /// The job record as the table would give it back: with the idempotency record's output and token,
    /// as the record says it is now (`JobRecord::seen_with`: a run SQS's redrive took is dead-lettered).
    fn job_view(&self, job: &JobRecord) -> JobRecord {
        let mut job = job.clone();
        if let Some(record) = self.lock().get(&job.key) {
            job.output = record
                .output
                .clone()
                .filter(|_| job.status == JobStatus::Succeeded);
            job.token = record.token;
            job = job.seen_with(record, SystemTime::now());
        }
        job
    }

    fn check_available(&self, counter: &AtomicU64) -> Result<(), StoreError> {
        counter.fetch_add(1, Ordering::Relaxed);
        if self.misconfigured.load(Ordering::SeqCst) {
            return Err(StoreError::Misconfigured {
                message: "memory idempotency store is set misconfigured (as a table that does not exist): \
                          point the consumer at the right table"
                    .to_owned(),
            });
        }
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                message: "memory idempotency store is set unavailable".to_owned(),
            });
        }
        Ok(())
    }

    /// Runs `change` on the claim's record if it still carries the claim's token (and, when
    /// `in_progress_only`, is still in progress: the DynamoDB store's extend condition).
    fn fenced(
        &self,
        claim: &Claim,
        in_progress_only: bool,
        change: impl FnOnce(&mut HashMap<String, IdempotencyRecord>),
    ) -> Result<(), StoreError> {
        self.fenced_tracked(claim, in_progress_only, change, None)
    }

    /// [`Self::fenced`], also applying a tracked job's change in the same step.
    fn fenced_tracked(
        &self,
        claim: &Claim,
        in_progress_only: bool,
        change: impl FnOnce(&mut HashMap<String, IdempotencyRecord>),
        job_change: Option<&JobChange>,
    ) -> Result<(), StoreError> {
        let mut records = self.lock();
        let held = records.get(&claim.key).is_some_and(|record| {
            record.token == Some(claim.token)
                && (!in_progress_only || record.status == RecordStatus::InProgress)
        });
        if !held {
            return Err(StoreError::Fenced {
                key: claim.key.clone(),
            });
        }
        change(&mut records);
        if let Some(job_change) = job_change {
            self.track(&claim.key, job_change);
        }
        Ok(())
    }

    /// The claim, with a tracked job's change applied in the same step when acquired.
    fn claim_with(&self, request: &ClaimRequest, job_change: Option<&JobChange>) -> ClaimOutcome {
        let now = SystemTime::now();
        let mut records = self.lock();
        if let Some(record) = records.get(&request.key)
            && !record.is_free_at(now)
        {
            return ClaimOutcome::Exists(record.clone());
        }
        // DynamoDB's `if_not_exists(fence, :now_ms) + 1` in the same conditional write; the run count
        // starts again on a record that was absent or expired.
        let previous = records.get(&request.key);
        // On the thread's wall clock (a simulation's virtual one), so that tokens replay with their seed.
        let token = next_token(
            previous.and_then(|record| record.token),
            conveyor_core::wall_clock::now(),
        );
        let fresh = request.restart_runs
            || previous.is_none_or(|record| epoch_secs(record.expires_at) < epoch_secs(now));
        let run = {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            let count = runs.entry(request.key.clone()).or_insert(0);
            *count = if fresh { 1 } else { count.saturating_add(1) };
            *count
        };
        let record = stored(IdempotencyRecord::in_progress(request, token));
        records.insert(request.key.clone(), record);
        if let Some(job_change) = job_change {
            self.track(&request.key, job_change);
        }
        ClaimOutcome::Acquired(Claim {
            key: request.key.clone(),
            token,
            run,
        })
    }

    fn complete_with(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        job_change: Option<&JobChange>,
    ) -> Result<(), StoreError> {
        self.check_available(&self.counters.complete)?;
        if let Some(output) = output
            && output.len() > self.max_output_bytes
        {
            return Err(StoreError::OutputTooLarge {
                key: claim.key.clone(),
                size: output.len(),
                limit: self.max_output_bytes,
            });
        }
        let complete = |records: &mut HashMap<String, IdempotencyRecord>| {
            if let Some(record) = records.get_mut(&claim.key) {
                record.status = RecordStatus::Completed;
                record.output = output.map(str::to_owned);
                record.expires_at = truncate_secs(expires_at);
            }
        };
        self.fenced_tracked(claim, false, complete, job_change)
    }

    fn release_with(&self, claim: &Claim, job_change: Option<&JobChange>) -> Result<(), StoreError> {
        self.check_available(&self.counters.release)?;
        let release = |records: &mut HashMap<String, IdempotencyRecord>| {
            if let Some(record) = records.get_mut(&claim.key) {
                record.lease_until = Some(UNIX_EPOCH);
                record.token = Some(claim.token.saturating_add(1));
                if let Some(until) = job_change.and_then(|change| change.keep_until) {
                    record.expires_at = truncate_secs(until);
                }
            }
            if let Some(runs) = job_change.and_then(|change| change.spend_runs) {
                self.runs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(claim.key.clone(), runs);
            }
        };
        self.fenced_tracked(claim, false, release, job_change)
    }
}

fn epoch_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn epoch_millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis())
}

fn truncate_secs(time: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(epoch_secs(time))
}

fn truncate_millis(time: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(epoch_millis(time)).unwrap_or(u64::MAX))
}

/// The record as DynamoDB would hold it: `expiration` in seconds, `in_progress_expiration` in ms.
fn stored(mut record: IdempotencyRecord) -> IdempotencyRecord {
    record.expires_at = truncate_secs(record.expires_at);
    record.lease_until = record.lease_until.map(truncate_millis);
    record
}

#[async_trait]
impl IdempotencyStore for MemoryIdempotencyStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.check_available(&self.counters.claim)?;
        Ok(self.claim_with(request, None))
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.complete_with(claim, output, expires_at, None)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.release_with(claim, None)
    }

    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError> {
        self.check_available(&self.counters.extend_lease)?;
        self.fenced(claim, true, |records| {
            if let Some(record) = records.get_mut(&claim.key) {
                record.lease_until = Some(truncate_millis(lease_until));
                let past_lease = truncate_secs(lease_until + EXPIRY_PAST_LEASE);
                // A tracked record keeps its claim's expiry (its status retention), as DynamoDB's
                // `if_not_exists(job_keep_until, ...)` does.
                record.expires_at = if self.jobs().contains_key(&claim.key) {
                    record.expires_at.max(past_lease)
                } else {
                    past_lease
                };
            }
        })
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.check_available(&self.counters.get)?;
        Ok(self.lock().get(key).cloned())
    }

    async fn claim_tracked(
        &self,
        request: &ClaimRequest,
        change: &JobChange,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check_available(&self.counters.claim)?;
        Ok(self.claim_with(request, Some(change)))
    }

    async fn complete_tracked(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: &JobChange,
    ) -> Result<(), StoreError> {
        self.complete_with(claim, output, expires_at, Some(change))
    }

    async fn release_tracked(&self, claim: &Claim, change: &JobChange) -> Result<(), StoreError> {
        self.release_with(claim, Some(change))
    }

    async fn record_progress(&self, claim: &Claim, progress: &Progress) -> Result<(), StoreError> {
        self.check_available(&self.counters.progress)?;
        self.fenced(claim, true, |_| {
            if let Some(job) = self.jobs().get_mut(&claim.key) {
                job.progress = Some(progress.clone());
            }
        })
    }

    async fn mark_sent(&self, key: &str, change: &JobChange) -> Result<(), StoreError> {
        self.check_available(&self.counters.sent)?;
        let records = self.lock();
        let mut jobs = self.jobs();
        if records.contains_key(key) || jobs.contains_key(key) {
            return Ok(());
        }
        jobs.insert(key.to_owned(), JobRecord::first(key, change));
        Ok(())
    }

    async fn job(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        self.check_available(&self.counters.get)?;
        let job = self.jobs().get(key).cloned();
        Ok(job.map(|job| self.job_view(&job)))
    }

    async fn jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        self.check_available(&self.counters.get)?;
        let of_type: Vec<JobRecord> = self
            .jobs()
            .values()
            .filter(|job| job.job_type == query.job_type)
            .cloned()
            .collect();
        let mut found: Vec<JobRecord> = of_type
            .iter()
            .map(|job| self.job_view(job))
            .filter(|job| query.status.is_none_or(|status| job.status == status))
            .collect();
        conveyor_core::port::newest_first(&mut found, query.limit);
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &str, lease: Duration) -> ClaimRequest {
        let now = SystemTime::now();
        ClaimRequest {
            key: key.to_owned(),
            lease_until: now + lease,
            expires_at: now + Duration::from_secs(3600),
            validation: None,
            restart_runs: false,
            last_attempt: false,
        }
    }

    #[tokio::test]
    async fn times_are_stored_at_dynamodb_granularity() {
        let store = MemoryIdempotencyStore::new();
        let ClaimOutcome::Acquired(_) = store.claim(&request("k", Duration::from_secs(60))).await.unwrap()
        else {
            panic!("expected to acquire a fresh key")
        };
        let record = store.get("k").await.unwrap().unwrap();
        assert_eq!(
            record
                .expires_at
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
            0
        );
        let lease = record.lease_until.unwrap().duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(lease.subsec_nanos() % 1_000_000, 0);
    }

    #[tokio::test]
    async fn in_progress_without_a_lease_is_held_until_expiry() {
        let store = MemoryIdempotencyStore::new();
        store.insert(IdempotencyRecord {
            key: "powertools".to_owned(),
            status: RecordStatus::InProgress,
            expires_at: SystemTime::now() + Duration::from_secs(3600),
            lease_until: None,
            output: None,
            validation: None,
            token: None,
            last_attempt: false,
        });
        let outcome = store
            .claim(&request("powertools", Duration::from_secs(1)))
            .await
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Exists(_)));
    }

    #[tokio::test]
    async fn large_outputs_are_refused_and_unavailable_fails_every_call() {
        let store = MemoryIdempotencyStore::new().with_max_output_bytes(4);
        let ClaimOutcome::Acquired(claim) =
            store.claim(&request("k", Duration::from_secs(60))).await.unwrap()
        else {
            panic!("expected to acquire a fresh key")
        };
        let far = SystemTime::now() + Duration::from_secs(60);
        let error = store.complete(&claim, Some("\"12345\""), far).await.unwrap_err();
        assert!(matches!(
            error,
            StoreError::OutputTooLarge {
                size: 7,
                limit: 4,
                ..
            }
        ));
        store.set_unavailable(true);
        assert!(matches!(
            store.get("k").await,
            Err(StoreError::Unavailable { .. })
        ));
        assert!(matches!(
            store.release(&claim).await,
            Err(StoreError::Unavailable { .. })
        ));
        store.set_unavailable(false);
        store.release(&claim).await.unwrap();
        assert_eq!(store.requests().release, 2);
    }
}
