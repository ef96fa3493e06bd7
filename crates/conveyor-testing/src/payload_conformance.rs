//! The payload store conformance suite: the [`PayloadStore`] port's contracts, checked against any
//! backend (the in-memory double and S3 on LocalStack). Cases use fresh random keys in one bucket, which
//! must exist; `missing_bucket` must not.

use conveyor_core::port::{PayloadError, PayloadStore};

use crate::suite::{Case, CaseResult, SuiteFailure, SuiteFailures, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "put_then_get_returns_the_same_bytes",
    "a_five_mib_payload_round_trips",
    "a_missing_key_is_not_found_naming_bucket_and_key",
    "delete_removes_and_a_second_delete_succeeds",
    "put_replaces",
    "a_missing_bucket_is_misconfigured",
];

/// Runs every case against `store` in `bucket`; `missing_bucket` names a bucket that does not exist.
pub async fn run_all(
    store: &dyn PayloadStore,
    bucket: &str,
    missing_bucket: &str,
) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (
            "put_then_get_returns_the_same_bytes",
            Box::pin(put_then_get_returns_the_same_bytes(store, bucket)),
        ),
        (
            "a_five_mib_payload_round_trips",
            Box::pin(a_five_mib_payload_round_trips(store, bucket)),
        ),
        (
            "a_missing_key_is_not_found_naming_bucket_and_key",
            Box::pin(a_missing_key_is_not_found_naming_bucket_and_key(store, bucket)),
        ),
        (
            "delete_removes_and_a_second_delete_succeeds",
            Box::pin(delete_removes_and_a_second_delete_succeeds(store, bucket)),
        ),
        ("put_replaces", Box::pin(put_replaces(store, bucket))),
        (
            "a_missing_bucket_is_misconfigured",
            Box::pin(a_missing_bucket_is_misconfigured(store, missing_bucket)),
        ),
    ];
    run_cases("payload", CASES, cases).await
}

fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn fail(case: &'static str, message: impl Into<String>) -> SuiteFailure {
    SuiteFailure::new(case, message)
}

/// Puts `body` at `key` and reads it back unchanged.
async fn round_trip(
    case: &'static str,
    store: &dyn PayloadStore,
    bucket: &str,
    key: &str,
    body: Vec<u8>,
) -> CaseResult {
    store
        .put(bucket, key, body.clone())
        .await
        .map_err(|error| fail(case, format!("put failed: {error}")))?;
    let got = store
        .get(bucket, key)
        .await
        .map_err(|error| fail(case, format!("get failed: {error}")))?;
    if got != body {
        return Err(fail(
            case,
            format!("got {} bytes back, expected {}", got.len(), body.len()),
        ));
    }
    Ok(())
}

/// Bytes that are not all ASCII (a body is UTF-8 text, often with multi-byte characters).
pub(crate) async fn put_then_get_returns_the_same_bytes(
    store: &dyn PayloadStore,
    bucket: &str,
) -> CaseResult {
    const CASE: &str = "put_then_get_returns_the_same_bytes";
    let body = "{\"name\":\"Zoë\",\"emoji\":\"📦\"}".as_bytes().to_vec();
    round_trip(CASE, store, bucket, &key(), body).await
}

/// The size the issue names.
pub(crate) async fn a_five_mib_payload_round_trips(store: &dyn PayloadStore, bucket: &str) -> CaseResult {
    const CASE: &str = "a_five_mib_payload_round_trips";
    let key = key();
    let body: Vec<u8> = (0..5 * 1024 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    round_trip(CASE, store, bucket, &key, body).await?;
    store
        .delete(bucket, &key)
        .await
        .map_err(|error| fail(CASE, format!("delete failed: {error}")))
}

/// `NotFound` carries the bucket and key, so the failure reason can name them.
pub(crate) async fn a_missing_key_is_not_found_naming_bucket_and_key(
    store: &dyn PayloadStore,
    bucket: &str,
) -> CaseResult {
    const CASE: &str = "a_missing_key_is_not_found_naming_bucket_and_key";
    let key = key();
    match store.get(bucket, &key).await {
        Err(PayloadError::NotFound {
            bucket: got_bucket,
            key: got_key,
        }) if got_bucket == bucket && got_key == key => Ok(()),
        other => Err(fail(
            CASE,
            format!("expected NotFound {{ {bucket}, {key} }}, got {other:?}"),
        )),
    }
}

/// A deleted object is gone; deleting it again succeeds (as S3's `DeleteObject`).
pub(crate) async fn delete_removes_and_a_second_delete_succeeds(
    store: &dyn PayloadStore,
    bucket: &str,
) -> CaseResult {
    const CASE: &str = "delete_removes_and_a_second_delete_succeeds";
    let key = key();
    store
        .put(bucket, &key, b"x".to_vec())
        .await
        .map_err(|error| fail(CASE, format!("put failed: {error}")))?;
    store
        .delete(bucket, &key)
        .await
        .map_err(|error| fail(CASE, format!("delete failed: {error}")))?;
    match store.get(bucket, &key).await {
        Err(PayloadError::NotFound { .. }) => {}
        other => {
            return Err(fail(
                CASE,
                format!("after delete, expected NotFound, got {other:?}"),
            ));
        }
    }
    store
        .delete(bucket, &key)
        .await
        .map_err(|error| fail(CASE, format!("a second delete failed: {error}")))
}

/// A second put to the same key replaces the object.
pub(crate) async fn put_replaces(store: &dyn PayloadStore, bucket: &str) -> CaseResult {
    const CASE: &str = "put_replaces";
    let key = key();
    for body in [b"first".to_vec(), b"second".to_vec()] {
        store
            .put(bucket, &key, body)
            .await
            .map_err(|error| fail(CASE, format!("put failed: {error}")))?;
    }
    match store.get(bucket, &key).await {
        Ok(body) if body == b"second" => Ok(()),
        other => Err(fail(CASE, format!("expected the second body, got {other:?}"))),
    }
}

/// A bucket that does not exist is a configuration error (never `NotFound`, which dead-letters a job).
pub(crate) async fn a_missing_bucket_is_misconfigured(
    store: &dyn PayloadStore,
    missing_bucket: &str,
) -> CaseResult {
    const CASE: &str = "a_missing_bucket_is_misconfigured";
    match store.get(missing_bucket, &key()).await {
        Err(PayloadError::Misconfigured { message }) if message.contains(missing_bucket) => Ok(()),
        other => Err(fail(
            CASE,
            format!("expected Misconfigured naming {missing_bucket}, got {other:?}"),
        )),
    }
}
