//! The queue page's fair-queue view: for each standard queue, SQS's fair-queue metrics (noisy tenants,
//! and the quiet tenants' backlog and oldest message), which SQS publishes to CloudWatch only.
//!
//! One `GetMetricData` call reads the five metrics of every shown standard queue (the latest one-minute
//! `Maximum` of the last ten minutes; one call per 100 queues, its limit being 500 queries), at most
//! once a minute (the metrics' own resolution; a call per page refresh would cost CloudWatch requests
//! for numbers that have not changed). It runs beside the queues' own reads, under its own deadlines
//! ([`deadlines`]): a CloudWatch that does not answer delays a refresh by 5 s at most, and the queue
//! list is shown whatever CloudWatch does. Queues without datapoints (not fair queues, or idle) are left
//! out; the view appears only with [`Console::with_cloudwatch`](crate::Console::with_cloudwatch), and
//! only when a standard queue is shown. `cloudwatch:GetMetricData` has no
//! resource-level permission: the operator's policy grants it on `*` (infra/modules/queue).
//!
//! A read that fails says why on the page, in place of the table, sorted by what the operator should
//! do ([`ReadError`]): a denial (credentials, permissions) is a configuration mistake to fix; no answer,
//! throttling or a server error is an outage to wait out; anything else is shown as CloudWatch said it. A failed read is reused for
//! [`RETRY_AFTER`], so a page refreshing every few seconds does not call a failing CloudWatch each time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudwatch::primitives::DateTime;
use aws_sdk_cloudwatch::types::{Dimension, Metric, MetricDataQuery, MetricStat};
use aws_smithy_runtime_api::http::Response;
use aws_smithy_types::timeout::TimeoutConfig;
use conveyor_core::metric_names::FAIR_QUEUE_METRICS;
use conveyor_sqs::admin::display_chain;
use maud::{Markup, html};

/// How long a successful read is reused.
const REUSE_FOR: Duration = Duration::from_secs(60);
/// How long a failed read is reused before CloudWatch is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(15);
/// How far back a read looks for the latest datapoint.
const LOOK_BACK: Duration = Duration::from_secs(10 * 60);
/// Queues per `GetMetricData` call: its limit is 500 queries, five per queue.
const QUEUES_PER_CALL: usize = 500 / FAIR_QUEUE_METRICS.len();

/// The latest value of each fair-queue metric, by queue name and metric name.
pub(crate) type FairQueueValues = BTreeMap<String, BTreeMap<&'static str, f64>>;

/// What one read gave.
pub(crate) type FairQueueRead = Result<FairQueueValues, ReadError>;

/// Why the fair-queue metrics could not be read, by what the operator should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReadError {
    /// CloudWatch refused the console's credentials or permissions: a configuration mistake, not an outage.
    #[error(
        "CloudWatch denied the console's request for the fair-queue metrics ({detail}). The console's role \
         needs cloudwatch:GetMetricData on \"*\" (the operator policy's ReadFairQueueMetrics statement, \
         infra/modules/queue), or run the console without CloudWatch (conveyor console --no-fair-queues)"
    )]
    Denied {
        /// CloudWatch's words.
        detail: String,
    },
    /// No answer in time, no connection, throttled or a server error: it passes.
    #[error(
        "CloudWatch is unavailable ({detail}); the fair-queue view comes back when it is (the queues above \
         are read from SQS and are current)"
    )]
    Unavailable {
        /// What happened.
        detail: String,
    },
    /// Any other refusal: a bad request, or an endpoint that does not speak CloudWatch's protocol and
    /// says so with a 4xx.
    #[error(
        "CloudWatch refused the request for the fair-queue metrics ({detail}); check that the endpoint \
         serves CloudWatch (conveyor console's --endpoint-url applies to it too)"
    )]
    Refused {
        /// CloudWatch's words.
        detail: String,
    },
}

impl ReadError {
    /// A short word for logs and the page's `data-cause`.
    fn cause(&self) -> &'static str {
        match self {
            ReadError::Denied { .. } => "denied",
            ReadError::Unavailable { .. } => "unavailable",
            ReadError::Refused { .. } => "refused",
        }
    }
}

/// The deadlines of the console's CloudWatch calls (applied by
/// [`Console::with_cloudwatch`](crate::Console::with_cloudwatch) whatever the client had): a page waits
/// for the read, so a CloudWatch that does not answer costs a refresh at most this long.
pub(crate) fn deadlines() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(2))
        .operation_attempt_timeout(Duration::from_secs(3))
        .operation_timeout(Duration::from_secs(5))
        .build()
}

