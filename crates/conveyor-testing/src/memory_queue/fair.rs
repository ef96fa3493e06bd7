//! SQS fair queues on a standard [`MemoryQueue`](super::MemoryQueue): which visible messages a receive
//! takes first when one tenant (one `MessageGroupId`) holds a disproportionate share of the messages in
//! flight.
//!
//! # Design note: the model, and where it stops
//!
//! Fair queues are not a setting on SQS: every standard queue whose messages carry a `MessageGroupId`
//! has them (July 2025). AWS's description ("How Amazon SQS fair queues work") gives the rules modelled
//! here:
//!
//! - a tenant is **noisy** when it holds more than 10% of the queue's in-flight messages *and* at least
//!   30 of its own ([`NOISY_SHARE`], [`NOISY_MIN_IN_FLIGHT`]); a message without a group is a tenant of
//!   its own, so it is never noisy;
//! - while a tenant is noisy, a receive returns the quiet tenants' visible messages first (oldest first),
//!   then the noisy tenants' (the noisy tenant with the fewest messages in flight first, as AWS says);
//!   a noisy tenant's messages are never dropped or held back when nothing quiet is waiting.
//!
//! Left out, and said so in `docs/tenants.md`: AWS's second measure (a tenant's share of the consumers'
//! recent processing time, which catches slow tenants with few messages in flight) and the stickiness
//! of the noisy state (AWS keeps a tenant noisy until its backlog drains or it sends nothing for five
//! minutes; here it is judged afresh at every receive, from the in-flight counts of that moment). AWS
//! calls its thresholds approximate; so is this.
//!
//! The queue counts every group's in-flight messages on both kinds of queue (FIFO needs the counts to
//! hold a group back); this module only reads them.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{Status, Stored};

/// A tenant is noisy above this share of the queue's in-flight messages ...
pub const NOISY_SHARE: f64 = 0.10;
/// ... when it also has at least this many in flight.
pub const NOISY_MIN_IN_FLIGHT: u32 = 30;

/// The noisy groups now, fewest in flight first (ties by name, so a run is reproducible).
pub(super) fn noisy_groups(group_in_flight: &HashMap<String, u32>, total_in_flight: u64) -> Vec<String> {
    let mut noisy: Vec<(u32, &String)> = group_in_flight
        .iter()
        .filter(|(_, count)| {
            **count >= NOISY_MIN_IN_FLIGHT && f64::from(**count) > NOISY_SHARE * total_in_flight as f64
        })
        .map(|(group, count)| (*count, group))
        .collect();
    noisy.sort_unstable();
    noisy.into_iter().map(|(_, group)| group.clone()).collect()
}

/// Up to `max` visible messages in the order a fair receive hands them out: every quiet tenant's
/// message oldest first, then each noisy group's in `noisy`'s order. Stale `ready` entries are skipped
/// (they are dropped when they reach the front).
pub(super) fn pick(
    ready: &VecDeque<(u64, u64)>,
    messages: &HashMap<u64, Stored>,
    noisy: &[String],
    max: usize,
) -> Vec<u64> {
    let visible = ready.iter().filter_map(|(seq, version)| {
        let message = messages.get(seq)?;
        (message.version == *version && message.status == Status::Visible).then_some((*seq, message))
    });
    let noisy_set: HashSet<&str> = noisy.iter().map(String::as_str).collect();
    let mut picked: Vec<u64> = Vec::with_capacity(max);
    let mut held: HashMap<&str, Vec<u64>> = HashMap::new();
    for (seq, message) in visible {
        match message
            .group_id
            .as_deref()
            .filter(|group| noisy_set.contains(group))
        {
            Some(group) => held.entry(group).or_default().push(seq),
            None if picked.len() < max => picked.push(seq),
            None => {}
        }
    }
    for group in noisy {
        let room = max.saturating_sub(picked.len());
        if room == 0 {
            break;
        }
        if let Some(seqs) = held.get(group.as_str()) {
            picked.extend(seqs.iter().take(room));
        }
    }
    picked
}
