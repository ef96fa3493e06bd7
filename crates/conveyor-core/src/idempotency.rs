//! The `IdempotencyStore` port: claims that make a job's effect happen once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::tracking::{JobChange, JobQuery, JobRecord, Progress};

/// A record's status, spelled as AWS Lambda Powertools spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// `INPROGRESS`: a worker holds the claim until its lease ends.
    InProgress,
    /// `COMPLETED`: the job is done; duplicates are acknowledged without running.
    Completed,
    /// `EXPIRED`: Powertools writes it for a record that was already past its expiry when saved; such
    /// a record counts as expired (claimable once its `expiration` has passed, like any other).
    Expired,
}

impl RecordStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::InProgress => "INPROGRESS",
            RecordStatus::Completed => "COMPLETED",
            RecordStatus::Expired => "EXPIRED",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "INPROGRESS" => Some(RecordStatus::InProgress),
            "COMPLETED" => Some(RecordStatus::Completed),
            "EXPIRED" => Some(RecordStatus::Expired),
            _ => None,
        }
    }
}

/// One idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// The namespaced key.
    pub key: String,
    /// In progress or completed.
    pub status: RecordStatus,
    /// After this the record no longer counts (whether or not DynamoDB's TTL has deleted it yet).
    pub expires_at: SystemTime,
    /// The in-progress lease's end; Powertools omits it outside Lambda.
    pub lease_until: Option<SystemTime>,
    /// The handler's output as JSON, on completed records.
    pub output: Option<String>,
    /// The payload hash, when payload validation is on.
    pub validation: Option<String>,
    /// The fencing token of the claim that wrote it; absent on Powertools' records.
    pub token: Option<u64>,
    /// The claim that wrote it ran the message's last allowed receive ([`ClaimRequest::last_attempt`]);
    /// the next claim clears it (a release keeps it: the message's receives are spent either way).
    pub last_attempt: bool,
}

/// What a job record says when its last allowed run never reported how it ended: SQS's redrive
/// policy moved its message to the DLQ, unless that run finished its work and only its record was lost.
pub const REDRIVE_REASON: &str = "the last attempt allowed did not report how it ended before its lease ran out \
                                  (a crash, out of memory, a timeout, or the idempotency store unreachable when \
                                  it ended); SQS's redrive policy moved the message to the DLQ. If it is not \
                                  there, that attempt finished and only its record was lost";

impl IdempotencyRecord {
    /// True when the record means that SQS's redrive policy moved the job's message to its DLQ
    /// (but for the at-least-once window below): a claim on the last receive the redrive policy allows ([`Self::last_attempt`]), not
    /// completed, with its lease over at `now` (lapsed, or ended by a release that put the message
    /// back: a cancelled last run whose deferred copy could not be sent). The lease is the message's
    /// visibility deadline, so the message became visible again with its receives spent: SQS moves
    /// it on its next receive instead of delivering it. Any later claim (a deferred copy, a redrive
    /// back from the DLQ) clears this. A job record already final is not changed by it.
    ///
    /// The one other way to this record is the at-least-once window: the run finished its work but
    /// its completion could not be written before its lease ended (the store down), and its consumer
    /// deleted the message (running it again would repeat the work). No reader can tell the two
    /// apart, so [`REDRIVE_REASON`] says both.
    pub fn dead_lettered_by_redrive(&self, now: SystemTime) -> bool {
        self.last_attempt
            && self.status == RecordStatus::InProgress
            && self.lease_until.is_some_and(|lease| lease < now)
    }

    /// DynamoDB's claim condition at `now`: `expiration < :now OR (status = INPROGRESS AND
    /// in_progress_expiration < :now_ms)`, compared in the units the table stores (seconds, milliseconds).
    /// (`attribute_not_exists(id)` is the caller's: no record at all is free.)
    pub fn is_free_at(&self, now: SystemTime) -> bool {
        let secs = |time: SystemTime| time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let millis = |time: SystemTime| time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        if secs(self.expires_at) < secs(now) {
            return true;
        }
        self.status == RecordStatus::InProgress
            && self.lease_until.is_some_and(|lease| millis(lease) < millis(now))
    }

    /// The in-progress record a claim for `request` writes under `token`.
    pub fn in_progress(request: &ClaimRequest, token: u64) -> Self {
        Self {
            key: request.key.clone(),
            status: RecordStatus::InProgress,
            expires_at: request.expires_at,
            lease_until: Some(request.lease_until),
            output: None,
            validation: request.validation.clone(),
            token: Some(token),
            last_attempt: request.last_attempt,
        }
    }
}

