//! The Lambda entry point: the Runtime API loop of `lambda_runtime`, one batch per invocation.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::{FifoFailure, LambdaConfig};
use aws_lambda_events::sqs::SqsBatchResponse;
use conveyor_core::{Pipeline, RejectMode};
use lambda_runtime::{LambdaEvent, service_fn};
use tokio::time::Instant;
use tracing::Instrument;

use crate::batch::BatchProcessor;
use crate::error::{InvocationError, LambdaError};
use crate::event::parse_event;
use crate::queues::SqsQueues;

/// Environment variable: records of one batch processed at once.
pub const BATCH_CONCURRENCY_ENV: &str = "CONVEYOR_BATCH_CONCURRENCY";
/// Environment variable: records processed at once by the whole execution environment, across its
/// concurrent invocations (Lambda Managed Instances); see [`LambdaConfig::process_concurrency`].
pub const PROCESS_CONCURRENCY_ENV: &str = "CONVEYOR_PROCESS_CONCURRENCY";
/// Environment variable: `group` (default) or `batch`: what a failed record holds back on a FIFO queue.
pub const FIFO_FAILURE_ENV: &str = "CONVEYOR_FIFO_FAILURE";
/// Environment variable: `true` fails the invocation when every record of a batch failed.
pub const FAIL_WHEN_ALL_FAIL_ENV: &str = "CONVEYOR_FAIL_WHEN_ALL_FAIL";
/// Environment variable: messages that cannot start this long before the deadline are retried.
pub const DEADLINE_MARGIN_ENV: &str = "CONVEYOR_DEADLINE_MARGIN_MS";
/// Environment variable: `send_to_dlq` (default) or `leave_to_redrive`.
pub const REJECT_MODE_ENV: &str = "CONVEYOR_REJECT_MODE";
/// `CONVEYOR_TENANT_MAX_CONCURRENT`: at most this many records of one tenant at once per environment.
pub const TENANT_MAX_CONCURRENT_ENV: &str = "CONVEYOR_TENANT_MAX_CONCURRENT";
/// `CONVEYOR_TENANT_PER_SECOND`: at most this many records of one tenant start a second per environment.
pub const TENANT_PER_SECOND_ENV: &str = "CONVEYOR_TENANT_PER_SECOND";
/// `CONVEYOR_TENANT_METRICS_TOP`: how many tenants the per-tenant metrics name.
pub const TENANT_METRICS_TOP_ENV: &str = "CONVEYOR_TENANT_METRICS_TOP";

/// Runs the function with the configuration its environment gives ([`config_from_env`]): receives SQS
/// batches from the Lambda Runtime API until the environment is shut down. With the `dynamodb` feature,
/// the idempotency store is built on `CONVEYOR_IDEMPOTENCY_TABLE` when the pipeline has none. The same shape as
/// `conveyor_worker::run(pipeline)`, so one `main` line tells the two runtimes apart.
///
/// ```no_run
/// # async fn example(router: conveyor_core::Router) -> Result<(), conveyor_lambda::LambdaError> {
/// let pipeline = conveyor_core::Pipeline::new(router);
/// conveyor_lambda::run(pipeline).await
/// # }
/// ```
pub async fn run(pipeline: Pipeline) -> Result<(), LambdaError> {
    run_with_config(pipeline, config_from_env()?).await
}

