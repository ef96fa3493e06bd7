//! The idempotency store on the paused clock.
//!
//! # Design note: why a clock adapter
//!
//! The runtimes give the store wall-clock times (`SystemTime::now()` plus a tokio duration: a lease
//! ends when the message's visibility deadline does), and [`MemoryIdempotencyStore`] compares them
//! with `SystemTime::now()`. Under tokio's paused clock, tokio time jumps minutes ahead while the wall
//! clock barely moves, so a claim would never lapse and a dead worker's key would stay locked forever.
//!
//! [`VirtualStore`] keeps the store's records on a *virtual* wall clock that advances with tokio time
//! (far in the future, so the inner store's own comparisons never find anything lapsed): each time
//! coming in is turned into "virtual now + (time − real now)", each time going out the other way.
//! Lapses are decided here, with DynamoDB's condition at virtual now: a record that is free then is
//! marked expired in the inner store just before the claim, so the inner store's atomic claim (and its
//! fencing on tokens) does the rest. Everything runs on one thread with no await between the two steps.
//!
//! A run also makes the virtual wall clock its thread's wall clock ([`VirtualStore::wall_clock`],
//! `conveyor_core::wall_clock`): the times the runtimes compute are then virtual already, the
//! conversions reduce to the consumers' skews, and no real time reaches the run (a seed replays
//! exactly). Without it (a test of the store alone) times are converted from the real wall clock.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use conveyor_core::port::{
    Claim, ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, JobChange, StoreError,
};
use conveyor_core::{JobQuery, JobRecord, Progress};
use conveyor_testing::MemoryIdempotencyStore;
use tokio::time::Instant;

/// Where the virtual wall clock starts: 2100-01-01, far past any real clock the run sees.
const VIRTUAL_EPOCH_SECS: u64 = 4_102_444_800;

/// A [`MemoryIdempotencyStore`] whose leases and expiries follow tokio's (paused) clock.
#[derive(Debug)]
pub struct VirtualStore {
    inner: Arc<MemoryIdempotencyStore>,
    origin: Instant,
    completed: Mutex<HashSet<(String, u64)>>,
}

/// The virtual wall clock at tokio time now, for a run that started at `origin`.
fn virtual_now(origin: Instant) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(VIRTUAL_EPOCH_SECS) + (Instant::now() - origin)
}

fn round_to_millis(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_micros().div_ceil(1000)).unwrap_or(u64::MAX))
}

impl VirtualStore {
    /// Wraps `inner`; virtual time starts now.
    pub fn new(inner: Arc<MemoryIdempotencyStore>) -> Self {
        Self {
            inner,
            origin: Instant::now(),
            completed: Mutex::new(HashSet::new()),
        }
    }

    /// The claims (key, fencing token) completed so far.
    pub fn completed_tokens(&self) -> HashSet<(String, u64)> {
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The virtual wall clock now.
    pub fn now(&self) -> SystemTime {
        virtual_now(self.origin)
    }

    /// The virtual wall clock as a clock the runtimes can read: a run sets it as its thread's wall
    /// clock (`conveyor_core::wall_clock::set_for_thread`), so that every wall-clock time a runtime
    /// computes (a lease's end, a record's expiry, when a batch arrived, the queue's first-receive
    /// timestamps) follows tokio's paused clock and a seed replays exactly. Without it the store turns
    /// the real wall clock's times into virtual ones (to the millisecond), and real time leaks in.
    pub fn wall_clock(&self) -> conveyor_core::runtime::Clock {
        let origin = self.origin;
        Arc::new(move || virtual_now(origin))
    }

    /// A time a caller with clock `skew` sent (computed from its real wall clock) on the virtual clock.
    fn to_virtual(&self, time: SystemTime, skew: Skew) -> SystemTime {
        let real = conveyor_core::wall_clock::now();
        if real == self.now() {
            // The caller's wall clock is this one ([`Self::wall_clock`]): nothing to convert.
            return skew.apply(time);
        }
        let virtual_time = match time.duration_since(real) {
            Ok(ahead) => self.now() + round_to_millis(ahead),
            Err(behind) => self.now() - round_to_millis(behind.duration()),
        };
        skew.apply(virtual_time)
    }

    /// A virtual time as the wall clock of a caller with clock `skew` sees it.
    fn to_caller(&self, time: SystemTime, skew: Skew) -> SystemTime {
        let real = conveyor_core::wall_clock::now();
        if real == self.now() {
            return skew.undo(time);
        }
        let caller_time = match time.duration_since(self.now()) {
            Ok(ahead) => real + ahead,
            Err(behind) => real - behind.duration(),
        };
        skew.undo(caller_time)
    }

    /// The record of `key` as stored (virtual times), without counting a request.
    pub fn current(&self, key: &str) -> Option<IdempotencyRecord> {
        self.inner.records().into_iter().find(|record| record.key == key)
    }
}

/// How far one consumer's clock runs ahead of the true (virtual) clock, in milliseconds; negative:
/// behind.
///
/// A skewed consumer computes every time it sends from its own clock, and compares every time it reads
/// with its own clock: so its times are shifted by the skew on the way in, back on the way out, and the
/// claim condition it sends is evaluated at *its* now (DynamoDB's condition takes the claimant's `:now`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skew(pub i64);

impl Skew {
    /// `time` moved by the skew (ahead: later).
    pub fn apply(self, time: SystemTime) -> SystemTime {
        let by = Duration::from_millis(self.0.unsigned_abs());
        if self.0 >= 0 { time + by } else { time - by }
    }

