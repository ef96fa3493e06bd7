//! A Lambda function for latency figures, run by `conveyor lambda run` in the worker's
//! `bench_idempotent` (part e): each job carries its send time (`{"sent_us": …}`, microseconds since
//! the epoch) and the handler appends `send → start` in microseconds, one line per first run, to the
//! file named by `CONVEYOR_PROBE_LOG`; a job with `"work_ms": n` then waits n ms, as a handler waiting on a
//! call (`managed_instances`). Idempotency on DynamoDB when `CONVEYOR_IDEMPOTENCY_TABLE` is set,
//! as the example application's function.
//!
//! ```text
//! cargo build --release -p conveyor-lambda --example probe_function
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary: failing loudly is the point

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_dynamodb::{DynamoStore, dynamodb_client_from_env};

#[derive(serde::Deserialize)]
struct Probe {
    sent_us: u64,
    /// Milliseconds of waiting (an I/O-bound handler's call) before the job is done; none by default.
    #[serde(default)]
    work_ms: u64,
}

/// Appends each first run's wait to the log.
struct RecordWait {
    log: Mutex<std::fs::File>,
}

impl Handler for RecordWait {
    type Job = Probe;
    type Output = ();
    const JOB_TYPE: &'static str = "probe";

    async fn handle(&self, job: Probe, ctx: Context) -> Result<(), HandlerError> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let now_us = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        if ctx.receive_count() == 1 {
            let mut log = self.log.lock().unwrap();
            writeln!(log, "{}", now_us.saturating_sub(job.sent_us))
                .map_err(|error| HandlerError::retryable(format!("probe log: {error}")))?;
        }
        if job.work_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(job.work_ms)).await;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    conveyor_lambda::init_tracing();
    let path = std::env::var("CONVEYOR_PROBE_LOG")?;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let mut pipeline = Pipeline::new(Router::single(RecordWait { log: Mutex::new(log) }));
    if let Ok(table) = std::env::var("CONVEYOR_IDEMPOTENCY_TABLE") {
        let store = DynamoStore::new(dynamodb_client_from_env().await, table);
        pipeline = pipeline.with_store(Arc::new(store));
    }
    conveyor_lambda::run(pipeline).await?;
    Ok(())
}
