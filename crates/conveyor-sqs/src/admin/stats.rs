//! Queue statistics: depth of a queue and its DLQ, and the age of the oldest message when asked for.
//!
//! # Design note: the age of the oldest message
//!
//! SQS does not return the age of the oldest message from `GetQueueAttributes`: it is only the CloudWatch
//! metric `ApproximateAgeOfOldestMessage` (one-minute resolution), and LocalStack here runs without
//! CloudWatch. So by default [`OldestAge::Unavailable`] is reported. When the caller asks for it,
//! the age is derived from a [`peek`](fn@super::peek) of up to [`AGE_PEEK_MAX`] messages: the oldest
//! `SentTimestamp` among them. On a standard queue a receive samples a subset of the queue, so the value is
//! a lower bound ([`OldestAge::AtLeast`]); the peek has the side effects described in [`peek`](mod@super::peek).

use std::time::{Duration, SystemTime};

use aws_sdk_sqs::Client;

use super::error::AdminError;
use super::peek::{PeekOptions, peek};
use super::queue_info::{QueueInfo, dead_letter_sources, describe, url_for_arn};

/// The most messages peeked to estimate the oldest message's age.
pub const AGE_PEEK_MAX: usize = 100;

/// The age of a queue's oldest message, as far as it can be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldestAge {
    /// Not measured: SQS exposes it only as the CloudWatch metric `ApproximateAgeOfOldestMessage`.
    Unavailable,
    /// Measured by a peek, which saw no visible message.
    Empty,
    /// The oldest `SentTimestamp` among `peeked` peeked messages: the oldest message is at least this old.
    AtLeast {
        /// The age.
        age: Duration,
        /// How many messages the peek saw.
        peeked: usize,
    },
}

/// One queue's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub queue: QueueInfo,
    /// The oldest message's age.
    pub oldest: OldestAge,
}

/// A queue's numbers and its DLQ's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// The queue asked about.
    pub queue: QueueStats,
    /// Its DLQ, from the redrive policy; `None` when it has none.
    pub dead_letter: Option<QueueStats>,
    /// When the queue has no redrive policy: the URLs of the queues it is the DLQ of (often none).
    pub dead_letter_of: Vec<String>,
}

/// Reads the depth of `queue_url` and of its DLQ (or, for a queue without one, which queues use it as
/// theirs); with `peek_age`, estimates each one's oldest message age
/// by peeking (see the module's design note).
pub async fn stats(client: &Client, queue_url: &str, peek_age: bool) -> Result<Stats, AdminError> {
    let queue = describe(client, queue_url).await?;
    let dead_letter = match &queue.redrive {
        Some(policy) => {
            let url = url_for_arn(client, &policy.dead_letter_arn).await?;
            Some(describe(client, &url).await?)
        }
        None => None,
    };
    let dead_letter_of = match &queue.redrive {
        Some(_) => Vec::new(),
        None => dead_letter_sources(client, queue_url).await?,
    };
    let queue = with_age(client, queue, peek_age).await?;
    let dead_letter = match dead_letter {
        Some(info) => Some(with_age(client, info, peek_age).await?),
        None => None,
    };
    Ok(Stats {
        queue,
        dead_letter,
        dead_letter_of,
    })
}

/// [`stats`] of several queues (no age), reading each queue once: a DLQ that is itself among `urls` (a
/// name prefix lists both) is read once, shown as its source's DLQ, and not reported on its own.
///
/// Requests: one `GetQueueAttributes` per URL; for a queue whose DLQ is not among `urls`, `GetQueueUrl`
/// and `GetQueueAttributes` of the DLQ; for a queue without a redrive policy that is nobody's DLQ in
/// `urls`, one `ListDeadLetterSourceQueues`. Each entry is the queue's stats, or its URL and error.
pub async fn stats_of(client: &Client, urls: &[String]) -> Vec<Result<Stats, (String, AdminError)>> {
    let mut described = Vec::with_capacity(urls.len());
    for url in urls {
        described.push(describe(client, url).await.map_err(|error| (url.clone(), error)));
    }
    let known: Vec<&QueueInfo> = described.iter().filter_map(|read| read.as_ref().ok()).collect();
    let dead_letter_arns: Vec<&str> = known
        .iter()
        .filter_map(|queue| Some(queue.redrive.as_ref()?.dead_letter_arn.arn.as_str()))
        .collect();
    let mut all = Vec::with_capacity(described.len());
    for read in &described {
        let queue = match read {
            Ok(queue) => queue,
            Err(error) => {
                all.push(Err(error.clone()));
                continue;
            }
        };
        if dead_letter_arns.contains(&queue.arn.arn.as_str()) {
            continue;
        }
        all.push(
            stats_with(client, queue, &known)
                .await
                .map_err(|error| (queue.url.clone(), error)),
        );
    }
    all
}

/// One queue's [`Stats`], taking its DLQ from `known` when it is there.
async fn stats_with(client: &Client, queue: &QueueInfo, known: &[&QueueInfo]) -> Result<Stats, AdminError> {
    let unmeasured = |queue: QueueInfo| QueueStats {
        queue,
        oldest: OldestAge::Unavailable,
    };
    let Some(policy) = &queue.redrive else {
        return Ok(Stats {
            queue: unmeasured(queue.clone()),
            dead_letter: None,
            dead_letter_of: dead_letter_sources(client, &queue.url).await?,
        });
    };
    let dead_letter = match known.iter().find(|known| known.arn == policy.dead_letter_arn) {
        Some(dlq) => (*dlq).clone(),
        None => describe(client, &url_for_arn(client, &policy.dead_letter_arn).await?).await?,
    };
    Ok(Stats {
        queue: unmeasured(queue.clone()),
        dead_letter: Some(unmeasured(dead_letter)),
        dead_letter_of: Vec::new(),
    })
}

async fn with_age(client: &Client, queue: QueueInfo, peek_age: bool) -> Result<QueueStats, AdminError> {
    if !peek_age {
        return Ok(QueueStats {
            queue,
            oldest: OldestAge::Unavailable,
        });
    }
    let options = PeekOptions {
        max: AGE_PEEK_MAX,
        ..PeekOptions::default()
    };
    let peeked = peek(client, &queue.url, options).await?;
    let sent: Vec<SystemTime> = peeked
        .messages
        .iter()
        .filter_map(|received| received.message.sent_at)
        .collect();
    Ok(QueueStats {
        queue,
        oldest: oldest_age(&sent, SystemTime::now()),
    })
}

/// The age of the oldest of `sent` at `now`.
pub(crate) fn oldest_age(sent: &[SystemTime], now: SystemTime) -> OldestAge {
    let Some(oldest) = sent.iter().min() else {
        return OldestAge::Empty;
    };
    OldestAge::AtLeast {
        age: now.duration_since(*oldest).unwrap_or(Duration::ZERO),
        peeked: sent.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_send_wins_and_clock_skew_gives_zero() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let sent = [now - Duration::from_secs(5), now - Duration::from_secs(60), now];
        assert_eq!(
            oldest_age(&sent, now),
            OldestAge::AtLeast {
                age: Duration::from_secs(60),
                peeked: 3
            }
        );
        assert_eq!(oldest_age(&[], now), OldestAge::Empty);
        let future = [now + Duration::from_secs(2)];
        assert_eq!(
            oldest_age(&future, now),
            OldestAge::AtLeast {
                age: Duration::ZERO,
                peeked: 1
            }
        );
    }
}
