//! Job status and progress: what a tracked job's record says about it, and how the pipeline writes it.
//!
//! # Design note: where the record lives and what it costs
//!
//! A tracked job's status sits **in its idempotency record** (same item, same key), in attributes of
//! its own (`job_*`, see `conveyor-dynamodb`) that AWS Lambda Powertools ignores, so a shared table
//! stays readable by Powertools. The status is written **in the same conditional writes idempotency
//! already makes**: the claim writes `running` (and the attempt), complete writes `succeeded`, release
//! writes `retrying` or `dead_lettered` with the error. A short tracked job therefore costs exactly
//! what an untracked idempotent one does: one claim and one complete. Only progress reports add writes,
//! at most one per [`HandlerSettings::progress_interval`](crate::HandlerSettings) whatever the handler
//! calls, and the last report rides on the complete or release (so it always lands, at no cost).
//!
//! Every tracking write is fenced on the claim's token like the rest of the record: a worker whose lease
//! lapsed cannot overwrite the status or progress of the one that took over.
//!
//! Tracking needs idempotency on (`HandlerSettings::idempotent` and a store in the pipeline): the
//! record is the idempotency record.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::idempotency::IdempotencyRecord;
use crate::outcome::{AckReason, Outcome};

/// Where a tracked job is.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Sent by a producer that records it, not picked up yet.
    Sent,
    /// A worker or Lambda function holds its claim and runs it.
    Running,
    /// A run failed; the job waits for its next attempt.
    Retrying,
    /// Done; its output is stored.
    Succeeded,
    /// Sent to the dead-letter queue with its last error.
    DeadLettered,
    /// Cancelled by its producer before it ran (`conveyor_core::runtime::cancel`).
    Cancelled,
}

impl JobStatus {
    /// Every status, in the order a job goes through them.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Sent,
        JobStatus::Running,
        JobStatus::Retrying,
        JobStatus::Succeeded,
        JobStatus::DeadLettered,
        JobStatus::Cancelled,
    ];

    /// The stored name: `sent`, `running`, `retrying`, `succeeded`, `dead_lettered`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Sent => "sent",
            JobStatus::Running => "running",
            JobStatus::Retrying => "retrying",
            JobStatus::Succeeded => "succeeded",
            JobStatus::DeadLettered => "dead_lettered",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// The status a stored name stands for (`dead-lettered` is accepted too).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().to_ascii_lowercase().replace('-', "_");
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// True for the statuses a job does not leave on its own.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::DeadLettered | JobStatus::Cancelled
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A progress report from a handler ([`Context::progress`](crate::Context::progress)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// 0 to 100.
    pub percent: u8,
    /// What the handler is doing, in its own words.
    pub message: String,
    /// When the handler reported it.
    #[serde(with = "epoch_millis")]
    pub at: SystemTime,
}

/// One change of a tracked job's status, as the store writes it with the claim, complete or release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobChange {
    /// The job type (the secondary index lists jobs by type and status).
    pub job_type: String,
    /// The new status.
    pub status: JobStatus,
    /// The run this change belongs to (1 = first).
    pub attempt: u32,
    /// The error, when a run failed.
    pub error: Option<String>,
    /// The handler's last progress report, when it made one not yet written.
    pub progress: Option<Progress>,
    /// When it changed.
    pub at: SystemTime,
    /// The record's new expiry, when this change sets one: a final status's write keeps the record
    /// for the status retention ([`HandlerSettings::status_retention`](crate::HandlerSettings)), a
    /// producer's `sent` marker for the job's delay plus that.
    pub keep_until: Option<SystemTime>,
    /// The release sets the record's run count to this. A release that dead-letters the job after a
    /// run sets the redrive policy's `maxReceiveCount`: should the DLQ send fail and the message come
    /// back, its claim is over the budget and the job is dead-lettered again without running. One that
    /// records a job leaving unrun (`src/unrun.rs`) sets the count from before its claim.
    pub spend_runs: Option<u32>,
}

impl JobChange {
    /// A change to `status` now.
    pub fn now(job_type: &str, status: JobStatus, attempt: u32) -> Self {
        Self {
            job_type: job_type.to_owned(),
            status,
            attempt,
            error: None,
            progress: None,
            at: crate::wall_clock::now(),
            keep_until: None,
            spend_runs: None,
        }
    }

    /// The same change, keeping the record until `until`.
    pub fn keep_until(mut self, until: SystemTime) -> Self {
        self.keep_until = Some(until);
        self
    }
}

/// The status a run's outcome leaves the job in, with the error that goes with it.
pub(crate) fn status_after(outcome: &Outcome) -> (JobStatus, Option<String>) {
    match outcome {
        Outcome::Ack(AckReason::Completed | AckReason::Duplicate | AckReason::Ignored) => {
            (JobStatus::Succeeded, None)
        }
        Outcome::Ack(AckReason::Cancelled) => (JobStatus::Cancelled, None),
        Outcome::Retry { reason, .. } | Outcome::Defer { reason, .. } => {
            (JobStatus::Retrying, Some(reason.clone()))
        }
        Outcome::Reject(failure) => (JobStatus::DeadLettered, Some(failure.error.clone())),
    }
}

