//! Request shapes, checked with aws-smithy-mocks: the claim is one UpdateItem under Powertools' exact
//! condition that also increases the fencing token, a duplicate costs one request, and
//! complete/release/extend are fenced on the token.
//!
//! The fixture `fixtures/powertools-idempotency-record.json` was captured on 2026-11-29 from AWS Lambda
//! Powertools for Python 3.37.0 against DynamoDB Local 3.3.1 (see its `what` and `versions` fields).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{Config, Region};
use aws_sdk_dynamodb::operation::get_item::{GetItemInput, GetItemOutput};
use aws_sdk_dynamodb::operation::update_item::{UpdateItemError, UpdateItemInput, UpdateItemOutput};
use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_mocks::{
    MockResponse, MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock,
};
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_types::body::SdkBody;
use conveyor_core::port::{Claim, ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus, StoreError};
use conveyor_dynamodb::{DynamoStore, OversizedOutput, StoreOptions};
use serde_json::Value;

const TABLE: &str = "jobs-idempotency";

fn fixture() -> Value {
    let text = include_str!("fixtures/powertools-idempotency-record.json");
    serde_json::from_str(text).unwrap()
}

fn powertools_put() -> Value {
    fixture()["requests_first_invocation"][0]["request"].clone()
}

/// A client that answers from `rules` and never retries.
fn mock_client(rules: &[&Rule]) -> Client {
    let mut interceptor = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for rule in rules {
        interceptor = interceptor.with_rule(rule);
    }
    let config = Config::builder()
        .with_test_defaults()
        .region(Region::new("us-east-1"))
        .retry_config(RetryConfig::disabled())
        .http_client(create_mock_http_client())
        .interceptor(interceptor)
        .build();
    Client::from_conf(config)
}

/// Records each input a rule sees.
fn recorder<I>() -> (Arc<Mutex<Vec<I>>>, impl Fn(&I) + Send + Sync + 'static)
where
    I: Clone + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    (seen, move |input: &I| sink.lock().unwrap().push(input.clone()))
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

fn names_of(names: Option<&HashMap<String, String>>) -> HashMap<String, String> {
    names.cloned().unwrap_or_default()
}

fn json_names(value: &Value) -> HashMap<String, String> {
    value
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

fn n(value: &AttributeValue) -> u64 {
    value.as_n().unwrap().parse().unwrap()
}

fn s(value: &AttributeValue) -> &str {
    value.as_s().unwrap()
}

fn epoch_secs_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A 400 response in DynamoDB's JSON protocol; `item` is raw typed JSON as DynamoDB sends it.
fn conditional_check_failed_response(item: Option<&Value>) -> Response {
    let mut body = serde_json::json!({
        "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
        "message": "The conditional request failed",
    });
    if let Some(item) = item {
        body["Item"] = item.clone();
    }
    Response::new(
        StatusCode::try_from(400).unwrap(),
        SdkBody::from(body.to_string()),
    )
}

#[tokio::test]
async fn the_claim_is_powertools_condition_on_one_update_that_increases_the_token() {
    let (seen, record) = recorder::<UpdateItemInput>();
    // UPDATED_OLD: the values the claim replaced (a released record: its token and run count).
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(
            UpdateItemOutput::builder()
                .attributes("fence", AttributeValue::N("1796000000122".into()))
                .attributes("runs", AttributeValue::N("2".into()))
                .build(),
        )
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);
    let mut claim = request("conveyor:email#user:42");
    claim.validation = Some("hash".into());
    let before = epoch_secs_now();
    let outcome = store.claim(&claim).await.unwrap();
    let ClaimOutcome::Acquired(held) = outcome else {
        panic!("expected Acquired, got {outcome:?}");
    };
    assert_eq!(
        held.token, 1_796_000_000_123,
        "the token is the one DynamoDB computed: the old one + 1"
    );
    assert_eq!(held.run, 3, "the run is the old count + 1");
    assert_eq!(store.requests(), 1);

    let seen = seen.lock().unwrap();
    let input = &seen[0];
    let reference = powertools_put();
    assert_eq!(input.table_name(), Some(TABLE));
    assert_eq!(
        input.condition_expression(),
        reference["ConditionExpression"].as_str(),
        "the claim condition must be Powertools' own"
    );
    assert_eq!(
        input.update_expression(),
        Some(
            "SET #status = :inprogress, #expiry = :expiry, #in_progress_expiry = :in_progress_expiry, \
             #token = if_not_exists(#token, :fence_base) + :one, #runs = if_not_exists(#runs, :zero) + :one, \
             #validation = :validation REMOVE #response_data, #last_attempt"
        )
    );
    let mut expected_names = json_names(&reference["ExpressionAttributeNames"]);
    expected_names.insert("#token".into(), "fence".into());
    expected_names.insert("#runs".into(), "runs".into());
    expected_names.insert("#response_data".into(), "data".into());
    expected_names.insert("#last_attempt".into(), "last_attempt".into());
    expected_names.insert("#validation".into(), "validation".into());
    assert_eq!(names_of(input.expression_attribute_names()), expected_names);
    assert_eq!(
        input.return_values_on_condition_check_failure(),
        Some(&ReturnValuesOnConditionCheckFailure::AllOld)
    );
    assert_eq!(input.return_values(), Some(&ReturnValue::UpdatedOld));
    let values = input.expression_attribute_values().unwrap();
    let mut value_names: Vec<_> = values.keys().cloned().collect();
    value_names.sort();
    assert_eq!(
        value_names,
        [
            ":expiry",
            ":fence_base",
            ":in_progress_expiry",
            ":inprogress",
            ":now",
            ":now_in_millis",
            ":one",
            ":validation",
            ":zero"
        ]
    );
    assert_eq!(s(&values[":inprogress"]), "INPROGRESS");
    let now = n(&values[":now"]);
    assert!((before..=before + 2).contains(&now), "{now} is not epoch seconds");
    assert_eq!(
        n(&values[":now_in_millis"]) / 1000,
        now,
        ":now_in_millis is not epoch millis"
    );
    assert_eq!(n(&values[":fence_base"]), n(&values[":now_in_millis"]));
    assert_eq!(n(&values[":one"]), 1);
    assert_eq!(s(&values[":validation"]), "hash");
    assert_eq!(
        input.key().unwrap()["id"],
        AttributeValue::S("conveyor:email#user:42".into())
    );
    let expiration = n(&values[":expiry"]);
    assert!(
        (now + 3599..=now + 3601).contains(&expiration),
        "expiration is not epoch seconds"
    );
    let lease = n(&values[":in_progress_expiry"]);
    assert!(
        (now * 1000 + 59_000..=now * 1000 + 62_000).contains(&lease),
        "in_progress_expiration is not epoch millis"
    );
}

#[tokio::test]
async fn a_claim_without_validation_removes_a_stale_one() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(
            UpdateItemOutput::builder()
                .attributes("fence", AttributeValue::N("7".into()))
                .build(),
        )
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);
    store.claim(&request("k")).await.unwrap();
    let expression = seen.lock().unwrap()[0].update_expression().unwrap().to_owned();
    assert!(
        expression.ends_with(" REMOVE #response_data, #last_attempt, #validation"),
        "{expression}"
    );
}

