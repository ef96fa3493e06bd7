//! Sending parked jobs again after the cause is fixed: one aggregate, every aggregate parked on one
//! queue, or all of them (`conveyor outbox resend`).
//!
//! A parked job's aggregate waits behind it; unparking resets its attempts and the relay sends the
//! aggregate's jobs again from that job on, in order. Many aggregates park together when a queue is
//! deleted or its policy broken: `--queue` unparks them all in one command.

use std::collections::HashSet;

use crate::store::{OutboxStore, StoreError, StoredJob};

/// Parked jobs read per round (oldest first). Each round unparks what it found; a round that finds
/// nothing new to unpark ends the resend.
const PAGE: usize = 1_000;

/// Which parked aggregates [`resend`] unparks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Parked {
    /// One aggregate, by name.
    Aggregate(String),
    /// Every aggregate whose parked job is for this queue: its URL, or its name (the URL's last part).
    Queue(String),
    /// Every parked aggregate.
    All,
}

impl Parked {
    fn matches(&self, job: &StoredJob) -> bool {
        match self {
            Self::Aggregate(aggregate) => job.aggregate == *aggregate,
            Self::Queue(queue) => {
                job.queue_url == *queue || job.queue_url.rsplit('/').next() == Some(queue.as_str())
            }
            Self::All => true,
        }
    }
}

/// What [`resend`] unparked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resent {
    /// Aggregates unparked, in the order their parked jobs were parked.
    pub aggregates: Vec<String>,
    /// Jobs unparked.
    pub jobs: usize,
}

/// Unparks the aggregates `which` names, so the relay sends their jobs again, each aggregate in order.
/// It reads the parked jobs a thousand at a time, oldest first, until a page has none left to unpark
/// that matches; a thousand older parked jobs of other queues hide the rest from `Parked::Queue`
/// (unpark those first, or use `Parked::All`).
pub async fn resend(store: &dyn OutboxStore, which: &Parked) -> Result<Resent, StoreError> {
    if let Parked::Aggregate(aggregate) = which {
        let jobs = store.unpark(aggregate).await?;
        let aggregates = if jobs > 0 {
            vec![aggregate.clone()]
        } else {
            Vec::new()
        };
        return Ok(Resent { aggregates, jobs });
    }
    let mut resent = Resent::default();
    let mut done: HashSet<String> = HashSet::new();
    loop {
        let parked = store.backlog(PAGE).await?.parked;
        let due: Vec<String> = parked
            .iter()
            .filter(|job| which.matches(job) && !done.contains(&job.aggregate))
            .map(|job| job.aggregate.clone())
            .collect();
        if due.is_empty() {
            return Ok(resent);
        }
        for aggregate in due {
            if !done.insert(aggregate.clone()) {
                continue;
            }
            resent.jobs += store.unpark(&aggregate).await?;
            resent.aggregates.push(aggregate);
        }
    }
}
