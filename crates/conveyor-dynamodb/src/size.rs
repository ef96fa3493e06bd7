//! Item size, estimated the way DynamoDB documents it, so an output that cannot fit is handled before
//! the request instead of by a `ValidationException`.
//!
//! Size = for each attribute, the UTF-8 bytes of its name plus its value: strings by their UTF-8
//! bytes, numbers 1 byte per two significant digits plus 1 (at most 21). The estimate errs upward.

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::limits::MAX_ITEM_BYTES;

use crate::item::Item;
use crate::options::AttributeNames;

/// Upper bound for a number attribute's value.
const MAX_NUMBER_BYTES: usize = 21;
/// Room left for a `validation` value the completing worker cannot see (Conveyor writes a 64-character
/// SHA-256 hex digest, Powertools a 32-character MD5).
const VALIDATION_ALLOWANCE: usize = 128;
/// Room for the fencing token (Conveyor's are 32 characters).
const TOKEN_ALLOWANCE: usize = 64;

/// The size of one attribute value.
pub(crate) fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(text) => number_size(text),
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(texts) => texts.iter().map(String::len).sum(),
        AttributeValue::Ns(numbers) => numbers.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(blobs) => blobs.iter().map(|b| b.as_ref().len()).sum(),
        // Lists and maps: 3 bytes of overhead, 1 per element, plus the elements (and keys).
        AttributeValue::L(values) => 3 + values.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map.iter().map(|(name, v)| 1 + name.len() + value_size(v)).sum::<usize>()
        }
        _ => MAX_ITEM_BYTES,
    }
}

fn number_size(text: &str) -> usize {
    let digits = text
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
    (significant.div_ceil(2) + 1).min(MAX_NUMBER_BYTES)
}

/// The size of a whole item.
pub(crate) fn item_size(item: &Item) -> usize {
    item.iter().map(|(name, value)| name.len() + value_size(value)).sum()
}

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
    use super::*;
    use crate::item::{number, string};

    #[test]
    fn numbers_count_significant_digits() {
        assert_eq!(number_size("1795964720"), 1 + 5); // 9 significant digits after trimming the 0
        assert_eq!(number_size("0"), 2);
        assert_eq!(number_size("1".repeat(60).as_str()), MAX_NUMBER_BYTES);
    }

    #[test]
    fn an_item_counts_names_and_values() {
        let item = Item::from([
            ("id".to_owned(), string("abc")),
            ("expiration".to_owned(), number(1_795_964_720)),
        ]);
        assert_eq!(item_size(&item), 2 + 3 + 10 + 6);
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
