//! [`MemoryPayloadStore`]: the large-payload store in memory, with S3's semantics as the conformance
//! suite ([`crate::payload_conformance`]) pins them: buckets exist or not, a missing key is `NotFound`
//! naming bucket and key, deleting a missing key succeeds. An outage can be switched on for tests of the
//! paths that must defer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use conveyor_core::port::{PayloadError, PayloadStore};

/// An in-memory [`PayloadStore`].
#[derive(Debug, Default)]
pub struct MemoryPayloadStore {
    buckets: Mutex<BTreeSet<String>>,
    objects: Mutex<BTreeMap<(String, String), Vec<u8>>>,
    unavailable: AtomicBool,
    requests: PayloadRequests,
}

/// How many calls of each kind a [`MemoryPayloadStore`] answered (outages included).
#[derive(Debug, Default)]
pub struct PayloadRequests {
    /// `put` calls.
    pub puts: AtomicU64,
    /// `get` calls.
    pub gets: AtomicU64,
    /// `delete` calls.
    pub deletes: AtomicU64,
}

impl MemoryPayloadStore {
    /// A store with one bucket, `bucket`.
    pub fn with_bucket(bucket: &str) -> Self {
        let store = Self::default();
        store.create_bucket(bucket);
        store
    }

    /// Creates `bucket` (no-op when it exists).
    pub fn create_bucket(&self, bucket: &str) {
        lock(&self.buckets).insert(bucket.to_owned());
    }

    /// Makes every call fail with [`PayloadError::Unavailable`] (an outage) until switched off.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Stores `body` at `bucket`/`key` directly (no request counted; the bucket is created).
    pub fn put_now(&self, bucket: &str, key: &str, body: &str) {
        self.create_bucket(bucket);
        lock(&self.objects).insert((bucket.to_owned(), key.to_owned()), body.as_bytes().to_vec());
    }

    /// The object at `bucket`/`key`, if any.
    pub fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        lock(&self.objects)
            .get(&(bucket.to_owned(), key.to_owned()))
            .cloned()
    }

    /// How many objects `bucket` holds.
    pub fn len(&self, bucket: &str) -> usize {
        lock(&self.objects)
            .keys()
            .filter(|(name, _)| name == bucket)
            .count()
    }

    /// True when `bucket` holds no object.
    pub fn is_empty(&self, bucket: &str) -> bool {
        self.len(bucket) == 0
    }

    /// The calls answered so far.
    pub fn requests(&self) -> &PayloadRequests {
        &self.requests
    }

    fn check(&self, bucket: &str) -> Result<(), PayloadError> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(PayloadError::Unavailable {
                message: "memory payload store switched to unavailable".to_owned(),
            });
        }
        if !lock(&self.buckets).contains(bucket) {
            return Err(PayloadError::Misconfigured {
                message: format!("bucket {bucket} does not exist"),
            });
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl PayloadStore for MemoryPayloadStore {
    async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PayloadError> {
        self.requests.puts.fetch_add(1, Ordering::Relaxed);
        self.check(bucket)?;
        lock(&self.objects).insert((bucket.to_owned(), key.to_owned()), body);
        Ok(())
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, PayloadError> {
        self.requests.gets.fetch_add(1, Ordering::Relaxed);
        self.check(bucket)?;
        self.object(bucket, key).ok_or_else(|| PayloadError::NotFound {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), PayloadError> {
        self.requests.deletes.fetch_add(1, Ordering::Relaxed);
        self.check(bucket)?;
        lock(&self.objects).remove(&(bucket.to_owned(), key.to_owned()));
        Ok(())
    }
}
