//! What other AWS services put on the example application's queue: billing events from EventBridge,
//! uploads from S3, and sign-ups as CloudEvents. Each is routed by what it is ([`routes`]), so no
//! producer has to speak Conveyor's message format; SNS notifications of Conveyor jobs (a
//! `conveyor.type` message attribute) reach the job routes as they are.

use std::sync::Arc;

use conveyor_core::events::S3Event;
use conveyor_core::{Context, Handler, HandlerError, Router};
use serde::{Deserialize, Serialize};

use crate::outbox::Outbox;

/// The EventBridge `source` of the billing system's events.
pub const BILLING_SOURCE: &str = "com.example.billing";
/// The `detail-type` of a paid invoice.
pub const INVOICE_PAID: &str = "Invoice Paid";
/// The CloudEvents `type` of a sign-up.
pub const USER_SIGNED_UP: &str = "com.example.user.signed_up";

/// An EventBridge event's `detail`: an invoice was paid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvoicePaid {
    /// The invoice.
    pub invoice_id: String,
    /// What was paid, in cents.
    pub amount_cents: u64,
}

/// Books a paid invoice.
#[derive(Debug)]
pub struct RecordPayment {
    /// Where bookings are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for RecordPayment {
    type Job = InvoicePaid;
    type Output = ();
    const JOB_TYPE: &'static str = "record_payment";

    async fn handle(&self, job: InvoicePaid, ctx: Context) -> Result<(), HandlerError> {
        let event_id = ctx.event().map(|event| event.id.clone());
        self.outbox
            .record(&serde_json::json!({
                "effect": "payment_recorded",
                "invoice_id": job.invoice_id,
                "amount_cents": job.amount_cents,
                "event_id": event_id,
                "key": ctx.idempotency_key(),
            }))
            .await?;
        Ok(())
    }
}

/// Indexes uploaded objects (an S3 event notification, every record of it).
#[derive(Debug)]
pub struct IndexUpload {
    /// Where indexed objects are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for IndexUpload {
    type Job = S3Event;
    type Output = ();
    const JOB_TYPE: &'static str = "index_upload";

    async fn handle(&self, job: S3Event, ctx: Context) -> Result<(), HandlerError> {
        for record in &job.records {
            self.outbox
                .record(&serde_json::json!({
                    "effect": "upload_indexed",
                    "event": record.event_name,
                    "bucket": record.bucket,
                    "object": record.key,
                    "size": record.size,
                    "key": ctx.idempotency_key(),
                }))
                .await?;
        }
        Ok(())
    }
}

/// A sign-up, as the identity service publishes it (a CloudEvent's `data`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedUp {
    /// The new user.
    pub user_id: u64,
}

/// Starts a new user's onboarding.
#[derive(Debug)]
pub struct StartOnboarding {
    /// Where onboardings are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for StartOnboarding {
    type Job = SignedUp;
    type Output = ();
    const JOB_TYPE: &'static str = "start_onboarding";

    async fn handle(&self, job: SignedUp, ctx: Context) -> Result<(), HandlerError> {
        let event = ctx
            .cloud_event()
            .map(|event| format!("{} {}", event.source, event.id));
        self.outbox
            .record(&serde_json::json!({
                "effect": "onboarding_started",
                "user_id": job.user_id,
                "cloud_event": event,
                "key": ctx.idempotency_key(),
            }))
            .await?;
        Ok(())
    }
}

/// Adds the event routes to the application's `router`.
pub fn routes(router: Router, outbox: &Arc<Outbox>) -> Router {
    router
        .event(
            BILLING_SOURCE,
            INVOICE_PAID,
            RecordPayment {
                outbox: Arc::clone(outbox),
            },
        )
        .s3_events(IndexUpload {
            outbox: Arc::clone(outbox),
        })
        .cloud_event(
            USER_SIGNED_UP,
            StartOnboarding {
                outbox: Arc::clone(outbox),
            },
        )
}
