//! The application's schedules, declared beside its handlers.
//!
//! One definition serves both runtimes: the ECS worker runs them (`CONVEYOR_SCHEDULES=on`; every task
//! runs the scheduler, each tick is sent by exactly one), and a Lambda deployment gets them as
//! EventBridge Scheduler schedules: `worker --export-schedules infra/examples/lambda/schedules.json`
//! (or `conveyor schedules export --app target/debug/worker --out ...`) writes the file
//! `infra/modules/schedules` reads.

use std::sync::Arc;

use anyhow::Context as _;
use conveyor_schedule::{MissedTicks, Schedule, Scheduler, TickStore};
use conveyor_sqs::Producer;

use crate::jobs::report::{BuildReport, GenerateReport};

/// Environment variable that turns the worker's scheduler on (`on`); off by default in the example,
/// so test and demo queues only get the jobs they send.
pub const SCHEDULES_ENV: &str = "CONVEYOR_SCHEDULES";
/// Environment variable naming the queue the schedules send to (default: the worker's first queue).
pub const SCHEDULE_QUEUE_ENV: &str = "CONVEYOR_SCHEDULE_QUEUE_URL";

/// Every schedule of the application.
pub fn schedules() -> anyhow::Result<Vec<Schedule>> {
    let nightly = GenerateReport {
        report_id: "nightly-sales".into(),
        sections: 3,
        section_millis: 200,
    };
    let snapshot = GenerateReport {
        report_id: "usage-snapshot".into(),
        sections: 1,
        section_millis: 50,
    };
    Ok(vec![
        // Every five minutes on the clock (:00, :05, ... UTC): what `CONVEYOR_SCHEDULES=on` shows first
        // when the worker is tried locally. `All`, as EventBridge Scheduler delivers them: ticks missed
        // while every worker was down (since the schedule's last tick) fire when one comes back.
        Schedule::cron("usage-snapshot", "*/5 * * * *", "UTC")?
            .job::<BuildReport>(&snapshot)?
            .missed_ticks(MissedTicks::All),
        // 02:00 in Berlin, summer and winter; if every worker was down at 02:00, the report is built
        // when one comes back. `All`: what EventBridge Scheduler does for the Lambda deployment (it
        // retries each tick's delivery), so the export can express it.
        Schedule::cron("nightly-sales-report", "0 2 * * *", "Europe/Berlin")?
            .job::<BuildReport>(&nightly)?
            .missed_ticks(MissedTicks::All),
    ])
}

/// The scheduler for the worker, when `CONVEYOR_SCHEDULES=on`: ticks claimed in the idempotency
/// table (`CONVEYOR_IDEMPOTENCY_TABLE`), jobs sent to `CONVEYOR_SCHEDULE_QUEUE_URL` or the first of
/// `CONVEYOR_QUEUE_URL`.
pub async fn app_scheduler() -> anyhow::Result<Option<Scheduler>> {
    match std::env::var(SCHEDULES_ENV).as_deref() {
        Ok("on") => {}
        Ok("off") | Err(_) => return Ok(None),
        Ok(other) => anyhow::bail!("{SCHEDULES_ENV}={other:?}: use on or off"),
    }
    let table = std::env::var(crate::TABLE_ENV).with_context(|| {
        format!(
            "{SCHEDULES_ENV}=on needs {} (ticks are claimed there)",
            crate::TABLE_ENV
        )
    })?;
    let queue = match std::env::var(SCHEDULE_QUEUE_ENV) {
        Ok(url) => url,
        Err(_) => first_queue_url()?,
    };
    let sqs = conveyor_sqs::sqs_client_from_env().await;
    let dynamodb = conveyor_dynamodb::dynamodb_client_from_env().await;
    // The owner names this process first, so an operator (or a test) reading the lease knows which
    // task leads; the start time in nanoseconds keeps two tasks whose pids are equal (each
    // container's pid 1) apart.
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let owner = format!("pid-{}-{started:x}", std::process::id());
    let scheduler = Scheduler::new(
        schedules()?,
        TickStore::new(dynamodb, table),
        Arc::new(Producer::new(sqs, queue)),
    )?
    .with_owner(&owner);
    Ok(Some(scheduler))
}

/// The first URL of `CONVEYOR_QUEUE_URL` (`url` or `url1=3,url2=1`).
fn first_queue_url() -> anyhow::Result<String> {
    let value = std::env::var("CONVEYOR_QUEUE_URL").with_context(|| {
        format!("set {SCHEDULE_QUEUE_ENV} or CONVEYOR_QUEUE_URL: the queue schedules send to")
    })?;
    let first = value.split(',').next().unwrap_or_default();
    let url = first.rsplit_once('=').map_or(first, |(url, _)| url).trim();
    Ok(url.to_owned())
}
