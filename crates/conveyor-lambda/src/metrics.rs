//! Per-batch metrics, printed as CloudWatch Embedded Metric Format: one JSON line per source queue
//! per batch on stdout, which Lambda ships to CloudWatch Logs and CloudWatch turns into metrics
//! without an API call (and without the latency of one), and one per tenant of the batch.
//!
//! # Design note: per-tenant documents and EMF's limits
//!
//! A queue's document has dimension `queue`. Each tenant seen in the batch gets a document of its
//! own with dimensions `queue` and `tenant`, the tenant labelled as the worker's Prometheus metrics
//! label it (`conveyor_core::runtime::TenantMetrics`): one of the `metrics_top` busiest tenants by
//! name, everyone else `other`, jobs without a tenant `none`. So a queue has at most
//! `metrics_top + 2` tenant series per metric in CloudWatch, whatever the number of tenants (each is a
//! custom metric, billed as one). The bound is per execution environment, each with its own sketch:
//! environments label the tenants busy in their own traffic, so across a fleet and over time the
//! named series are the tenants that were among the busiest somewhere (at any moment at most
//! `2 × metrics_top` tenants can hold the `1 / (2 × metrics_top)` share a label needs). A label that
//! is not a valid dimension value (a `conveyor.tenant` attribute from a foreign producer: non-ASCII,
//! a control character, blank, over 1,024 characters; CloudWatch takes 1 to 1,024 ASCII characters,
//! not only whitespace, no control characters) counts as `other`.
//!
//! EMF's limits hold by construction: a directive declares at most 8 metrics (100 allowed), its
//! dimension set has at most 2 dimensions (30 allowed), a metric carries at most
//! [`MAX_EMF_VALUES`] values (100 allowed; more durations go to further documents), and the largest
//! document (a 128-character tenant, an 80-character queue name, 100 durations) is under 3 KB, far
//! below the 256 KB of a CloudWatch Logs event (EMF documents may reach 1 MB). The unit tests check
//! each, on the worst case.

use std::time::{Duration, SystemTime};

use conveyor_core::runtime::{OTHER_TENANTS, epoch_millis};
use serde::Serialize;
use serde::ser::Serializer;

/// The CloudWatch namespace.
pub const NAMESPACE: &str = "Conveyor";

/// What one batch did with one queue's records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchMetrics {
    /// The source queue's name (the `queue` dimension).
    pub queue: String,
    /// Records in the batch.
    pub received: u64,
    /// Handled and acknowledged.
    pub succeeded: u64,
    /// Reported in `batchItemFailures` (retried by SQS, after their backoff when they ran).
    pub retried: u64,
    /// Sent to the DLQ by the adapter (permanent failures).
    pub dead_lettered: u64,
    /// Acknowledged without running: an earlier delivery completed them.
    pub duplicates: u64,
    /// Acknowledged without running: the producer cancelled them (`conveyor_core::runtime::cancel`).
    pub cancelled: u64,
    /// Put back without running as a delayed copy (a key in progress elsewhere, the store unreachable).
    pub deferred: u64,
    /// How long each handler run took.
    pub handler_durations: Vec<Duration>,
    /// The same by tenant label (see the module's design note), in the order first seen. Records
    /// that could not be converted (no receipt handle or source, which a real event source mapping
    /// never sends) are counted per queue only.
    pub tenants: Vec<TenantBatchMetrics>,
}

/// What one batch did with one tenant label's records of one queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantBatchMetrics {
    /// The label (the `tenant` dimension): a tenant, `other` or `none`.
    pub tenant: String,
    /// Records in the batch.
    pub received: u64,
    /// Handled and acknowledged.
    pub succeeded: u64,
    /// Reported in `batchItemFailures`.
    pub retried: u64,
    /// Sent to the DLQ by the adapter.
    pub dead_lettered: u64,
    /// Put back without running as a delayed copy (a tenant limit, a key in progress elsewhere, the
    /// store unreachable).
    pub deferred: u64,
    /// How long each handler run took.
    pub handler_durations: Vec<Duration>,
}

