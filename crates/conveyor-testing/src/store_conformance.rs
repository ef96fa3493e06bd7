//! The idempotency store conformance suite: the `IdempotencyStore` port's contracts, checked against any
//! backend.
//!
//! Each case is a public function taking the store and returning `Result<(), SuiteFailure>`;
//! [`run_all`] runs them all. Cases use fresh random keys, so one store (one table) serves the whole run.
//! No case waits: lapsed leases and expired records are written with times already in the past (at least
//! 2 s, because DynamoDB compares `expiration` in whole seconds).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_core::port::{
    Claim, ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError,
};

use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "claim_race_exactly_one_wins",
    "live_claim_blocks_a_second_claim",
    "lapsed_lease_is_taken_over",
    "settling_is_fenced_after_takeover",
    "completed_is_a_duplicate_with_its_output",
    "expired_completed_record_is_claimable",
    "release_makes_the_key_claimable",
    "extend_lease_moves_the_lease",
    "extend_lease_refuses_a_completed_record",
    "validation_hash_is_kept",
    "fencing_token_increases_with_every_claim",
    "runs_are_counted_across_claims",
];

/// Runs every case against `store`; returns every failed case.
pub async fn run_all(store: Arc<dyn IdempotencyStore>) -> Result<(), SuiteFailures> {
    let cases: Vec<Case<'_>> = vec![
        (
            "claim_race_exactly_one_wins",
            Box::pin(claim_race_exactly_one_wins(Arc::clone(&store))),
        ),
        (
            "live_claim_blocks_a_second_claim",
            Box::pin(live_claim_blocks_a_second_claim(store.as_ref())),
        ),
        (
            "lapsed_lease_is_taken_over",
            Box::pin(lapsed_lease_is_taken_over(store.as_ref())),
        ),
        (
            "settling_is_fenced_after_takeover",
            Box::pin(settling_is_fenced_after_takeover(store.as_ref())),
        ),
        (
            "completed_is_a_duplicate_with_its_output",
            Box::pin(completed_is_a_duplicate_with_its_output(store.as_ref())),
        ),
        (
            "expired_completed_record_is_claimable",
            Box::pin(expired_completed_record_is_claimable(store.as_ref())),
        ),
        (
            "release_makes_the_key_claimable",
            Box::pin(release_makes_the_key_claimable(store.as_ref())),
        ),
        (
            "extend_lease_moves_the_lease",
            Box::pin(extend_lease_moves_the_lease(store.as_ref())),
        ),
        (
            "extend_lease_refuses_a_completed_record",
            Box::pin(extend_lease_refuses_a_completed_record(store.as_ref())),
        ),
        (
            "validation_hash_is_kept",
            Box::pin(validation_hash_is_kept(store.as_ref())),
        ),
        (
            "fencing_token_increases_with_every_claim",
            Box::pin(fencing_token_increases_with_every_claim(store.as_ref())),
        ),
        (
            "runs_are_counted_across_claims",
            Box::pin(runs_are_counted_across_claims(store.as_ref())),
        ),
    ];
    run_cases("store", CASES, cases).await
}

const HOUR: Duration = Duration::from_secs(3600);
/// How far in the past "lapsed" and "expired" are set: more than DynamoDB's one-second granularity.
const PAST: Duration = Duration::from_secs(5);

fn key(case: &str) -> String {
    format!("conveyor:conformance#{case}:{}", uuid::Uuid::new_v4().simple())
}