#[tokio::test]
async fn a_duplicate_costs_one_request_and_reads_the_record_from_the_failure() {
    let fixture = fixture();
    // Exactly the response Powertools got for its duplicate delivery.
    let returned = fixture["requests_duplicate_invocation"][1]["response"]["Item"].clone();
    let put = mock!(Client::update_item)
        .then_http_response(move || conditional_check_failed_response(Some(&returned)));
    let get = mock!(Client::get_item).then_output(|| GetItemOutput::builder().build());
    let store = DynamoStore::new(mock_client(&[&put, &get]), TABLE);
    let key = fixture["key_derivation"]["id"].as_str().unwrap();

    let outcome = store.claim(&request(key)).await.unwrap();

    let ClaimOutcome::Exists(record) = outcome else {
        panic!("expected Exists, got {outcome:?}");
    };
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(
        record.output.as_deref(),
        Some(r#"{"messageId": "f03c5386-ffaa-4261-84fe-68fdd7caeb19", "ok": true}"#)
    );
    assert_eq!(record.key, key);
    assert_eq!(record.token, None);
    assert_eq!(put.num_calls(), 1);
    assert_eq!(
        get.num_calls(),
        0,
        "the record must come from the failure response"
    );
    assert_eq!(store.requests(), 1);
}

#[tokio::test]
async fn a_failure_without_the_record_reads_it_once_consistently() {
    let put = mock!(Client::update_item).then_http_response(|| conditional_check_failed_response(None));
    let (seen, record) = recorder::<GetItemInput>();
    let get = mock!(Client::get_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(
            GetItemOutput::builder()
                .item("id", AttributeValue::S("k".into()))
                .item("status", AttributeValue::S("INPROGRESS".into()))
                .item("expiration", AttributeValue::N("4000000000".into()))
                .item(
                    "in_progress_expiration",
                    AttributeValue::N("4000000000000".into()),
                )
                .build(),
        )
    });
    let store = DynamoStore::new(mock_client(&[&put, &get]), TABLE);

    let outcome = store.claim(&request("k")).await.unwrap();

    let ClaimOutcome::Exists(record) = outcome else {
        panic!("expected Exists, got {outcome:?}");
    };
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(
        record.lease_until,
        Some(UNIX_EPOCH + Duration::from_millis(4_000_000_000_000))
    );
    assert_eq!(get.num_calls(), 1);
    assert_eq!(seen.lock().unwrap()[0].consistent_read(), Some(true));
    assert_eq!(store.requests(), 2);
}

