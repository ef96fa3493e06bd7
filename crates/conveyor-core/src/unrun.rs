//! A job whose message leaves its queue unrun at the last receive the redrive policy allows.
//!
//! # Design note: why a runtime asks the store before such a message goes
//!
//! A runtime gives a message back unrun in a few places: behind its FIFO group (an earlier message of
//! the group went back), at shutdown (it had not started, or a receive in flight brought it), or at a
//! Lambda invocation's cutoff. At the last receive the redrive policy allows (`maxReceiveCount`) the
//! message then reaches the DLQ: the runtime sends it there with a reason, or SQS's redrive moves it
//! on its next receive. No run claims it on the way, so without this step:
//!
//! - a tracked job's status stays what its last run wrote (`running` or `retrying`, or `sent`) while
//!   its message sits in the DLQ: `jobs show` lies until the record expires;
//! - a job that had completed (a duplicate delivery of a done job) gets a DLQ copy it never deserved.
//!
//! So, before the message goes, [`Pipeline::unrun_at_the_last_receive`] asks the store:
//!
//! 1. Completed: the job is done, the message is a duplicate; the runtime deletes it instead.
//! 2. A live claim elsewhere: that run settles the job and writes its status; nothing here.
//! 3. Free (or no record): a claim is taken and released at once with the `dead_lettered` status and
//!    the failure's reason: the release is fenced on the claim, so a run that claims in between is
//!    never overwritten. A tracked job only; an untracked job's record is read, not written. Unlike a
//!    rejection the runs are not spent: the job never ran, and another message with the same key (a
//!    producer's second send) must still run it. The release sets the key's run count back to what
//!    it was before this claim ([`JobChange::spend_runs`]), so the claim costs the job no run.
//!
//! The store unreachable: with a `deadline`, the store is asked again (jittered waits from 250 ms
//! doubling to 5 s, `crate::store_retry`, as a completion is tried again) until it answers or the
//! deadline passes. A worker gives the end of the message's hold and
//! stops asking when its lease ends, so a store outage holds the message in flight (behind it a FIFO
//! group waits, as it would for the outage anyway) until the status can be written; a Lambda
//! invocation gives its settle deadline. Past the deadline (or without one, after one try) the
//! message goes as it would have and the status is not written: the DLQ copy carries the reason. A
//! refusal (a misconfigured table) is a configuration error, not an outage: it is not waited out.
//! Only a handler with a store and idempotency on is asked.

use std::time::Duration;

use tokio::time::Instant;

use crate::handler::HandlerSettings;
use crate::idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError,
};
use crate::message::Message;
use crate::outcome::Failure;
use crate::pipeline::Pipeline;
use crate::store_retry::StoreRetry;
use crate::tracking::{JobChange, JobStatus};

/// How long the claim this step takes lasts: it is released at once, so only a process that dies
/// between the two writes leaves it, and then it lapses after this.
const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// What the store says about a job whose message leaves unrun at its last allowed receive.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnrunJob {
    /// The job completed before: delete the message (a duplicate) instead of dead-lettering it.
    Completed,
    /// Dead-letter it (or let SQS's redrive move it) as decided; a tracked job's status says so when
    /// the store could write it.
    DeadLetter,
}

