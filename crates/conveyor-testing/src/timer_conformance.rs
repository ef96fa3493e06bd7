//! The timers conformance suite: the `TimerStore` port's contracts (`conveyor-core/src/timer.rs`),
//! checked against any backend (`MemoryTimers`, and `DynamoStore` on DynamoDB Local), including the race
//! of many relays claiming one timer.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::TimerChange;
use conveyor_core::message::AttributeValue;
use conveyor_core::port::{NewTimer, OutgoingMessage, TimerStore, new_timer};

use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "timers_are_written_once_and_listed_soonest_first_per_queue",
    "a_claim_holds_off_changes_and_other_claims_until_it_lapses",
    "a_cancel_or_a_reschedule_applies_only_before_any_claim",
    "the_message_comes_back_whole",
    "one_of_many_concurrent_claims_wins",
];

/// Runs every case against `store`; returns every failed case.
pub async fn run_all(store: Arc<dyn TimerStore>) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (CASES[0], Box::pin(written_once_and_listed(store.as_ref()))),
        (CASES[1], Box::pin(a_claim_holds(store.as_ref()))),
        (CASES[2], Box::pin(changes_before_claims(store.as_ref()))),
        (CASES[3], Box::pin(message_whole(store.as_ref()))),
        (CASES[4], Box::pin(one_claim_wins(Arc::clone(&store)))),
    ];
    run_cases("timers", CASES, cases).await
}

/// A queue URL of its own for one case.
fn queue(case: &str) -> String {
    format!(
        "http://127.0.0.1:4566/000000000000/timers-{}-{}",
        case.len(),
        uuid::Uuid::new_v4().simple()
    )
}

/// An instant `secs` seconds after a fixed epoch (whole milliseconds, as the stores keep them).
fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_900_000_000 + secs)
}

fn timer(queue_url: &str, due: SystemTime) -> NewTimer {
    let message = OutgoingMessage {
        body: r#"{"to":"a@example.com"}"#.to_owned(),
        attributes: [("conveyor.type".to_owned(), AttributeValue::string("email"))]
            .into_iter()
            .collect(),
        ..OutgoingMessage::default()
    };
    new_timer(queue_url, "email", due, message)
}

async fn written_once_and_listed(store: &dyn TimerStore) -> CaseResult {
    let case = CASES[0];
    let (mine, other) = (queue(case), queue(case));
    let late = timer(&mine, at(300));
    let early = timer(&mine, at(100));
    let middle = timer(&mine, at(200));
    for new in [&late, &early, &middle] {
        let written = store.put_timer(new, at(0)).await.or_fail(case, "put_timer")?;
        ensure!(case, written, "the first write of {} was not written", new.id);
    }
    let again = store
        .put_timer(&late, at(1))
        .await
        .or_fail(case, "put_timer again")?;
    ensure!(case, !again, "a second write of the same id answered written");
    store
        .put_timer(&timer(&other, at(50)), at(0))
        .await
        .or_fail(case, "put_timer other")?;
    let listed = store.timers(&mine, None, 10).await.or_fail(case, "timers")?;
    let ids: Vec<&str> = listed.iter().map(|timer| timer.id.as_str()).collect();
    ensure!(
        case,
        ids == [early.id.as_str(), middle.id.as_str(), late.id.as_str()],
        "listing: {ids:?}"
    );
    ensure!(
        case,
        listed[0].due == at(100) && listed[0].job_type == "email",
        "first: {:?}",
        listed[0]
    );
    ensure!(
        case,
        listed[2].created == at(0),
        "the second write changed the timer: {:?}",
        listed[2]
    );
    let due = store
        .timers(&mine, Some(at(200)), 10)
        .await
        .or_fail(case, "timers before")?;
    ensure!(case, due.len() == 2, "due by 200 s: {due:?}");
    let first = store.timers(&mine, None, 1).await.or_fail(case, "timers limit")?;
    ensure!(
        case,
        first.len() == 1 && first[0].id == early.id,
        "limit 1: {first:?}"
    );
    let read = store.timer(&mine, &middle.id).await.or_fail(case, "timer")?;
    ensure!(
        case,
        read.is_some_and(|read| read.due == at(200)),
        "timer() of the middle one"
    );
    let elsewhere = store
        .timer(&other, &middle.id)
        .await
        .or_fail(case, "timer on another queue")?;
    ensure!(case, elsewhere.is_none(), "a timer was found under another queue");
    Ok(())
}

