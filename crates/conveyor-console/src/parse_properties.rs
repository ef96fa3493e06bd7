//! Property tests: no form or query a client can send panics a handler's parser, and a value that
//! does not parse is refused naming its field, never read as absent (a malformed filter never widens
//! an action). Every parser a handler runs before it acts is exercised: the dead-letter page's query
//! (`ShowQuery`), its action form (`ActForm`), its peek size, the delayed jobs' action
//! (`DelayAction`) and the send form's delay carried through the producer's own encoding. The other
//! handlers read only text fields (`Fields::get`) and paths axum parses (`/tasks/{id}`).

use std::time::{Duration, SystemTime};

use axum::extract::Query;
use axum::http::Uri;
use proptest::prelude::*;

use crate::delays::DelayAction;
use crate::dlq::{ActForm, FilterSpec, ShowQuery, peek_size};
use crate::fields::{FieldError, Fields};

/// Every field name the console's forms and queries use, and one they do not.
const NAMES: &[&str] = &[
    "queue",
    "job_type",
    "reason",
    "newer",
    "older",
    "show",
    "fetch",
    "max",
    "action",
    "id",
    "rate",
    "confirm",
    "to",
    "to_other",
    "in_secs",
    "delay_secs",
    "csrf",
    "handle",
    "name",
    "set",
    "key",
    "record_id",
    "message_id",
    "payload",
    "tenant",
    "group_id",
    "other",
];

/// Values that look like numbers (signs, fractions, spaces, overflowing digits) and any text.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ ]{0,2}[+-]?[0-9]{0,30}[ ]{0,2}",
        "[0-9]{1,25}(\\.[0-9]{0,3})?",
        prop_oneof![
            Just("18446744073709551615".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just("200000000000000000".to_owned()),
            Just("-1".to_owned()),
            Just("1e9".to_owned()),
            Just("yes".to_owned()),
            Just("1".to_owned()),
            Just("reschedule".to_owned()),
            Just("delete_filter".to_owned()),
        ],
        any::<String>(),
    ]
}

fn fields() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (prop::sample::select(NAMES).prop_map(str::to_owned), value()),
        0..10,
    )
}

/// The time the parsers count from: now, or any second from 1970 to 2106.
fn now() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        Just(SystemTime::now()),
        (0..=u64::from(u32::MAX)).prop_map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
    ]
}

/// Runs every parser on `fields` at `now`; a refusal must name a field the form carried.
fn parse_all(fields: &Fields, pairs: &[(String, String)], now: SystemTime) -> Result<(), TestCaseError> {
    let named = |error: &FieldError| {
        // `action` and `in_secs` are also refused when missing; every other refusal is of a given value.
        ["action", "in_secs"].contains(&error.field) || pairs.iter().any(|(name, _)| name == error.field)
    };
    let spec = FilterSpec::parse(fields);
    if let Ok(spec) = &spec {
        let _ = spec.at(now);
    }
    for error in [
        ShowQuery::parse(fields, now).err(),
        ActForm::parse(fields, now).err(),
        peek_size(fields).err(),
        DelayAction::parse(fields, now).err(),
        crate::send::delay(fields).err(),
        spec.err(),
    ]
    .into_iter()
    .flatten()
    {
        prop_assert!(named(&error), "{error} names no field of {pairs:?}");
        let _ = error.refusal("t");
    }
    if let Ok(Some(delay)) = crate::send::delay(fields) {
        // The producer's own encoding adds the delay to its clock: a delay the form accepts is one it
        // can count.
        let job = conveyor_sqs::NewJob::new("t", serde_json::json!({})).delay(delay);
        let _ = job.to_message("q");
    }
    Ok(())
}

/// Cases per property; the two properties run this many inputs each.
const CASES: u32 = 25_000;

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_form_panics_a_parser(pairs in fields(), now in now()) {
        let fields = Fields::of_owned(pairs.clone());
        parse_all(&fields, &pairs, now)?;
    }

    #[test]
    fn no_query_string_panics_a_parser(query in "[a-z_=&%0-9A-F+.\\-]{0,80}|\\PC{0,80}") {
        let Ok(uri) = format!("/dlq?{query}").parse::<Uri>() else {
            return Ok(());
        };
        if let Ok(Query(fields)) = Query::<Fields>::try_from_uri(&uri) {
            let pairs = fields.pairs();
            parse_all(&fields, &pairs, SystemTime::now())?;
        }
    }
}

#[test]
fn the_probes_are_refused_naming_their_field() {
    let now = SystemTime::now();
    let older = Fields::of(&[("action", "delete_filter"), ("older", "-1"), ("confirm", "yes")]);
    assert_eq!(
        ActForm::parse(&older, now).map(|_| ()).unwrap_err().field,
        "older"
    );
    let newer = Fields::of(&[("queue", "q"), ("newer", "200000000000000000")]);
    assert_eq!(
        ShowQuery::parse(&newer, now).map(|_| ()).unwrap_err().field,
        "newer"
    );
    let delay = Fields::of(&[("delay_secs", "18446744073709551615")]);
    assert_eq!(crate::send::delay(&delay).unwrap_err().field, "delay_secs");
    let in_secs = Fields::of(&[("action", "reschedule"), ("in_secs", "18446744073709551615")]);
    assert_eq!(DelayAction::parse(&in_secs, now).unwrap_err().field, "in_secs");
}