/// One read: when, for which queues, what it gave.
struct Read {
    at: Instant,
    queues: Vec<String>,
    values: FairQueueRead,
}

/// The last read, reused for [`REUSE_FOR`] (a failed one for [`RETRY_AFTER`]). Refreshes that come
/// while a read is under way wait for it instead of starting their own.
#[derive(Default)]
pub(crate) struct FairQueueCache {
    last: tokio::sync::Mutex<Option<Read>>,
}

impl FairQueueCache {
    /// The metrics of the standard queues among `urls`, read now or reused from a recent read of the
    /// same queues; `None` when none of them is a standard queue (nothing to read, nothing to show).
    pub(crate) async fn read(
        &self,
        cloudwatch: &aws_sdk_cloudwatch::Client,
        urls: &[String],
    ) -> Option<FairQueueRead> {
        let queues = standard_queue_names(urls);
        if queues.is_empty() {
            return None;
        }
        let mut last = self.last.lock().await;
        if let Some(read) = last.as_ref() {
            let reuse_for = if read.values.is_ok() {
                REUSE_FOR
            } else {
                RETRY_AFTER
            };
            if read.at.elapsed() < reuse_for && read.queues == queues {
                return Some(read.values.clone());
            }
        }
        let values = read_metrics(cloudwatch, &queues).await;
        match &values {
            Ok(values) => tracing::debug!(
                queues = queues.len(),
                with_datapoints = values.len(),
                "console: read the fair-queue metrics"
            ),
            Err(error) => tracing::warn!(
                cause = error.cause(),
                queues = queues.len(),
                %error,
                "console: reading the fair-queue metrics failed"
            ),
        }
        *last = Some(Read {
            at: Instant::now(),
            queues,
            values: values.clone(),
        });
        Some(values)
    }
}

/// The names of the standard queues among `urls` (a queue's name is its URL's last segment; a FIFO
/// queue's ends in `.fifo`), as CloudWatch's `QueueName` dimension: fair queues are standard queues.
fn standard_queue_names(urls: &[String]) -> Vec<String> {
    urls.iter()
        .filter_map(|url| url.trim_end_matches('/').rsplit('/').next())
        .filter(|name| !name.is_empty() && !name.ends_with(".fifo"))
        .map(str::to_owned)
        .collect()
}

/// `GetMetricData` for the five metrics of every queue, [`QUEUES_PER_CALL`] queues a call (query ids
/// `m<queue>_<metric>`, the queue's index within its call).
async fn read_metrics(cloudwatch: &aws_sdk_cloudwatch::Client, queues: &[String]) -> FairQueueRead {
    let now = SystemTime::now();
    let mut values = FairQueueValues::new();
    for chunk in queues.chunks(QUEUES_PER_CALL) {
        let mut request = cloudwatch
            .get_metric_data()
            .start_time(DateTime::from(now - LOOK_BACK))
            // The current minute too: its datapoints are the latest (a window ending now leaves it out).
            .end_time(DateTime::from(now + Duration::from_secs(60)));
        for (queue_index, queue) in chunk.iter().enumerate() {
            for (metric_index, metric) in FAIR_QUEUE_METRICS.iter().enumerate() {
                request = request.metric_data_queries(query(queue_index, queue, metric_index, metric));
            }
        }
        let output = request.send().await.map_err(|error| classify(&error))?;
        for result in output.metric_data_results() {
            let Some((queue, metric)) = result.id().and_then(|id| parse_id(id, chunk)) else {
                continue;
            };
            // The datapoints come newest first (`ScanBy` defaults to `TimestampDescending`).
            if let Some(latest) = result.values().first() {
                values.entry(queue.clone()).or_default().insert(metric, *latest);
            }
        }
    }
    Ok(values)
}

/// The query for one metric of one queue: its one-minute `Maximum`.
fn query(queue_index: usize, queue: &str, metric_index: usize, metric: &str) -> MetricDataQuery {
    let metric = Metric::builder()
        .namespace("AWS/SQS")
        .metric_name(metric)
        .dimensions(Dimension::builder().name("QueueName").value(queue).build())
        .build();
    let stat = MetricStat::builder()
        .metric(metric)
        .period(60)
        .stat("Maximum")
        .build();
    MetricDataQuery::builder()
        .id(format!("m{queue_index}_{metric_index}"))
        .metric_stat(stat)
        .return_data(true)
        .build()
}

/// The queue and metric of a query id `m<queue>_<metric>`.
fn parse_id<'a>(id: &str, queues: &'a [String]) -> Option<(&'a String, &'static str)> {
    let (queue, metric) = id.strip_prefix('m')?.split_once('_')?;
    let queue = queues.get(queue.parse::<usize>().ok()?)?;
    let metric = FAIR_QUEUE_METRICS.get(metric.parse::<usize>().ok()?)?;
    Some((queue, metric))
}

