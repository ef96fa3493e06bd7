//! A bounded in-process cache of COMPLETED records, so duplicates this process has seen completed are
//! answered without a request.
//!
//! # Design note: why this is safe
//!
//! A completed record is final until it expires: no claim can overwrite it before `expires_at` (the
//! claim condition only frees absent, expired, or in-progress-and-lapsed records). So a cached completed
//! record gives the same answer the table would, as long as the cache checks the expiry itself. The
//! one thing it cannot see is someone deleting the record by hand; disable the cache if you do that.
//! In-progress records are never cached: they change at any moment.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use conveyor_core::port::{IdempotencyRecord, RecordStatus};

/// Completed records by key, evicted oldest-first when full.
#[derive(Debug)]
pub(crate) struct CompletedCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// key -> (insertion number, record)
    records: HashMap<String, (u64, IdempotencyRecord)>,
    /// Insertion order; entries whose number no longer matches `records` are stale and skipped.
    order: VecDeque<(u64, String)>,
    next: u64,
}

impl CompletedCache {
    /// A cache holding up to `capacity` records; `None` for zero.
    pub(crate) fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The record for `key` if it is cached and has not expired at `now`.
    pub(crate) fn get(&self, key: &str, now: SystemTime) -> Option<IdempotencyRecord> {
        let mut inner = self.lock();
        let (_, record) = inner.records.get(key)?;
        if record.expires_at > now {
            return Some(record.clone());
        }
        inner.records.remove(key);
        None
    }

    /// Remembers a completed record; anything else is ignored.
    pub(crate) fn insert(&self, record: &IdempotencyRecord) {
        if record.status != RecordStatus::Completed {
            return;
        }
        let mut inner = self.lock();
        let number = inner.next;
        inner.next += 1;
        inner.records.insert(record.key.clone(), (number, record.clone()));
        inner.order.push_back((number, record.key.clone()));
        while inner.records.len() > self.capacity {
            let Some((number, key)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .records
                .get(&key)
                .is_some_and(|(current, _)| *current == number)
            {
                inner.records.remove(&key);
            }
        }
        if inner.order.len() > 2 * self.capacity {
            let Inner { records, order, .. } = &mut *inner;
            order.retain(|(number, key)| records.get(key).is_some_and(|(current, _)| current == number));
        }
    }

    /// Forgets `key`.
    pub(crate) fn remove(&self, key: &str) {
        self.lock().records.remove(key);
    }

    /// How many records are cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().records.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that matters
        // (worst case a stale order entry), so a poisoned lock is used as is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(key: &str, status: RecordStatus, expires_in: Duration) -> IdempotencyRecord {
        IdempotencyRecord {
            key: key.into(),
            status,
            expires_at: SystemTime::now() + expires_in,
            lease_until: None,
            output: Some("{}".into()),
            validation: None,
            token: None,
            last_attempt: false,
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn zero_capacity_is_no_cache() {
        assert!(CompletedCache::new(0).is_none());
    }

    #[test]
    fn only_completed_records_are_kept() {
        let cache = CompletedCache::new(4).unwrap();
        cache.insert(&record("a", RecordStatus::InProgress, HOUR));
        assert_eq!(cache.get("a", SystemTime::now()), None);
        let done = record("a", RecordStatus::Completed, HOUR);
        cache.insert(&done);
        assert_eq!(cache.get("a", SystemTime::now()), Some(done));
    }

    #[test]
    fn expired_records_are_not_answered() {
        let cache = CompletedCache::new(4).unwrap();
        cache.insert(&record("a", RecordStatus::Completed, Duration::from_secs(10)));
        assert!(cache.get("a", SystemTime::now()).is_some());
        assert_eq!(cache.get("a", SystemTime::now() + Duration::from_secs(11)), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_oldest_record_is_evicted_when_full() {
        let cache = CompletedCache::new(2).unwrap();
        for key in ["a", "b", "a", "c"] {
            cache.insert(&record(key, RecordStatus::Completed, HOUR));
        }
        // "a" was re-inserted after "b", so "b" is the oldest live entry.
        let now = SystemTime::now();
        assert!(cache.get("a", now).is_some());
        assert!(cache.get("b", now).is_none());
        assert!(cache.get("c", now).is_some());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn the_order_queue_stays_bounded() {
        let cache = CompletedCache::new(3).unwrap();
        for round in 0..1000 {
            cache.insert(&record(&format!("k{}", round % 2), RecordStatus::Completed, HOUR));
        }
        assert!(cache.lock().order.len() <= 6);
        assert_eq!(cache.len(), 2);
    }
}
