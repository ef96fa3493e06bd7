//! Item size, estimated the way DynamoDB documents it, so an output that cannot fit is handled before
//! the request instead of by a `ValidationException`.
//!
//! Size = for each attribute, the UTF-8 bytes of its name plus its value: strings by their UTF-8
//! bytes, numbers 1 byte per two significant digits plus 1 (at most 21). The estimate errs upward:
//! numbers count as 21 bytes, and the validation and token values get a generous allowance.

use conveyor_core::limits::MAX_ITEM_BYTES;

use crate::options::AttributeNames;

/// Upper bound for a number attribute's value.
const MAX_NUMBER_BYTES: usize = 21;
/// Room left for a `validation` value the completing worker cannot see (Conveyor writes a 64-character
/// SHA-256 hex digest, Powertools a 32-character MD5).
const VALIDATION_ALLOWANCE: usize = 128;
/// Room for the fencing token (a number: at most 21 bytes; a random string in older releases).
const TOKEN_ALLOWANCE: usize = 64;

/// The size of a completed record for `key`, without its output: everything `complete` leaves or
/// writes on the item except `data`'s value.
pub(crate) fn completed_overhead(names: &AttributeNames, key: &str) -> usize {
    names.id.len()
        + key.len()
        + names.status.len()
        + "INPROGRESS".len().max("COMPLETED".len())
        + names.expiration.len()
        + MAX_NUMBER_BYTES
        + names.in_progress_expiration.len()
        + MAX_NUMBER_BYTES
        + names.fencing_token.len()
        + TOKEN_ALLOWANCE
        + names.validation.len()
        + VALIDATION_ALLOWANCE
        + names.data.len()
}

/// The largest output that fits next to the rest of `key`'s record.
pub(crate) fn output_limit(names: &AttributeNames, key: &str) -> usize {
    MAX_ITEM_BYTES.saturating_sub(completed_overhead(names, key))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use aws_sdk_dynamodb::types::AttributeValue;

    use super::*;
    use crate::item::{Item, epoch_millis, number, primary_key, string};

    /// DynamoDB's documented sizes, exactly, for the types a record uses.
    fn item_size(item: &Item) -> usize {
        item.iter()
            .map(|(name, value)| {
                name.len()
                    + match value {
                        AttributeValue::S(text) => text.len(),
                        AttributeValue::N(text) => number_size(text),
                        other => panic!("unexpected type {other:?}"),
                    }
            })
            .sum()
    }

    fn number_size(text: &str) -> usize {
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
        significant.div_ceil(2) + 1
    }

    #[test]
    fn the_overhead_covers_a_real_completed_record() {
        let names = AttributeNames::default();
        let now = SystemTime::now();
        let key = "conveyor:email#user:42";
        let mut item = primary_key(&names, None, key);
        item.insert(
            names.in_progress_expiration.clone(),
            number(epoch_millis(now + Duration::from_secs(30))),
        );
        item.insert(names.fencing_token.clone(), number(epoch_millis(now) + 1));
        item.insert(
            names.validation.clone(),
            string(conveyor_core::port::payload_hash("body")),
        );
        item.insert(names.status.clone(), string("COMPLETED"));
        item.insert(names.expiration.clone(), number(4_000_000_000));
        item.insert(names.data.clone(), string(""));
        let real = item_size(&item);
        let estimate = completed_overhead(&names, key);
        assert!(estimate >= real, "estimate {estimate} < real {real}");
        assert!(estimate < real + 256, "estimate {estimate} far above real {real}");
    }

    #[test]
    fn the_output_limit_leaves_room_for_the_rest_of_the_record() {
        let names = AttributeNames::default();
        let limit = output_limit(&names, "conveyor:email#user:42");
        assert!(limit < MAX_ITEM_BYTES);
        assert!(limit > MAX_ITEM_BYTES - 1024, "overhead should be small: {limit}");
        assert!(500 * 1024 > limit);
    }
}