/// How a call failed, before its error code is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No response: timeout, connection, DNS, TLS.
    NoAnswer,
    /// A response arrived, with this HTTP status when the SDK kept it.
    Answered { status: Option<u16> },
    /// The request could not be built.
    NotBuilt,
}

/// Sorts an SDK error into a [`ReadError`] ([`classify_failure`] holds the table).
fn classify<E>(error: &SdkError<E, Response>) -> ReadError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let status = error.raw_response().map(|raw| raw.status().as_u16());
    let failure = match error {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => Failure::NoAnswer,
        SdkError::ConstructionFailure(_) => Failure::NotBuilt,
        // A service error, or a response the SDK could not read (an error body in another protocol):
        // its status still tells a denial (403) from an outage.
        _ => Failure::Answered { status },
    };
    let detail = match (error.code(), error.message(), status) {
        (Some(code), Some(message), _) => format!("{code}: {message}"),
        (Some(code), None, _) => code.to_owned(),
        // An error body in another protocol than the request's (an emulator that does not speak it):
        // its own words, which the SDK could not read.
        (None, _, Some(status)) => match error.raw_response().and_then(|raw| raw.body().bytes()) {
            Some(body) if !body.is_empty() => format!("HTTP {status}: {}", body_text(body)),
            _ => format!("HTTP {status}: {}", display_chain(error)),
        },
        (None, _, None) => display_chain(error),
    };
    classify_failure(failure, error.code(), detail)
}

/// What an error body the SDK could not read says: its XML `<Message>` (moto and LocalStack answer
/// CloudWatch's CBOR requests in the `query` protocol's XML), else its start; 300 characters at most.
fn body_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let message = text
        .split_once("<Message>")
        .and_then(|(_, rest)| rest.split_once("</Message>"))
        .map_or(text.as_ref(), |(message, _)| message);
    message.trim().chars().take(300).collect()
}

/// Error codes that mean the credentials or their permissions are wrong.
const DENIED_CODES: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "ExpiredTokenException",
];

/// Error codes that pass by themselves.
const TRANSIENT_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServiceError",
    "InternalServiceFault",
    "ServiceUnavailable",
];

/// The classification table, as a pure function:
///
/// | what happened | [`ReadError`] |
/// |---|---|
/// | one of [`DENIED_CODES`], or HTTP 401/403 | `Denied` |
/// | no answer, one of [`TRANSIENT_CODES`], HTTP 429 or 5xx, an answer without a status | `Unavailable` |
/// | anything else (a bad request, an endpoint not speaking CloudWatch, a request not built) | `Refused` |
fn classify_failure(failure: Failure, code: Option<&str>, detail: String) -> ReadError {
    let code = code.unwrap_or_default();
    let status = match failure {
        Failure::NoAnswer => return ReadError::Unavailable { detail },
        Failure::NotBuilt => return ReadError::Refused { detail },
        Failure::Answered { status } => status,
    };
    if DENIED_CODES.contains(&code) || matches!(status, Some(401 | 403)) {
        return ReadError::Denied { detail };
    }
    let passes = TRANSIENT_CODES.contains(&code)
        || match status {
            Some(status) => status == 429 || status >= 500,
            None => true,
        };
    if passes {
        return ReadError::Unavailable { detail };
    }
    ReadError::Refused { detail }
}