/// [`run`] with `config` instead of the environment's. Clients are built once here (the cold start);
/// queues are resolved on first use.
///
/// On Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY` above 1) the process serves that many
/// invocations at once (`lambda_runtime::run_concurrent`), each with its own deadline, request id and
/// X-Ray trace, sharing the clients, the store and one pool of record slots
/// ([`LambdaConfig::process_concurrency`]); unset or 1, one invocation at a time, as on classic Lambda.
pub async fn run_with_config(pipeline: Pipeline, mut config: LambdaConfig) -> Result<(), LambdaError> {
    // Logging unless the function set up its own: a function written from the README logs too.
    init_tracing();
    config.validate()?;
    let invocations = crate::concurrency::invocations_at_once(|name| std::env::var(name).ok())?;
    let slots = crate::concurrency::record_slots(&config, invocations, crate::concurrency::vcpus())?;
    config.process_concurrency = Some(slots);
    if invocations > 1 {
        tracing::info!(
            invocations,
            record_slots = slots,
            vcpus = crate::concurrency::vcpus(),
            batch_concurrency = config.batch_concurrency,
            "serving concurrent invocations in one process (Lambda Managed Instances)"
        );
    }
    let pipeline = crate::store_env::with_store_from_env(pipeline).await?;
    let client = conveyor_sqs::sqs_client_from_env().await;
    let processor = Arc::new(BatchProcessor::new(
        pipeline,
        config,
        Arc::new(SqsQueues::new(client)),
    ));
    // A store that cannot be used fails the cold start with what to fix, before any record is taken.
    processor.check_store().await.map_err(LambdaError::Store)?;
    let handler = service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let processor = Arc::clone(&processor);
        async move { handle(&processor, event).await }
    });
    // Sequential (and the same as `lambda_runtime::run`) when AWS_LAMBDA_MAX_CONCURRENCY is unset or 1.
    lambda_runtime::run_concurrent(handler)
        .await
        .map_err(|error| LambdaError::Runtime(error.to_string()))
}

/// Set by the process's first SQS invocation: the later ones are warm (`faas.coldstart`).
static WARM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One invocation: parse, then process with the invocation's deadline.
pub(crate) async fn handle(
    processor: &BatchProcessor,
    event: LambdaEvent<serde_json::Value>,
) -> Result<SqsBatchResponse, InvocationError> {
    let (payload, context) = event.into_parts();
    crate::store_env::log_start_once(processor, &payload);
    if crate::flow_sweep::is_flow_sweep(&payload) {
        let span = tracing::info_span!("flow_sweep", request_id = %context.request_id);
        return crate::flow_sweep::sweep_flows(processor.pipeline())
            .instrument(span)
            .await;
    }
    if crate::timer_relay::is_timer_relay(&payload) {
        let span = tracing::info_span!("timer_relay", request_id = %context.request_id);
        return crate::timer_relay::relay_timers(processor.pipeline())
            .instrument(span)
            .await;
    }
    let event = match parse_event(payload) {
        Ok(event) => event,
        Err(error) => {
            tracing::error!(request_id = %context.request_id, %error, "not an SQS event");
            return Err(error.into());
        }
    };
    let span = tracing::info_span!(
        "invocation",
        request_id = %context.request_id,
        records = event.records.len(),
        xray_trace_id = context.xray_trace_id.as_deref(),
        otel.kind = tracing::field::Empty,
    );
    let cold_start = !WARM.swap(true, std::sync::atomic::Ordering::AcqRel);
    // This invocation's own X-Ray trace (from its context: concurrent invocations of one process each
    // have theirs): the parent of the invocation's span with Active Tracing, a link without it (an
    // unsampled parent would have the default sampler drop every span), and no parent without a
    // header; each record's span links to its producer. The `faas.*` attributes go on it too.
    #[cfg(feature = "otel")]
    conveyor_otel::relate_invocation(
        &span,
        context.xray_trace_id.as_deref(),
        &conveyor_otel::Invocation::new(
            &context.request_id,
            &context.invoked_function_arn,
            cold_start,
            event.records.len(),
        ),
    );
    #[cfg(not(feature = "otel"))]
    let _ = cold_start;
    let budget = invocation_budget(
        context.deadline,
        SystemTime::now(),
        processor.config().function_timeout,
    );
    if let Budget::Fallback { problem, budget } = &budget {
        warn_once_about_the_deadline(context.deadline, problem, *budget);
    }
    let deadline = Instant::now() + budget.time();
    let response = processor
        .process_invocation(event, deadline, Some(&context.request_id))
        .instrument(span)
        .await;
    // Lambda freezes the process once the response is sent: the spans leave first (feature `otel`),
    // in the time the invocation has left, never later.
    #[cfg(feature = "otel")]
    flush_spans(deadline, &context.request_id).await;
    Ok(response?)
}

