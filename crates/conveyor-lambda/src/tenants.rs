//! Per-tenant limits in a Lambda execution environment (see `conveyor-core/src/tenant_limits.rs`).
//!
//! The limits count the records this environment runs at once (a batch's lanes, `batch_concurrency`
//! of them): a record whose tenant is at its limit is deferred with a delayed copy, unrun and without
//! spending a receive, like every other deferral here. Each concurrent execution environment counts its
//! own; Lambda's own scaling multiplies the limit by the function's concurrency.

use std::future::Future;
use std::sync::Arc;

use conveyor_core::message::{DeferralRecord, Message};
use conveyor_core::runtime::{
    Outcome, Processed, TenantAdmission, TenantGuards, TenantMetrics, TenantSettings, first_sent,
};

/// The limits and the per-tenant metrics of one execution environment.
#[derive(Debug)]
pub(crate) struct Tenants {
    guards: Arc<TenantGuards>,
    metrics: TenantMetrics,
}

impl Tenants {
    pub(crate) fn new(settings: &TenantSettings) -> Self {
        Self {
            guards: TenantGuards::new(settings.limits()),
            metrics: TenantMetrics::new(settings.metrics_top),
        }
    }

    /// The tenant label `message`'s figures go under in the per-tenant EMF documents (the label its
    /// run or deferral was counted under, or `other` / `none`), without counting it again.
    pub(crate) fn label(&self, message: &Message) -> std::borrow::Cow<'static, str> {
        self.metrics.label_of(message.tenant())
    }

    /// Runs `process` when `message`'s tenant is within its limits (holding its slot meanwhile);
    /// otherwise the deferral, unrun.
    pub(crate) async fn run(
        &self,
        message: &Message,
        job_type: Option<&'static str>,
        process: impl Future<Output = Processed>,
    ) -> Processed {
        let tenant = message.tenant();
        let deferrals = DeferralRecord::of(message).map_or(0, |record| record.deferrals);
        match self.guards.admit_after(tenant, deferrals) {
            TenantAdmission::Run(slot) => {
                if tenant.is_some() {
                    let dwell = first_sent(message)
                        .and_then(|sent| conveyor_core::wall_clock::now().duration_since(sent).ok());
                    self.metrics.started(tenant, dwell);
                }
                let processed = process.await;
                drop(slot);
                processed
            }
            TenantAdmission::Defer { delay, limit } => {
                self.metrics.deferred(tenant, limit);
                let tenant = tenant.unwrap_or_default();
                tracing::debug!(
                    tenant,
                    limit,
                    ?delay,
                    "tenant at its limit; the record goes back unrun"
                );
                let reason = format!("tenant {tenant} at its {limit} limit");
                let cause = conveyor_core::runtime::DeferCause::TenantLimit;
                Processed::not_run(Outcome::Defer { delay, reason, cause }, job_type)
            }
        }
    }
}
