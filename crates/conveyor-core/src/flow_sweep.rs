//! The deadline sweep: every flow ends, even when a child ended where no consumer could count it.
//!
//! A child moved to the DLQ by SQS's own redrive (a crash, an out of memory or a Lambda timeout on its
//! last receive) is never seen by a pipeline again, and a child whose producer crashed before sending
//! it never exists in a queue. Past a flow's deadline the sweep looks at each child not counted yet:
//! its idempotency record completed → counted as succeeded, with the record's output (a count lost
//! after the record was written); claimed and its lease not over → **running**: not counted, the flow
//! stays open and the next pass looks again (its own consumer counts it when it ends, and its lease
//! ends with its process); otherwise → counted as failed, "not finished by the flow's deadline". The
//! policy then decides for the parent like any count's, the flow is closed (unless a child runs), and
//! the flow is reported (an error log and [`SweepReport::overdue`], which the worker exports as
//! `conveyor_flows_overdue_total`) so an alarm can fire.
//!
//! Counts here race with late children harmlessly: a child counted by its own consumer first makes
//! the sweep's count a `Before`, and a failed count is moved to succeeded by a later success while
//! the parent was not sent (once it was, the flow keeps what the parent saw).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::background::BackgroundTask;
use crate::flow::{ChildEnd, Flows};
use crate::flow_step::{StepError, count_and_send, send_due};
use crate::handler::BoxFuture;
use crate::idempotency::{IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError};

/// Flows listed per page.
const PAGE: usize = 100;
/// Flows one pass looks at, at most (closed or failed): a pass ends in bounded time however many
/// flows are overdue or keep failing; the next pass takes the rest.
const MAX_PER_PASS: usize = 1_000;

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Flows found past their deadline and closed.
    pub overdue: usize,
    /// Children counted as succeeded from their records (their own count was lost).
    pub recovered: usize,
    /// Children counted as failed at the deadline.
    pub counted_out: usize,
    /// Flows past their deadline left open because a child still runs (claimed, its lease not over):
    /// the next pass looks again.
    pub running: usize,
    /// Flows whose sweep failed in this pass (each logged with its id and error; they stay overdue and
    /// the next pass tries them again). One flow's failure never stops the sweep of the others.
    pub failed: usize,
}

/// Sweeps the flows past their deadline at `now` (see the module's note), at most a
/// thousand of them. `records` is the children's idempotency store. A flow whose sweep fails
/// (its parent's queue refuses the send, a store call fails) is logged, counted in
/// [`SweepReport::failed`] and passed over; only a failure to list the overdue flows is an error.
pub async fn sweep_overdue_flows(
    flows: &Flows,
    records: &dyn IdempotencyStore,
    now: SystemTime,
) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    let mut failed: HashSet<String> = HashSet::new();
    while report.overdue + failed.len() < MAX_PER_PASS {
        // Flows that failed in this pass are still listed: ask for as many more, so they never hide
        // the flows behind them.
        let limit = PAGE + failed.len();
        let listed = flows.store.overdue(now, limit).await?;
        let page: Vec<&String> = listed.iter().filter(|id| !failed.contains(*id)).collect();
        if page.is_empty() {
            break;
        }
        for flow_id in page {
            match sweep_and_close(flows, records, flow_id, now, &mut report).await {
                Ok(Swept::Closed) => report.overdue += 1,
                Ok(Swept::Running) => {
                    report.running += 1;
                    // Still listed: passed over like a failure for the rest of this pass.
                    failed.insert(flow_id.clone());
                }
                Err(error) => {
                    tracing::error!(
                        flow_id = %flow_id,
                        %error,
                        "sweeping a flow past its deadline failed; the sweep goes on with the others and tries it \
                         again at the next pass"
                    );
                    failed.insert(flow_id.clone());
                }
            }
        }
        if listed.len() < limit {
            break;
        }
    }
    report.failed = failed.len() - report.running;
    Ok(report)
}

/// How one flow's sweep ended.
enum Swept {
    /// Every child counted: closed.
    Closed,
    /// A child still runs: left open.
    Running,
}

async fn sweep_and_close(
    flows: &Flows,
    records: &dyn IdempotencyStore,
    flow_id: &str,
    now: SystemTime,
    report: &mut SweepReport,
) -> Result<Swept, StoreError> {
    if let Swept::Running = sweep_flow(flows, records, flow_id, now, report).await? {
        return Ok(Swept::Running);
    }
    flows.store.close(flow_id).await?;
    Ok(Swept::Closed)
}