fn claim() -> Claim {
    Claim {
        key: "conveyor:email#user:42".into(),
        token: 1_796_000_000_001,
        run: 1,
    }
}

#[tokio::test]
async fn complete_sets_powertools_fields_under_the_token_condition() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);
    let expires_at = UNIX_EPOCH + Duration::from_secs(1_795_964_720);

    store
        .complete(&claim(), Some(r#"{"ok":true}"#), expires_at)
        .await
        .unwrap();

    let seen = seen.lock().unwrap();
    let input = &seen[0];
    let reference = &fixture()["requests_first_invocation"][2]["request"];
    assert_eq!(input.update_expression(), reference["UpdateExpression"].as_str());
    assert_eq!(input.condition_expression(), Some("#token = :token"));
    let mut expected_names = json_names(&reference["ExpressionAttributeNames"]);
    expected_names.insert("#token".into(), "fence".into());
    assert_eq!(names_of(input.expression_attribute_names()), expected_names);
    let values = input.expression_attribute_values().unwrap();
    assert_eq!(n(&values[":token"]), 1_796_000_000_001);
    assert_eq!(s(&values[":status"]), "COMPLETED");
    assert_eq!(s(&values[":response_data"]), r#"{"ok":true}"#);
    assert_eq!(n(&values[":expiry"]), 1_795_964_720);
    assert_eq!(input.key().unwrap()["id"], AttributeValue::S(claim().key));
    assert_eq!(
        input.return_values(),
        None,
        "no cache, so nothing needs to come back"
    );
}

#[tokio::test]
async fn complete_without_output_writes_no_data() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);

    store.complete(&claim(), None, SystemTime::now()).await.unwrap();

    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].update_expression(),
        Some("SET #expiry = :expiry, #status = :status")
    );
    assert!(
        !seen[0]
            .expression_attribute_values()
            .unwrap()
            .contains_key(":response_data")
    );
}

#[tokio::test]
async fn with_a_cache_complete_asks_for_the_new_record() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let options = StoreOptions::default().with_completed_cache(Some(16));
    let store = DynamoStore::new(mock_client(&[&update]), TABLE).with_options(options);
    store.complete(&claim(), None, SystemTime::now()).await.unwrap();
    assert_eq!(
        seen.lock().unwrap()[0].return_values(),
        Some(&ReturnValue::AllNew)
    );
}

#[tokio::test]
async fn release_ends_the_lease_and_moves_the_token_under_the_token_condition() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);

    store.release(&claim()).await.unwrap();

    let seen = seen.lock().unwrap();
    let input = &seen[0];
    assert_eq!(input.condition_expression(), Some("#token = :token"));
    assert_eq!(
        input.update_expression(),
        Some("SET #in_progress_expiry = :released, #token = #token + :one")
    );
    assert_eq!(
        names_of(input.expression_attribute_names()),
        HashMap::from([
            ("#token".to_owned(), "fence".to_owned()),
            (
                "#in_progress_expiry".to_owned(),
                "in_progress_expiration".to_owned()
            ),
        ])
    );
    let values = input.expression_attribute_values().unwrap();
    assert_eq!(n(&values[":token"]), 1_796_000_000_001);
    assert_eq!(
        n(&values[":released"]),
        0,
        "a lease at the epoch has lapsed for every claimant"
    );
    assert_eq!(n(&values[":one"]), 1);
    assert_eq!(input.key().unwrap()["id"], AttributeValue::S(claim().key));
}

#[tokio::test]
async fn extend_moves_the_lease_under_token_and_status_conditions() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);
    let lease_until = UNIX_EPOCH + Duration::from_millis(1_795_961_180_693);

    store.extend_lease(&claim(), lease_until).await.unwrap();

    let seen = seen.lock().unwrap();
    let input = &seen[0];
    assert_eq!(
        input.update_expression(),
        Some("SET #in_progress_expiry = :in_progress_expiry, #expiry = if_not_exists(#keep, :expiry)")
    );
    assert_eq!(
        input.condition_expression(),
        Some("#token = :token AND #status = :inprogress")
    );
    let names = names_of(input.expression_attribute_names());
    assert_eq!(names["#in_progress_expiry"], "in_progress_expiration");
    assert_eq!(names["#expiry"], "expiration");
    assert_eq!(names["#token"], "fence");
    assert_eq!(names["#status"], "status");
    assert_eq!(
        names["#keep"], "job_keep_until",
        "a tracked record keeps its status retention"
    );
    let values = input.expression_attribute_values().unwrap();
    assert_eq!(n(&values[":in_progress_expiry"]), 1_795_961_180_693);
    assert_eq!(
        n(&values[":expiry"]),
        1_795_961_180 + 3600,
        "the record expires an hour past its lease, so TTL cannot delete it under a running job"
    );
    assert_eq!(s(&values[":inprogress"]), "INPROGRESS");
    assert_eq!(n(&values[":token"]), 1_796_000_000_001);
}

