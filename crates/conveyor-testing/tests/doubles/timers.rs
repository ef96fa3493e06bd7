//! A relay pass over the in-memory doubles: a burst of timers due at one moment drains in one pass, and
//! a queue that refuses every send loses nothing and leaves every timer claimed for changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use conveyor_core::port::{FlowSender, OutgoingMessage, QueueError};
use conveyor_core::{TimerChange, Timers};
use conveyor_testing::{MemoryQueue, MemoryTimers, QueueSender};

const QUEUE: &str = "http://127.0.0.1:4566/000000000000/jobs";

async fn put_due(timers: &Timers, count: usize) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for index in 0..count {
        let message = OutgoingMessage {
            body: format!("{{\"n\":{index}}}"),
            ..OutgoingMessage::default()
        };
        ids.push(timers.put("reminder", SystemTime::now(), message).await?);
    }
    Ok(ids)
}

#[tokio::test]
async fn a_burst_due_at_one_moment_drains_in_one_pass() -> anyhow::Result<()> {
    let queue = Arc::new(MemoryQueue::new("jobs"));
    let store = Arc::new(MemoryTimers::new());
    let timers = Timers::new(store.clone(), Arc::new(QueueSender(queue.clone())), QUEUE);
    put_due(&timers, 250).await?;

    let relayed = timers.relay(Duration::from_secs(60)).await?;

    assert_eq!((relayed.sent, relayed.failed), (250, 0), "{relayed:?}");
    assert_eq!(queue.len(), 250, "every timer is in the queue");
    assert!(store.is_empty(), "every sent timer was finished");
    Ok(())
}

/// A queue that refuses every send.
struct Refusing;

#[async_trait]
impl FlowSender for Refusing {
    async fn send_to(&self, _queue_url: &str, _message: OutgoingMessage) -> Result<String, QueueError> {
        Err(QueueError::Unavailable {
            message: "SendMessage timed out".to_owned(),
        })
    }
}

#[tokio::test]
async fn a_queue_that_refuses_every_send_loses_nothing_and_stops_the_pass() -> anyhow::Result<()> {
    let store = Arc::new(MemoryTimers::new());
    let timers = Timers::new(store.clone(), Arc::new(Refusing), QUEUE);
    let ids = put_due(&timers, 150).await?;

    let relayed = timers.relay(Duration::from_secs(60)).await?;

    assert_eq!(
        (relayed.sent, relayed.failed),
        (0, 100),
        "one page, then the pass stops: {relayed:?}"
    );
    assert_eq!(store.len(), 150, "nothing lost");
    let tried = timers
        .list(200)
        .await?
        .into_iter()
        .filter(|timer| timer.claimed_until.is_some());
    for timer in tried {
        // A failed send may have reached the queue: the timer stays claimed for changes...
        assert_eq!(timers.cancel(&timer.id).await?, TimerChange::Sending);
    }
    // ...but the next pass may send it again at once.
    let again = timers.relay(Duration::from_secs(60)).await?;
    assert_eq!(again.failed, 100, "{again:?}");
    assert!(ids.iter().all(|id| !id.is_empty()));
    Ok(())
}
