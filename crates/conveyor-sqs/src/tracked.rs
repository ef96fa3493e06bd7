//! Sending a tracked job: its record says `sent` before a consumer picks it up (see
//! `conveyor-core/src/tracking.rs`).

use conveyor_core::port::idempotency_key;
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
    /// status is missing.
    pub async fn send_tracked<J: Serialize>(
        &self,
        job: &NewJob<J>,
        store: &dyn IdempotencyStore,
    ) -> Result<String, ProduceError> {
        let id = self.send(job).await?;
        let key = idempotency_key(job.job_type(), job.producer_key(), &id);
        let sent = JobChange::now(job.job_type(), JobStatus::Sent, 0);
        if let Err(error) = store.mark_sent(&key, &sent).await {
            tracing::warn!(%error, key, "job sent, but its sent status was not recorded");
        }
        Ok(id)
    }
}