/// A request to claim a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The namespaced key (see [`idempotency_key`]).
    pub key: String,
    /// The lease's end: the message's visibility deadline.
    pub lease_until: SystemTime,
    /// When the record stops counting.
    pub expires_at: SystemTime,
    /// The payload hash, when payload validation is on.
    pub validation: Option<String>,
    /// Count this claim as the job's first run ([`Claim::run`] 1): the message came back from a
    /// dead-letter queue (a redrive), which gives it the whole retry budget again.
    pub restart_runs: bool,
    /// The message is on the last receive its queue's redrive policy allows (`maxReceiveCount`): if
    /// this run never settles, SQS moves the message to the DLQ. Stored on the record (see
    /// [`IdempotencyRecord::dead_lettered_by_redrive`]).
    pub last_attempt: bool,
}

/// A held claim; complete, release and extend are fenced on its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The namespaced key.
    pub key: String,
    /// The claim's fencing token: greater than every earlier claim's on this key (see [`next_token`]).
    pub token: u64,
    /// Which run of the job this claim starts: 1 for the first claim on the key, counted across
    /// deliveries, deferred copies and runs a runtime repeats in place (a FIFO head retried while its
    /// group waits), started again when the record had expired or the message came back from a DLQ
    /// ([`ClaimRequest::restart_runs`]). The retry budget
    /// counts this, not only SQS's receive count, where the two differ.
    pub run: u32,
}

/// The result of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (absent, expired, or in progress with a lapsed lease): run the job.
    Acquired(Claim),
    /// A live record exists: completed (a duplicate) or in progress elsewhere.
    Exists(IdempotencyRecord),
}

/// A store call that failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The record is no longer ours: its token changed (a takeover after our lease lapsed) or it is gone.
    #[error("claim on {key} is no longer held: another worker took it over after the lease lapsed")]
    Fenced {
        /// The key.
        key: String,
    },
    /// The store cannot be reached, throttled or failed: retry later, never run unclaimed.
    #[error("idempotency store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
    },
    /// The table does not exist, access is denied, or the request is invalid: fix the configuration.
    #[error("idempotency store refused the request: {message}")]
    Misconfigured {
        /// What was wrong and what to do.
        message: String,
    },
    /// The output does not fit in one item (400 KB) and the store is set to refuse it.
    #[error("output of {key} is {size} bytes, over the store's limit of {limit} bytes")]
    OutputTooLarge {
        /// The key.
        key: String,
        /// The output's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
}

/// The idempotency port, implemented on DynamoDB (`conveyor-dynamodb`) and in memory (`conveyor-testing`).
///
/// Contracts every implementation keeps (the conformance suite in `conveyor-testing` checks them):
/// - `claim` is atomic: of any number of concurrent claims on one key, exactly one is `Acquired`; the
///   others see `Exists` with the winner's record. A record counts as free when it is absent, when its
///   `expires_at` has passed, or when it is in progress with a `lease_until` that has passed. Times are
///   compared by the store at the moment of the write, never left to TTL deletion.
/// - Each acquired claim carries a fencing token greater than every earlier claim's on the key
///   ([`next_token`] of the record it replaced), stored on the record in the same atomic write.
/// - `complete`, `release` and `extend_lease` succeed only while the record still carries the claim's
///   token; otherwise they fail with `StoreError::Fenced` and change nothing.
/// - `complete` sets the status to completed, stores the output and the new expiry; `release` ends
///   the record's lease (`lease_until` at the epoch, so the key is claimable at once) and moves its token
///   one past the claim's (the record stays, so the token keeps increasing); `extend_lease` moves `lease_until`, and `expires_at` to [`EXPIRY_PAST_LEASE`] after it,
///   so a long job's record can neither be taken over as expired nor deleted by TTL while it runs.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// The table the records are in, when the store has one (DynamoDB's table name; `None` for an
    /// in-memory store): the runtimes compare it with `CONVEYOR_IDEMPOTENCY_TABLE` and name it in their
    /// start line. A store that wraps another returns the inner one's.
    fn table(&self) -> Option<&str> {
        None
    }

    /// Claims a key.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Marks the claim's job completed with its output.
    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError>;

    /// Frees the claim's record so a retry can claim it at once (its lease ends; its token moves on).
    /// The key's run count stays: the retry is the next run.
    async fn release(&self, claim: &Claim) -> Result<(), StoreError>;

    /// Moves the claim's lease end.
    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError>;

    /// Reads a record (expired or not).
    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError>;

    // Job tracking (see `crate::tracking`). The status rides on the claim, complete and release writes
    // above, under the same conditions; a store that keeps no job records falls back to them.

    /// [`claim`](Self::claim), also recording the job as `change.status` (running) when acquired.
    async fn claim_tracked(
        &self,
        request: &ClaimRequest,
        change: &JobChange,
    ) -> Result<ClaimOutcome, StoreError> {
        let _ = change;
        self.claim(request).await
    }

    /// [`complete`](Self::complete), also recording `change` (succeeded, the last progress).
    async fn complete_tracked(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: &JobChange,
    ) -> Result<(), StoreError> {
        let _ = change;
        self.complete(claim, output, expires_at).await
    }

    /// [`release`](Self::release), also recording `change` (retrying or dead-lettered, the error).
    async fn release_tracked(&self, claim: &Claim, change: &JobChange) -> Result<(), StoreError> {
        let _ = change;
        self.release(claim).await
    }

    /// Writes a progress report on the claim's record, fenced on its token while it is in progress.
    async fn record_progress(&self, claim: &Claim, progress: &Progress) -> Result<(), StoreError> {
        let _ = (claim, progress);
        Ok(())
    }

    /// Records a job as sent (a producer's write): only when no record exists for the key yet, so it
    /// never overwrites a run that started first. The record does not block the claim.
    async fn mark_sent(&self, key: &str, change: &JobChange) -> Result<(), StoreError> {
        let _ = (key, change);
        Ok(())
    }

    /// Reads a tracked job's record; `None` when the key has no record or an untracked one.
    async fn job(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        let _ = key;
        Err(not_tracking())
    }

    /// Lists tracked jobs of one type, newest change first.
    async fn jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        let _ = query;
        Err(not_tracking())
    }
}

