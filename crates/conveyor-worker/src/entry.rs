//! The one-call entry point, as the Lambda adapter has: read the configuration, build the SQS client,
//! connect the queues (checking them), run until SIGTERM/SIGINT.
//!
//! ```no_run
//! # async fn example(pipeline: conveyor_core::Pipeline) -> Result<(), conveyor_worker::WorkerError> {
//! // main.rs of an ECS service: the same size as a Lambda function's.
//! let report = conveyor_worker::run(pipeline).await?;
//! println!("{} jobs succeeded", report.succeeded);
//! # Ok(()) }
//! ```
//!
//! What it does, in order: installs logging unless the application set up its own
//! ([`crate::init_logging`]: text or JSON on stderr, `RUST_LOG`); loads the TOML file named by `CONVEYOR_CONFIG` (if set) and the
//! `CONVEYOR_*` variables ([`crate::load_config`], unknown variables are warned about with the closest
//! known name); builds the DynamoDB idempotency store on `CONVEYOR_IDEMPOTENCY_TABLE` when the pipeline has
//! none (feature `dynamodb`; set but unusable, the start is refused with the fix); builds the SQS client
//! from the environment with deadlines on every call ([`conveyor_sqs::sqs_client_from_env`]); connects
//! each queue (a name resolved once with `GetQueueUrl`), reading its visibility timeout, FIFO
//! flag and redrive policy (a configuration error stops here with its fix, an outage is retried,
//! [`crate::connect`]); watches each queue's DLQ depth; builds the [`Worker`] (which refuses a queue whose
//! visibility timeout is too short for the heartbeat, a drain that does not fit in the stop timeout, a
//! record lifetime shorter than the longest job) and runs it until a signal.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use conveyor_core::{Pipeline, port::Queue};

use crate::config::{ENV_CONFIG, load_config_reading};
use crate::connect::{DEFAULT_CONNECT_PATIENCE, connect_with_retry};
use crate::error::WorkerError;
use crate::report::WorkerReport;
use crate::worker::Worker;

/// Runs a worker for `pipeline` as a deployment does (see the module docs); returns after the graceful
/// shutdown that follows SIGTERM or SIGINT.
pub async fn run(pipeline: Pipeline) -> Result<WorkerReport, WorkerError> {
    Runner::new(pipeline).run().await
}

/// [`run`] with choices: a config file, the application's own variables, protections.
pub struct Runner {
    pipeline: Pipeline,
    config_path: Option<PathBuf>,
    app_variables: Vec<&'static str>,
    configure: Vec<Box<dyn FnOnce(Worker) -> Worker + Send>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("config_path", &self.config_path)
            .field("app_variables", &self.app_variables)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner for `pipeline`; the config file is the one `CONVEYOR_CONFIG` names, if any.
    pub fn new(pipeline: Pipeline) -> Self {
        Self {
            pipeline,
            config_path: std::env::var_os(ENV_CONFIG).map(PathBuf::from),
            app_variables: Vec::new(),
            configure: Vec::new(),
        }
    }

    /// Reads this TOML file (environment variables still override it).
    pub fn config_file(mut self, path: Option<PathBuf>) -> Self {
        if path.is_some() {
            self.config_path = path;
        }
        self
    }