/// Exports the invocation's spans, waiting for the collector only until the response's reserve
/// before `deadline`: a collector that is slow, down or refusing never makes the invocation late
/// (Lambda would time it out and the event source mapping return the whole batch, jobs done
/// included). Spans lost to a failed export or still unexported when the time is up are said in one
/// log line and one EMF line (`SpansDropped`, `SpansUnflushed`).
#[cfg(feature = "otel")]
async fn flush_spans(deadline: Instant, request_id: &str) {
    use std::io::Write as _;

    let budget = flush_budget(deadline, Instant::now());
    let report = conveyor_otel::flush_within(budget).await;
    if report.is_clean() {
        return;
    }
    tracing::warn!(
        request_id,
        spans_dropped = report.dropped,
        spans_unflushed = report.unflushed,
        spans_exported = report.exported,
        flush_budget_ms = budget.as_millis() as u64,
        "spans not exported by the end of the invocation: the collector refused or failed them (dropped), or had \
         not taken them in the time left before the deadline (unflushed: they leave with a later export, or are \
         lost if the environment ends); check OTEL_EXPORTER_OTLP_ENDPOINT and the collector"
    );
    let line =
        crate::metrics::spans_emf_line(SystemTime::now(), request_id, report.dropped, report.unflushed);
    // A closed stdout must not fail the invocation: the line is dropped (and counted).
    let _ = conveyor_core::runtime::stdout().write_all(format!("{line}\n").as_bytes());
}

/// How long the span flush may wait: until the response's reserve before the invocation's deadline.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
fn flush_budget(deadline: Instant, now: Instant) -> Duration {
    deadline
        .checked_sub(crate::batch::RESPONSE_RESERVE)
        .unwrap_or(deadline)
        .saturating_duration_since(now)
}

/// Lambda's longest function timeout: a deadline further ahead is not Lambda's.
pub(crate) const MAX_FUNCTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The time an invocation has, from its `Lambda-Runtime-Deadline-Ms` header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Budget {
    /// The header's deadline, this far ahead.
    Deadline(Duration),
    /// The header cannot be Lambda's (already past, or past Lambda's 15-minute maximum): an emulator's
    /// mistake, such as cargo-lambda's `600000` (ten minutes as a duration, not an epoch time). The
    /// invocation runs under `budget` (the configured `function_timeout`).
    Fallback {
        /// What is wrong with the header.
        problem: &'static str,
        /// The time the invocation gets instead.
        budget: Duration,
    },
}

impl Budget {
    fn time(&self) -> Duration {
        match self {
            Budget::Deadline(ahead) => *ahead,
            Budget::Fallback { budget, .. } => *budget,
        }
    }
}

/// The invocation's budget for a deadline header of `deadline_ms` (epoch milliseconds) seen at `now`.
fn invocation_budget(deadline_ms: u64, now: SystemTime, fallback: Duration) -> Budget {
    let deadline = SystemTime::UNIX_EPOCH + Duration::from_millis(deadline_ms);
    match deadline.duration_since(now) {
        Err(_) => Budget::Fallback {
            problem: "already past when the invocation arrived",
            budget: fallback,
        },
        Ok(ahead) if ahead > MAX_FUNCTION_TIMEOUT + Duration::from_secs(1) => Budget::Fallback {
            problem: "further ahead than Lambda's 15-minute maximum",
            budget: fallback,
        },
        Ok(ahead) => Budget::Deadline(ahead),
    }
}

