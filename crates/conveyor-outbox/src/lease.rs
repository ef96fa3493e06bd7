//! The polling relay's lease: one relay of a store sends at a time, and a relay whose lease was taken
//! over stops sending.
//!
//! # Design note: a lease judged on one clock
//!
//! The stored record holds an owner, an epoch (raised by every takeover) and a version (raised by every
//! renewal). No wall clock is compared across machines:
//! - The holder renews every third of the lease with a write conditional on the record it last wrote.
//!   Its own deadline is the instant *before* it sent the renewal that succeeded, plus the lease, less a
//!   third of it, on its monotonic clock.
//! - A taker that finds another owner notes the record and the instant it read it, and takes over only
//!   when, a whole lease later on its own monotonic clock, the record is still exactly that one (a
//!   conditional write on it, raising the epoch). Since the holder's last successful renewal was sent
//!   before the taker's read, the holder's deadline passed before the takeover.
//! - The relay checks [`Lease::holds`] before every send round ([`crate::Fence`]). A holder paused between
//!   that check and its send can still send once late; the relay's conditional removals make that a
//!   duplicate of an accepted job, never a job out of order (`relay.rs`).
//! - A released lease (owner empty) is taken at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::relay::Fence;
use crate::store::{LeaseRecord, OutboxStore, StoreError};

/// A relay's hold on a named lease in its store.
#[derive(Debug)]
pub struct Lease {
    store: Arc<dyn OutboxStore>,
    name: String,
    owner: String,
    length: Duration,
    /// The record this relay wrote last while holding it.
    held: Option<LeaseRecord>,
    /// Another owner's record and when this relay first saw it unchanged.
    observed: Option<(LeaseRecord, Instant)>,
    /// The holder's deadline, milliseconds after `origin` (0: not held), shared with the fence.
    deadline: Arc<AtomicU64>,
    origin: Instant,
}

/// The fence of a [`Lease`]: holds until the lease's deadline on this relay's monotonic clock.
#[derive(Debug, Clone)]
pub struct LeaseFence {
    deadline: Arc<AtomicU64>,
    origin: Instant,
}

impl Fence for LeaseFence {
    fn holds(&self) -> bool {
        let deadline = self.deadline.load(Ordering::Acquire);
        deadline > 0 && millis_since(self.origin) < deadline
    }
}

fn millis_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Lease {
    /// The lease `name` in `store` for a relay calling itself `owner` (unique per process), lasting
    /// `length` without renewal.
    pub fn new(store: Arc<dyn OutboxStore>, name: &str, owner: &str, length: Duration) -> Self {
        Self {
            store,
            name: name.to_owned(),
            owner: owner.to_owned(),
            length,
            held: None,
            observed: None,
            deadline: Arc::default(),
            // One millisecond back, so a deadline is never 0.
            origin: Instant::now()
                .checked_sub(Duration::from_millis(1))
                .unwrap_or_else(Instant::now),
        }
    }

    /// The fence to give the relay.
    pub fn fence(&self) -> LeaseFence {
        LeaseFence {
            deadline: Arc::clone(&self.deadline),
            origin: self.origin,
        }
    }

    /// The lease's epoch while held.
    pub fn epoch(&self) -> Option<u64> {
        self.held.as_ref().map(|held| held.epoch)
    }

    /// How often to call [`Lease::acquire`]: a third of the lease.
    pub fn renew_every(&self) -> Duration {
        self.length / 3
    }

    /// Takes or renews the lease; true while this relay holds it.
    pub async fn acquire(&mut self) -> Result<bool, StoreError> {
        let started = millis_since(self.origin);
        if let Some(held) = self.held.clone() {
            let renewed = LeaseRecord {
                version: held.version + 1,
                ..held.clone()
            };
            return self.write(Some(&held), renewed, started).await;
        }
        let current = self.store.read_lease(&self.name).await?;
        let Some(current) = current else {
            let first = LeaseRecord {
                owner: self.owner.clone(),
                epoch: 1,
                version: 0,
            };
            return self.write(None, first, started).await;
        };
        let taken = LeaseRecord {
            owner: self.owner.clone(),
            epoch: current.epoch + 1,
            version: 0,
        };
        if current.owner.is_empty() {
            return self.write(Some(&current), taken, started).await;
        }
        match &self.observed {
            Some((seen, since)) if *seen == current && since.elapsed() >= self.length => {
                tracing::warn!(
                    lease = %self.name,
                    previous_owner = %current.owner,
                    epoch = taken.epoch,
                    "outbox relay lease unchanged for a whole lease: taking it over"
                );
                self.write(Some(&current), taken, started).await
            }
            Some((seen, _)) if *seen == current => Ok(false),
            _ => {
                self.observed = Some((current, Instant::now()));
                Ok(false)
            }
        }
    }

    async fn write(
        &mut self,
        expected: Option<&LeaseRecord>,
        record: LeaseRecord,
        started: u64,
    ) -> Result<bool, StoreError> {
        let written = self.store.write_lease(&self.name, expected, &record).await;
        match written {
            Ok(true) => {
                let length = u64::try_from(self.length.as_millis()).unwrap_or(u64::MAX);
                let deadline = started.saturating_add(length - length / 3).max(1);
                self.deadline.store(deadline, Ordering::Release);
                self.held = Some(record);
                self.observed = None;
                Ok(true)
            }
            Ok(false) => {
                self.lose();
                Ok(false)
            }
            Err(error) => {
                // Not renewed: the deadline stands and runs out by itself.
                Err(error)
            }
        }
    }

    fn lose(&mut self) {
        if self.held.take().is_some() {
            tracing::warn!(lease = %self.name, "outbox relay lease lost to another relay: this relay stops sending");
        }
        self.deadline.store(0, Ordering::Release);
    }

    /// Gives the lease up (when held), so a standby relay takes over at once.
    pub async fn release(&mut self) -> Result<(), StoreError> {
        let Some(held) = self.held.clone() else {
            return Ok(());
        };
        self.deadline.store(0, Ordering::Release);
        let released = LeaseRecord {
            owner: String::new(),
            epoch: held.epoch,
            version: held.version + 1,
        };
        self.store.write_lease(&self.name, Some(&held), &released).await?;
        self.held = None;
        Ok(())
    }
}