/// The view: a table of the queues with fair-queue datapoints, a line when none has any, or why the
/// read failed.
pub(crate) fn render(read: &FairQueueRead) -> Markup {
    let values = match read {
        Ok(values) if values.is_empty() => {
            return html! {
                p class="muted" id="fair-queues-none" {
                    "Fair queues: no datapoints in CloudWatch for these queues in the last 10 minutes (SQS "
                    "publishes them for standard queues whose jobs carry a tenant, while they have messages)."
                }
            };
        }
        Ok(values) => values,
        Err(error) => {
            let class = match error {
                ReadError::Unavailable { .. } => "note",
                ReadError::Denied { .. } | ReadError::Refused { .. } => "bad",
            };
            return html! {
                h2 { "Fair queues" }
                p class=(class) id="fair-queues-error" data-cause=(error.cause()) { (error.to_string()) }
            };
        }
    };
    let value = |metrics: &BTreeMap<&'static str, f64>, name: &str| {
        metrics
            .get(name)
            .map_or_else(|| "–".to_owned(), |value| format!("{value:.0}"))
    };
    html! {
        h2 { "Fair queues" }
        p class="muted" {
            "SQS's fair-queue metrics (CloudWatch, latest minute): noisy tenants are the message groups SQS "
            "holds back; the quiet tenants' backlog should stay low while one floods the queue."
        }
        div class="scroll" {
            table id="fair-queues" {
                thead {
                    tr {
                        th { "Queue" }
                        th class="n" { "Noisy tenants" }
                        th class="n" { "Quiet visible" }
                        th class="n" { "Quiet in flight" }
                        th class="n wide" { "Quiet delayed" }
                        th class="n" { "Quiet oldest (s)" }
                    }
                }
                tbody {
                    @for (queue, metrics) in values {
                        tr data-queue=(queue) {
                            td { (queue) }
                            @for name in FAIR_QUEUE_METRICS {
                                td class="n" { (value(metrics, name)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_ids_name_their_queue_and_metric() {
        let queues = vec!["orders".to_owned(), "emails".to_owned()];
        assert_eq!(
            parse_id("m1_4", &queues),
            Some((&queues[1], "ApproximateAgeOfOldestMessageInQuietGroups"))
        );
        assert_eq!(parse_id("m2_0", &queues), None);
        assert_eq!(parse_id("m0_5", &queues), None);
        assert_eq!(parse_id("x0_0", &queues), None);
    }

    #[test]
    fn only_standard_queues_are_asked_for() {
        let urls = [
            "http://127.0.0.1:4566/queue/us-east-1/000000000000/orders".to_owned(),
            "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq/".to_owned(),
            "https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo".to_owned(),
        ];
        assert_eq!(standard_queue_names(&urls), ["orders", "orders-dlq"]);
    }

    #[test]
    fn a_denial_is_not_an_outage() {
        let answered = |status| Failure::Answered { status: Some(status) };
        let cause = |failure, code: Option<&str>| classify_failure(failure, code, "x".to_owned()).cause();
        // Real CloudWatch: the query-compatible code of the CBOR error.
        assert_eq!(cause(answered(403), Some("AccessDenied")), "denied");
        assert_eq!(cause(answered(400), Some("AccessDenied")), "denied");
        assert_eq!(cause(answered(403), Some("InvalidClientTokenId")), "denied");
        assert_eq!(cause(answered(400), Some("ExpiredToken")), "denied");
        // An error body the SDK could not read (moto answers the CBOR protocol's errors in XML).
        assert_eq!(cause(answered(403), None), "denied");
        assert_eq!(cause(Failure::NoAnswer, None), "unavailable");
        assert_eq!(cause(answered(503), None), "unavailable");
        assert_eq!(cause(answered(400), Some("Throttling")), "unavailable");
        assert_eq!(cause(answered(429), None), "unavailable");
        assert_eq!(cause(Failure::Answered { status: None }, None), "unavailable");
        assert_eq!(cause(answered(400), Some("InvalidParameterValue")), "refused");
        assert_eq!(cause(answered(404), None), "refused");
        assert_eq!(cause(Failure::NotBuilt, None), "refused");
    }

    #[test]
    fn an_unreadable_error_body_is_quoted() {
        // LocalStack 4.8.1's answer to a CBOR GetMetricData (HTTP 500).
        let localstack = "<?xml version='1.0' encoding='utf-8'?>\n<ErrorResponse><Error><Code>InternalError</Code>\
            <Message>exception while calling cloudwatch with unknown operation: Operation detection failed. Missing \
            Action in request for query-protocol service ServiceModel(cloudwatch).</Message></Error></ErrorResponse>";
        assert!(body_text(localstack.as_bytes()).starts_with("exception while calling cloudwatch"));
        assert!(body_text(localstack.as_bytes()).ends_with("ServiceModel(cloudwatch)."));
        assert_eq!(body_text(b" bad gateway \n"), "bad gateway");
        assert_eq!(body_text("x".repeat(500).as_bytes()).len(), 300);
    }

    #[test]
    fn the_page_says_which_failure_it_is() {
        let denied = render(&Err(ReadError::Denied {
            detail: "AccessDenied: not authorized".to_owned(),
        }))
        .into_string();
        assert!(denied.contains("data-cause=\"denied\""), "{denied}");
        assert!(denied.contains("cloudwatch:GetMetricData"), "{denied}");
        assert!(!denied.contains("unavailable"), "{denied}");
        let down = render(&Err(ReadError::Unavailable {
            detail: "timeout".to_owned(),
        }))
        .into_string();
        assert!(down.contains("CloudWatch is unavailable"), "{down}");
        assert!(
            !down.contains("GetMetricData"),
            "an outage is not a permission problem: {down}"
        );
    }
}
