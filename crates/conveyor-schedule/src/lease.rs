//! [`Lease`]: one leader per schedule set; the others only watch the record.
//!
//! # Design note: a lease judged on one clock
//!
//! The ideas of `conveyor-outbox`'s relay lease, on the schedule store (this crate does not depend on
//! the outbox: its lease is written against `OutboxStore`, a port with a dozen methods about outbox
//! jobs, and a scheduler has no business with it). The record holds an owner, an epoch (raised by every
//! takeover) and a version (raised by every renewal). No wall clock is compared across machines:
//! - The holder renews every third of the lease with a write conditional on the record it wrote last.
//!   Its deadline is the instant *before* it sent the renewal that succeeded, plus two thirds of the
//!   lease, on its own monotonic clock.
//! - A taker that finds another owner notes the record and the instant it read it, and takes over only
//!   when a whole lease later (its monotonic clock) the record is still exactly that one, by a write
//!   conditional on it that raises the epoch. The holder's last successful renewal was sent before the
//!   taker's read, so the holder's deadline passed before the takeover.
//! - The leader checks [`Lease::holds`] before every send. A leader stalled between that check and the
//!   send can still send once late: the tick's idempotency key makes that send a duplicate the consumer
//!   acknowledges without running, and the conditional cursor refuses its late write.
//! - A released lease (owner empty) is taken at once (a worker that drains releases it).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{LeaseRecord, ScheduleStore, StoreError};

/// A scheduler's hold on its schedule set's lease.
#[derive(Debug)]
pub(crate) struct Lease {
    store: Arc<dyn ScheduleStore>,
    set: String,
    owner: String,
    length: Duration,
    /// The record this scheduler wrote last while holding it.
    held: Option<LeaseRecord>,
    /// Another owner's record and when this scheduler first saw it unchanged.
    observed: Option<(LeaseRecord, Instant)>,
    /// The holder's deadline on this process's monotonic clock.
    deadline: Option<Instant>,
}

impl Lease {
    pub(crate) fn new(store: Arc<dyn ScheduleStore>, set: &str, owner: &str, length: Duration) -> Self {
        Self {
            store,
            set: set.to_owned(),
            owner: owner.to_owned(),
            length,
            held: None,
            observed: None,
            deadline: None,
        }
    }

    /// True while this scheduler may act as the leader.
    pub(crate) fn holds(&self) -> bool {
        self.deadline.is_some_and(|deadline| Instant::now() < deadline)
    }

    /// The epoch while held.
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.held.as_ref().map(|held| held.epoch)
    }

    /// How often to call [`Lease::acquire`].
    pub(crate) fn renew_every(&self) -> Duration {
        self.length / 3
    }

    /// Takes or renews the lease; true while this scheduler holds it.
    pub(crate) async fn acquire(&mut self) -> Result<bool, StoreError> {
        let started = Instant::now();
        if let Some(held) = self.held.clone() {
            let renewed = LeaseRecord {
                version: held.version + 1,
                ..held.clone()
            };
            return self.write(Some(&held), renewed, started).await;
        }
        let Some(current) = self.store.read_lease(&self.set).await? else {
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
                tracing::warn!(set = %self.set, previous_owner = %current.owner, epoch = taken.epoch, "schedule leader lease unchanged for a whole lease: taking it over");
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
        started: Instant,
    ) -> Result<bool, StoreError> {
        match self.store.write_lease(&self.set, expected, &record).await {
            Ok(true) => {
                if self.held.is_none() {
                    tracing::info!(set = %self.set, owner = %self.owner, epoch = record.epoch, "schedule leader");
                }
                self.deadline = Some(started + (self.length - self.length / 3));
                self.held = Some(record);
                self.observed = None;
                Ok(true)
            }
            Ok(false) => {
                if self.held.take().is_some() {
                    tracing::warn!(set = %self.set, "schedule leader lease lost to another scheduler: no more sends");
                }
                self.deadline = None;
                Ok(false)
            }
            // Not renewed: the deadline stands and runs out by itself.
            Err(error) => Err(error),
        }
    }

    /// Gives the lease up (when held), so a follower takes over at once.
    pub(crate) async fn release(&mut self) -> Result<(), StoreError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        self.deadline = None;
        let released = LeaseRecord {
            owner: String::new(),
            epoch: held.epoch,
            version: held.version + 1,
        };
        self.store.write_lease(&self.set, Some(&held), &released).await?;
        Ok(())
    }
}