fn request(key: &str, lease_until: SystemTime) -> ClaimRequest {
    ClaimRequest {
        key: key.to_owned(),
        lease_until,
        expires_at: SystemTime::now() + HOUR,
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

fn live(key: &str) -> ClaimRequest {
    request(key, SystemTime::now() + Duration::from_secs(60))
}

fn lapsed(key: &str) -> ClaimRequest {
    request(key, SystemTime::now() - PAST)
}

/// Claims and expects to acquire.
async fn acquire(
    case: &'static str,
    store: &dyn IdempotencyStore,
    request: &ClaimRequest,
) -> Result<Claim, SuiteFailure> {
    match store.claim(request).await.or_fail(case, "claim")? {
        ClaimOutcome::Acquired(claim) => {
            ensure!(
                case,
                claim.key == request.key,
                "claim returned key {}, asked for {}",
                claim.key,
                request.key
            );
            Ok(claim)
        }
        ClaimOutcome::Exists(record) => Err(SuiteFailure::new(
            case,
            format!("expected to acquire {}, found {record:?}", request.key),
        )),
    }
}

/// Claims and expects an existing record.
async fn existing(
    case: &'static str,
    store: &dyn IdempotencyStore,
    request: &ClaimRequest,
) -> Result<IdempotencyRecord, SuiteFailure> {
    match store.claim(request).await.or_fail(case, "claim")? {
        ClaimOutcome::Exists(record) => {
            ensure!(
                case,
                record.key == request.key,
                "claim returned the record of {}",
                record.key
            );
            Ok(record)
        }
        ClaimOutcome::Acquired(claim) => Err(SuiteFailure::new(
            case,
            format!("acquired {} although a live record exists", claim.key),
        )),
    }
}

async fn read(
    case: &'static str,
    store: &dyn IdempotencyStore,
    key: &str,
) -> Result<Option<IdempotencyRecord>, SuiteFailure> {
    store.get(key).await.or_fail(case, "get")
}

fn close(a: SystemTime, b: SystemTime, tolerance: Duration) -> bool {
    let difference = a
        .duration_since(b)
        .or_else(|_| b.duration_since(a))
        .unwrap_or_default();
    difference <= tolerance
}

fn is_fenced<T>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Fenced { .. }))
}

/// Of 20 concurrent claims on one key, exactly one acquires; the others see the winner's record.
pub async fn claim_race_exactly_one_wins(store: Arc<dyn IdempotencyStore>) -> CaseResult {
    let case = "claim_race_exactly_one_wins";
    let key = key(case);
    let mut claimants = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let store = Arc::clone(&store);
        let request = live(&key);
        claimants.spawn(async move { store.claim(&request).await });
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    while let Some(joined) = claimants.join_next().await {
        match joined.or_fail(case, "a claimant task")?.or_fail(case, "claim")? {
            ClaimOutcome::Acquired(claim) => winners.push(claim),
            ClaimOutcome::Exists(record) => losers.push(record),
        }
    }
    ensure!(
        case,
        winners.len() == 1,
        "{} of 20 concurrent claims acquired the key",
        winners.len()
    );
    let winner = &winners[0];
    for record in &losers {
        ensure!(
            case,
            record.status == RecordStatus::InProgress,
            "a loser saw status {:?}",
            record.status
        );
        ensure!(
            case,
            record.token == Some(winner.token),
            "a loser saw token {:?}, the winner holds {}",
            record.token,
            winner.token
        );
    }
    let stored = read(case, store.as_ref(), &key).await?;
    ensure!(
        case,
        stored.and_then(|record| record.token) == Some(winner.token),
        "the stored record is not the winner's"
    );
    Ok(())
}

/// A claim whose lease has not lapsed keeps the key: a second claim sees it in progress, with its lease.
pub async fn live_claim_blocks_a_second_claim(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "live_claim_blocks_a_second_claim";
    let key = key(case);
    let first = live(&key);
    acquire(case, store, &first).await?;
    let record = existing(case, store, &live(&key)).await?;
    ensure!(
        case,
        record.status == RecordStatus::InProgress,
        "status {:?}",
        record.status
    );
    ensure!(
        case,
        record
            .lease_until
            .is_some_and(|lease| close(lease, first.lease_until, Duration::from_millis(2))),
        "the record's lease {:?} is not the first claim's {:?}",
        record.lease_until,
        first.lease_until
    );
    ensure!(
        case,
        close(record.expires_at, first.expires_at, Duration::from_secs(1)),
        "expiry {:?}",
        record.expires_at
    );
    Ok(())
}

/// A claim whose lease has lapsed is taken over by the next claim, with a higher token.
pub async fn lapsed_lease_is_taken_over(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "lapsed_lease_is_taken_over";
    let key = key(case);
    let crashed = acquire(case, store, &lapsed(&key)).await?;
    let next = acquire(case, store, &live(&key)).await?;
    ensure!(
        case,
        next.token > crashed.token,
        "the takeover's token {} is not above the old {}",
        next.token,
        crashed.token
    );
    let record = read(case, store, &key).await?;
    ensure!(
        case,
        record.and_then(|record| record.token) == Some(next.token),
        "the record does not carry the new token"
    );
    Ok(())
}