/// A tracked job's record, as `conveyor jobs show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The record's key (`conveyor:<job type>#<key>`).
    pub key: String,
    /// The job type.
    pub job_type: String,
    /// Where it is.
    pub status: JobStatus,
    /// Runs started so far.
    pub attempts: u32,
    /// The last run's error (kept after a later success, so a retried job says why it was retried).
    pub last_error: Option<String>,
    /// The last progress written.
    pub progress: Option<Progress>,
    /// The output, once succeeded (JSON text).
    pub output: Option<String>,
    /// When the status last changed.
    #[serde(with = "epoch_millis")]
    pub updated_at: SystemTime,
    /// The last time the job entered each status it has been in, in [`JobStatus::ALL`]'s order.
    pub history: Vec<(JobStatus, StatusTime)>,
    /// The fencing token of the claim that wrote the record last.
    pub token: Option<u64>,
}

impl JobRecord {
    /// The record a first change creates (a producer's `sent`, or a claim's `running`).
    pub fn first(key: &str, change: &JobChange) -> Self {
        let mut record = Self {
            key: key.to_owned(),
            job_type: change.job_type.clone(),
            status: change.status,
            attempts: 0,
            last_error: None,
            progress: None,
            output: None,
            updated_at: change.at,
            history: Vec::new(),
            token: None,
        };
        record.apply(change);
        record
    }

    /// Applies one change, as every store writes it: the status and its time; a run's start counts an
    /// attempt and clears the previous run's progress; an error replaces the last one (and stays after
    /// a later success); a progress report replaces the last one.
    pub fn apply(&mut self, change: &JobChange) {
        self.job_type.clone_from(&change.job_type);
        self.status = change.status;
        self.updated_at = change.at;
        match self
            .history
            .iter_mut()
            .find(|(status, _)| *status == change.status)
        {
            Some(entry) => entry.1 = StatusTime(change.at),
            None => {
                self.history.push((change.status, StatusTime(change.at)));
                self.history.sort_by_key(|(status, _)| *status);
            }
        }
        if change.status == JobStatus::Running {
            self.attempts = self.attempts.saturating_add(1);
            self.progress = None;
        }
        if let Some(error) = &change.error {
            self.last_error = Some(error.clone());
        }
        if let Some(progress) = &change.progress {
            self.progress = Some(progress.clone());
        }
    }
}

impl JobRecord {
    /// The record as its idempotency record says it is at `now`: a run on the last receive the
    /// redrive policy allows that never settled and whose lease is over was moved to the DLQ by SQS
    /// ([`IdempotencyRecord::dead_lettered_by_redrive`]), so it is `dead_lettered` with
    /// [`REDRIVE_REASON`](crate::port::REDRIVE_REASON), since its lease's end. Every reader
    /// (`conveyor jobs show|list`, the console) sees jobs through this.
    pub fn seen_with(mut self, record: &IdempotencyRecord, now: SystemTime) -> Self {
        let redriven = matches!(self.status, JobStatus::Running | JobStatus::Retrying)
            && record.dead_lettered_by_redrive(now);
        if !redriven {
            return self;
        }
        let at = record.lease_until.unwrap_or(now);
        self.apply(&JobChange {
            error: Some(crate::idempotency::REDRIVE_REASON.to_owned()),
            at,
            ..JobChange::now(&self.job_type.clone(), JobStatus::DeadLettered, self.attempts)
        });
        self
    }
}

/// A time in a job's history (epoch milliseconds in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusTime(#[serde(with = "epoch_millis")] pub SystemTime);

/// Which tracked jobs to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobQuery {
    /// The job type.
    pub job_type: String,
    /// One status, or every status when `None`.
    pub status: Option<JobStatus>,
    /// At most this many, newest change first.
    pub limit: usize,
}

/// Orders jobs newest change first and keeps the first `limit`, as every store's `jobs` answers.
pub fn newest_first(jobs: &mut Vec<JobRecord>, limit: usize) {
    jobs.sort_by_key(|job| std::cmp::Reverse(job.updated_at));
    jobs.truncate(limit);
}

/// Epoch milliseconds of `time` (0 before the epoch).
pub fn to_epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The time `millis` after the epoch.
pub fn from_epoch_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

mod epoch_millis {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(time: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(super::to_epoch_millis(*time))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
        Ok(super::from_epoch_millis(u64::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Failure;

    #[test]
    fn statuses_round_trip_and_accept_dashes() {
        for status in JobStatus::ALL {
            assert_eq!(JobStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(JobStatus::parse("Dead-Lettered"), Some(JobStatus::DeadLettered));
        assert_eq!(JobStatus::parse("done"), None);
    }

    #[test]
    fn outcomes_map_to_statuses_with_their_errors() {
        let retry = Outcome::Retry {
            delay: Duration::from_secs(1),
            reason: "503".into(),
        };
        assert_eq!(status_after(&retry), (JobStatus::Retrying, Some("503".into())));
        let reject = Outcome::Reject(Failure::now("gone", 2, "q", "report"));
        assert_eq!(
            status_after(&reject),
            (JobStatus::DeadLettered, Some("gone".into()))
        );
        assert_eq!(
            status_after(&Outcome::Ack(AckReason::Completed)),
            (JobStatus::Succeeded, None)
        );
    }
}
