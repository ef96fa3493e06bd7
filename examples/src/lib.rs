#![doc = include_str!("../README.md")]

pub mod fenced_ledger;
pub mod jobs;
pub mod outbox;
pub mod schedules;
pub mod webhook_receiver;

/// The repository's README and the guides in `docs/`, whose snippets are compiled (and, where they
/// can run without AWS, run) as this crate's doctests: the crate depends on every member a snippet uses.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/handlers.md")]
    struct Handlers;
    #[doc = include_str!("../../docs/running.md")]
    struct Running;
    #[doc = include_str!("../../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../docs/figures.md")]
    struct Figures;
    #[doc = include_str!("../../docs/delays.md")]
    struct Delays;
    #[doc = include_str!("../../docs/schedules.md")]
    struct Schedules;
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../../docs/tracing.md")]
    struct Tracing;
    #[doc = include_str!("../../docs/events.md")]
    struct Events;
    #[doc = include_str!("../../docs/tenants.md")]
    struct Tenants;
    #[doc = include_str!("../../docs/batch-handlers.md")]
    struct BatchHandlers;
}

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use conveyor_core::{Pipeline, Router};

use crate::jobs::chunked_report::{AssembleReportHandler, RunReportChunk};
use crate::jobs::import_contacts::ImportContacts;
use crate::jobs::report::BuildReport;
use crate::jobs::webhook::DeliverWebhook;
use crate::jobs::welcome_email::SendWelcomeEmail;
use crate::outbox::Outbox;

/// Environment variable naming the outbox file.
pub const OUTBOX_ENV: &str = "CONVEYOR_DEMO_OUTBOX";
/// Environment variable holding the webhook signing secret.
pub const WEBHOOK_SECRET_ENV: &str = "WEBHOOK_SIGNING_SECRET";
/// Environment variable naming the idempotency table.
pub const TABLE_ENV: &str = "CONVEYOR_IDEMPOTENCY_TABLE";
/// Environment variable overriding every handler's retry budget, in seconds (15 minutes by default).
pub const RETRY_BUDGET_ENV: &str = "CONVEYOR_RETRY_BUDGET_SECS";
/// The application's own `CONVEYOR_*` variables (so the worker does not report them as typos).
pub const APP_VARIABLES: &[&str] = &[
    OUTBOX_ENV,
    RETRY_BUDGET_ENV,
    schedules::SCHEDULES_ENV,
    schedules::SCHEDULE_QUEUE_ENV,
    conveyor_outbox::table::TABLE_ENV,
    conveyor_outbox::table::PARTITION_KEY_ENV,
    conveyor_outbox::table::SORT_KEY_ENV,
    conveyor_outbox::LEASE_SECONDS_ENV,
    conveyor_outbox::MAX_ATTEMPTS_ENV,
    conveyor_outbox::POSTGRES_URL_ENV,
];

/// The application's settings, from the environment.
#[derive(Debug, Clone)]
pub struct AppSettings {
    /// Where side effects are recorded.
    pub outbox: PathBuf,
    /// The webhook signing secret.
    pub webhook_secret: Vec<u8>,
    /// The webhook request timeout.
    pub webhook_timeout: Duration,
}

impl AppSettings {
    /// Reads `CONVEYOR_DEMO_OUTBOX` (default `outbox.jsonl`) and `WEBHOOK_SIGNING_SECRET` (required).
    pub fn from_env() -> anyhow::Result<Self> {
        let outbox =
            std::env::var_os(OUTBOX_ENV).map_or_else(|| PathBuf::from("outbox.jsonl"), PathBuf::from);
        let secret = std::env::var(WEBHOOK_SECRET_ENV).with_context(|| {
            format!("{WEBHOOK_SECRET_ENV} is not set: set it to the secret webhook receivers verify signatures with")
        })?;
        Ok(Self {
            outbox,
            webhook_secret: secret.into_bytes(),
            webhook_timeout: Duration::from_secs(10),
        })
    }
}

/// One router for every job type the application runs, in either runtime.
pub fn router(settings: &AppSettings) -> anyhow::Result<Router> {
    let outbox = Arc::new(Outbox::new(&settings.outbox));
    let webhook = DeliverWebhook::new(settings.webhook_secret.clone(), settings.webhook_timeout)
        .context("building the webhook HTTP client")?;
    let router = Router::new()
        .route(SendWelcomeEmail {
            outbox: Arc::clone(&outbox),
        })
        .route(BuildReport {
            outbox: Arc::clone(&outbox),
        })
        .route(RunReportChunk)
        .route(ImportContacts {
            outbox: Arc::clone(&outbox),
        })
        .route(AssembleReportHandler {
            outbox: Arc::clone(&outbox),
        })
        .route(webhook);
    Ok(crate::jobs::events::routes(router, &outbox))
}

/// The router, configured from the environment.
pub fn app_router() -> anyhow::Result<Router> {
    router(&AppSettings::from_env()?)
}

/// The pipeline, with idempotency, job tracking and flows on DynamoDB when `CONVEYOR_IDEMPOTENCY_TABLE`
/// is set (flow parents are sent through SQS) and then the timer table of `CONVEYOR_QUEUE_URL`'s queue, and
/// large payloads on S3 when `CONVEYOR_PAYLOAD_BUCKET` is set.
pub async fn app_pipeline() -> anyhow::Result<Pipeline> {
    let mut pipeline = Pipeline::new(app_router()?);
    if let Some(budget) = retry_budget_from_env()? {
        pipeline = pipeline.with_retry_budget(budget);
    }
    // Large payloads (claim check) through S3 when CONVEYOR_PAYLOAD_BUCKET is set.
    if let Some(payloads) = conveyor_s3::payloads_from_env().await? {
        pipeline = pipeline.with_payloads(payloads);
    }
    let Ok(table) = std::env::var(TABLE_ENV) else {
        tracing::warn!("{TABLE_ENV} is not set: running WITHOUT idempotency; duplicates will run twice");
        return Ok(pipeline);
    };
    let client = conveyor_dynamodb::dynamodb_client_from_env().await;
    let store = Arc::new(conveyor_dynamodb::DynamoStore::new(client, table));
    let sender = Arc::new(conveyor_sqs::SqsSender::new(
        conveyor_sqs::sqs_client_from_env().await,
    ));
    let flows = conveyor_core::Flows {
        store: store.clone(),
        sender: sender.clone(),
    };
    // The queue's timer table (jobs a producer kept with `with_timers`): the worker relays it, and the
    // Lambda function when its schedule invokes it with {"conveyor": "relay_timers"}.
    if let Ok(queue_url) = std::env::var("CONVEYOR_QUEUE_URL") {
        pipeline = pipeline.with_timers(conveyor_core::Timers::new(store.clone(), sender, queue_url));
    }
    Ok(pipeline.with_store(store).with_flows(flows))
}

/// `CONVEYOR_RETRY_BUDGET_SECS`, when set: how long a failing job keeps being retried.
fn retry_budget_from_env() -> anyhow::Result<Option<Duration>> {
    let Ok(value) = std::env::var(RETRY_BUDGET_ENV) else {
        return Ok(None);
    };
    let seconds: f64 = value.trim().parse().with_context(|| {
        format!("{RETRY_BUDGET_ENV}={value:?} is not a number of seconds (the default budget is 900)")
    })?;
    let budget = Duration::try_from_secs_f64(seconds)
        .with_context(|| format!("{RETRY_BUDGET_ENV}={value:?} must be a positive number of seconds"))?;
    Ok(Some(budget))
}