    /// `time` moved back by the skew.
    pub fn undo(self, time: SystemTime) -> SystemTime {
        Skew(-self.0).apply(time)
    }
}

impl VirtualStore {
    /// A tracked job's change with its times on the virtual clock.
    fn change_as(&self, change: &JobChange, skew: Skew) -> JobChange {
        JobChange {
            at: self.to_virtual(change.at, skew),
            keep_until: change.keep_until.map(|until| self.to_virtual(until, skew)),
            ..change.clone()
        }
    }

    /// The virtual wall clock at the start of the run.
    pub fn started(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(VIRTUAL_EPOCH_SECS)
    }

    /// The job record of `key` as `conveyor jobs show` reads it at virtual time `at` (now or later),
    /// after DynamoDB's TTL removed what had expired by then (the inner store judges at the real
    /// clock, before every virtual time, and never deletes).
    pub async fn job_at(&self, key: &str, at: SystemTime) -> Result<Option<JobRecord>, StoreError> {
        let at = at.max(self.now());
        let Some(record) = self.current(key) else {
            return self.inner.job(key).await;
        };
        if record.expires_at < at {
            return Ok(None);
        }
        let job = self.inner.job(key).await?;
        Ok(job.map(|job| job.seen_with(&record, at)))
    }

    /// [`Self::job_at`] now.
    pub async fn job_now(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        self.job_at(key, self.now()).await
    }

    async fn claim_as(&self, request: &ClaimRequest, skew: Skew) -> Result<ClaimOutcome, StoreError> {
        self.claim_tracked_as(request, None, skew).await
    }

    async fn claim_tracked_as(
        &self,
        request: &ClaimRequest,
        change: Option<&JobChange>,
        skew: Skew,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = skew.apply(self.now());
        if let Some(record) = self.current(&request.key)
            && record.is_free_at(now)
        {
            // Free on the claimant's clock: make the inner store see it so, as expired or as a lapsed
            // lease, whichever it is (an expired record's run count starts again; a lapsed lease's
            // goes on).
            let secs = |time: SystemTime| time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let seen = if secs(record.expires_at) < secs(now) {
                IdempotencyRecord {
                    expires_at: UNIX_EPOCH,
                    ..record.clone()
                }
            } else {
                IdempotencyRecord {
                    lease_until: Some(UNIX_EPOCH),
                    ..record.clone()
                }
            };
            if seen != record {
                self.inner.insert(seen);
            }
        }
        let request = ClaimRequest {
            lease_until: self.to_virtual(request.lease_until, skew),
            expires_at: self.to_virtual(request.expires_at, skew),
            ..request.clone()
        };
        let claimed = match change {
            Some(change) => {
                self.inner
                    .claim_tracked(&request, &self.change_as(change, skew))
                    .await?
            }
            None => self.inner.claim(&request).await?,
        };
        match claimed {
            ClaimOutcome::Acquired(claim) => Ok(ClaimOutcome::Acquired(claim)),
            ClaimOutcome::Exists(record) => Ok(ClaimOutcome::Exists(self.record_as_seen(record, skew))),
        }
    }

    /// A stored record as a caller with clock `skew` reads it.
    fn record_as_seen(&self, mut record: IdempotencyRecord, skew: Skew) -> IdempotencyRecord {
        record.expires_at = self.to_caller(record.expires_at, skew);
        record.lease_until = record.lease_until.map(|lease| self.to_caller(lease, skew));
        record
    }