/// After a takeover, the old claim can neither complete, release nor extend, and changes nothing.
pub async fn settling_is_fenced_after_takeover(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "settling_is_fenced_after_takeover";
    let key = key(case);
    let old = acquire(case, store, &lapsed(&key)).await?;
    let new = acquire(case, store, &live(&key)).await?;
    let later = SystemTime::now() + HOUR;
    ensure!(
        case,
        is_fenced(&store.complete(&old, Some("\"old\""), later).await),
        "complete with the old claim was not fenced"
    );
    ensure!(
        case,
        is_fenced(&store.extend_lease(&old, later).await),
        "extend_lease with the old claim was not fenced"
    );
    ensure!(
        case,
        is_fenced(&store.release(&old).await),
        "release with the old claim was not fenced"
    );
    let record = read(case, store, &key).await?;
    let Some(record) = record else {
        return Err(SuiteFailure::new(
            case,
            "the old claim's release deleted the new claim's record",
        ));
    };
    ensure!(
        case,
        record.token == Some(new.token),
        "token changed to {:?}",
        record.token
    );
    ensure!(
        case,
        record.status == RecordStatus::InProgress && record.output.is_none(),
        "the old claim changed the record: {record:?}"
    );
    store
        .complete(&new, Some("\"new\""), later)
        .await
        .or_fail(case, "complete with the new claim")?;
    Ok(())
}

/// A completed key is a duplicate, even with its in-progress lease long lapsed, and carries the output.
pub async fn completed_is_a_duplicate_with_its_output(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "completed_is_a_duplicate_with_its_output";
    let key = key(case);
    let output = "{\"provider_id\":\"msg-42\",\"note\":\"ünïcode ✓\"}";
    let claim = acquire(case, store, &lapsed(&key)).await?;
    store
        .complete(&claim, Some(output), SystemTime::now() + HOUR)
        .await
        .or_fail(case, "complete")?;
    let record = existing(case, store, &live(&key)).await?;
    ensure!(
        case,
        record.status == RecordStatus::Completed,
        "status {:?} after complete",
        record.status
    );
    ensure!(
        case,
        record.output.as_deref() == Some(output),
        "output {:?}",
        record.output
    );
    let read_back = read(case, store, &key).await?;
    ensure!(
        case,
        read_back.is_some_and(|record| record.status == RecordStatus::Completed),
        "get does not show the completed record"
    );
    Ok(())
}

/// A completed record past its expiry no longer counts: the key can be claimed again.
pub async fn expired_completed_record_is_claimable(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "expired_completed_record_is_claimable";
    let key = key(case);
    let claim = acquire(case, store, &live(&key)).await?;
    store
        .complete(&claim, Some("1"), SystemTime::now() - PAST)
        .await
        .or_fail(case, "complete (already expired)")?;
    let again = acquire(case, store, &live(&key)).await?;
    ensure!(
        case,
        again.token > claim.token,
        "the new claim's token is not above the old one"
    );
    Ok(())
}

/// Release frees the key at once (the record stays, its lease ended, so its token keeps counting); a
/// second release is fenced, and so is a late extension (it would lock the key again).
pub async fn release_makes_the_key_claimable(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "release_makes_the_key_claimable";
    let key = key(case);
    ensure!(
        case,
        read(case, store, &key).await?.is_none(),
        "a never-claimed key has a record"
    );
    let claim = acquire(case, store, &live(&key)).await?;
    store.release(&claim).await.or_fail(case, "release")?;
    let released = read(case, store, &key).await?;
    ensure!(
        case,
        released
            .as_ref()
            .is_none_or(|record| record.is_free_at(SystemTime::now())),
        "the record is not free after its release: {released:?}"
    );
    ensure!(
        case,
        is_fenced(&store.release(&claim).await),
        "a second release was not fenced"
    );
    ensure!(
        case,
        is_fenced(&store.extend_lease(&claim, SystemTime::now() + HOUR).await),
        "an extension after the release was not fenced"
    );
    acquire(case, store, &live(&key)).await?;
    Ok(())
}

/// `extend_lease` moves the lease: a lapsed claim extended into the future holds the key again.
pub async fn extend_lease_moves_the_lease(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "extend_lease_moves_the_lease";
    let key = key(case);
    let claim = acquire(case, store, &lapsed(&key)).await?;
    // Past the record's expiry: a long job's record must not expire under it.
    let until = SystemTime::now() + 2 * HOUR;
    store
        .extend_lease(&claim, until)
        .await
        .or_fail(case, "extend_lease")?;
    let record = existing(case, store, &live(&key)).await?;
    ensure!(
        case,
        record
            .lease_until
            .is_some_and(|lease| close(lease, until, Duration::from_millis(2))),
        "lease {:?} after extending to {until:?}",
        record.lease_until
    );
    ensure!(
        case,
        record.expires_at >= until,
        "the record expires at {:?}, before its lease {until:?}: TTL could delete it under the running job",
        record.expires_at
    );
    ensure!(
        case,
        record.token == Some(claim.token),
        "extending changed the token"
    );
    Ok(())
}