    /// `CONVEYOR_*` variables the application reads itself, so they are not reported as typos.
    pub fn app_variables(mut self, names: &[&'static str]) -> Self {
        self.app_variables.extend_from_slice(names);
        self
    }

    /// Adjusts the worker before it runs (protections: [`Worker::limit_job_type`],
    /// [`Worker::rate_limit_job_type`], [`Worker::circuit_breaker`]).
    pub fn configure(mut self, adjust: impl FnOnce(Worker) -> Worker + Send + 'static) -> Self {
        self.configure.push(Box::new(adjust));
        self
    }

    /// Connects and runs until SIGTERM/SIGINT.
    pub async fn run(self) -> Result<WorkerReport, WorkerError> {
        crate::logging::init_logging()?;
        let mut config = load_config_reading(self.config_path.as_deref(), &self.app_variables)?;
        let config_stop_timeout = config.stop_timeout;
        let pipeline = crate::store_env::with_store_from_env(self.pipeline).await?;
        let client = conveyor_sqs::sqs_client_from_env().await;
        let region = client.config().region().map(ToString::to_string);
        let mut queues: Vec<Arc<dyn Queue>> = Vec::new();
        let mut dead_letter_queues: Vec<Arc<dyn Queue>> = Vec::new();
        for queue in &mut config.queues {
            let connected = connect_with_retry(&queue.url, DEFAULT_CONNECT_PATIENCE, || {
                conveyor_sqs::SqsQueue::connect(client.clone(), &queue.url)
            })
            .await
            .map_err(|error| name_the_regions(error, &queue.url, region.as_deref()))?;
            // A name was resolved once, with GetQueueUrl: from here on the worker uses the URL.
            if queue.url != connected.url() {
                tracing::info!(name = %queue.url, url = connected.url(), "queue name resolved");
                connected.url().clone_into(&mut queue.url);
            }
            if let Some(dlq_url) = connected.dead_letter_queue_url() {
                let dlq = connect_with_retry(dlq_url, DEFAULT_CONNECT_PATIENCE, || {
                    conveyor_sqs::SqsQueue::connect(client.clone(), dlq_url)
                })
                .await
                .map_err(|error| name_the_regions(error, dlq_url, region.as_deref()))?;
                dead_letter_queues.push(Arc::new(dlq));
            }
            queues.push(Arc::new(connected));
        }
        let mut worker = Worker::new(config, pipeline, queues)?;
        for dlq in dead_letter_queues {
            worker = worker.watch_dead_letter_queue(dlq);
        }
        for adjust in self.configure {
            worker = adjust(worker);
        }
        let graceful = CancellationToken::new();
        let immediate = CancellationToken::new();
        let listener = crate::signals::listen(graceful.clone(), immediate.clone())?;
        // When the platform's stop timeout started counting: the span flush below ends inside it.
        let signalled = {
            let graceful = graceful.clone();
            tokio::spawn(async move {
                graceful.cancelled().await;
                Instant::now()
            })
        };
        let report = worker.run_with(graceful, immediate).await;
        listener.abort();
        let since_signal = if signalled.is_finished() {
            signalled.await.ok().map(|at| at.elapsed())
        } else {
            signalled.abort();
            None
        };
        // The spans of the last jobs leave before the process does (feature `otel`), inside the stop
        // timeout whatever the collector does.
        let budget = span_flush_budget(config_stop_timeout, since_signal);
        #[cfg(feature = "otel")]
        export_last_spans(budget).await;
        #[cfg(not(feature = "otel"))]
        let _ = budget;
        report
    }
}

/// The longest the last span export waits when the stop timeout leaves more (the SDK's own bound).
const SPAN_FLUSH_CAP: Duration = Duration::from_secs(5);
/// What the process keeps after the span export to exit before the platform's SIGKILL.
const EXIT_MARGIN: Duration = Duration::from_millis(500);

/// How long the last span export may wait: what is left of the stop timeout since the signal, less
/// [`EXIT_MARGIN`], at most [`SPAN_FLUSH_CAP`] (also when the worker stopped without a signal).
fn span_flush_budget(stop_timeout: Duration, since_signal: Option<Duration>) -> Duration {
    let Some(elapsed) = since_signal else {
        return SPAN_FLUSH_CAP;
    };
    stop_timeout
        .saturating_sub(elapsed)
        .saturating_sub(EXIT_MARGIN)
        .min(SPAN_FLUSH_CAP)
}

/// Exports the last spans and stops the exporter within `budget`; says what did not leave.
#[cfg(feature = "otel")]
async fn export_last_spans(budget: Duration) {
    let report = conveyor_otel::shutdown_within(budget).await;
    if report.is_clean() {
        return;
    }
    tracing::warn!(
        spans_dropped = report.dropped,
        spans_unflushed = report.unflushed,
        spans_exported = report.exported,
        flush_budget_ms = budget.as_millis() as u64,
        "spans not exported before the stop timeout: the collector refused or failed them (dropped), or had not \
         taken them in the time left (unflushed, lost with the process); check OTEL_EXPORTER_OTLP_ENDPOINT and the \
         collector"
    );
}

/// SQS answers "does not exist" for a queue of another region: when the queue URL names a region
/// other than the client's, the start-up error says both and how to fix it (as the CLI does).
fn name_the_regions(error: WorkerError, url: &str, client_region: Option<&str>) -> WorkerError {
    let WorkerError::Connect { queue, problem } = error else {
        return error;
    };
    if !url.contains("://") && problem.contains("does not exist") {
        let region = client_region.unwrap_or("(none set)");
        return WorkerError::Connect {
            queue,
            problem: format!(
                "{problem} (the name was looked up with GetQueueUrl in the worker's region, {region}: set AWS_REGION \
                 to the queue's region, or give its URL; `conveyor local init --queue {url}` creates a local queue)"
            ),
        };
    }
    let url_region = conveyor_sqs::admin::queue_url_region(url);
    match (url_region, client_region) {
        (Some(url_region), Some(client_region))
            if url_region != client_region && problem.contains("does not exist") =>
        {
            WorkerError::Connect {
                queue,
                problem: format!(
                    "the queue URL names region {url_region} but the worker's AWS region is {client_region}, and SQS \
                     answers \"does not exist\" for a queue of another region: set AWS_REGION={url_region} (or the \
                     profile's region), or use the queue of region {client_region}"
                ),
            }
        }
        _ => WorkerError::Connect { queue, problem },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_span_export_ends_inside_the_stop_timeout() {
        let stop = Duration::from_secs(30);
        assert_eq!(span_flush_budget(stop, None), SPAN_FLUSH_CAP);
        assert_eq!(
            span_flush_budget(stop, Some(Duration::from_secs(1))),
            SPAN_FLUSH_CAP
        );
        assert_eq!(
            span_flush_budget(stop, Some(Duration::from_secs(28))),
            Duration::from_secs(2) - EXIT_MARGIN
        );
        assert_eq!(
            span_flush_budget(stop, Some(Duration::from_secs(40))),
            Duration::ZERO
        );
    }

    #[test]
    fn a_missing_queue_of_another_region_names_both_regions() {
        let missing = || WorkerError::Connect {
            queue: "q".to_owned(),
            problem: "it does not exist: create it".to_owned(),
        };
        let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs";
        let named = name_the_regions(missing(), url, Some("us-east-1")).to_string();
        assert!(
            named.contains("eu-west-1")
                && named.contains("us-east-1")
                && named.contains("AWS_REGION=eu-west-1"),
            "{named}"
        );
        let same = name_the_regions(missing(), url, Some("eu-west-1")).to_string();
        assert!(
            same.contains("create it") && !same.contains("AWS_REGION"),
            "{same}"
        );
    }
}