    async fn complete_as(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: Option<&JobChange>,
        skew: Skew,
    ) -> Result<(), StoreError> {
        let expires_at = self.to_virtual(expires_at, skew);
        match change {
            Some(change) => {
                self.inner
                    .complete_tracked(claim, output, expires_at, &self.change_as(change, skew))
                    .await?;
            }
            None => self.inner.complete(claim, output, expires_at).await?,
        }
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((claim.key.clone(), claim.token));
        Ok(())
    }

    async fn extend_lease_as(
        &self,
        claim: &Claim,
        lease_until: SystemTime,
        skew: Skew,
    ) -> Result<(), StoreError> {
        let lease_until = self.to_virtual(lease_until, skew);
        self.inner.extend_lease(claim, lease_until).await
    }

    async fn get_as(&self, key: &str, skew: Skew) -> Result<Option<IdempotencyRecord>, StoreError> {
        let record = self.inner.get(key).await?;
        Ok(record.map(|record| self.record_as_seen(record, skew)))
    }
}

/// The shared [`VirtualStore`] as a consumer with a skewed clock reaches it.
#[derive(Debug)]
pub struct SkewedStore {
    store: Arc<VirtualStore>,
    skew: Skew,
}

impl SkewedStore {
    /// `store` seen from a clock `skew` off the true one.
    pub fn new(store: Arc<VirtualStore>, skew: Skew) -> Self {
        Self { store, skew }
    }
}

#[async_trait]
impl IdempotencyStore for SkewedStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.store.claim_as(request, self.skew).await
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.store
            .complete_as(claim, output, expires_at, None, self.skew)
            .await
    }

    async fn claim_tracked(
        &self,
        request: &ClaimRequest,
        change: &JobChange,
    ) -> Result<ClaimOutcome, StoreError> {
        self.store
            .claim_tracked_as(request, Some(change), self.skew)
            .await
    }

    async fn complete_tracked(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: &JobChange,
    ) -> Result<(), StoreError> {
        self.store
            .complete_as(claim, output, expires_at, Some(change), self.skew)
            .await
    }

    async fn release_tracked(&self, claim: &Claim, change: &JobChange) -> Result<(), StoreError> {
        let change = self.store.change_as(change, self.skew);
        self.store.inner.release_tracked(claim, &change).await
    }

    async fn record_progress(&self, claim: &Claim, progress: &Progress) -> Result<(), StoreError> {
        self.store.inner.record_progress(claim, progress).await
    }

    async fn job(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        self.store.job_now(key).await
    }

    async fn jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        self.store.inner.jobs(query).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.store.inner.release(claim).await
    }

    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError> {
        self.store.extend_lease_as(claim, lease_until, self.skew).await
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.store.get_as(key, self.skew).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn request(lease: Duration) -> ClaimRequest {
        let now = SystemTime::now();
        ClaimRequest {
            key: "k".to_owned(),
            lease_until: now + lease,
            expires_at: now + Duration::from_secs(24 * 3600),
            validation: None,
            restart_runs: false,
            last_attempt: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_lapses_when_tokio_time_passes_its_lease() {
        let shared = Arc::new(VirtualStore::new(Arc::new(MemoryIdempotencyStore::new())));
        let store = SkewedStore::new(Arc::clone(&shared), Skew::default());
        let ClaimOutcome::Acquired(first) = store.claim(&request(Duration::from_secs(30))).await.unwrap()
        else {
            panic!("a fresh key is free")
        };
        tokio::time::sleep(Duration::from_secs(29)).await;
        let ClaimOutcome::Exists(record) = store.claim(&request(Duration::from_secs(30))).await.unwrap()
        else {
            panic!("the lease still runs")
        };
        let left = record
            .lease_until
            .unwrap()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            left > Duration::from_millis(900) && left <= Duration::from_secs(1),
            "{left:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let ClaimOutcome::Acquired(second) = store.claim(&request(Duration::from_secs(30))).await.unwrap()
        else {
            panic!("the lease lapsed")
        };
        assert_ne!(first.token, second.token);
        assert!(matches!(
            store.release(&first).await,
            Err(StoreError::Fenced { .. })
        ));
        assert_eq!(shared.current("k").unwrap().token, Some(second.token));
    }
}