/// A late heartbeat cannot extend a record that was already completed: fenced, and nothing changes.
pub async fn extend_lease_refuses_a_completed_record(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "extend_lease_refuses_a_completed_record";
    let key = key(case);
    let claim = acquire(case, store, &live(&key)).await?;
    store
        .complete(&claim, Some("2"), SystemTime::now() + HOUR)
        .await
        .or_fail(case, "complete")?;
    let extended = store.extend_lease(&claim, SystemTime::now() + HOUR).await;
    ensure!(
        case,
        is_fenced(&extended),
        "extend_lease on a completed record returned {extended:?}"
    );
    let record = read(case, store, &key).await?;
    ensure!(
        case,
        record.is_some_and(
            |record| record.status == RecordStatus::Completed && record.output.as_deref() == Some("2")
        ),
        "the completed record changed"
    );
    Ok(())
}

/// The payload hash is stored with the claim and returned with the record.
pub async fn validation_hash_is_kept(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "validation_hash_is_kept";
    let key = key(case);
    let hash = conveyor_core::port::payload_hash("{\"user_id\":42}");
    let mut first = live(&key);
    first.validation = Some(hash.clone());
    acquire(case, store, &first).await?;
    let record = existing(case, store, &live(&key)).await?;
    ensure!(
        case,
        record.validation.as_deref() == Some(hash.as_str()),
        "validation {:?}",
        record.validation
    );
    Ok(())
}

/// Every claim of a key gets a token above every earlier one: a takeover, a claim after a release and a
/// claim after the record expired, back to back (a counter in the record, not a clock).
pub async fn fencing_token_increases_with_every_claim(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "fencing_token_increases_with_every_claim";
    let key = key(case);
    let mut tokens = vec![acquire(case, store, &lapsed(&key)).await?.token];
    let taken_over = acquire(case, store, &lapsed(&key)).await?;
    tokens.push(taken_over.token);
    store.release(&taken_over).await.or_fail(case, "release")?;
    let after_release = acquire(case, store, &live(&key)).await?;
    tokens.push(after_release.token);
    store
        .complete(&after_release, Some("1"), SystemTime::now() - PAST)
        .await
        .or_fail(case, "complete (already expired)")?;
    tokens.push(acquire(case, store, &live(&key)).await?.token);
    ensure!(
        case,
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens did not increase with every claim: {tokens:?}"
    );
    let record = read(case, store, &key).await?;
    ensure!(
        case,
        record.and_then(|record| record.token) == tokens.last().copied(),
        "the record does not carry the last claim's token"
    );
    Ok(())
}

/// Every claim on a key counts a run (`Claim::run`): a takeover and a claim after a release are the
/// next run; a claim of an expired record, or one that restarts the count (a DLQ redrive), is run 1.
pub async fn runs_are_counted_across_claims(store: &dyn IdempotencyStore) -> CaseResult {
    let case = "runs_are_counted_across_claims";
    let key = key(case);
    let mut runs = vec![acquire(case, store, &lapsed(&key)).await?.run];
    let taken_over = acquire(case, store, &lapsed(&key)).await?;
    runs.push(taken_over.run);
    store.release(&taken_over).await.or_fail(case, "release")?;
    let after_release = acquire(case, store, &live(&key)).await?;
    runs.push(after_release.run);
    store
        .complete(&after_release, Some("1"), SystemTime::now() - PAST)
        .await
        .or_fail(case, "complete (already expired)")?;
    let after_expiry = acquire(case, store, &live(&key)).await?;
    runs.push(after_expiry.run);
    store.release(&after_expiry).await.or_fail(case, "release")?;
    let restarted = acquire(
        case,
        store,
        &ClaimRequest {
            restart_runs: true,
            last_attempt: false,
            ..live(&key)
        },
    )
    .await?;
    runs.push(restarted.run);
    store.release(&restarted).await.or_fail(case, "release")?;
    runs.push(acquire(case, store, &live(&key)).await?.run);
    ensure!(
        case,
        runs == [1, 2, 3, 1, 1, 2],
        "runs {runs:?}, expected [1, 2, 3, 1, 1, 2] (takeover and release count on; expiry and a \
         restart start at 1)"
    );
    Ok(())
}
