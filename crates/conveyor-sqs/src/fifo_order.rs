//! A FIFO group's order when some of its jobs are not sent.
//!
//! # Design note: ordering
//!
//! `SendMessageBatch` answers per entry, so a call can store a group's third job after failing its
//! second. SQS keeps a group in the order its messages were *stored*, so anything sent after a failed
//! job of its group overtakes it. The producers hold to one rule: a group's jobs reach the queue in the
//! order they were given, and none after one that was not sent.
//!
//! 1. **Within one call** nothing can be taken back: a failed entry whose group has a later entry
//!    stored by the same call is not resent ([`sent_after`]): its caller is told, with why
//!    ([`overtaken`]). An entry with no later success of its group is retried, together with the later
//!    entries of its group that failed, in their order.
//! 2. **Across calls** ([`HeldGroups`]): once a group has a job not sent, the group's later jobs of the
//!    same batch are held back ([`ProduceError::GroupHeld`]) without a request, so the caller can send
//!    the group again from the first failure, in order. The batching producer holds back only the jobs
//!    it took before the failure was known (see `batching`).
//!
//! Standard queues have no order to keep: none of this applies there.

use std::collections::HashSet;

use crate::job::ProduceError;
use crate::producer::Pending;

/// The index and group of each entry of a chunk, taken before the chunk is sent.
pub(crate) fn groups_of(chunk: &[Pending]) -> Vec<(usize, Option<String>)> {
    chunk
        .iter()
        .map(|pending| (pending.index, pending.message.group_id.clone()))
        .collect()
}

/// The group of the entry `index` when a later entry of the same group in `chunk` was stored.
pub(crate) fn sent_after<'a>(
    chunk: &'a [Pending],
    index: usize,
    results: &[Option<Result<String, ProduceError>>],
) -> Option<&'a str> {
    let position = chunk.iter().position(|pending| pending.index == index)?;
    let group = chunk[position].message.group_id.as_deref()?;
    chunk[position + 1..]
        .iter()
        .filter(|later| later.message.group_id.as_deref() == Some(group))
        .any(|later| matches!(results.get(later.index), Some(Some(Ok(_)))))
        .then_some(group)
}

/// The error of an entry not resent because a later job of its group was stored.
pub(crate) fn overtaken(code: &str, message: Option<&str>, group: &str) -> ProduceError {
    ProduceError::Rejected {
        code: code.to_owned(),
        message: format!(
            "{}; not sent again: later jobs of message group {group:?} were stored by the same call, \
             and a resend would put this one after them",
            message.unwrap_or("no message")
        ),
        sender_fault: false,
    }
}

/// The groups of one batch that have a job not sent.
#[derive(Debug, Default)]
pub(crate) struct HeldGroups {
    groups: HashSet<String>,
}

impl HeldGroups {
    /// Answers the entries of held groups with [`ProduceError::GroupHeld`]; returns the rest.
    pub(crate) fn hold_back(
        &self,
        chunk: Vec<Pending>,
        results: &mut [Option<Result<String, ProduceError>>],
    ) -> Vec<Pending> {
        if self.groups.is_empty() {
            return chunk;
        }
        let (held, go): (Vec<Pending>, Vec<Pending>) = chunk.into_iter().partition(|pending| {
            pending
                .message
                .group_id
                .as_ref()
                .is_some_and(|group| self.groups.contains(group))
        });
        for pending in held {
            let group = pending.message.group_id.unwrap_or_default();
            results[pending.index] = Some(Err(ProduceError::GroupHeld { group }));
        }
        go
    }

    /// Holds the groups of `groups` whose entry ended in an error.
    pub(crate) fn note_failures(
        &mut self,
        groups: &[(usize, Option<String>)],
        results: &[Option<Result<String, ProduceError>>],
    ) {
        for (index, group) in groups {
            let failed = matches!(results.get(*index), Some(Some(Err(_))));
            if let (true, Some(group)) = (failed, group) {
                self.groups.insert(group.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use conveyor_core::port::OutgoingMessage;

    use super::*;

    fn entry(index: usize, group: &str) -> Pending {
        let message = OutgoingMessage {
            group_id: Some(group.to_owned()),
            ..OutgoingMessage::default()
        };
        Pending {
            index,
            message,
            size: 1,
        }
    }

    #[test]
    fn a_failed_entry_is_overtaken_only_by_a_later_stored_entry_of_its_group() {
        let chunk = vec![entry(0, "a"), entry(1, "b"), entry(2, "a"), entry(3, "b")];
        let failed = Some(Err(ProduceError::ShutDown));
        let results = vec![failed.clone(), failed, Some(Ok("m2".to_owned())), None];
        assert_eq!(sent_after(&chunk, 0, &results), Some("a"));
        assert_eq!(
            sent_after(&chunk, 1, &results),
            None,
            "b's later entry was not stored"
        );
        assert_eq!(sent_after(&chunk, 2, &results), None, "nothing of a after it");
    }

    #[test]
    fn a_held_group_loses_its_later_entries_and_the_others_go() {
        let mut held = HeldGroups::default();
        let mut results = vec![
            Some(Err(ProduceError::ShutDown)),
            Some(Ok("m".to_owned())),
            None,
            None,
        ];
        held.note_failures(&groups_of(&[entry(0, "a"), entry(1, "b")]), &results);
        let go = held.hold_back(vec![entry(2, "a"), entry(3, "b")], &mut results);
        assert_eq!(
            go.iter().map(|pending| pending.index).collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(
            results[2],
            Some(Err(ProduceError::GroupHeld {
                group: "a".to_owned()
            }))
        );
    }
}