/// Says once per execution environment that the deadline header is not Lambda's, with its value.
fn warn_once_about_the_deadline(deadline_ms: u64, problem: &str, budget: Duration) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            deadline_ms,
            fallback_secs = budget.as_secs_f64(),
            "the invocation's deadline (Lambda-Runtime-Deadline-Ms: {deadline_ms}) is {problem}: not a deadline \
             Lambda sends (an emulator's, such as cargo lambda's); running each invocation under the configured \
             function timeout of {budget:?} instead (LambdaConfig::function_timeout)"
        );
    });
}

/// The tokio instant at wall-clock time `at` (now, when it has passed).
pub fn instant_at(at: SystemTime) -> Instant {
    let now = Instant::now();
    match at.duration_since(SystemTime::now()) {
        Ok(ahead) => now + ahead,
        Err(_) => now,
    }
}

/// The default [`LambdaConfig`] with the `CONVEYOR_*` overrides a function's environment may set:
/// [`BATCH_CONCURRENCY_ENV`], [`PROCESS_CONCURRENCY_ENV`], [`DEADLINE_MARGIN_ENV`], [`REJECT_MODE_ENV`],
/// [`FIFO_FAILURE_ENV`], [`FAIL_WHEN_ALL_FAIL_ENV`] and the `CONVEYOR_TENANT_*` limits.
pub fn config_from_env() -> Result<LambdaConfig, LambdaError> {
    config_from(|name| std::env::var(name).ok())
}

fn config_from(var: impl Fn(&str) -> Option<String>) -> Result<LambdaConfig, LambdaError> {
    let mut config = LambdaConfig::default();
    if let Some(value) = var(BATCH_CONCURRENCY_ENV) {
        config.batch_concurrency = value.trim().parse().map_err(|_| LambdaError::Environment {
            name: BATCH_CONCURRENCY_ENV,
            value: value.clone(),
            problem: "expected a positive integer".to_owned(),
        })?;
    }
    if let Some(value) = var(PROCESS_CONCURRENCY_ENV) {
        config.process_concurrency = Some(parsed(PROCESS_CONCURRENCY_ENV, value, "a positive integer")?);
    }
    if let Some(value) = var(DEADLINE_MARGIN_ENV) {
        let millis: u64 = value.trim().parse().map_err(|_| LambdaError::Environment {
            name: DEADLINE_MARGIN_ENV,
            value: value.clone(),
            problem: "expected milliseconds".to_owned(),
        })?;
        config.deadline_margin = Duration::from_millis(millis);
    }
    if let Some(value) = var(REJECT_MODE_ENV) {
        config.reject_mode = choice(
            REJECT_MODE_ENV,
            value,
            &[
                ("send_to_dlq", RejectMode::SendToDlq),
                ("leave_to_redrive", RejectMode::LeaveToRedrive),
            ],
        )?;
    }
    if let Some(value) = var(FIFO_FAILURE_ENV) {
        config.fifo_failure = choice(
            FIFO_FAILURE_ENV,
            value,
            &[("group", FifoFailure::Group), ("batch", FifoFailure::Batch)],
        )?;
    }
    if let Some(value) = var(TENANT_MAX_CONCURRENT_ENV) {
        config.tenants.max_concurrent = Some(parsed(TENANT_MAX_CONCURRENT_ENV, value, "a positive integer")?);
    }
    if let Some(value) = var(TENANT_PER_SECOND_ENV) {
        config.tenants.per_second = Some(parsed(TENANT_PER_SECOND_ENV, value, "a number of jobs a second")?);
    }
    if let Some(value) = var(TENANT_METRICS_TOP_ENV) {
        config.tenants.metrics_top = parsed(TENANT_METRICS_TOP_ENV, value, "a whole number")?;
    }
    if let Some(value) = var(FAIL_WHEN_ALL_FAIL_ENV) {
        config.fail_invocation_when_all_fail = choice(
            FAIL_WHEN_ALL_FAIL_ENV,
            value,
            &[("true", true), ("1", true), ("false", false), ("0", false)],
        )?;
    }
    Ok(config)
}

