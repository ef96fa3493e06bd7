#![doc = include_str!("../README.md")]

mod auth;
mod config;
mod delays;
mod dlq;
mod fair_queues;
mod fields;
mod history;
mod html;
mod jobs;
#[cfg(test)]
mod parse_properties;
mod peeks;
mod queues;
mod requests;
mod schedules;
mod send;
mod state;
mod tasks;
mod workers;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{ConsoleConfig, ConsoleError, DEFAULT_MAX_PAYLOAD_BYTES, TOKEN_ENV, VIEWER_TOKEN_ENV};

/// The IAM actions behind the console's own AWS calls beyond the operator's SQS and DynamoDB ones
/// (`conveyor_sqs::iam::OPERATOR`, `conveyor_dynamodb::iam::OPERATOR_TABLE`), as those lists are
/// written: each `aws_sdk_cloudwatch::Client` method and its action. `infra/modules/queue`'s operator
/// policy grants them (`tests/tests/infra.rs` holds both sides to this list).
pub mod iam {
    /// The fair-queue view ([`Console::with_cloudwatch`](crate::Console::with_cloudwatch)).
    pub const CLOUDWATCH: &[(&str, &str)] = &[("get_metric_data", "cloudwatch:GetMetricData")];
}
pub use workers::parse_metrics;

use crate::state::AppState;

/// A console ready to serve: its configuration checked, its queues resolved.
#[derive(Clone)]
pub struct Console {
    state: Arc<AppState>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// Checks `config` (a TLS proxy in front for any address but loopback) and resolves its queue names
    /// with `sqs`; generates the token when `config.token` is `None`.
    /// `dynamodb` serves the job lookup when `config.table` is set.
    pub async fn new(
        config: ConsoleConfig,
        sqs: aws_sdk_sqs::Client,
        dynamodb: aws_sdk_dynamodb::Client,
    ) -> Result<Self, ConsoleError> {
        config.check()?;
        let state = AppState::new(config, sqs, dynamodb).await?;
        Ok(Self {
            state: Arc::new(state),
        })
    }

    /// Lets the dead-letter page fetch a large payload's object (an S3 pointer's, as the SQS Extended
    /// Client writes them) when the operator asks: `conveyor_s3::S3PayloadStore` (give it
    /// `with_max_read` so the read stops at [`ConsoleConfig::max_payload_bytes`]), or any
    /// [`PayloadStore`](conveyor_core::port::PayloadStore). Only pointers into
    /// [`ConsoleConfig::payload_buckets`] are followed; reading never deletes, and each read is logged
    /// at warn with the client's address.
    pub fn with_payloads(self, store: Arc<dyn conveyor_core::port::PayloadStore>) -> Self {
        let _ = self.state.payloads.set(store);
        self
    }

    /// Shows SQS's fair-queue metrics of the standard queues on the queues page (noisy tenants, the
    /// quiet tenants' backlog and oldest message), read from CloudWatch when the page is open, at most
    /// once a minute; needs `cloudwatch:GetMetricData` ([`iam::CLOUDWATCH`]). The console's own
    /// deadlines replace the client's (5 s a read at most), and a read that fails says on the page
    /// whether CloudWatch denied it (a permission to grant) or is unavailable (an outage).
    pub fn with_cloudwatch(self, cloudwatch: aws_sdk_cloudwatch::Client) -> Self {
        let config = cloudwatch
            .config()
            .to_builder()
            .timeout_config(fair_queues::deadlines())
            .interceptor(self.state.requests.clone())
            .build();
        let _ = self
            .state
            .cloudwatch
            .set(aws_sdk_cloudwatch::Client::from_conf(config));
        self
    }

    /// The token every request must carry: the configured one or the one generated at start. Print
    /// it as the address to open, `http://127.0.0.1:8025/?token=<token>`.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// The pages and actions (their answers carry the security headers).
    fn routes(&self) -> Router {
        Router::new()
            .route("/", get(queues::overview))
            .route("/live", get(queues::live))
            .route("/queues/purge", post(queues::purge))
            .route("/dlq", get(dlq::show))
            .route("/dlq/peek", post(dlq::take_peek))
            .route("/dlq/act", post(dlq::act))
            .route("/dlq/cancel-task", post(dlq::cancel_task))
            .route("/tasks", get(tasks::list))
            .route("/tasks/{id}", get(tasks::show))
            .route("/tasks/{id}/stop", post(tasks::stop))
            .route("/tasks/{id}/live", get(tasks::live))
            .route("/jobs", get(jobs::show))
            .route("/schedules", get(schedules::show))
            .route("/schedules/act", post(schedules::act))
            .route("/delays", get(delays::show))
            .route("/delays/act", post(delays::act))
            .route("/send", get(send::form).post(send::submit))
            .route("/static/console.css", get(html::stylesheet))
            .route("/static/console.js", get(html::script))
            .fallback(html::not_found)
            .with_state(Arc::clone(&self.state))
    }

    /// The checks every request passes before its body is read (see `src/auth.rs`), outermost first:
    /// the audit span, the security headers, the `Host` and cross-site checks, the token.
    fn gate(&self, routes: Router) -> Router {
        let state = Arc::clone(&self.state);
        routes
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&state),
                auth::require_token,
            ))
            .layer(axum::middleware::from_fn_with_state(
                state,
                auth::closed_to_other_sites,
            ))
            .layer(axum::middleware::from_fn(html::security_headers))
            .layer(axum::middleware::from_fn(auth::audit))
    }

    /// Serves on `listener` until `stop` is cancelled, and samples the charts' numbers meanwhile.
    pub async fn serve(self, listener: TcpListener, stop: CancellationToken) {
        tokio::spawn(history::sample_until(Arc::clone(&self.state), stop.clone()));
        let limits = self.state.config.limits;
        let routes = self.routes();
        conveyor_http::serve_gated(listener, routes, limits, stop, |routes| self.gate(routes)).await;
    }

    /// AWS requests made so far (SQS, DynamoDB and CloudWatch, retries included).
    pub fn aws_requests(&self) -> u64 {
        self.state.requests.total()
    }
}
