//! A report that runs longer than the queue's visibility timeout: the heartbeat keeps it invisible,
//! its progress goes to its job record (`conveyor jobs watch`) and the logs, and it finishes once.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::{Context, Handler, HandlerError, HandlerSettings};
use serde::{Deserialize, Serialize};

use crate::outbox::Outbox;

/// The job: which report, and how many sections to build.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerateReport {
    /// The report's id.
    pub report_id: String,
    /// Sections to build; each takes `section_millis`.
    pub sections: u32,
    /// How long one section takes (a stand-in for real queries).
    pub section_millis: u64,
}

/// Where the report went.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReportBuilt {
    /// The report's location.
    pub location: String,
}

/// Builds reports.
#[derive(Debug)]
pub struct BuildReport {
    /// Where finished reports are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for BuildReport {
    type Job = GenerateReport;
    type Output = ReportBuilt;
    const JOB_TYPE: &'static str = "report";

    async fn handle(&self, job: GenerateReport, ctx: Context) -> Result<ReportBuilt, HandlerError> {
        for section in 1..=job.sections {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(job.section_millis)) => {}
                () = ctx.cancelled() => {
                    return Err(HandlerError::retryable(format!("report {} cancelled at section {section}", job.report_id)));
                }
            }
            tracing::info!(report_id = %job.report_id, section, of = job.sections, "report progress");
            let percent = u8::try_from(section * 100 / job.sections.max(1)).unwrap_or(100);
            ctx.progress(percent, format!("section {section} of {}", job.sections));
        }
        let location = format!("reports/{}.pdf", job.report_id);
        self.outbox
            .record(&serde_json::json!({
                "effect": "report_built",
                "report_id": job.report_id,
                "location": location,
                "message_id": ctx.message_id(),
                "receive_count": ctx.receive_count(),
            }))
            .await?;
        Ok(ReportBuilt { location })
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_tracked(true)
    }
}
