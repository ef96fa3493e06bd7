//! Per-batch metrics, printed as CloudWatch Embedded Metric Format: one JSON line per source queue
//! per batch on stdout, which Lambda ships to CloudWatch Logs and CloudWatch turns into metrics
//! without an API call (and without the latency of one).

use std::time::{Duration, SystemTime};

use conveyor_core::outcome::epoch_millis;
use serde_json::{Value, json};

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
    /// Acknowledged without running: the producer cancelled them (`conveyor_core::delay::cancel`).
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

    /// The EMF documents, stamped `at`: the counts and the first 100 handler durations in the first,
    /// further durations 100 per document (EMF takes at most 100 values per metric, and a batch may
    /// hold up to 10,000 records).
    pub fn to_emf(&self, at: SystemTime) -> Vec<Value> {
        let chunks: Vec<&[Duration]> = self.handler_durations.chunks(MAX_EMF_VALUES).collect();
        let mut documents = vec![self.document(at, chunks.first().copied(), true)];
        for chunk in chunks.iter().skip(1) {
            documents.push(self.document(at, Some(chunk), false));
        }
        documents
    }

    fn document(&self, at: SystemTime, durations: Option<&[Duration]>, counts: bool) -> Value {
        let count = |name: &str| json!({"Name": name, "Unit": "Count"});
        let mut definitions = Vec::new();
        let mut document = json!({ "queue": self.queue });
        if counts {
            for (name, value) in [
                ("Received", self.received),
                ("Succeeded", self.succeeded),
                ("Retried", self.retried),
                ("DeadLettered", self.dead_lettered),
                ("Duplicates", self.duplicates),
                ("Cancelled", self.cancelled),
                ("Deferred", self.deferred),
            ] {
                definitions.push(count(name));
                document[name] = json!(value);
            }
        }
        // An empty array is invalid EMF, so the metric is left out when no handler ran.
        if let Some(durations) = durations.filter(|durations| !durations.is_empty()) {
            definitions.push(json!({"Name": "HandlerDurationMs", "Unit": "Milliseconds"}));
            let values: Vec<f64> = durations
                .iter()
                .map(|duration| (duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0)
                .collect();
            document["HandlerDurationMs"] = json!(values);
        }
        document["_aws"] = json!({
            "Timestamp": epoch_millis(at),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["queue"]],
                "Metrics": definitions,
            }],
        });
        document
    }

    /// The EMF documents, one line each.
    pub fn to_emf_lines(&self, at: SystemTime) -> Vec<String> {
        self.to_emf(at).iter().map(Value::to_string).collect()
    }
}

/// The most values one EMF metric may carry in one document.
const MAX_EMF_VALUES: usize = 100;

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

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
        let documents = metrics.to_emf(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
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
        let documents = metrics.to_emf(UNIX_EPOCH);
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
        let documents = BatchMetrics::new("jobs").to_emf(UNIX_EPOCH);
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