async fn a_claim_holds(store: &dyn TimerStore) -> CaseResult {
    let case = CASES[1];
    let q = queue(case);
    let new = timer(&q, at(100));
    store.put_timer(&new, at(0)).await.or_fail(case, "put_timer")?;
    let first = store
        .claim_timer(&q, &new.id, "a", at(100), at(400))
        .await
        .or_fail(case, "claim a")?;
    ensure!(case, first.is_some(), "the first claim failed");
    let second = store
        .claim_timer(&q, &new.id, "b", at(399), at(700))
        .await
        .or_fail(case, "claim b")?;
    ensure!(
        case,
        second.is_none(),
        "a second claim won while the first lasted"
    );
    let listed = store.timer(&q, &new.id).await.or_fail(case, "timer")?;
    ensure!(
        case,
        listed.is_some_and(|timer| timer.claimed_until == Some(at(400))),
        "the claim's end is not listed"
    );
    let moved = store
        .reschedule_timer(&q, &new.id, at(900))
        .await
        .or_fail(case, "reschedule")?;
    ensure!(
        case,
        moved == TimerChange::Sending,
        "reschedule during a claim: {moved:?}"
    );
    let cancelled = store.cancel_timer(&q, &new.id).await.or_fail(case, "cancel")?;
    ensure!(
        case,
        cancelled == TimerChange::Sending,
        "cancel during a claim: {cancelled:?}"
    );
    store
        .release_timer(&q, &new.id, "b", at(200))
        .await
        .or_fail(case, "release b")?;
    store
        .finish_timer(&q, &new.id, "b")
        .await
        .or_fail(case, "finish b")?;
    ensure!(
        case,
        store.timer(&q, &new.id).await.or_fail(case, "timer")?.is_some(),
        "another token's finish removed the timer"
    );
    let taken = store
        .claim_timer(&q, &new.id, "c", at(401), at(701))
        .await
        .or_fail(case, "claim c")?;
    ensure!(case, taken.is_some(), "a lapsed claim was not taken over");
    store
        .finish_timer(&q, &new.id, "a")
        .await
        .or_fail(case, "finish a")?;
    ensure!(
        case,
        store.timer(&q, &new.id).await.or_fail(case, "timer")?.is_some(),
        "the lapsed claim's finish removed the timer taken over"
    );
    store
        .finish_timer(&q, &new.id, "c")
        .await
        .or_fail(case, "finish c")?;
    ensure!(
        case,
        store.timer(&q, &new.id).await.or_fail(case, "timer")?.is_none(),
        "the holder's finish left the timer"
    );
    let after = store
        .cancel_timer(&q, &new.id)
        .await
        .or_fail(case, "cancel after")?;
    ensure!(
        case,
        after == TimerChange::NotFound,
        "cancel after the finish: {after:?}"
    );
    Ok(())
}