fn not_tracking() -> StoreError {
    StoreError::Misconfigured {
        message:
            "this idempotency store keeps no job records (job tracking needs the DynamoDB or memory store)"
                .to_owned(),
    }
}

/// How far past its lease an in-progress record's expiry is set on each extension.
pub const EXPIRY_PAST_LEASE: Duration = Duration::from_secs(3600);

/// Keys longer than this are hashed (DynamoDB allows 2,048 bytes in a partition key).
const MAX_PLAIN_KEY_BYTES: usize = 1024;

/// The record key for a job: `conveyor:<job type>#<producer key or message id>`, hashed when long.
pub fn idempotency_key(job_type: &str, producer_key: Option<&str>, message_id: &str) -> String {
    let key = producer_key.unwrap_or(message_id);
    let full = format!("conveyor:{job_type}#{key}");
    if full.len() <= MAX_PLAIN_KEY_BYTES {
        return full;
    }
    format!("conveyor:{job_type}#sha256:{}", payload_hash(key))
}

/// The hash stored for payload validation: SHA-256 of the body, hex.
pub fn payload_hash(payload: &str) -> String {
    hex::encode(Sha256::digest(payload.as_bytes()))
}

/// The fencing token a claim writes over `previous` (the token of the record it replaces, if that
/// record had one): one more than it, or, on a record without one, one more than the claimant's clock
/// in epoch milliseconds. The clock base keeps tokens increasing across records that were released
/// (deleted) or expired and removed, as long as the claimants' clocks agree to within the time between
/// one claim's end and the next claim (seconds, at least: a retry's backoff, a lapsed lease).
pub fn next_token(previous: Option<u64>, now: SystemTime) -> u64 {
    let base = previous.unwrap_or_else(|| {
        now.duration_since(UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    });
    base.saturating_add(1)
}

/// How long to wait before retrying a job whose key is in progress elsewhere: until the other lease
/// lapses (a little after), or `fallback` when the record carries no lease.
pub(crate) fn wait_for_lease(record: &IdempotencyRecord, now: SystemTime, fallback: Duration) -> Duration {
    let end = record
        .lease_until
        .unwrap_or(now + fallback)
        .min(record.expires_at);
    end.duration_since(now).unwrap_or(Duration::ZERO) + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespaced_and_prefer_the_producer_key() {
        assert_eq!(
            idempotency_key("email", Some("user:42"), "m-1"),
            "conveyor:email#user:42"
        );
        assert_eq!(idempotency_key("email", None, "m-1"), "conveyor:email#m-1");
        assert_ne!(
            idempotency_key("email", None, "m-1"),
            idempotency_key("report", None, "m-1")
        );
    }

    #[test]
    fn long_keys_are_hashed_below_the_dynamodb_limit() {
        let long = "x".repeat(5000);
        let key = idempotency_key("email", Some(&long), "m-1");
        assert!(key.len() < 200);
        assert_eq!(key, idempotency_key("email", Some(&long), "m-2"));
    }

    #[test]
    fn waiting_for_a_lease_ends_just_after_it() {
        let now = SystemTime::now();
        let record = IdempotencyRecord {
            key: "k".into(),
            status: RecordStatus::InProgress,
            expires_at: now + Duration::from_secs(3600),
            lease_until: Some(now + Duration::from_secs(30)),
            output: None,
            validation: None,
            token: None,
            last_attempt: false,
        };
        assert_eq!(
            wait_for_lease(&record, now, Duration::from_secs(60)),
            Duration::from_secs(31)
        );
        let no_lease = IdempotencyRecord {
            lease_until: None,
            ..record
        };
        assert_eq!(
            wait_for_lease(&no_lease, now, Duration::from_secs(60)),
            Duration::from_secs(61)
        );
    }
}
