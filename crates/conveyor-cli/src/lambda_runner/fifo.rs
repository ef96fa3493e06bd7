//! FIFO across concurrent invocations: at most one in-flight batch per message group.
//!
//! SQS hands out none of a group's messages while another of that group is in flight, so on AWS two
//! invocations never hold the same group. LocalStack unlocks a group as soon as any of its messages is
//! visible again (see `crates/conveyor-testing/README.md`): a batch cut to the payload cap, or a
//! retried head whose successors come back a moment later, would let a second invocation run a group's
//! later messages beside its earlier ones. The runner enforces SQS's rule itself:
//!
//! - a received message whose group is busy in another invocation (or already has messages waiting
//!   here) is held: it stays in flight, as it would have stayed in the queue;
//! - when the busy invocation ends and deleted all of that group's messages, the held ones are the
//!   group's next: the next free environment takes them (in `SequenceNumber` order) before receiving,
//!   with their visibility reset to the queue's timeout, as a fresh receive would;
//! - when it left some of the group's messages in the queue (failures, a timeout, a crash), those come
//!   first: the held ones are left in flight untouched and come back when their receive's visibility
//!   timeout ends, behind the failed ones (whose backoff is normally shorter).
//!
//! On SQS itself nothing is ever held; the rule only makes LocalStack behave like it.

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};

/// A message's group (`MessageGroupId`), when it has one.
pub(crate) fn group_of(message: &Message) -> Option<&str> {
    message
        .attributes
        .as_ref()?
        .get(&MessageSystemAttributeName::MessageGroupId)
        .map(String::as_str)
}

fn sequence_of(message: &Message) -> u128 {
    message
        .attributes
        .as_ref()
        .and_then(|attributes| attributes.get(&MessageSystemAttributeName::SequenceNumber))
        .and_then(|text| text.parse().ok())
        .unwrap_or(u128::MAX)
}

/// Which environment holds which group, and the messages waiting for a busy group.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    busy: HashMap<String, usize>,
    held: BTreeMap<String, Vec<Message>>,
}

impl Groups {
    /// Splits a received batch for `environment`: returns the messages it may run now (their groups
    /// become busy for it) and how many were held for a group busy elsewhere.
    pub(crate) fn admit(&mut self, environment: usize, messages: Vec<Message>) -> (Vec<Message>, usize) {
        let mut run = Vec::with_capacity(messages.len());
        let mut held = 0;
        for message in messages {
            let Some(group) = group_of(&message).map(str::to_owned) else {
                run.push(message);
                continue;
            };
            let busy_elsewhere = self.busy.get(&group).is_some_and(|owner| *owner != environment);
            if busy_elsewhere || self.held.contains_key(&group) {
                let waiting = self.held.entry(group).or_default();
                waiting.push(message);
                waiting.sort_by_key(sequence_of);
                held += 1;
                continue;
            }
            self.busy.insert(group, environment);
            run.push(message);
        }
        (run, held)
    }

    /// Up to `max` held messages of groups no environment holds, group by group in sequence order;
    /// their groups become busy for `environment`.
    pub(crate) fn take_ready(&mut self, environment: usize, max: usize) -> Vec<Message> {
        let ready: Vec<String> = self
            .held
            .keys()
            .filter(|group| !self.busy.contains_key(*group))
            .cloned()
            .collect();
        let mut taken = Vec::new();
        for group in ready {
            if taken.len() >= max {
                break;
            }
            let Some(waiting) = self.held.get_mut(&group) else {
                continue;
            };
            let count = waiting.len().min(max - taken.len());
            taken.extend(waiting.drain(..count));
            if waiting.is_empty() {
                self.held.remove(&group);
            }
            self.busy.insert(group, environment);
        }
        taken
    }

    /// `environment`'s invocation of `messages` ended and `deleted` (message ids) were deleted: its
    /// groups are free again. Held messages of a group that left messages in the queue are dropped
    /// from the hold (left in flight; see the module note); returns how many.
    pub(crate) fn finish(
        &mut self,
        environment: usize,
        messages: &[Message],
        deleted: &HashSet<String>,
    ) -> usize {
        let mut left_behind = HashSet::new();
        for message in messages {
            let Some(group) = group_of(message) else {
                continue;
            };
            if self.busy.get(group) == Some(&environment) {
                self.busy.remove(group);
            }
            let was_deleted = message.message_id.as_ref().is_some_and(|id| deleted.contains(id));
            if !was_deleted {
                left_behind.insert(group.to_owned());
            }
        }
        left_behind
            .iter()
            .filter_map(|group| self.held.remove(group))
            .map(|waiting| waiting.len())
            .sum()
    }

