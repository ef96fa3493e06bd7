//! The job-tracking conformance suite: the tracking methods of the `IdempotencyStore` port
//! (`claim_tracked`, `complete_tracked`, `release_tracked`, `record_progress`, `mark_sent`, `job`,
//! `jobs`), checked against any backend, so the memory store cannot drift from DynamoDB.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_core::{
    port::{Claim, ClaimOutcome, ClaimRequest, IdempotencyStore, JobChange, StoreError},
    {JobQuery, JobRecord, JobStatus, Progress},
};

use crate::suite::{Case, CaseResult, OrFail, SuiteFailure, SuiteFailures, ensure, run_cases};

/// Every case's name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "a_tracked_run_records_its_status_attempts_and_output",
    "a_retry_then_a_success_tells_the_truth",
    "a_dead_lettered_job_keeps_its_error",
    "progress_is_fenced_and_lands_with_the_end",
    "a_sent_marker_never_blocks_the_claim",
    "an_untracked_claim_keeps_no_job_record",
    "jobs_are_listed_by_type_and_status",
    "a_last_attempt_that_never_settles_is_dead_lettered_by_redrive",
    "a_final_status_is_kept_for_its_retention",
];

/// Runs every case against `store`; returns every failed case.
pub async fn run_all(store: Arc<dyn IdempotencyStore>) -> Result<(), SuiteFailures> {
    let store = store.as_ref();
    let cases: Vec<Case<'_>> = vec![
        (
            CASES[0],
            Box::pin(a_tracked_run_records_its_status_attempts_and_output(store)),
        ),
        (CASES[1], Box::pin(a_retry_then_a_success_tells_the_truth(store))),
        (CASES[2], Box::pin(a_dead_lettered_job_keeps_its_error(store))),
        (
            CASES[3],
            Box::pin(progress_is_fenced_and_lands_with_the_end(store)),
        ),
        (CASES[4], Box::pin(a_sent_marker_never_blocks_the_claim(store))),
        (CASES[5], Box::pin(an_untracked_claim_keeps_no_job_record(store))),
        (CASES[6], Box::pin(jobs_are_listed_by_type_and_status(store))),
        (
            CASES[7],
            Box::pin(a_last_attempt_that_never_settles_is_dead_lettered_by_redrive(
                store,
            )),
        ),
        (
            CASES[8],
            Box::pin(a_final_status_is_kept_for_its_retention(store)),
        ),
    ];
    run_cases("tracking", CASES, cases).await
}

const HOUR: Duration = Duration::from_secs(3600);

fn key(case: &str) -> String {
    format!("conveyor:tracking#{case}:{}", uuid::Uuid::new_v4().simple())
}

