//! What every [`ScheduleStore`] must do with pauses and removals, checked on the memory store and on
//! [`TickStore`] against DynamoDB Local: pauses are intervals the cursor steps over however many there
//! are between two looks of the leader, and removing a run-time schedule deletes its state, so one
//! added again under the same name starts fresh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use conveyor_schedule::{Advance, MemoryScheduleStore, ScheduleStore, TickStore};
use conveyor_testing::localstack;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn sent(tick: SystemTime) -> Advance {
    Advance {
        tick,
        count_run: true,
        fired_at: Some(tick),
        outcome: "sent m-1".to_owned(),
        history: Vec::new(),
    }
}

/// Every 30 s from T = 0: paused at 35, resumed at 70, paused at 75, resumed at 80, and no look of
/// the leader in between (the issue's measured case). The 60 s tick lies in the first pause.
async fn two_pauses_between_two_looks_are_both_kept(store: &dyn ScheduleStore, name: &str) {
    assert!(store.advance(name, &sent(at(30)), None).await.unwrap());
    store.pause(name, at(35)).await.unwrap();
    store.resume(name, at(70)).await.unwrap();
    store.pause(name, at(75)).await.unwrap();
    store.resume(name, at(80)).await.unwrap();
    let state = store.state(name).await.unwrap();
    assert!(!state.paused, "{state:?}");
    assert!(
        state.in_pause(at(60)),
        "the first pause's tick is skipped: {state:?}"
    );
    assert!(state.in_pause(at(78)), "the second pause's: {state:?}");
    assert!(
        !state.in_pause(at(72)),
        "between the pauses ticks fire: {state:?}"
    );
    assert!(!state.in_pause(at(90)), "after the resume ticks fire: {state:?}");
    // A resume of a schedule not paused changes nothing.
    store.resume(name, at(85)).await.unwrap();
    assert_eq!(store.state(name).await.unwrap(), state);
}

/// A run-time schedule with `max_runs` 1 fired once, removed, and added again: it starts fresh.
async fn a_removed_schedule_added_again_starts_fresh(store: &dyn ScheduleStore, name: &str) {
    store.put_definition("default", name, "{}").await.unwrap();
    assert!(store.advance(name, &sent(at(30)), Some(1)).await.unwrap());
    store.pause(name, at(40)).await.unwrap();
    store.remove_definition("default", name).await.unwrap();
    assert_eq!(
        store.state(name).await.unwrap(),
        conveyor_schedule::ScheduleState::default(),
        "remove deletes the state"
    );
    assert!(!store.definitions("default").await.unwrap().contains_key(name));
    // A leader that had not reloaded yet served it once more, after the removal.
    assert!(store.advance(name, &sent(at(60)), Some(1)).await.unwrap());
    store.put_definition("default", name, "{}").await.unwrap();
    let state = store.state(name).await.unwrap();
    assert_eq!(
        (state.runs, state.last_tick),
        (0, None),
        "added again: fresh {state:?}"
    );
    assert!(
        store.advance(name, &sent(at(90)), Some(1)).await.unwrap(),
        "it fires again"
    );
    // Replacing a schedule that is in the set keeps its state.
    store
        .put_definition("default", name, r#"{"replaced":true}"#)
        .await
        .unwrap();
    assert_eq!(store.state(name).await.unwrap().runs, 1);
    // Removing a name the set does not hold leaves that name's state alone (a code schedule's).
    assert!(store.advance("code-only", &sent(at(30)), None).await.unwrap());
    store.remove_definition("default", "code-only").await.unwrap();
    assert_eq!(store.state("code-only").await.unwrap().runs, 1);
}

#[tokio::test]
async fn the_memory_store_keeps_every_pause_and_forgets_a_removed_schedule() {
    let store = MemoryScheduleStore::new();
    two_pauses_between_two_looks_are_both_kept(&store, "pauses").await;
    a_removed_schedule_added_again_starts_fresh(&store, "readded").await;
}

#[tokio::test]
async fn the_dynamodb_store_keeps_every_pause_and_forgets_a_removed_schedule() {
    localstack::ensure_local_aws().await.unwrap();
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "sched-conf").await.unwrap();
    let store = TickStore::new(dynamodb, &table);
    two_pauses_between_two_looks_are_both_kept(&store, "pauses").await;
    a_removed_schedule_added_again_starts_fresh(&store, "readded").await;
}