    /// Every held message (at shutdown, to make them visible again).
    pub(crate) fn drain(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.held).into_values().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, group: &str, sequence: u64) -> Message {
        Message::builder()
            .message_id(id)
            .receipt_handle(format!("rh-{id}"))
            .attributes(MessageSystemAttributeName::MessageGroupId, group)
            .attributes(MessageSystemAttributeName::SequenceNumber, sequence.to_string())
            .build()
    }

    fn ids(messages: &[Message]) -> Vec<&str> {
        messages.iter().filter_map(|m| m.message_id.as_deref()).collect()
    }

    fn deleted(list: &[&str]) -> HashSet<String> {
        list.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn a_group_busy_in_one_environment_is_held_from_the_others() {
        let mut groups = Groups::default();
        let (run, held) = groups.admit(1, vec![message("a1", "a", 1), message("b1", "b", 1)]);
        assert_eq!((ids(&run), held), (vec!["a1", "b1"], 0));
        // LocalStack hands out a's successors (out of order here) while a1 runs in environment 1.
        let (run, held) = groups.admit(
            2,
            vec![
                message("a3", "a", 3),
                message("a2", "a", 2),
                message("c1", "c", 1),
            ],
        );
        assert_eq!((ids(&run), held), (vec!["c1"], 2));
        assert!(
            groups.take_ready(2, 10).is_empty(),
            "a is still busy in environment 1"
        );

        // Environment 1 deleted a1 and b1: a's held messages are next, in sequence order.
        let batch = [message("a1", "a", 1), message("b1", "b", 1)];
        assert_eq!(groups.finish(1, &batch, &deleted(&["a1", "b1"])), 0);
        let next = groups.take_ready(2, 10);
        assert_eq!(ids(&next), vec!["a2", "a3"]);
        // Now a is busy in environment 2: environment 1 cannot take or run it.
        let (run, held) = groups.admit(1, vec![message("a4", "a", 4)]);
        assert_eq!((run.len(), held), (0, 1));
        assert!(groups.take_ready(1, 10).is_empty());
    }

    #[test]
    fn held_messages_stay_behind_a_failed_head() {
        let mut groups = Groups::default();
        let head = [message("a1", "a", 1)];
        let _ = groups.admit(1, head.to_vec());
        let (_, held) = groups.admit(2, vec![message("a2", "a", 2), message("a3", "a", 3)]);
        assert_eq!(held, 2);
        // a1 failed (not deleted): a2 and a3 are released from the hold, untouched, and never run first.
        assert_eq!(groups.finish(1, &head, &deleted(&[])), 2);
        assert!(groups.take_ready(2, 10).is_empty());
        assert!(groups.drain().is_empty());
        // The group is free: a1's return is admitted.
        let (run, _) = groups.admit(2, head.to_vec());
        assert_eq!(ids(&run), vec!["a1"]);
    }

    #[test]
    fn take_ready_respects_the_batch_size_and_standard_messages_pass() {
        let mut groups = Groups::default();
        let _ = groups.admit(1, vec![message("a1", "a", 1)]);
        let _ = groups.admit(2, (2..=5).map(|n| message(&format!("a{n}"), "a", n)).collect());
        let _ = groups.finish(1, &[message("a1", "a", 1)], &deleted(&["a1"]));
        assert_eq!(ids(&groups.take_ready(3, 3)), vec!["a2", "a3", "a4"]);
        assert!(
            groups.take_ready(2, 3).is_empty(),
            "a5 waits: a is busy in environment 3"
        );
        let plain = Message::builder().message_id("s").build();
        let (run, held) = groups.admit(2, vec![plain]);
        assert_eq!((ids(&run), held), (vec!["s"], 0));
        assert_eq!(ids(&groups.drain()), vec!["a5"]);
    }
}