impl Pipeline {
    /// Asks the store about `message`, which leaves its queue unrun at the last receive its redrive
    /// policy allows for `failure` (see the design note in `src/unrun.rs`): a completed job's message
    /// is a duplicate; a tracked job's status becomes `dead_lettered` unless a live claim holds it.
    /// With a `deadline` (the end of the message's hold, a Lambda invocation's settle deadline) an
    /// unreachable store is asked again until then; without one it is asked once. Never fails.
    pub async fn unrun_at_the_last_receive(
        &self,
        message: &Message,
        failure: &Failure,
        deadline: Option<Instant>,
    ) -> UnrunJob {
        let Some(store) = self.store() else {
            return UnrunJob::DeadLetter;
        };
        // An event is keyed by its envelope (see `crate::events`).
        let opened = self.router().opened(message);
        let message = opened.as_ref().unwrap_or(message);
        let Ok(handler) = self.router().handler_for(message) else {
            return UnrunJob::DeadLetter;
        };
        let settings = handler.settings();
        if !settings.idempotent {
            return UnrunJob::DeadLetter;
        }
        let Ok(key) = settings.key_style.key(handler.job_type(), message) else {
            return UnrunJob::DeadLetter;
        };
        // Without a deadline the store is asked once.
        let mut retry = StoreRetry::new(FIRST_WAIT, LONGEST_WAIT, deadline.unwrap_or_else(Instant::now));
        let asking = async {
            loop {
                match ask(
                    store.as_ref(),
                    &key,
                    handler.job_type(),
                    settings,
                    failure,
                    &mut retry,
                )
                .await
                {
                    Ok(answer) => return answer,
                    Err(error) if retry.after(&error).await => {}
                    Err(error) => {
                        let why = match error {
                            StoreError::Unavailable { .. } => "the store did not answer",
                            _ => "the store refused the request",
                        };
                        tracing::warn!(%key, %error, "{why}; the job leaves unrun and its status is not written");
                        return UnrunJob::DeadLetter;
                    }
                }
            }
        };
        // The deadline also bounds a single request that hangs.
        let answer = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, asking).await.unwrap_or_else(|_| {
                tracing::warn!(%key, "the store did not answer before the deadline; the job leaves unrun and its status is not written");
                UnrunJob::DeadLetter
            }),
            None => asking.await,
        };
        if answer == UnrunJob::Completed {
            tracing::info!(%key, "the job completed before; its unrun message is a duplicate and is deleted");
        }
        answer
    }
}

/// The first wait before the store is asked again, doubled up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// The store's answer, or the error that kept it from answering (logged). A status release that
/// fails is tried again on `retry`'s schedule: asked again from the start, the claim would be found
/// live (this one, until its lease lapses).
async fn ask(
    store: &dyn IdempotencyStore,
    key: &str,
    job_type: &str,
    settings: &HandlerSettings,
    failure: &Failure,
    retry: &mut StoreRetry<'_>,
) -> Result<UnrunJob, StoreError> {
    if !settings.tracked {
        return match store.get(key).await {
            Ok(Some(record)) if completed(&record) => Ok(UnrunJob::Completed),
            Ok(_) => Ok(UnrunJob::DeadLetter),
            Err(error) => {
                tracing::warn!(%error, %key, "cannot read the record of a job that leaves unrun at its last receive");
                Err(error)
            }
        };
    }
    let now = crate::wall_clock::now();
    let request = ClaimRequest {
        key: key.to_owned(),
        lease_until: now + CLAIM_LEASE,
        expires_at: now + settings.settled_record_ttl(),
        validation: None,
        restart_runs: false,
        last_attempt: true,
    };
    let claim = match store.claim(&request).await {
        Ok(ClaimOutcome::Acquired(claim)) => claim,
        Ok(ClaimOutcome::Exists(record)) if completed(&record) => return Ok(UnrunJob::Completed),
        Ok(ClaimOutcome::Exists(_)) => return Ok(UnrunJob::DeadLetter),
        Err(error) => {
            tracing::warn!(%error, %key, "cannot record the dead-lettered status of a job that leaves unrun at its last receive");
            return Err(error);
        }
    };
    let mut change = JobChange {
        error: Some(failure.error.clone()),
        ..JobChange::now(job_type, JobStatus::DeadLettered, failure.receive_count)
    };
    // The claim counted a run the job never had: the release puts the count back.
    change.spend_runs = Some(claim.run.saturating_sub(1));
    let change = change.keep_until(now + settings.settled_record_ttl());
    loop {
        let Err(error) = store.release_tracked(&claim, &change).await else {
            return Ok(UnrunJob::DeadLetter);
        };
        if !retry.after(&error).await {
            tracing::warn!(%error, %key, "could not record the dead-lettered status; the claim lapses with its lease");
            return Ok(UnrunJob::DeadLetter);
        }
        tracing::warn!(%error, %key, "could not record the dead-lettered status yet; trying again");
    }
}

/// A completed record that still counts (past its expiry it is free to claim, whatever it says).
fn completed(record: &IdempotencyRecord) -> bool {
    record.status == RecordStatus::Completed && record.expires_at > crate::wall_clock::now()
}
