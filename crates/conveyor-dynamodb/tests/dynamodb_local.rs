//! The store against DynamoDB Local (started by `localstack/start.sh`), one table per test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::port::payload_hash;
use conveyor_core::port::{Claim, ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus, StoreError};
use conveyor_dynamodb::{DynamoStore, OversizedOutput, StoreOptions};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

async fn store(prefix: &str) -> (Client, String, DynamoStore) {
    store_with(prefix, StoreOptions::default()).await
}

async fn store_with(prefix: &str, options: StoreOptions) -> (Client, String, DynamoStore) {
    let client = support::local_client().await.unwrap();
    let table = support::create_table(&client, prefix).await.unwrap();
    let store = DynamoStore::new(client.clone(), &table).with_options(options);
    (client, table, store)
}

fn request(key: &str, lease: Duration) -> ClaimRequest {
    let now = SystemTime::now();
    ClaimRequest {
        key: key.into(),
        lease_until: now + lease,
        expires_at: now + HOUR,
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

async fn acquire(store: &DynamoStore, request: &ClaimRequest) -> Claim {
    match store.claim(request).await.unwrap() {
        ClaimOutcome::Acquired(claim) => claim,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn existing(store: &DynamoStore, request: &ClaimRequest) -> conveyor_core::port::IdempotencyRecord {
    match store.claim(request).await.unwrap() {
        ClaimOutcome::Exists(record) => record,
        other => panic!("expected Exists, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_twenty_concurrent_claimants_exactly_one_acquires() {
    let (_, _, store) = store("race").await;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&request("conveyor:race#one", MINUTE)).await.unwrap()
        }));
    }
    let mut winners = Vec::new();
    let mut others = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            ClaimOutcome::Acquired(claim) => winners.push(claim),
            ClaimOutcome::Exists(record) => others.push(record),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claimant may win");
    assert_eq!(others.len(), 19);
    for record in &others {
        assert_eq!(record.status, RecordStatus::InProgress);
        assert_eq!(record.token, Some(winners[0].token), "the winner's record");
        assert!(record.lease_until.is_some());
    }
    assert_eq!(store.requests(), 20, "one request per claimant, no reads");
}

#[tokio::test]
async fn a_lapsed_lease_is_taken_over_and_the_stale_owner_is_fenced() {
    let (_, _, store) = store("takeover").await;
    let key = "conveyor:takeover#1";
    let mut stale_request = request(key, MINUTE);
    stale_request.lease_until = SystemTime::now() - Duration::from_secs(1);
    let stale = acquire(&store, &stale_request).await;

    let fresh = acquire(&store, &request(key, MINUTE)).await;
    assert!(fresh.token > stale.token);

    let fenced = Err(StoreError::Fenced { key: key.into() });
    assert_eq!(
        store
            .complete(&stale, Some("{\"stale\":true}"), SystemTime::now() + HOUR)
            .await,
        fenced
    );
    assert_eq!(store.release(&stale).await, fenced);
    assert_eq!(store.extend_lease(&stale, SystemTime::now() + HOUR).await, fenced);

    let record = store.get(key).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(record.token, Some(fresh.token));
    assert_eq!(record.output, None);
    store
        .complete(&fresh, Some("{\"fresh\":true}"), SystemTime::now() + HOUR)
        .await
        .unwrap();
    let record = store.get(key).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output.as_deref(), Some("{\"fresh\":true}"));
}

#[tokio::test]
async fn a_live_lease_is_not_taken_over() {
    let (_, _, store) = store("live").await;
    let key = "conveyor:live#1";
    let owner = acquire(&store, &request(key, MINUTE)).await;
    let record = existing(&store, &request(key, MINUTE)).await;
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(record.token, Some(owner.token));
}

