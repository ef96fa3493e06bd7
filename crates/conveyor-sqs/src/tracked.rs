//! Sending a tracked job: its record says `sent` before a consumer picks it up (see
//! `conveyor-core/src/tracking.rs`).

use conveyor_core::port::idempotency_key;
use conveyor_core::runtime::STATUS_RETENTION;
use conveyor_core::{
    JobStatus,
    port::{IdempotencyStore, JobChange},
};
use serde::Serialize;

use crate::job::{NewJob, ProduceError};
use crate::producer::Producer;

impl Producer {
    /// Sends a job of a tracked type ([`Producer::send`]), then records it as `sent` in its job record
    /// in `store` (the consumers' idempotency table), keyed as the consumers key it (Conveyor's key
    /// style: the job's key, or the message id). One more DynamoDB write per job, on the producer's
    /// side; the marker never overwrites a run that started first and never blocks the claim. A failed
    /// marker write is logged and the message id returned anyway: the job is sent, only its `sent`
    /// status is missing. The marker lasts the job's delay plus the status retention
    /// (`conveyor_core::runtime::STATUS_RETENTION`, 14 days), so a job delayed for days still says
    /// `sent` until it runs.
    ///
    /// Tracking needs Conveyor's key style on the consumer: a consumer that keys records the
    /// Powertools way claims another key than this marker's, and refuses to start with a tracked
    /// handler in that style.
    pub async fn send_tracked<J: Serialize>(
        &self,
        job: &NewJob<J>,
        store: &dyn IdempotencyStore,
    ) -> Result<String, ProduceError> {
        let now = std::time::SystemTime::now();
        let id = self.send(job).await?;
        let key = idempotency_key(job.job_type(), job.producer_key(), &id);
        let delay = job.delay_from(now).unwrap_or_default();
        let sent =
            JobChange::now(job.job_type(), JobStatus::Sent, 0).keep_until(now + delay + STATUS_RETENTION);
        if let Err(error) = store.mark_sent(&key, &sent).await {
            tracing::warn!(%error, key, "job sent, but its sent status was not recorded");
        }
        Ok(id)
    }
}