/// True when `record` is a claim whose lease is not over at `now`: its job runs.
fn running(record: &IdempotencyRecord, now: SystemTime) -> bool {
    record.status == RecordStatus::InProgress && !record.is_free_at(now)
}

async fn sweep_flow(
    flows: &Flows,
    records: &dyn IdempotencyStore,
    flow_id: &str,
    now: SystemTime,
    report: &mut SweepReport,
) -> Result<Swept, StoreError> {
    let Some(flow) = flows.store.flow(flow_id).await? else {
        return Ok(Swept::Closed);
    };
    let unfinished: Vec<_> = flows
        .store
        .children(flow_id)
        .await?
        .into_iter()
        .filter(|child| child.end.is_none())
        .collect();
    if !unfinished.is_empty() {
        tracing::error!(
            flow_id,
            unfinished = unfinished.len(),
            deadline = %crate::display::format_epoch_millis(flow.deadline),
            "flow passed its deadline with children unfinished; counting those not running as failed"
        );
    }
    let mut still_running = 0;
    for child in unfinished {
        let end = match records.get(&child.key).await? {
            Some(record) if running(&record, now) => {
                still_running += 1;
                continue;
            }
            Some(record) if record.status == RecordStatus::Completed => {
                report.recovered += 1;
                ChildEnd::Succeeded {
                    output: record.output,
                }
            }
            _ => {
                report.counted_out += 1;
                ChildEnd::Failed(format!(
                    "not finished by the flow's deadline ({}): dead-lettered by SQS's redrive after a crash \
                     or timeout, never sent, or still retrying",
                    crate::display::format_epoch_millis(flow.deadline)
                ))
            }
        };
        count_and_send(flows, flow_id, &child.id, &end)
            .await
            .map_err(into_store_error)?;
    }
    // Every child was counted before: the parent may still be owed (a crash between a count and the send).
    if let Some(flow) = flows.store.flow(flow_id).await? {
        send_due(flows, &flow).await.map_err(into_store_error)?;
    }
    if still_running > 0 {
        tracing::warn!(
            flow_id,
            running = still_running,
            "flow past its deadline has children still running; they are not counted as failed while they run"
        );
        return Ok(Swept::Running);
    }
    Ok(Swept::Closed)
}

fn into_store_error(error: StepError) -> StoreError {
    match error {
        StepError::Store(error) => error,
        StepError::Send(error) => StoreError::Unavailable {
            message: format!("sending a flow's parent failed: {error}"),
        },
    }
}

/// Runs [`sweep_overdue_flows`] every `interval` beside a worker's jobs (a [`BackgroundTask`]).
pub struct FlowSweeper {
    flows: Flows,
    records: Arc<dyn IdempotencyStore>,
    interval: Duration,
}

impl std::fmt::Debug for FlowSweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowSweeper")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl FlowSweeper {
    /// A sweeper of `flows` whose children's records are in `records`, once a minute.
    pub fn new(flows: Flows, records: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            flows,
            records,
            interval: Duration::from_secs(60),
        }
    }

    /// Sweeps every `interval` instead.
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// One pass now.
    pub async fn sweep(&self) -> Result<SweepReport, StoreError> {
        sweep_overdue_flows(&self.flows, self.records.as_ref(), SystemTime::now()).await
    }
}

impl BackgroundTask for FlowSweeper {
    fn name(&self) -> &'static str {
        "flow sweeper"
    }

    fn run(self: Box<Self>, drain: tokio_util::sync::CancellationToken) -> BoxFuture<()> {
        Box::pin(async move {
            loop {
                match self.sweep().await {
                    Ok(report) if report.overdue > 0 || report.failed > 0 => {
                        let overdue = u64::try_from(report.overdue).unwrap_or(u64::MAX);
                        metrics::counter!(crate::metric_names::FLOWS_OVERDUE).increment(overdue);
                        tracing::warn!(
                            overdue = report.overdue,
                            recovered = report.recovered,
                            counted_out = report.counted_out,
                            failed = report.failed,
                            "flows swept past their deadline"
                        );
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "the flow sweep failed; trying again at the next pass")
                    }
                }
                tokio::select! {
                    () = drain.cancelled() => return,
                    () = tokio::time::sleep(crate::backoff::equal_jitter(self.interval)) => {}
                }
            }
        })
    }
}