impl BatchMetrics {
    /// Metrics for `queue`, all zero.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            ..Self::default()
        }
    }

    /// The figures of tenant label `label`, added when new; a label that is not a valid CloudWatch
    /// dimension value is `other`.
    pub fn tenant(&mut self, label: &str) -> &mut TenantBatchMetrics {
        let label = if is_dimension_value(label) {
            label
        } else {
            OTHER_TENANTS
        };
        let position = match self.tenants.iter().position(|tenant| tenant.tenant == label) {
            Some(position) => position,
            None => {
                self.tenants.push(TenantBatchMetrics {
                    tenant: label.to_owned(),
                    ..TenantBatchMetrics::default()
                });
                self.tenants.len() - 1
            }
        };
        &mut self.tenants[position]
    }

    /// The documents [`to_emf_lines`](Self::to_emf_lines) writes: the queue's, then each tenant's.
    fn to_emf(&self, at: SystemTime) -> Vec<EmfDocument<'_>> {
        let queue = Series {
            queue: &self.queue,
            tenant: None,
            counts: Counts(vec![
                ("Received", self.received),
                ("Succeeded", self.succeeded),
                ("Retried", self.retried),
                ("DeadLettered", self.dead_lettered),
                ("Duplicates", self.duplicates),
                ("Cancelled", self.cancelled),
                ("Deferred", self.deferred),
            ]),
            durations: &self.handler_durations,
        };
        let tenants = self.tenants.iter().map(|tenant| Series {
            queue: &self.queue,
            tenant: Some(&tenant.tenant),
            counts: Counts(vec![
                ("Received", tenant.received),
                ("Succeeded", tenant.succeeded),
                ("Retried", tenant.retried),
                ("DeadLettered", tenant.dead_lettered),
                ("Deferred", tenant.deferred),
            ]),
            durations: &tenant.handler_durations,
        });
        std::iter::once(queue)
            .chain(tenants)
            .flat_map(|series| series.documents(at))
            .collect()
    }

    /// The EMF documents, stamped `at`, one JSON line each: the queue's counts and its first 100
    /// handler durations in the first, further durations 100 per document (EMF takes at most 100
    /// values per metric, and a batch may hold up to 10,000 records); then the same for each tenant
    /// label, with dimensions `queue` and `tenant`.
    pub fn to_emf_lines(&self, at: SystemTime) -> Vec<String> {
        self.emf_lines_of(at, None)
    }

    /// [`BatchMetrics::to_emf_lines`], each document carrying the invocation's `requestId` (a property,
    /// not a dimension: it costs no metric, and Logs Insights finds an invocation's lines by it).
    pub(crate) fn emf_lines_of(&self, at: SystemTime, request_id: Option<&str>) -> Vec<String> {
        self.to_emf(at)
            .into_iter()
            .map(|document| EmfDocument {
                request_id,
                ..document
            })
            .collect::<Vec<_>>()
            .iter()
            .filter_map(|document| match serde_json::to_string(document) {
                Ok(line) => Some(line),
                // Not reachable with these types (string keys, finite numbers); a metric line is not
                // worth failing a batch for.
                Err(error) => {
                    tracing::warn!(%error, "an EMF document did not serialize; its metrics are dropped");
                    None
                }
            })
            .collect()
    }
}

/// The EMF line for an invocation whose spans did not all leave (see `conveyor-otel`'s
/// `FlushReport`): `SpansDropped` (lost to a failed export) and `SpansUnflushed` (not exported when
/// the invocation's time was up), with no dimension (one series per function's log group), the
/// invocation's `requestId` as a property.
#[cfg_attr(not(feature = "otel"), allow(dead_code))] // called by the runtime's span flush
pub(crate) fn spans_emf_line(at: SystemTime, request_id: &str, dropped: u64, unflushed: u64) -> String {
    serde_json::json!({
        SPANS_DROPPED: dropped,
        SPANS_UNFLUSHED: unflushed,
        "requestId": request_id,
        "_aws": {
            "Timestamp": epoch_millis(at),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [[]],
                "Metrics": [
                    {"Name": SPANS_DROPPED, "Unit": "Count"},
                    {"Name": SPANS_UNFLUSHED, "Unit": "Count"},
                ],
            }],
        },
    })
    .to_string()
}

/// Spans lost to a failed export in an invocation.
const SPANS_DROPPED: &str = "SpansDropped";
/// Spans not exported when an invocation's time was up.
const SPANS_UNFLUSHED: &str = "SpansUnflushed";

/// CloudWatch's rule for a dimension value: 1 to 1,024 ASCII characters, at least one of them not
/// whitespace, no control characters.
fn is_dimension_value(value: &str) -> bool {
    (1..=1024).contains(&value.len())
        && value.is_ascii()
        && !value.chars().any(|c| c.is_ascii_control())
        && !value.trim().is_empty()
}