#[tokio::test]
async fn a_failed_token_condition_is_fenced() {
    let failed_update = mock!(Client::update_item).then_error(|| {
        UpdateItemError::ConditionalCheckFailedException(ConditionalCheckFailedException::builder().build())
    });
    let store = DynamoStore::new(mock_client(&[&failed_update]), TABLE);
    let fenced = StoreError::Fenced { key: claim().key };

    assert_eq!(
        store.complete(&claim(), Some("{}"), SystemTime::now()).await,
        Err(fenced.clone())
    );
    assert_eq!(store.release(&claim()).await, Err(fenced.clone()));
    assert_eq!(store.extend_lease(&claim(), SystemTime::now()).await, Err(fenced));
}

#[tokio::test]
async fn an_oversized_output_is_omitted_or_refused_before_any_request() {
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        MockResponse::Output(UpdateItemOutput::builder().build())
    });
    let client = mock_client(&[&update]);
    let output = "x".repeat(500 * 1024);

    let refusing = DynamoStore::new(client.clone(), TABLE)
        .with_options(StoreOptions::default().with_oversized_output(OversizedOutput::Error));
    let error = refusing
        .complete(&claim(), Some(&output), SystemTime::now())
        .await
        .unwrap_err();
    let StoreError::OutputTooLarge { size, limit, .. } = error else {
        panic!("expected OutputTooLarge, got {error:?}");
    };
    assert_eq!(size, output.len());
    assert!(limit < conveyor_core::limits::MAX_ITEM_BYTES);
    assert_eq!(refusing.requests(), 0);

    let omitting = DynamoStore::new(client, TABLE);
    omitting
        .complete(&claim(), Some(&output), SystemTime::now())
        .await
        .unwrap();
    assert_eq!(omitting.requests(), 1);
    let seen = seen.lock().unwrap();
    assert!(
        !seen[0]
            .expression_attribute_values()
            .unwrap()
            .contains_key(":response_data")
    );
    assert_eq!(
        s(&seen[0].expression_attribute_values().unwrap()[":status"]),
        "COMPLETED"
    );
}

#[tokio::test]
async fn dynamodb_refusing_the_size_applies_the_same_policy() {
    let too_large = || {
        let body = serde_json::json!({
            "__type": "com.amazon.coral.validate#ValidationException",
            "message": "Item size to update has exceeded the maximum allowed size",
        });
        Response::new(
            StatusCode::try_from(400).unwrap(),
            SdkBody::from(body.to_string()),
        )
    };
    let (seen, record) = recorder::<UpdateItemInput>();
    let update = mock!(Client::update_item).then_compute_response(move |input| {
        record(input);
        if input
            .expression_attribute_values()
            .unwrap()
            .contains_key(":response_data")
        {
            MockResponse::Http(too_large())
        } else {
            MockResponse::Output(UpdateItemOutput::builder().build())
        }
    });
    let store = DynamoStore::new(mock_client(&[&update]), TABLE);

    store
        .complete(&claim(), Some("{}"), SystemTime::now())
        .await
        .unwrap();

    assert_eq!(seen.lock().unwrap().len(), 2, "retried once without the output");
}

#[tokio::test]
async fn throttling_is_unavailable_and_a_missing_table_is_misconfigured() {
    let error_response = |code: &'static str| {
        move || {
            let body = serde_json::json!({
                "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
                "message": "nope",
            });
            Response::new(
                StatusCode::try_from(400).unwrap(),
                SdkBody::from(body.to_string()),
            )
        }
    };
    let throttled = mock!(Client::update_item)
        .then_http_response(error_response("ProvisionedThroughputExceededException"));
    let store = DynamoStore::new(mock_client(&[&throttled]), TABLE);
    let error = store.claim(&request("k")).await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");

    let missing = mock!(Client::update_item).then_http_response(error_response("ResourceNotFoundException"));
    let store = DynamoStore::new(mock_client(&[&missing]), TABLE);
    let error = store.claim(&request("k")).await.unwrap_err();
    let StoreError::Misconfigured { message } = error else {
        panic!("expected Misconfigured, got {error:?}");
    };
    assert!(message.contains(TABLE), "{message}");
    assert!(message.contains("infra/modules/idempotency-table"), "{message}");
}
