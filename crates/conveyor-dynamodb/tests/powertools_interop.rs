//! One table shared with AWS Lambda Powertools: records Powertools wrote are understood, and the records
//! Conveyor writes have exactly Powertools' attribute names and types (plus `fence`).
//!
//! The items come from `fixtures/powertools-idempotency-record.json`, captured on 2026-11-29 from
//! Powertools for Python 3.37.0 against DynamoDB Local 3.3.1; only their times are refreshed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

mod support;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::port::{ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus};
use conveyor_dynamodb::DynamoStore;
use serde_json::Value;

type Item = HashMap<String, AttributeValue>;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/powertools-idempotency-record.json")).unwrap()
}

/// A fixture item as the SDK's typed values (the fixture only uses S and N).
fn typed(item: &Value) -> Item {
    item.as_object()
        .unwrap()
        .iter()
        .map(|(name, value)| {
            let (kind, text) = value.as_object().unwrap().iter().next().unwrap();
            let text = text.as_str().unwrap().to_owned();
            let value = match kind.as_str() {
                "S" => AttributeValue::S(text),
                "N" => AttributeValue::N(text),
                other => panic!("unexpected type {other} in the fixture"),
            };
            (name.clone(), value)
        })
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn now_millis() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The fixture's item with fresh times: expiry in an hour, the lease `lease_offset_ms` from now.
fn powertools_item(which: &str, lease_offset_ms: i64) -> Item {
    let mut item = typed(&fixture()[which]);
    item.insert(
        "expiration".into(),
        AttributeValue::N((now_secs() + 3600).to_string()),
    );
    let lease = now_millis().checked_add_signed(lease_offset_ms).unwrap();
    item.insert(
        "in_progress_expiration".into(),
        AttributeValue::N(lease.to_string()),
    );
    item
}

async fn put_raw(client: &Client, table: &str, item: Item) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
}

fn request(key: &str) -> ClaimRequest {
    let now = SystemTime::now();
    ClaimRequest {
        key: key.into(),
        lease_until: now + Duration::from_secs(60),
        expires_at: now + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

fn powertools_key() -> String {
    fixture()["key_derivation"]["id"].as_str().unwrap().to_owned()
}

async fn setup(prefix: &str) -> (Client, String, DynamoStore) {
    let client = support::local_client().await.unwrap();
    let table = support::create_table(&client, prefix).await.unwrap();
    let store = DynamoStore::new(client.clone(), &table);
    (client, table, store)
}

#[tokio::test]
async fn a_powertools_completed_record_is_a_duplicate_with_its_data() {
    let (client, table, store) = setup("pt-completed").await;
    let item = powertools_item("item_completed", -60_000);
    let expiration = item["expiration"].as_n().unwrap().parse::<u64>().unwrap();
    put_raw(&client, &table, item).await;

    let outcome = store.claim(&request(&powertools_key())).await.unwrap();

    let ClaimOutcome::Exists(record) = outcome else {
        panic!("expected Exists, got {outcome:?}");
    };
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(
        record.output.as_deref(),
        Some(r#"{"messageId": "f03c5386-ffaa-4261-84fe-68fdd7caeb19", "ok": true}"#)
    );
    assert_eq!(record.expires_at, UNIX_EPOCH + Duration::from_secs(expiration));
    assert_eq!(record.token, None);
    assert_eq!(store.requests(), 1);
}

#[tokio::test]
async fn a_powertools_in_progress_record_holds_until_its_lease() {
    let (client, table, store) = setup("pt-inprogress").await;
    let item = powertools_item("item_inprogress", 60_000);
    let lease = item["in_progress_expiration"]
        .as_n()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    put_raw(&client, &table, item).await;

    let outcome = store.claim(&request(&powertools_key())).await.unwrap();

    let ClaimOutcome::Exists(record) = outcome else {
        panic!("expected Exists, got {outcome:?}");
    };
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(
        record.lease_until,
        Some(UNIX_EPOCH + Duration::from_millis(lease))
    );
}

#[tokio::test]
async fn a_powertools_in_progress_record_with_a_lapsed_lease_is_taken_over() {
    let (client, table, store) = setup("pt-lapsed").await;
    put_raw(&client, &table, powertools_item("item_inprogress", -1_000)).await;

    let outcome = store.claim(&request(&powertools_key())).await.unwrap();

    assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
}

#[tokio::test]
async fn a_powertools_in_progress_record_without_a_lease_holds_until_it_expires() {
    // Powertools outside Lambda writes no in_progress_expiration; its condition then only frees the
    // record at `expiration`, and so does ours.
    let (client, table, store) = setup("pt-nolease").await;
    let mut item = powertools_item("item_inprogress", 0);
    item.remove("in_progress_expiration");
    put_raw(&client, &table, item).await;

    let outcome = store.claim(&request(&powertools_key())).await.unwrap();

    let ClaimOutcome::Exists(record) = outcome else {
        panic!("expected Exists, got {outcome:?}");
    };
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(record.lease_until, None);
}

fn kinds(item: &Item) -> Vec<(String, &'static str)> {
    let mut kinds: Vec<_> = item
        .iter()
        .map(|(name, value)| {
            let kind = match value {
                AttributeValue::S(_) => "S",
                AttributeValue::N(_) => "N",
                _ => "other",
            };
            (name.clone(), kind)
        })
        .collect();
    kinds.sort();
    kinds
}

#[tokio::test]
async fn a_conveyor_record_has_powertools_names_and_types_plus_the_token() {
    let (client, table, store) = setup("pt-layout").await;
    let key = "conveyor:email#user:42";
    let before_secs = now_secs();
    let claim = match store.claim(&request(key)).await.unwrap() {
        ClaimOutcome::Acquired(claim) => claim,
        other => panic!("expected Acquired, got {other:?}"),
    };
    store
        .complete(
            &claim,
            Some(r#"{"ok": true}"#),
            SystemTime::now() + Duration::from_secs(3600),
        )
        .await
        .unwrap();

    let item = client
        .get_item()
        .table_name(&table)
        .key("id", AttributeValue::S(key.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();

    // Powertools' completed item, attribute for attribute, plus Conveyor's token and run count.
    let mut expected = kinds(&typed(&fixture()["item_completed"]));
    expected.push(("fence".into(), "N"));
    expected.push(("runs".into(), "N"));
    expected.sort();
    assert_eq!(kinds(&item), expected);
    assert_eq!(item["id"].as_s().unwrap(), key);
    assert_eq!(item["status"].as_s().unwrap(), "COMPLETED");
    assert_eq!(item["data"].as_s().unwrap(), r#"{"ok": true}"#);
    assert_eq!(item["fence"].as_n().unwrap(), &claim.token.to_string());
    assert_eq!(item["runs"].as_n().unwrap(), "1");
    let expiration: u64 = item["expiration"].as_n().unwrap().parse().unwrap();
    assert!(
        (before_secs + 3590..=before_secs + 3610).contains(&expiration),
        "expiration must be epoch seconds: {expiration}"
    );
    let lease: u64 = item["in_progress_expiration"].as_n().unwrap().parse().unwrap();
    assert!(
        (before_secs * 1000 + 50_000..=before_secs * 1000 + 70_000).contains(&lease),
        "in_progress_expiration must be epoch milliseconds: {lease}"
    );
}