/// One series of documents: a queue's, or a tenant label's of that queue.
struct Series<'a> {
    queue: &'a str,
    tenant: Option<&'a str>,
    counts: Counts,
    durations: &'a [Duration],
}

impl<'a> Series<'a> {
    /// The counts and the first [`MAX_EMF_VALUES`] durations, then the further durations.
    fn documents(self, at: SystemTime) -> Vec<EmfDocument<'a>> {
        let mut chunks = self.durations.chunks(MAX_EMF_VALUES);
        let first = chunks.next().unwrap_or_default();
        let mut documents = vec![self.document(at, first, Some(self.counts.clone()))];
        documents.extend(chunks.map(|chunk| self.document(at, chunk, None)));
        documents
    }

    fn document(&self, at: SystemTime, durations: &[Duration], counts: Option<Counts>) -> EmfDocument<'a> {
        let mut metrics: Vec<MetricDefinition> = counts
            .iter()
            .flat_map(|counts| counts.0.iter())
            .map(|&(name, _)| MetricDefinition {
                name,
                unit: Unit::Count,
            })
            .collect();
        // An empty array is invalid EMF, so the metric is left out when no handler ran.
        if !durations.is_empty() {
            metrics.push(MetricDefinition {
                name: HANDLER_DURATION,
                unit: Unit::Milliseconds,
            });
        }
        let dimensions = match self.tenant {
            Some(_) => vec![QUEUE_DIMENSION, TENANT_DIMENSION],
            None => vec![QUEUE_DIMENSION],
        };
        EmfDocument {
            queue: self.queue,
            tenant: self.tenant,
            counts,
            request_id: None,
            handler_duration_ms: durations
                .iter()
                .map(|duration| (duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0)
                .collect(),
            aws: Metadata {
                timestamp: epoch_millis(at),
                cloud_watch_metrics: [Directive {
                    namespace: NAMESPACE,
                    dimensions: [dimensions],
                    metrics,
                }],
            },
        }
    }
}

/// The most values one EMF metric may carry in one document.
const MAX_EMF_VALUES: usize = 100;
/// The queue dimension: the source queue's name ([`EmfDocument::queue`]).
const QUEUE_DIMENSION: &str = "queue";
/// The tenant dimension of the per-tenant documents ([`EmfDocument::tenant`]).
const TENANT_DIMENSION: &str = "tenant";
/// The handler duration metric's name.
const HANDLER_DURATION: &str = "HandlerDurationMs";

/// One Embedded Metric Format document: the dimensions' values, the metric values, and the `_aws`
/// metadata declaring them (<https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html>).
#[derive(Debug, Serialize)]
struct EmfDocument<'a> {
    /// The `queue` dimension.
    queue: &'a str,
    /// The `tenant` dimension, in a tenant's documents only.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    /// In the first document of a series only.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    counts: Option<Counts>,
    /// The invocation's request id, when known.
    #[serde(rename = "requestId", skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    /// Milliseconds, at most [`MAX_EMF_VALUES`]; left out when empty.
    #[serde(rename = "HandlerDurationMs", skip_serializing_if = "Vec::is_empty")]
    handler_duration_ms: Vec<f64>,
    #[serde(rename = "_aws")]
    aws: Metadata,
}

/// A series' counts, one metric each, in this order: each is declared from the same list, so a
/// document declares exactly the counts it carries.
#[derive(Debug, Clone)]
struct Counts(Vec<(&'static str, u64)>);

impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().copied())
    }
}

/// The `_aws` member: when, and which members are metrics.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Metadata {
    /// Epoch milliseconds.
    timestamp: u64,
    cloud_watch_metrics: [Directive; 1],
}

/// A metric directive: the namespace, the dimension set, the metrics.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Directive {
    namespace: &'static str,
    dimensions: [Vec<&'static str>; 1],
    metrics: Vec<MetricDefinition>,
}

/// One metric's name and unit.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct MetricDefinition {
    name: &'static str,
    unit: Unit,
}

/// The CloudWatch units used here.
#[derive(Debug, Clone, Copy, Serialize)]
enum Unit {
    Count,
    Milliseconds,
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use serde_json::{Value, json};

    use super::*;