/// `value` of `name` parsed as a `T`, or an error saying what was `expected`.
fn parsed<T: std::str::FromStr>(name: &'static str, value: String, expected: &str) -> Result<T, LambdaError> {
    value.trim().parse().map_err(|_| LambdaError::Environment {
        name,
        value: value.clone(),
        problem: format!("expected {expected}"),
    })
}

/// The value of `name` among `choices`, or an error that lists them.
fn choice<T: Copy>(name: &'static str, value: String, choices: &[(&str, T)]) -> Result<T, LambdaError> {
    if let Some((_, chosen)) = choices.iter().find(|(text, _)| *text == value.trim()) {
        return Ok(*chosen);
    }
    let names: Vec<&str> = choices.iter().map(|(text, _)| *text).collect();
    Err(LambdaError::Environment {
        name,
        value,
        problem: format!("expected one of {}", names.join(", ")),
    })
}

/// Logs the way Lambda's advanced logging controls ask: JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON`
/// (`timestamp`, `level`, `requestId`, `message` and the fields, flat), else one text line per event
/// with the request id once and the innermost span of Conveyor's own, never the X-Ray header;
/// the level from `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`, else `INFO`; no ANSI
/// colours (CloudWatch shows them as escape codes); no timestamps in text (CloudWatch adds its own).
/// Does nothing when a global subscriber is already set. Logs go to stdout through
/// [`conveyor_core::runtime::stdout`]: a write that fails is dropped and counted, never a panic.
pub fn init_tracing() {
    use lambda_runtime::tracing::subscriber::EnvFilter;
    use lambda_runtime::tracing::subscriber::Layer as _;
    use lambda_runtime::tracing::subscriber::filter::LevelFilter;
    use lambda_runtime::tracing::subscriber::layer::SubscriberExt as _;

    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|text| text.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::INFO);
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy();
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json"));
    // The level filters the log lines only: a quiet log (`warn`) still exports every record's span.
    let lines = crate::log_format::log_layer(json, conveyor_core::runtime::stdout).with_filter(filter);
    if !install(lambda_runtime::tracing::subscriber::registry().with(lines)) {
        tracing::debug!("a tracing subscriber is already set");
    }
}