fn request(key: &str, lease: Duration) -> ClaimRequest {
    let now = SystemTime::now();
    ClaimRequest {
        key: key.to_owned(),
        lease_until: now + lease,
        expires_at: now + HOUR,
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

fn change(status: JobStatus, error: Option<&str>) -> JobChange {
    JobChange {
        error: error.map(str::to_owned),
        ..JobChange::now("report", status, 1)
    }
}

async fn acquire(
    case: &'static str,
    store: &dyn IdempotencyStore,
    request: &ClaimRequest,
    job_type: &str,
) -> Result<Claim, SuiteFailure> {
    let running = JobChange::now(job_type, JobStatus::Running, 1);
    match store
        .claim_tracked(request, &running)
        .await
        .or_fail(case, "claim_tracked")?
    {
        ClaimOutcome::Acquired(claim) => Ok(claim),
        ClaimOutcome::Exists(record) => Err(SuiteFailure::new(
            case,
            format!("expected to acquire {}, found {record:?}", request.key),
        )),
    }
}

async fn job(case: &'static str, store: &dyn IdempotencyStore, key: &str) -> Result<JobRecord, SuiteFailure> {
    store
        .job(key)
        .await
        .or_fail(case, "job")?
        .ok_or_else(|| SuiteFailure::new(case, format!("no job record for {key}")))
}

fn has_history(job: &JobRecord, status: JobStatus) -> bool {
    job.history.iter().any(|(entry, _)| *entry == status)
}

/// Claim → running, attempt 1; complete → succeeded with the output, both times in the history.
pub(crate) async fn a_tracked_run_records_its_status_attempts_and_output(
    store: &dyn IdempotencyStore,
) -> CaseResult {
    let case = CASES[0];
    let key = key(case);
    let claim = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    let running = job(case, store, &key).await?;
    ensure!(
        case,
        running.status == JobStatus::Running,
        "after the claim: {running:?}"
    );
    ensure!(
        case,
        running.attempts == 1,
        "attempts after one claim: {}",
        running.attempts
    );
    ensure!(
        case,
        running.job_type == "report",
        "job type: {}",
        running.job_type
    );
    ensure!(
        case,
        running.output.is_none(),
        "a running job has no output: {running:?}"
    );
    let done = change(JobStatus::Succeeded, None);
    store
        .complete_tracked(&claim, Some(r#"{"rows":3}"#), SystemTime::now() + HOUR, &done)
        .await
        .or_fail(case, "complete_tracked")?;
    let succeeded = job(case, store, &key).await?;
    ensure!(
        case,
        succeeded.status == JobStatus::Succeeded,
        "after complete: {succeeded:?}"
    );
    ensure!(
        case,
        succeeded.output.as_deref().map(str::trim) == Some(r#"{"rows":3}"#)
            || succeeded
                .output
                .as_deref()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                == Some(serde_json::json!({"rows": 3})),
        "output: {:?}",
        succeeded.output
    );
    ensure!(
        case,
        has_history(&succeeded, JobStatus::Running) && has_history(&succeeded, JobStatus::Succeeded),
        "history: {:?}",
        succeeded.history
    );
    ensure!(
        case,
        succeeded.token == Some(claim.token),
        "token: {:?}",
        succeeded.token
    );
    Ok(())
}

/// Claim, release as retrying with an error, claim again, complete: two attempts, succeeded, and the
/// retry's error still said.
pub(crate) async fn a_retry_then_a_success_tells_the_truth(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[1];
    let key = key(case);
    let first = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    store
        .release_tracked(
            &first,
            &change(JobStatus::Retrying, Some("503 from the warehouse")),
        )
        .await
        .or_fail(case, "release_tracked")?;
    let retrying = job(case, store, &key).await?;
    ensure!(
        case,
        retrying.status == JobStatus::Retrying,
        "after release: {retrying:?}"
    );
    ensure!(
        case,
        retrying.last_error.as_deref() == Some("503 from the warehouse"),
        "error after release: {:?}",
        retrying.last_error
    );
    let second = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    let running = job(case, store, &key).await?;
    ensure!(
        case,
        running.attempts == 2,
        "attempts after two claims: {}",
        running.attempts
    );
    store
        .complete_tracked(
            &second,
            None,
            SystemTime::now() + HOUR,
            &change(JobStatus::Succeeded, None),
        )
        .await
        .or_fail(case, "complete_tracked")?;
    let done = job(case, store, &key).await?;
    ensure!(
        case,
        done.status == JobStatus::Succeeded && done.attempts == 2,
        "{done:?}"
    );
    ensure!(
        case,
        done.last_error.as_deref() == Some("503 from the warehouse"),
        "the retry's error is kept after the success: {:?}",
        done.last_error
    );
    ensure!(
        case,
        has_history(&done, JobStatus::Retrying),
        "history: {:?}",
        done.history
    );
    Ok(())
}

/// Release as dead-lettered: the status and the error stay.
pub(crate) async fn a_dead_lettered_job_keeps_its_error(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[2];
    let key = key(case);
    let claim = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    store
        .release_tracked(&claim, &change(JobStatus::DeadLettered, Some("410 Gone")))
        .await
        .or_fail(case, "release_tracked")?;
    let dead = job(case, store, &key).await?;
    ensure!(case, dead.status == JobStatus::DeadLettered, "{dead:?}");
    ensure!(case, dead.last_error.as_deref() == Some("410 Gone"), "{dead:?}");
    Ok(())
}

/// Progress from the holder lands; from a stale holder (after a takeover) and after the end it is
/// refused as fenced; the last report written with complete lands.
pub(crate) async fn progress_is_fenced_and_lands_with_the_end(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[3];
    let key = key(case);
    let report = |percent: u8, message: &str| Progress {
        percent,
        message: message.to_owned(),
        at: SystemTime::now(),
    };
    // A lease already lapsed (5 s ago: past DynamoDB's granularity), so a second claim takes over.
    let lapsed = ClaimRequest {
        lease_until: SystemTime::now() - Duration::from_secs(5),
        ..request(&key, Duration::ZERO)
    };
    let stale = acquire(case, store, &lapsed, "report").await?;
    let holder = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    let refused = store.record_progress(&stale, &report(90, "stale")).await;
    ensure!(
        case,
        matches!(refused, Err(StoreError::Fenced { .. })),
        "a stale holder's progress must be fenced, got {refused:?}"
    );
    store
        .record_progress(&holder, &report(40, "chunk 4 of 10"))
        .await
        .or_fail(case, "record_progress")?;
    let running = job(case, store, &key).await?;
    let progress = running.progress.clone();
    ensure!(
        case,
        progress
            .as_ref()
            .is_some_and(|p| p.percent == 40 && p.message == "chunk 4 of 10"),
        "progress after the write: {progress:?}"
    );
    let end = JobChange {
        progress: Some(report(100, "assembled")),
        ..change(JobStatus::Succeeded, None)
    };
    store
        .complete_tracked(&holder, None, SystemTime::now() + HOUR, &end)
        .await
        .or_fail(case, "complete_tracked")?;
    let late = store.record_progress(&holder, &report(50, "late")).await;
    ensure!(
        case,
        matches!(late, Err(StoreError::Fenced { .. })),
        "progress after the end must be refused, got {late:?}"
    );
    let done = job(case, store, &key).await?;
    ensure!(
        case,
        done.progress
            .as_ref()
            .is_some_and(|p| p.percent == 100 && p.message == "assembled"),
        "the last report rides on complete: {:?}",
        done.progress
    );
    Ok(())
}

/// A producer's sent marker is readable, does not block the claim, and never overwrites a run.
pub(crate) async fn a_sent_marker_never_blocks_the_claim(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[4];
    let key = key(case);
    store
        .mark_sent(&key, &JobChange::now("report", JobStatus::Sent, 0))
        .await
        .or_fail(case, "mark_sent")?;
    let sent = job(case, store, &key).await?;
    ensure!(
        case,
        sent.status == JobStatus::Sent && sent.attempts == 0,
        "{sent:?}"
    );
    let claim = acquire(case, store, &request(&key, Duration::from_secs(60)), "report").await?;
    store
        .mark_sent(&key, &JobChange::now("report", JobStatus::Sent, 0))
        .await
        .or_fail(case, "mark_sent again")?;
    let running = job(case, store, &key).await?;
    ensure!(
        case,
        running.status == JobStatus::Running && running.attempts == 1,
        "a late sent marker must not overwrite the run: {running:?}"
    );
    ensure!(
        case,
        has_history(&running, JobStatus::Sent),
        "the sent time is kept: {:?}",
        running.history
    );
    store.release(&claim).await.or_fail(case, "release")?;
    Ok(())
}

/// An untracked claim and complete leave no job record.
pub(crate) async fn an_untracked_claim_keeps_no_job_record(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[5];
    let key = key(case);
    let ClaimOutcome::Acquired(claim) = store
        .claim(&request(&key, Duration::from_secs(60)))
        .await
        .or_fail(case, "claim")?
    else {
        return Err(SuiteFailure::new(case, "a fresh key was not acquired"));
    };
    store
        .complete(&claim, Some("1"), SystemTime::now() + HOUR)
        .await
        .or_fail(case, "complete")?;
    let found = store.job(&key).await.or_fail(case, "job")?;
    ensure!(case, found.is_none(), "an untracked job has no record: {found:?}");
    Ok(())
}

/// `jobs` lists one type's jobs by status, newest change first.
pub(crate) async fn jobs_are_listed_by_type_and_status(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[6];
    let job_type = format!("listing{}", uuid::Uuid::new_v4().simple());
    let mut keys = Vec::new();
    for index in 0..3u64 {
        let key = key(&format!("{case}{index}"));
        // Changes a second apart, in order, so "newest first" has one answer.
        let running = JobChange {
            at: SystemTime::now() - Duration::from_secs(10 - index),
            ..JobChange::now(&job_type, JobStatus::Running, 1)
        };
        let ClaimOutcome::Acquired(claim) = store
            .claim_tracked(&request(&key, Duration::from_secs(60)), &running)
            .await
            .or_fail(case, "claim_tracked")?
        else {
            return Err(SuiteFailure::new(case, "a fresh key was not acquired"));
        };
        if index == 0 {
            let done = JobChange::now(&job_type, JobStatus::Succeeded, 1);
            store
                .complete_tracked(&claim, None, SystemTime::now() + HOUR, &done)
                .await
                .or_fail(case, "complete_tracked")?;
        }
        keys.push(key);
    }
    let query = |status| JobQuery {
        job_type: job_type.clone(),
        status,
        limit: 10,
    };
    let running = store
        .jobs(&query(Some(JobStatus::Running)))
        .await
        .or_fail(case, "jobs")?;
    let running_keys: Vec<&str> = running.iter().map(|job| job.key.as_str()).collect();
    ensure!(
        case,
        running_keys == [keys[2].as_str(), keys[1].as_str()],
        "running jobs, newest first: {running_keys:?}, expected {:?}",
        &keys[1..]
    );
    let all = store.jobs(&query(None)).await.or_fail(case, "jobs")?;
    ensure!(case, all.len() == 3, "every status: {} jobs", all.len());
    let other = store
        .jobs(&JobQuery {
            job_type: format!("{job_type}-other"),
            status: None,
            limit: 10,
        })
        .await
        .or_fail(case, "jobs")?;
    ensure!(case, other.is_empty(), "another type lists none: {other:?}");
    Ok(())
}

/// A claim on the last receive whose lease ran out unsettled reads as dead-lettered (SQS's redrive
/// took the message), in `job` and in `jobs` by status; a redrive back claims it again as running.
pub(crate) async fn a_last_attempt_that_never_settles_is_dead_lettered_by_redrive(
    store: &dyn IdempotencyStore,
) -> CaseResult {
    let case = CASES[7];
    let job_type = format!("redriven{}", uuid::Uuid::new_v4().simple());
    let key = key(case);
    // The lease already over: the worker died on the last receive (no waiting in the suite).
    let now = SystemTime::now();
    let last = ClaimRequest {
        lease_until: now - Duration::from_secs(1),
        last_attempt: true,
        ..request(&key, Duration::from_secs(60))
    };
    acquire(case, store, &last, &job_type).await?;
    let record = store
        .get(&key)
        .await
        .or_fail(case, "get")?
        .ok_or_else(|| SuiteFailure::new(case, "no record after the claim"))?;
    ensure!(
        case,
        record.last_attempt && record.dead_lettered_by_redrive(SystemTime::now()),
        "the record must say its last attempt lapsed: {record:?}"
    );
    let shown = job(case, store, &key).await?;
    ensure!(
        case,
        shown.status == JobStatus::DeadLettered
            && shown.last_error.as_deref() == Some(conveyor_core::port::REDRIVE_REASON),
        "a run SQS's redrive took must read dead_lettered with the reason: {shown:?}"
    );
    let query = |status| JobQuery {
        job_type: job_type.clone(),
        status: Some(status),
        limit: 10,
    };
    let dead = store
        .jobs(&query(JobStatus::DeadLettered))
        .await
        .or_fail(case, "jobs")?;
    ensure!(
        case,
        dead.iter().any(|job| job.key == key),
        "listed as dead_lettered: {dead:?}"
    );
    let running = store
        .jobs(&query(JobStatus::Running))
        .await
        .or_fail(case, "jobs")?;
    ensure!(case, running.is_empty(), "not listed as running: {running:?}");
    // Moved back from the DLQ: claimed again, running truthfully.
    let back = ClaimRequest {
        restart_runs: true,
        ..request(&key, Duration::from_secs(60))
    };
    let claim = acquire(case, store, &back, &job_type).await?;
    let again = job(case, store, &key).await?;
    ensure!(
        case,
        again.status == JobStatus::Running,
        "a redriven message claimed again is running: {again:?}"
    );
    store.release(&claim).await.or_fail(case, "release")?;
    Ok(())
}

/// A release to a final status keeps the record until the change's `keep_until`; the status stays
/// `dead_lettered` (the last-attempt mark does not turn a final status into another).
pub(crate) async fn a_final_status_is_kept_for_its_retention(store: &dyn IdempotencyStore) -> CaseResult {
    let case = CASES[8];
    let key = key(case);
    let last = ClaimRequest {
        last_attempt: true,
        ..request(&key, Duration::from_secs(60))
    };
    let claim = acquire(case, store, &last, "report").await?;
    let keep = SystemTime::now() + Duration::from_secs(14 * 24 * 3600);
    let dead = change(JobStatus::DeadLettered, Some("gone")).keep_until(keep);
    store
        .release_tracked(&claim, &dead)
        .await
        .or_fail(case, "release_tracked")?;
    let record = store
        .get(&key)
        .await
        .or_fail(case, "get")?
        .ok_or_else(|| SuiteFailure::new(case, "no record after the release"))?;
    ensure!(
        case,
        record.expires_at + Duration::from_secs(1) >= keep,
        "a final status is kept until {keep:?}: {record:?}"
    );
    let shown = job(case, store, &key).await?;
    ensure!(
        case,
        shown.status == JobStatus::DeadLettered,
        "dead_lettered: {shown:?}"
    );
    Ok(())
}