#[tokio::test]
async fn a_duplicate_of_a_completed_job_gets_the_stored_output() {
    let (_, _, store) = store("done").await;
    let key = "conveyor:done#1";
    let claim = acquire(&store, &request(key, MINUTE)).await;
    let expires_at = SystemTime::now() + HOUR;
    store
        .complete(&claim, Some(r#"{"sent":true}"#), expires_at)
        .await
        .unwrap();
    let before = store.requests();

    let record = existing(&store, &request(key, MINUTE)).await;

    assert_eq!(store.requests() - before, 1, "a duplicate costs one request");
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output.as_deref(), Some(r#"{"sent":true}"#));
    let expected_secs = expires_at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(record.expires_at, UNIX_EPOCH + Duration::from_secs(expected_secs));
}

#[tokio::test]
async fn a_different_payload_comes_back_with_the_stored_validation() {
    let (_, _, store) = store("validation").await;
    let key = "conveyor:validation#1";
    let mut first = request(key, MINUTE);
    first.validation = Some(payload_hash("{\"amount\":10}"));
    let claim = acquire(&store, &first).await;
    store
        .complete(&claim, Some("{}"), SystemTime::now() + HOUR)
        .await
        .unwrap();

    let mut second = request(key, MINUTE);
    second.validation = Some(payload_hash("{\"amount\":99}"));
    let record = existing(&store, &second).await;

    assert_eq!(
        record.validation, first.validation,
        "the pipeline refuses on this mismatch"
    );
    assert_ne!(record.validation, second.validation);
}

#[tokio::test]
async fn an_expired_record_that_ttl_has_not_deleted_is_claimable() {
    let (client, table, store) = store("expired").await;
    let key = "conveyor:expired#1";
    let an_hour_ago = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() - 3600;
    client
        .put_item()
        .table_name(&table)
        .item("id", AttributeValue::S(key.into()))
        .item("status", AttributeValue::S("COMPLETED".into()))
        .item("expiration", AttributeValue::N(an_hour_ago.to_string()))
        .item("data", AttributeValue::S("{\"old\":true}".into()))
        .send()
        .await
        .unwrap();

    let claim = acquire(&store, &request(key, MINUTE)).await;

    let record = store.get(key).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(record.token, Some(claim.token));
    assert_eq!(record.output, None, "the claim replaced the old item");
}

#[tokio::test]
async fn a_released_key_can_be_claimed_again() {
    let (_, _, store) = store("release").await;
    let key = "conveyor:release#1";
    let first = acquire(&store, &request(key, MINUTE)).await;
    store.release(&first).await.unwrap();
    let released = store.get(key).await.unwrap().unwrap();
    assert!(released.is_free_at(SystemTime::now()), "{released:?}");
    assert_eq!(
        released.token,
        Some(first.token + 1),
        "the release moved the token past ours"
    );
    let second = acquire(&store, &request(key, MINUTE)).await;
    assert_eq!(
        second.token,
        first.token + 2,
        "the counter keeps counting across a release"
    );
}

#[tokio::test]
async fn extending_moves_the_lease_and_stops_after_completion() {
    let (_, _, store) = store("extend").await;
    let key = "conveyor:extend#1";
    let claim = acquire(&store, &request(key, MINUTE)).await;
    let later = UNIX_EPOCH + Duration::from_millis(4_102_444_800_123);
    store.extend_lease(&claim, later).await.unwrap();
    assert_eq!(store.get(key).await.unwrap().unwrap().lease_until, Some(later));

    store
        .complete(&claim, None, SystemTime::now() + HOUR)
        .await
        .unwrap();
    assert_eq!(
        store.extend_lease(&claim, later).await,
        Err(StoreError::Fenced { key: key.into() }),
        "a completed record's lease is not extended"
    );
}

#[tokio::test]
async fn an_unreachable_store_is_unavailable_within_seconds() {
    let client = support::client_for("http://127.0.0.1:1");
    let store = DynamoStore::new(client, "nowhere");
    let started = Instant::now();

    let error = store
        .claim(&request("conveyor:down#1", MINUTE))
        .await
        .unwrap_err();

    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_missing_table_is_misconfigured_with_directions() {
    let client = support::local_client().await.unwrap();
    let table = support::unique_name("missing");
    let store = DynamoStore::new(client, &table);
    let error = store.claim(&request("k", MINUTE)).await.unwrap_err();
    let StoreError::Misconfigured { message } = error else {
        panic!("expected Misconfigured, got {error:?}");
    };
    assert!(message.contains(&table), "{message}");
    assert!(message.contains("infra/modules/idempotency-table"), "{message}");
}

#[tokio::test]
async fn a_malformed_record_is_misconfigured_and_names_the_key() {
    let (client, table, store) = store("malformed").await;
    let key = "conveyor:malformed#1";
    client
        .put_item()
        .table_name(&table)
        .item("id", AttributeValue::S(key.into()))
        .item("status", AttributeValue::S("DONE".into()))
        .item("expiration", AttributeValue::N("4102444800".into()))
        .send()
        .await
        .unwrap();
    let error = store.claim(&request(key, MINUTE)).await.unwrap_err();
    let StoreError::Misconfigured { message } = error else {
        panic!("expected Misconfigured, got {error:?}");
    };
    assert!(message.contains(key), "{message}");
    assert!(message.contains("DONE"), "{message}");
}

#[tokio::test]
async fn an_oversized_output_is_omitted_or_refused() {
    let output = "x".repeat(500 * 1024);

    let (_, _, omitting) = store("omit").await;
    let key = "conveyor:big#1";
    let claim = acquire(&omitting, &request(key, MINUTE)).await;
    omitting
        .complete(&claim, Some(&output), SystemTime::now() + HOUR)
        .await
        .unwrap();
    let record = omitting.get(key).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output, None);

    let refusing_options = StoreOptions::default().with_oversized_output(OversizedOutput::Error);
    let (_, _, refusing) = store_with("refuse", refusing_options).await;
    let claim = acquire(&refusing, &request(key, MINUTE)).await;
    let error = refusing
        .complete(&claim, Some(&output), SystemTime::now() + HOUR)
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::OutputTooLarge { size, .. } if size == output.len()),
        "{error:?}"
    );
    let record = refusing.get(key).await.unwrap().unwrap();
    assert_eq!(
        record.status,
        RecordStatus::InProgress,
        "a refused complete changes nothing"
    );
}

#[tokio::test]
async fn an_output_just_under_the_limit_is_stored() {
    let (_, _, store) = store("fits").await;
    let key = "conveyor:fits#1";
    let output = "y".repeat(399 * 1024);
    let claim = acquire(&store, &request(key, MINUTE)).await;
    store
        .complete(&claim, Some(&output), SystemTime::now() + HOUR)
        .await
        .unwrap();
    let record = store.get(key).await.unwrap().unwrap();
    assert_eq!(record.output.map(|o| o.len()), Some(output.len()));
}

#[tokio::test]
async fn the_cache_answers_completed_duplicates_without_a_request() {
    let options = StoreOptions::default().with_completed_cache(Some(100));
    let (_, _, store) = store_with("cache", options).await;
    let key = "conveyor:cache#1";
    let mut first = request(key, MINUTE);
    first.validation = Some(payload_hash("body"));
    let claim = acquire(&store, &first).await;
    store
        .complete(&claim, Some("{\"n\":1}"), SystemTime::now() + HOUR)
        .await
        .unwrap();
    let before = store.requests();

    let record = existing(&store, &request(key, MINUTE)).await;

    assert_eq!(store.requests(), before, "answered from the cache");
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.output.as_deref(), Some("{\"n\":1}"));
    assert_eq!(
        record.validation, first.validation,
        "the cached record keeps its validation"
    );
}

