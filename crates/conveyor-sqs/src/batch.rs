//! Entry ids of batch calls, and mapping a batch call's results back to the caller's indices.

use std::collections::HashSet;
use std::ops::Range;

use aws_sdk_sqs::types::BatchResultErrorEntry;
use conveyor_core::port::{EntryError, EntryFailure};

use crate::errors::entry_error;

/// The entry id for the entry at `index` of the caller's slice. Ids are the indices themselves, so they
/// are unique within a call even when two entries carry the same receipt handle.
pub(crate) fn entry_id(index: usize) -> String {
    index.to_string()
}

/// The caller's failures among `failed`, for a call that carried the entries of `range`. An id we did
/// not send is logged and left out: there is no entry to report it against.
pub(crate) fn entry_failures(failed: &[BatchResultErrorEntry], range: Range<usize>) -> Vec<EntryFailure> {
    failed
        .iter()
        .filter_map(|entry| match entry.id().parse::<usize>() {
            Ok(index) if range.contains(&index) => Some(EntryFailure {
                index,
                error: entry_error(entry),
            }),
            _ => {
                tracing::warn!(
                    entry_id = entry.id(),
                    code = entry.code(),
                    "batch result names an entry we did not send"
                );
                None
            }
        })
        .collect()
}

/// Like [`entry_failures`], and an entry SQS answered neither way (which it should not do) is reported
/// as a failure that may be retried, never silently taken as done.
pub(crate) fn all_failures<'a>(
    range: Range<usize>,
    successful: impl IntoIterator<Item = &'a str>,
    failed: &[BatchResultErrorEntry],
) -> Vec<EntryFailure> {
    let mut unanswered: HashSet<usize> = range.clone().collect();
    for id in successful {
        if let Ok(index) = id.parse::<usize>() {
            unanswered.remove(&index);
        }
    }
    let mut failures = entry_failures(failed, range);
    for failure in &failures {
        unanswered.remove(&failure.index);
    }
    failures.extend(unanswered.into_iter().map(|index| EntryFailure {
        index,
        error: EntryError::Failed {
            code: "NoResult".to_owned(),
            message: "SQS reported neither success nor failure for this entry".to_owned(),
            sender_fault: false,
        },
    }));
    failures.sort_by_key(|failure| failure.index);
    failures.dedup_by_key(|failure| failure.index);
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(id: &str, code: &str) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder()
            .id(id)
            .code(code)
            .sender_fault(true)
            .message("m")
            .build()
            .unwrap()
    }

    #[test]
    fn ids_map_back_to_indices_and_strangers_are_dropped() {
        let failures = entry_failures(
            &[
                failed("12", "ReceiptHandleIsInvalid"),
                failed("3", "X"),
                failed("abc", "X"),
            ],
            10..20,
        );
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].index, 12);
        assert!(matches!(failures[0].error, EntryError::NotIssued(_)));
    }

    #[test]
    fn unanswered_entries_are_not_taken_as_done() {
        let failures = all_failures(10..14, ["10", "12"], &[failed("11", "ReceiptHandleIsInvalid")]);
        assert_eq!(failures.len(), 2);
        assert_eq!(failures[0].index, 11);
        assert!(matches!(failures[0].error, EntryError::NotIssued(_)));
        assert_eq!(failures[1].index, 13);
        assert!(matches!(failures[1].error, EntryError::Failed { ref code, .. } if code == "NoResult"));
    }
}
