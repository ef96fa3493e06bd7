//! A report split into chunks (a flow): each chunk job runs its share of the queries on whichever
//! worker picks it up, reporting progress; the parent assembles the report from the chunks' outputs
//! once the last chunk succeeded. Sent with [`chunked_report_flow`] and `conveyor_sqs::FlowProducer`.

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::{Context, Handler, HandlerError, HandlerSettings};
use conveyor_sqs::{Flow, NewJob};
use serde::{Deserialize, Serialize};

use crate::outbox::Outbox;

/// The parent job: assemble report `report_id` from `chunks` chunks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssembleReport {
    /// The report's id.
    pub report_id: String,
    /// How many chunks it was split into.
    pub chunks: u32,
}

/// One chunk: `queries` queries of `query_millis` each (a stand-in for real queries).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportChunk {
    /// The report's id.
    pub report_id: String,
    /// This chunk's number (0-based).
    pub chunk: u32,
    /// Queries in this chunk.
    pub queries: u32,
    /// How long one query takes.
    pub query_millis: u64,
}

/// A chunk's result, stored in its idempotency record and read by the parent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkRows {
    /// The chunk's number.
    pub chunk: u32,
    /// Rows it produced.
    pub rows: u64,
}

/// The assembled report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportAssembled {
    /// Where it went.
    pub location: String,
    /// Chunks assembled.
    pub chunks: u32,
    /// Rows in all.
    pub rows: u64,
}

/// The flow of a chunked report: the parent on `queue_url`, `chunks` chunk jobs on the same queue.
pub fn chunked_report_flow(report_id: &str, chunks: u32, query_millis: u64, queue_url: &str) -> Flow {
    let parent = AssembleReport {
        report_id: report_id.to_owned(),
        chunks,
    };
    let mut flow = Flow::new(
        format!("report:{report_id}"),
        NewJob::new(AssembleReportHandler::JOB_TYPE, parent),
        queue_url,
    );
    for chunk in 0..chunks {
        let job = ReportChunk {
            report_id: report_id.to_owned(),
            chunk,
            queries: 4,
            query_millis,
        };
        flow = flow.child(NewJob::new(RunReportChunk::JOB_TYPE, job), queue_url);
    }
    flow
}

/// Runs one chunk's queries, reporting progress after each.
#[derive(Debug)]
pub struct RunReportChunk;

impl Handler for RunReportChunk {
    type Job = ReportChunk;
    type Output = ChunkRows;
    const JOB_TYPE: &'static str = "report_chunk";

    async fn handle(&self, job: ReportChunk, ctx: Context) -> Result<ChunkRows, HandlerError> {
        if job.queries == 0 {
            return Err(HandlerError::permanent(format!(
                "chunk {} of report {} has no queries",
                job.chunk, job.report_id
            )));
        }
        let mut rows = 0;
        for query in 1..=job.queries {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(job.query_millis)) => {}
                () = ctx.cancelled() => return Err(HandlerError::retryable("chunk cancelled")),
            }
            rows += u64::from(job.chunk + 1) * 10;
            let percent = u8::try_from(query * 100 / job.queries.max(1)).unwrap_or(100);
            ctx.progress(
                percent,
                format!("chunk {} query {query} of {}", job.chunk, job.queries),
            );
        }
        Ok(ChunkRows {
            chunk: job.chunk,
            rows,
        })
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default()
            .with_tracked(true)
            .with_progress_interval(Duration::from_secs(1))
    }
}

/// Assembles a report from its chunks' outputs (the flow's parent).
#[derive(Debug)]
pub struct AssembleReportHandler {
    /// Where assembled reports are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for AssembleReportHandler {
    type Job = AssembleReport;
    type Output = ReportAssembled;
    const JOB_TYPE: &'static str = "chunked_report";

    async fn handle(&self, job: AssembleReport, ctx: Context) -> Result<ReportAssembled, HandlerError> {
        let chunks: Vec<ChunkRows> = ctx.child_outputs()?;
        let failed = ctx.failed_children();
        if chunks.len() + failed != usize::try_from(job.chunks).unwrap_or(usize::MAX) {
            return Err(HandlerError::permanent(format!(
                "report {} expected {} chunks, the flow has {}",
                job.report_id,
                job.chunks,
                chunks.len() + failed
            )));
        }
        ctx.progress(100, format!("assembled {} chunks", chunks.len()));
        let rows = chunks.iter().map(|chunk| chunk.rows).sum();
        let location = format!("reports/{}.pdf", job.report_id);
        self.outbox
            .record(&serde_json::json!({
                "effect": "chunked_report_assembled",
                "report_id": job.report_id,
                "chunks": chunks.len(),
                "failed_chunks": failed,
                "rows": rows,
                "message_id": ctx.message_id(),
                "queue": ctx.queue(),
            }))
            .await?;
        Ok(ReportAssembled {
            location,
            chunks: u32::try_from(chunks.len()).unwrap_or(u32::MAX),
            rows,
        })
    }

    fn settings(&self) -> HandlerSettings {
        HandlerSettings::default().with_tracked(true)
    }
}