async fn changes_before_claims(store: &dyn TimerStore) -> CaseResult {
    let case = CASES[2];
    let q = queue(case);
    let moved = timer(&q, at(100));
    let cancelled = timer(&q, at(100));
    store.put_timer(&moved, at(0)).await.or_fail(case, "put_timer")?;
    store
        .put_timer(&cancelled, at(0))
        .await
        .or_fail(case, "put_timer")?;
    let answer = store
        .reschedule_timer(&q, &moved.id, at(500))
        .await
        .or_fail(case, "reschedule")?;
    ensure!(case, answer == TimerChange::Changed, "reschedule: {answer:?}");
    let due = store
        .timers(&q, Some(at(200)), 10)
        .await
        .or_fail(case, "timers")?;
    ensure!(
        case,
        due.iter().all(|timer| timer.id != moved.id),
        "a rescheduled timer is still listed at its old time"
    );
    let all = store.timers(&q, None, 10).await.or_fail(case, "timers")?;
    ensure!(
        case,
        all.last()
            .is_some_and(|timer| timer.id == moved.id && timer.due == at(500)),
        "the rescheduled timer: {all:?}"
    );
    let answer = store
        .cancel_timer(&q, &cancelled.id)
        .await
        .or_fail(case, "cancel")?;
    ensure!(case, answer == TimerChange::Changed, "cancel: {answer:?}");
    let claim = store
        .claim_timer(&q, &cancelled.id, "a", at(100), at(400))
        .await
        .or_fail(case, "claim")?;
    ensure!(case, claim.is_none(), "a cancelled timer was claimed");
    // A released claim (a failed send, which may still have reached the queue) lets a relay claim the
    // timer again at once, but allows no change.
    store
        .claim_timer(&q, &moved.id, "a", at(500), at(800))
        .await
        .or_fail(case, "claim moved")?;
    store
        .release_timer(&q, &moved.id, "a", at(501))
        .await
        .or_fail(case, "release")?;
    let answer = store
        .cancel_timer(&q, &moved.id)
        .await
        .or_fail(case, "cancel released")?;
    ensure!(
        case,
        answer == TimerChange::Sending,
        "cancel after a release: {answer:?}"
    );
    let again = store
        .claim_timer(&q, &moved.id, "b", at(502), at(802))
        .await
        .or_fail(case, "claim again")?;
    ensure!(case, again.is_some(), "a released claim held off the next relay");
    let missing = store
        .reschedule_timer(&q, "no-such-timer", at(1))
        .await
        .or_fail(case, "reschedule missing")?;
    ensure!(
        case,
        missing == TimerChange::NotFound,
        "reschedule of no timer: {missing:?}"
    );
    Ok(())
}

async fn message_whole(store: &dyn TimerStore) -> CaseResult {
    let case = CASES[3];
    let q = queue(case);
    let mut new = timer(&q, at(100));
    new.message.attributes.insert(
        "blob".to_owned(),
        AttributeValue {
            data_type: "Binary".to_owned(),
            string_value: None,
            binary_value: Some(vec![0, 1, 2, 255]),
        },
    );
    new.message
        .attributes
        .insert("tenant".to_owned(), AttributeValue::string("acme ☃"));
    new.message.group_id = Some("g-1".to_owned());
    new.message.trace_header = Some("Root=1-abc".to_owned());
    store.put_timer(&new, at(0)).await.or_fail(case, "put_timer")?;
    let claimed = store
        .claim_timer(&q, &new.id, "a", at(100), at(400))
        .await
        .or_fail(case, "claim")?
        .ok_or_else(|| SuiteFailure::new(case, "the claim failed"))?;
    ensure!(
        case,
        claimed.message == new.message,
        "kept {:?}, got {:?}",
        new.message,
        claimed.message
    );
    ensure!(case, claimed.timer.due == at(100), "due: {:?}", claimed.timer.due);
    Ok(())
}

async fn one_claim_wins(store: Arc<dyn TimerStore>) -> CaseResult {
    let case = CASES[4];
    let q = queue(case);
    let new = timer(&q, at(100));
    store.put_timer(&new, at(0)).await.or_fail(case, "put_timer")?;
    let claims = (0..8).map(|relay| {
        let store = Arc::clone(&store);
        let (q, id) = (q.clone(), new.id.clone());
        tokio::spawn(async move {
            store
                .claim_timer(&q, &id, &format!("relay-{relay}"), at(100), at(400))
                .await
        })
    });
    let mut won = 0;
    for claim in claims {
        let answer = claim
            .await
            .map_err(|error| SuiteFailure::new(case, format!("a claim task failed: {error}")))?
            .or_fail(case, "claim")?;
        won += usize::from(answer.is_some());
    }
    ensure!(case, won == 1, "{won} of 8 concurrent claims won");
    Ok(())
}