    /// The documents as CloudWatch reads them: each line parsed back.
    fn documents(metrics: &BatchMetrics, at: SystemTime) -> Vec<Value> {
        metrics
            .to_emf_lines(at)
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn an_invocations_lines_carry_its_request_id_and_no_more_metrics() {
        let mut metrics = BatchMetrics::new("jobs");
        metrics.received = 2;
        metrics.tenant("acme").received = 2;
        let at = SystemTime::UNIX_EPOCH;
        let lines = metrics.emf_lines_of(at, Some("req-7"));
        assert_eq!(lines.len(), 2);
        for line in &lines {
            let document: Value = serde_json::from_str(line).unwrap();
            assert_eq!(document["requestId"], "req-7", "{line}");
            let declared = document["_aws"]["CloudWatchMetrics"][0].to_string();
            assert!(
                !declared.contains("requestId"),
                "a property, not a metric or dimension: {line}"
            );
        }
        assert!(
            metrics
                .to_emf_lines(at)
                .iter()
                .all(|line| !line.contains("requestId"))
        );
    }

    #[test]
    fn the_span_line_declares_both_counts_without_dimensions() {
        let line = spans_emf_line(UNIX_EPOCH + Duration::from_secs(1), "req-1", 3, 5);
        let document: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(document["SpansDropped"], 3);
        assert_eq!(document["SpansUnflushed"], 5);
        assert_eq!(document["requestId"], "req-1");
        assert_eq!(document["_aws"]["Timestamp"], 1000);
        let directive = &document["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(directive["Dimensions"], json!([[]]));
        assert_eq!(
            directive["Metrics"],
            json!([{"Name": "SpansDropped", "Unit": "Count"}, {"Name": "SpansUnflushed", "Unit": "Count"}])
        );
    }

    #[test]
    fn a_batch_is_one_exact_emf_document() {
        let metrics = BatchMetrics {
            queue: "jobs".into(),
            received: 7,
            succeeded: 1,
            retried: 2,
            dead_lettered: 1,
            duplicates: 1,
            cancelled: 1,
            deferred: 1,
            handler_durations: vec![Duration::from_micros(1500), Duration::from_nanos(2_000_400)],
            tenants: Vec::new(),
        };
        let lines = metrics.to_emf_lines(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
        assert_eq!(lines.len(), 1, "{lines:?}");
        let document: Value = serde_json::from_str(&lines[0]).unwrap();
        let count = |name: &str| json!({"Name": name, "Unit": "Count"});
        assert_eq!(
            document,
            json!({
                "queue": "jobs",
                "Received": 7,
                "Succeeded": 1,
                "Retried": 2,
                "DeadLettered": 1,
                "Duplicates": 1,
                "Cancelled": 1,
                "Deferred": 1,
                "HandlerDurationMs": [1.5, 2.0],
                "_aws": {
                    "Timestamp": 1_700_000_000_123u64,
                    "CloudWatchMetrics": [{
                        "Namespace": "Conveyor",
                        "Dimensions": [["queue"]],
                        "Metrics": [
                            count("Received"),
                            count("Succeeded"),
                            count("Retried"),
                            count("DeadLettered"),
                            count("Duplicates"),
                            count("Cancelled"),
                            count("Deferred"),
                            {"Name": "HandlerDurationMs", "Unit": "Milliseconds"},
                        ],
                    }],
                },
            })
        );
        // The line itself: one line, members in the order the README shows.
        assert_eq!(
            lines[0],
            concat!(
                r#"{"queue":"jobs","Received":7,"Succeeded":1,"Retried":2,"DeadLettered":1,"Duplicates":1,"#,
                r#""Cancelled":1,"Deferred":1,"HandlerDurationMs":[1.5,2.0],"_aws":{"Timestamp":1700000000123,"#,
                r#""CloudWatchMetrics":[{"Namespace":"Conveyor","Dimensions":[["queue"]],"Metrics":["#,
                r#"{"Name":"Received","Unit":"Count"},{"Name":"Succeeded","Unit":"Count"},"#,
                r#"{"Name":"Retried","Unit":"Count"},{"Name":"DeadLettered","Unit":"Count"},"#,
                r#"{"Name":"Duplicates","Unit":"Count"},{"Name":"Cancelled","Unit":"Count"},"#,
                r#"{"Name":"Deferred","Unit":"Count"},{"Name":"HandlerDurationMs","Unit":"Milliseconds"}]}]}}"#,
            )
        );
    }

    #[test]
    fn later_documents_carry_only_durations() {
        let metrics = BatchMetrics {
            received: 101,
            succeeded: 101,
            handler_durations: vec![Duration::from_millis(3); 101],
            ..BatchMetrics::new("jobs")
        };
        let documents = documents(&metrics, UNIX_EPOCH + Duration::from_millis(5));
        assert_eq!(documents.len(), 2);
        assert_eq!(
            documents[1],
            json!({
                "queue": "jobs",
                "HandlerDurationMs": [3.0],
                "_aws": {
                    "Timestamp": 5,
                    "CloudWatchMetrics": [{
                        "Namespace": "Conveyor",
                        "Dimensions": [["queue"]],
                        "Metrics": [{"Name": "HandlerDurationMs", "Unit": "Milliseconds"}],
                    }],
                },
            })
        );
    }

    #[test]
    fn emf_declares_every_metric_it_carries() {
        let metrics = BatchMetrics {
            queue: "jobs".into(),
            received: 3,
            succeeded: 1,
            retried: 1,
            dead_lettered: 1,
            duplicates: 0,
            cancelled: 0,
            deferred: 0,
            handler_durations: vec![Duration::from_micros(1500), Duration::from_millis(2)],
            tenants: Vec::new(),
        };
        let documents = documents(&metrics, UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
        assert_eq!(documents.len(), 1);
        let emf = &documents[0];
        let aws = &emf["_aws"];
        assert_eq!(aws["Timestamp"], 1_700_000_000_123u64);
        let directive = &aws["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "Conveyor");
        assert_eq!(directive["Dimensions"], json!([["queue"]]));
        for definition in directive["Metrics"].as_array().unwrap() {
            let name = definition["Name"].as_str().unwrap();
            assert!(emf.get(name).is_some(), "{name} declared but missing");
        }
        assert_eq!(emf["queue"], "jobs");
        assert_eq!(emf["HandlerDurationMs"], json!([1.5, 2.0]));
        assert_eq!(emf["Received"], 3);
        assert!(
            metrics
                .to_emf_lines(UNIX_EPOCH)
                .iter()
                .all(|line| !line.contains('\n'))
        );
    }

    #[test]
    fn more_than_100_durations_are_split_across_documents() {
        let metrics = BatchMetrics {
            received: 250,
            succeeded: 250,
            handler_durations: vec![Duration::from_millis(1); 250],
            ..BatchMetrics::new("jobs")
        };
        let documents = documents(&metrics, UNIX_EPOCH);
        let sizes: Vec<usize> = documents
            .iter()
            .map(|document| document["HandlerDurationMs"].as_array().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![100, 100, 50], "every value kept, none over 100");
        assert_eq!(documents[0]["Received"], 250);
        assert!(
            documents[1].get("Received").is_none(),
            "counts once, not three times"
        );
        for document in &documents {
            for definition in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
            {
                let name = definition["Name"].as_str().unwrap();
                assert!(document.get(name).is_some(), "{name} declared but missing");
            }
        }
    }

    #[test]
    fn no_duration_metric_when_nothing_ran() {
        let documents = documents(&BatchMetrics::new("jobs"), UNIX_EPOCH);
        let emf = &documents[0];
        assert!(emf.get("HandlerDurationMs").is_none());
        let names: Vec<&str> = emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|metric| metric["Name"].as_str().unwrap())
            .collect();
        assert!(!names.contains(&"HandlerDurationMs"));
    }

    /// Every document's declared metrics are exactly the members it carries besides its dimensions,
    /// and each dimension it declares is a member.
    fn assert_declared_exactly(document: &Value) {
        let directive = &document["_aws"]["CloudWatchMetrics"][0];
        let dimensions: Vec<&str> = directive["Dimensions"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|dimension| dimension.as_str().unwrap())
            .collect();
        for dimension in &dimensions {
            assert!(document[dimension].is_string(), "{dimension} missing: {document}");
        }
        let mut declared: Vec<&str> = directive["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|metric| metric["Name"].as_str().unwrap())
            .collect();
        let mut carried: Vec<&str> = document
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .filter(|key| *key != "_aws" && !dimensions.contains(key))
            .collect();
        declared.sort_unstable();
        carried.sort_unstable();
        assert_eq!(declared, carried, "{document}");
    }

    #[test]
    fn each_tenant_label_gets_an_exact_document_with_queue_and_tenant() {
        let mut metrics = BatchMetrics {
            received: 3,
            succeeded: 2,
            retried: 1,
            handler_durations: vec![Duration::from_millis(4); 3],
            ..BatchMetrics::new("jobs")
        };
        let acme = metrics.tenant("acme-42");
        acme.received = 2;
        acme.succeeded = 1;
        acme.retried = 1;
        acme.handler_durations = vec![Duration::from_millis(4); 2];
        let none = metrics.tenant("none");
        none.received = 1;
        none.succeeded = 1;
        none.handler_durations = vec![Duration::from_millis(4)];
        let documents = documents(&metrics, UNIX_EPOCH + Duration::from_millis(7));
        assert_eq!(documents.len(), 3);
        let count = |name: &str| json!({"Name": name, "Unit": "Count"});
        assert_eq!(
            documents[1],
            json!({
                "queue": "jobs",
                "tenant": "acme-42",
                "Received": 2,
                "Succeeded": 1,
                "Retried": 1,
                "DeadLettered": 0,
                "Deferred": 0,
                "HandlerDurationMs": [4.0, 4.0],
                "_aws": {
                    "Timestamp": 7,
                    "CloudWatchMetrics": [{
                        "Namespace": "Conveyor",
                        "Dimensions": [["queue", "tenant"]],
                        "Metrics": [
                            count("Received"),
                            count("Succeeded"),
                            count("Retried"),
                            count("DeadLettered"),
                            count("Deferred"),
                            {"Name": "HandlerDurationMs", "Unit": "Milliseconds"},
                        ],
                    }],
                },
            })
        );
        assert_eq!(documents[2]["tenant"], "none");
        assert_eq!(
            documents[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["queue"]]),
            "the queue's own document keeps its one dimension"
        );
        for document in &documents {
            assert_declared_exactly(document);
        }
    }

    #[test]
    fn a_label_cloudwatch_would_refuse_as_a_dimension_value_is_other() {
        let mut metrics = BatchMetrics::new("jobs");
        for bad in ["acme corp\u{7}", "café", "   ", ""] {
            metrics.tenant(bad).received += 1;
        }
        metrics.tenant(&"x".repeat(1025)).received += 1;
        metrics.tenant("acme corp").received += 1;
        let labels: Vec<(&str, u64)> = metrics
            .tenants
            .iter()
            .map(|tenant| (tenant.tenant.as_str(), tenant.received))
            .collect();
        assert_eq!(labels, [("other", 5), ("acme corp", 1)]);
    }

    #[test]
    fn the_worst_case_stays_inside_emf_limits() {
        // The longest queue name, the longest tenant (all of it escaped in JSON), a full batch of
        // 10,000 records of the slowest handlers, every count at its largest, and `metrics_top` 20
        // tenants plus `other` and `none`.
        let queue = "q".repeat(80);
        let mut metrics = BatchMetrics {
            received: u64::MAX,
            succeeded: u64::MAX,
            retried: u64::MAX,
            dead_lettered: u64::MAX,
            duplicates: u64::MAX,
            cancelled: u64::MAX,
            deferred: u64::MAX,
            handler_durations: vec![Duration::from_nanos(899_999_999_999); 10_000],
            ..BatchMetrics::new(queue)
        };
        let mut labels: Vec<String> = (0..20).map(|n| format!("{n:\\>128}")).collect();
        labels.extend(["other".to_owned(), "none".to_owned()]);
        for label in &labels {
            assert!(conveyor_core::tenant::check_tenant(label).is_ok(), "{label}");
            let tenant = metrics.tenant(label);
            tenant.received = u64::MAX;
            tenant.handler_durations = vec![Duration::from_nanos(899_999_999_999); 500];
        }
        let lines = metrics.to_emf_lines(UNIX_EPOCH + Duration::from_secs(4_000_000_000));
        // The queue's 10,000 durations in 100 documents, each label's 500 in 5.
        assert_eq!(lines.len(), 100 + 22 * 5);
        let longest = lines.iter().map(String::len).max().unwrap();
        assert!(longest < 3 * 1024, "a line of {longest} bytes");
        assert!(longest < 256 * 1024, "CloudWatch Logs takes events up to 256 KB");
        for line in &lines {
            let document: Value = serde_json::from_str(line).unwrap();
            let directive = &document["_aws"]["CloudWatchMetrics"][0];
            assert!(directive["Metrics"].as_array().unwrap().len() <= 100);
            assert!(directive["Dimensions"][0].as_array().unwrap().len() <= 30);
            if let Some(values) = document.get("HandlerDurationMs") {
                assert!(values.as_array().unwrap().len() <= 100);
            }
            assert_declared_exactly(&document);
        }
        let tenants: std::collections::HashSet<&str> = lines
            .iter()
            .filter_map(|line| line.split("\"tenant\":").nth(1))
            .map(|rest| rest.split(",\"").next().unwrap())
            .collect();
        assert_eq!(tenants.len(), 22, "one series per label, no more");
    }
}