#[tokio::test]
async fn the_cache_learns_from_duplicates_and_never_holds_in_progress_records() {
    let options = StoreOptions::default().with_completed_cache(Some(100));
    let (client, table, store) = store_with("cache-learn", options).await;
    // Completed by another process: this store learns it from its first duplicate.
    let other = DynamoStore::new(client, &table);
    let key = "conveyor:cache#2";
    let claim = acquire(&other, &request(key, MINUTE)).await;

    let in_progress = existing(&store, &request(key, MINUTE)).await;
    assert_eq!(in_progress.status, RecordStatus::InProgress);
    other
        .complete(&claim, Some("{}"), SystemTime::now() + HOUR)
        .await
        .unwrap();

    let requests = store.requests();
    assert_eq!(
        existing(&store, &request(key, MINUTE)).await.status,
        RecordStatus::Completed
    );
    assert_eq!(
        store.requests(),
        requests + 1,
        "the in-progress record was not cached"
    );
    assert_eq!(
        existing(&store, &request(key, MINUTE)).await.status,
        RecordStatus::Completed
    );
    assert_eq!(store.requests(), requests + 1, "the completed one was");
}

#[tokio::test]
async fn the_cache_respects_expiry() {
    let options = StoreOptions::default().with_completed_cache(Some(100));
    let (_, _, store) = store_with("cache-expiry", options).await;
    let key = "conveyor:cache#3";
    let claim = acquire(&store, &request(key, MINUTE)).await;
    // Already expired when written: the cache must not answer, and the table lets a new claim in.
    store
        .complete(&claim, Some("{}"), SystemTime::now() - Duration::from_secs(5))
        .await
        .unwrap();
    let before = store.requests();
    let again = acquire(&store, &request(key, MINUTE)).await;
    assert!(again.token > claim.token);
    // The claim, and the write that starts the expired record's run count again (never the cache).
    assert_eq!(store.requests(), before + 2);
    assert_eq!(again.run, 1, "an expired record's runs start again");
}

/// The item Conveyor writes, as DynamoDB holds it.
pub async fn raw_item(client: &Client, table: &str, key: &str) -> HashMap<String, AttributeValue> {
    client
        .get_item()
        .table_name(table)
        .key("id", AttributeValue::S(key.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap()
}

#[tokio::test]
async fn a_claim_writes_the_validation_and_token() {
    let (client, table, store) = store("raw").await;
    let key = "conveyor:raw#1";
    let mut claim_request = request(key, MINUTE);
    claim_request.validation = Some(payload_hash("body"));
    let claim = acquire(&store, &claim_request).await;
    let item = raw_item(&client, &table, key).await;
    assert_eq!(item["validation"], AttributeValue::S(payload_hash("body")));
    assert_eq!(item["fence"], AttributeValue::N(claim.token.to_string()));
}
