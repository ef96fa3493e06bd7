//! The one task that gathers buffered jobs into batches and starts their calls.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BatchingConfig, Entry, Shared, send};

/// Gathers and dispatches until the buffer is closed (shutdown, or every handle dropped) and empty,
/// then waits for the calls in flight and says so through `shared.finished`.
pub(super) async fn run(shared: Arc<Shared>, receiver: mpsc::Receiver<Entry>, config: BatchingConfig) {
    let mut inbox = Inbox {
        receiver,
        stop: shared.stop.clone(),
        closed: false,
    };
    let mut calls = JoinSet::new();
    let mut carried: Option<Entry> = None;
    loop {
        let first = match carried.take() {
            Some(entry) => entry,
            None => match inbox.next(None).await {
                Some(entry) => entry,
                None => break,
            },
        };
        let until = Instant::now() + config.linger;
        let mut batch = Batch::new(first);
        while batch.entries.len() < config.max_entries {
            let Some(entry) = inbox.next(Some(until)).await else {
                break;
            };
            if batch.size + entry.size > config.max_bytes {
                carried = Some(entry);
                break;
            }
            batch.push(entry);
        }
        while calls.len() >= config.max_calls_in_flight {
            calls.join_next().await;
        }
        let groups = if shared.fifo {
            batch.groups()
        } else {
            HashSet::new()
        };
        let held = shared.gate.enter(groups).await;
        calls.spawn(send::call(Arc::clone(&shared), batch.entries, held));
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    tracing::debug!("batching producer drained");
    shared.finished.cancel();
}

/// The buffer's receiving end: closes itself when the producer is shut down.
struct Inbox {
    receiver: mpsc::Receiver<Entry>,
    stop: CancellationToken,
    closed: bool,
}

impl Inbox {
    /// The next buffered job; `None` once the buffer is closed and empty, or when `until` passes.
    /// Once closed, what is buffered is taken without waiting for `until`.
    async fn next(&mut self, until: Option<Instant>) -> Option<Entry> {
        loop {
            if self.closed {
                return self.receiver.recv().await;
            }
            let deadline = until.unwrap_or_else(|| Instant::now() + Duration::from_secs(3_600));
            tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    // Refuses sends not yet buffered; what is buffered is still received.
                    self.receiver.close();
                    self.closed = true;
                }
                entry = self.receiver.recv() => return entry,
                () = tokio::time::sleep_until(deadline), if until.is_some() => return None,
            }
        }
    }
}

/// The jobs of one call, in the order they were handed over.
struct Batch {
    entries: Vec<Entry>,
    size: usize,
}

impl Batch {
    fn new(first: Entry) -> Self {
        Self {
            size: first.size,
            entries: vec![first],
        }
    }

    fn push(&mut self, entry: Entry) {
        self.size += entry.size;
        self.entries.push(entry);
    }

    fn groups(&self) -> HashSet<String> {
        self.entries
            .iter()
            .filter_map(|entry| entry.message.group_id.clone())
            .collect()
    }
}