/// Sets `subscriber` as the global one, with OpenTelemetry export when the `otel` feature is on and
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see `conveyor-otel`). An `OTEL_*` value that cannot work is
/// logged as an error and the function runs without export: telemetry's configuration never fails
/// the jobs.
fn install<S>(subscriber: S) -> bool
where
    S: tracing::Subscriber
        + for<'span> lambda_runtime::tracing::subscriber::registry::LookupSpan<'span>
        + Send
        + Sync,
{
    use lambda_runtime::tracing::subscriber::util::SubscriberInitExt as _;

    #[cfg(feature = "otel")]
    {
        use lambda_runtime::tracing::subscriber::Layer as _;
        use lambda_runtime::tracing::subscriber::layer::SubscriberExt as _;

        let (layer, problem) = match conveyor_otel::layer::<S>() {
            Ok(layer) => (layer, None),
            Err(error) => (None, Some(error)),
        };
        // Conveyor's spans are at `info`; the AWS SDK's own (debug, trace) stay out of the traces.
        let layer = layer.map(|layer| layer.with_filter(tracing::level_filters::LevelFilter::INFO));
        let installed = subscriber.with(layer).try_init().is_ok();
        if let Some(error) = problem {
            tracing::error!(%error, "OpenTelemetry export is off: fix the variable to export spans");
        }
        installed
    }
    #[cfg(not(feature = "otel"))]
    {
        subscriber.try_init().is_ok()
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::*;

    #[test]
    fn lambdas_deadline_is_taken_and_an_emulators_is_replaced_by_the_fallback() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |ahead: Duration| {
            (now + ahead)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        let fallback = Duration::from_secs(10);
        assert_eq!(
            invocation_budget(at(Duration::from_secs(30)), now, fallback),
            Budget::Deadline(Duration::from_secs(30))
        );
        assert_eq!(
            invocation_budget(at(MAX_FUNCTION_TIMEOUT), now, fallback),
            Budget::Deadline(MAX_FUNCTION_TIMEOUT)
        );
        // cargo lambda's Runtime API sends ten minutes as a duration: 1970, long past.
        let cargo_lambda = invocation_budget(600_000, now, fallback);
        assert!(
            matches!(cargo_lambda, Budget::Fallback { problem, budget } if problem.contains("past") && budget == fallback)
        );
        let far = invocation_budget(at(Duration::from_secs(3600)), now, fallback);
        assert!(matches!(far, Budget::Fallback { problem, .. } if problem.contains("15-minute")));
    }

    #[test]
    fn the_span_flush_ends_where_the_responses_reserve_begins() {
        let now = Instant::now();
        let reserve = crate::batch::RESPONSE_RESERVE;
        assert_eq!(
            flush_budget(now + Duration::from_secs(4), now),
            Duration::from_secs(4) - reserve
        );
        assert_eq!(flush_budget(now + reserve / 2, now), Duration::ZERO);
        assert_eq!(flush_budget(now, now + Duration::from_secs(1)), Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<LambdaConfig, LambdaError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        config_from(|name| vars.get(name).cloned())
    }

    #[test]
    fn tenant_limits_from_the_environment() {
        let read = config(&[
            (TENANT_MAX_CONCURRENT_ENV, "3"),
            (TENANT_PER_SECOND_ENV, "1.5"),
            (TENANT_METRICS_TOP_ENV, "7"),
        ])
        .unwrap();
        assert_eq!(read.tenants.max_concurrent, Some(3));
        assert_eq!(read.tenants.per_second, Some(1.5));
        assert_eq!(read.tenants.metrics_top, 7);
        let error = config(&[(TENANT_PER_SECOND_ENV, "fast")])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(TENANT_PER_SECOND_ENV) && error.contains("jobs a second"),
            "{error}"
        );
        let zero = config(&[(TENANT_MAX_CONCURRENT_ENV, "0")]).unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("limit of 0"));
    }

    #[test]
    fn environment_overrides_the_defaults() {
        assert_eq!(config(&[]).unwrap(), LambdaConfig::default());
        let config = config(&[
            (BATCH_CONCURRENCY_ENV, "3"),
            (PROCESS_CONCURRENCY_ENV, "12"),
            (DEADLINE_MARGIN_ENV, "250"),
            (REJECT_MODE_ENV, "leave_to_redrive"),
        ])
        .unwrap();
        assert_eq!(config.batch_concurrency, 3);
        assert_eq!(config.process_concurrency, Some(12));
        assert_eq!(config.deadline_margin, Duration::from_millis(250));
        assert_eq!(config.reject_mode, RejectMode::LeaveToRedrive);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let error = config(&[(REJECT_MODE_ENV, "dlq")]).unwrap_err().to_string();
        assert!(
            error.contains(REJECT_MODE_ENV) && error.contains("send_to_dlq"),
            "{error}"
        );
        let error = config(&[(BATCH_CONCURRENCY_ENV, "-1")]).unwrap_err().to_string();
        assert!(error.contains(BATCH_CONCURRENCY_ENV), "{error}");
    }

    #[tokio::test]
    async fn wall_clock_deadlines_become_instants() {
        let in_two_seconds = instant_at(SystemTime::now() + Duration::from_secs(2));
        let remaining = in_two_seconds - Instant::now();
        assert!(remaining > Duration::from_millis(1500) && remaining <= Duration::from_secs(2));
        let past = instant_at(SystemTime::now() - Duration::from_secs(5));
        assert!(past <= Instant::now());
    }
}
