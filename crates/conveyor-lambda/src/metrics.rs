//! Per-batch metrics, printed as CloudWatch Embedded Metric Format: one JSON line per source queue
//! per batch on stdout, which Lambda ships to CloudWatch Logs and CloudWatch turns into metrics
//! without an API call (and without the latency of one).

use std::time::{Duration, SystemTime};

use conveyor_core::runtime::epoch_millis;
use serde::Serialize;

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
}

impl BatchMetrics {
    /// Metrics for `queue`, all zero.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            ..Self::default()
        }
    }

    /// The documents [`to_emf_lines`](Self::to_emf_lines) writes.
    fn to_emf(&self, at: SystemTime) -> Vec<EmfDocument<'_>> {
        let mut chunks = self.handler_durations.chunks(MAX_EMF_VALUES);
        let mut documents = vec![self.document(at, chunks.next().unwrap_or_default(), Some(self.counts()))];
        documents.extend(chunks.map(|chunk| self.document(at, chunk, None)));
        documents
    }

    fn counts(&self) -> Counts {
        Counts {
            received: self.received,
            succeeded: self.succeeded,
            retried: self.retried,
            dead_lettered: self.dead_lettered,
            duplicates: self.duplicates,
            cancelled: self.cancelled,
            deferred: self.deferred,
        }
    }

    fn document(&self, at: SystemTime, durations: &[Duration], counts: Option<Counts>) -> EmfDocument<'_> {
        let mut metrics: Vec<MetricDefinition> = Vec::new();
        if counts.is_some() {
            metrics.extend(Counts::NAMES.map(|name| MetricDefinition {
                name,
                unit: Unit::Count,
            }));
        }
        // An empty array is invalid EMF, so the metric is left out when no handler ran.
        if !durations.is_empty() {
            metrics.push(MetricDefinition {
                name: HANDLER_DURATION,
                unit: Unit::Milliseconds,
            });
        }
        EmfDocument {
            queue: &self.queue,
            counts,
            handler_duration_ms: durations
                .iter()
                .map(|duration| (duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0)
                .collect(),
            aws: Metadata {
                timestamp: epoch_millis(at),
                cloud_watch_metrics: [Directive {
                    namespace: NAMESPACE,
                    dimensions: [[DIMENSION]],
                    metrics,
                }],
            },
        }
    }

    /// The EMF documents, stamped `at`, one JSON line each: the counts and the first 100 handler
    /// durations in the first, further durations 100 per document (EMF takes at most 100 values per
    /// metric, and a batch may hold up to 10,000 records).
    pub fn to_emf_lines(&self, at: SystemTime) -> Vec<String> {
        self.to_emf(at)
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

/// The most values one EMF metric may carry in one document.
const MAX_EMF_VALUES: usize = 100;
/// The one dimension: the source queue's name ([`EmfDocument::queue`]).
const DIMENSION: &str = "queue";
/// The handler duration metric's name.
const HANDLER_DURATION: &str = "HandlerDurationMs";

/// One Embedded Metric Format document: the dimension's value, the metric values, and the `_aws`
/// metadata declaring them (<https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html>).
#[derive(Debug, Serialize)]
struct EmfDocument<'a> {
    /// The `queue` dimension.
    queue: &'a str,
    /// In the first document of a batch only.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    counts: Option<Counts>,
    /// Milliseconds, at most [`MAX_EMF_VALUES`]; left out when empty.
    #[serde(rename = "HandlerDurationMs", skip_serializing_if = "Vec::is_empty")]
    handler_duration_ms: Vec<f64>,
    #[serde(rename = "_aws")]
    aws: Metadata,
}

/// A batch's counts, one metric each (declared in [`Counts::NAMES`]'s order).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Counts {
    received: u64,
    succeeded: u64,
    retried: u64,
    dead_lettered: u64,
    duplicates: u64,
    cancelled: u64,
    deferred: u64,
}

impl Counts {
    /// The serialized names of the fields, in order.
    const NAMES: [&'static str; 7] = [
        "Received",
        "Succeeded",
        "Retried",
        "DeadLettered",
        "Duplicates",
        "Cancelled",
        "Deferred",
    ];
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
    dimensions: [[&'static str; 1]; 1],
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
}
