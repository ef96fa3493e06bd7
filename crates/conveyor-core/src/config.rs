//! Runtime configuration, validated at start-up with errors that say what to change.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::defaults;
use crate::disposition::RejectMode;
use crate::limits::{MAX_VISIBILITY_TIMEOUT, MAX_WAIT_TIME};

/// One invalid setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The setting's name, as in the config file.
    pub field: String,
    /// What is wrong and what to change.
    pub problem: String,
}

/// Every invalid setting found, so one start-up shows them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The problems, in field order.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration:")?;
        for problem in &self.problems {
            write!(f, "\n  - {}: {}", problem.field, problem.problem)?;
        }
        Ok(())
    }
}

/// Collects problems while validating.
#[derive(Default)]
struct Problems(Vec<ConfigProblem>);

impl Problems {
    fn check(&mut self, ok: bool, field: &str, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(ConfigProblem {
                field: field.to_owned(),
                problem: problem(),
            });
        }
    }

    fn finish(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: self.0 })
        }
    }
}

/// How a worker with several queues shares its capacity between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorityMode {
    /// Always receive from the highest-weight queue that has messages first.
    Strict,
    /// Share receives in proportion to the queues' weights.
    #[default]
    Weighted,
}

/// One queue a worker consumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// The queue URL.
    pub url: String,
    /// The queue's weight (or rank, in strict mode): higher goes first.
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// The long-poll worker's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The queues to consume.
    pub queues: Vec<QueueConfig>,
    /// Messages in flight at once, across all queues.
    pub max_in_flight: usize,
    /// Long-poll wait per receive (at most 20 s).
    #[serde(with = "seconds")]
    pub receive_wait: Duration,
    /// Overrides the queues' own visibility timeout: sent with every receive and every extension. By
    /// default (`None`) each queue's `VisibilityTimeout` attribute, read at connect, is what is sent.
    #[serde(with = "optional_seconds")]
    pub visibility_timeout: Option<Duration>,
    /// The longest a message is kept in flight by heartbeats (at most 12 h from first receipt).
    #[serde(with = "seconds")]
    pub max_processing_time: Duration,
    /// The platform's stop timeout (SIGTERM, then SIGKILL this long after; ECS's `stopTimeout`).
    /// Shutdown (drain, cancel, release, flush) fits inside it.
    #[serde(with = "seconds")]
    pub stop_timeout: Duration,
    /// On SIGTERM, how long in-flight jobs may finish before they are cancelled and released. By
    /// default (`None`) what fits: the stop timeout minus [`defaults::SHUTDOWN_RESERVE`].
    #[serde(with = "optional_seconds")]
    pub drain_deadline: Option<Duration>,
    /// Pending deletes are flushed at 10 or after this interval, whichever comes first.
    #[serde(with = "millis")]
    pub delete_flush_interval: Duration,
    /// Sharing capacity between several queues.
    pub priority: PriorityMode,
    /// Where permanent failures go.
    pub reject_mode: RejectMode,
    /// Address of `/healthz`, `/readyz` and `/metrics`; none to disable.
    pub listen_addr: Option<String>,
    /// How often queue depth is read for metrics.
    #[serde(with = "seconds")]
    pub stats_interval: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            max_in_flight: 100,
            receive_wait: MAX_WAIT_TIME,
            visibility_timeout: None,
            max_processing_time: Duration::from_secs(2 * 3600),
            stop_timeout: Duration::from_secs(defaults::ECS_STOP_TIMEOUT_SECS),
            drain_deadline: None,
            delete_flush_interval: Duration::from_millis(50),
            priority: PriorityMode::default(),
            reject_mode: RejectMode::default(),
            listen_addr: Some("127.0.0.1:9090".to_owned()),
            stats_interval: Duration::from_secs(30),
        }
    }
}

impl WorkerConfig {
    /// The drain deadline in force: the configured one, or what fits in the stop timeout.
    pub fn drain_deadline(&self) -> Duration {
        self.drain_deadline
            .unwrap_or_else(|| self.stop_timeout.saturating_sub(defaults::SHUTDOWN_RESERVE))
    }

    /// Checks every setting; the error lists all problems with what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        problems.check(!self.queues.is_empty(), "queues", || {
            "no queue configured: set CONVEYOR_QUEUE_URL or add [[queues]] url = \"...\"".to_owned()
        });
        for (index, queue) in self.queues.iter().enumerate() {
            let field = format!("queues[{index}].url");
            problems.check(
                queue.url.starts_with("http://") || queue.url.starts_with("https://"),
                &field,
                || {
                    format!(
                        "{:?} is not a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)",
                        queue.url
                    )
                },
            );
            problems.check(queue.weight > 0, &format!("queues[{index}].weight"), || {
                "must be at least 1".to_owned()
            });
        }
        problems.check(
            (1..=10_000).contains(&self.max_in_flight),
            "max_in_flight",
            || format!("{} is outside 1..=10000", self.max_in_flight),
        );
        problems.check(self.receive_wait <= MAX_WAIT_TIME, "receive_wait", || {
            format!("{:?} is over SQS's 20 s long-poll limit", self.receive_wait)
        });
        if let Some(visibility) = self.visibility_timeout {
            let visibility_ok =
                visibility >= defaults::MIN_VISIBILITY_TIMEOUT && visibility <= MAX_VISIBILITY_TIMEOUT;
            problems.check(visibility_ok, "visibility_timeout", || {
                format!(
                    "{visibility:?} is outside {:?}..=12 h: the heartbeat extends when half is left and \
                     needs that time to reach SQS; leave it unset to use each queue's own",
                    defaults::MIN_VISIBILITY_TIMEOUT
                )
            });
        }
        problems.check(
            self.max_processing_time <= MAX_VISIBILITY_TIMEOUT,
            "max_processing_time",
            || {
                format!(
                    "{:?} is over SQS's 12 h in-flight limit",
                    self.max_processing_time
                )
            },
        );
        let drain = self.drain_deadline();
        let reserve = defaults::SHUTDOWN_RESERVE;
        problems.check(self.stop_timeout > reserve, "stop_timeout", || {
            format!(
                "{:?} leaves no time to drain: shutdown needs {reserve:?} after the drain to cancel, release \
                 and flush; raise it (CONVEYOR_STOP_TIMEOUT_SECS, ECS stopTimeout) together with the platform's",
                self.stop_timeout
            )
        });
        problems.check(drain + reserve <= self.stop_timeout, "drain_deadline", || {
            format!(
                "{drain:?} of drain plus {reserve:?} to cancel, release and flush is more than the {:?} stop \
                 timeout, so the platform would kill the worker mid-shutdown; lower it to at most {:?}, or raise \
                 stop_timeout (CONVEYOR_STOP_TIMEOUT_SECS, and stop_timeout_seconds in infra/modules/ecs-consumer) \
                 together",
                self.stop_timeout,
                self.stop_timeout.saturating_sub(reserve)
            )
        });
        let flush_ok =
            !self.delete_flush_interval.is_zero() && self.delete_flush_interval < Duration::from_secs(5);
        problems.check(flush_ok, "delete_flush_interval", || {
            format!("{:?} is outside (0, 5 s)", self.delete_flush_interval)
        });
        problems.finish()
    }
}

/// The Lambda adapter's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LambdaConfig {
    /// The function's timeout.
    #[serde(with = "seconds")]
    pub function_timeout: Duration,
    /// The source queue's visibility timeout.
    #[serde(with = "seconds")]
    pub queue_visibility_timeout: Duration,
    /// Messages that cannot start before the deadline minus this margin are reported as failures.
    #[serde(with = "millis")]
    pub deadline_margin: Duration,
    /// Records of one batch processed at once (FIFO groups still run in order).
    pub batch_concurrency: usize,
    /// Where permanent failures go.
    pub reject_mode: RejectMode,
    /// When every record of a batch failed, fail the invocation too (after settling every record), so
    /// Lambda's `Errors` metric and its alarms see the outage, as Powertools' `BatchProcessingError`
    /// does. Off by default: the event source mapping then retries the whole batch, including records
    /// that were dead-lettered or deferred (each settled once by its idempotency record).
    pub fail_invocation_when_all_fail: bool,
    /// What a failed record holds back on a FIFO queue.
    pub fifo_failure: FifoFailure,
}

/// What a failed record holds back in a Lambda batch from a FIFO queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FifoFailure {
    /// Only the rest of its message group (the default): other groups are independent, so holding them
    /// back would only delay them and spend their receives.
    #[default]
    Group,
    /// Every record after it in the batch, whatever its group (AWS Lambda Powertools' behaviour), for
    /// consumers whose groups are not independent.
    Batch,
}

impl Default for LambdaConfig {
    fn default() -> Self {
        Self {
            function_timeout: Duration::from_secs(10),
            queue_visibility_timeout: Duration::from_secs(defaults::QUEUE_VISIBILITY_TIMEOUT_SECS),
            deadline_margin: Duration::from_millis(500),
            batch_concurrency: 10,
            reject_mode: RejectMode::default(),
            fail_invocation_when_all_fail: false,
            fifo_failure: FifoFailure::default(),
        }
    }
}

impl LambdaConfig {
    /// Checks every setting; the error lists all problems with what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        problems.check(self.function_timeout < self.queue_visibility_timeout, "function_timeout", || {
            format!(
                "the function timeout ({:?}) must stay below the queue's visibility timeout ({:?}), or SQS \
                 delivers messages again while the first invocation still runs; AWS advises a visibility \
                 timeout of at least {}x the function timeout",
                self.function_timeout,
                self.queue_visibility_timeout,
                defaults::LAMBDA_VISIBILITY_RATIO
            )
        });
        problems.check(
            self.deadline_margin < self.function_timeout,
            "deadline_margin",
            || {
                format!(
                    "{:?} leaves no time to run within the {:?} timeout",
                    self.deadline_margin, self.function_timeout
                )
            },
        );
        problems.check(
            (1..=10_000).contains(&self.batch_concurrency),
            "batch_concurrency",
            || format!("{} is outside 1..=10000", self.batch_concurrency),
        );
        problems.finish()
    }
}

/// Serialises a `Duration` as whole seconds (accepting fractions).
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(value.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(seconds).map_err(serde::de::Error::custom)
    }
}

/// Serialises an optional `Duration` as whole seconds (accepting fractions).
mod optional_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_some(&value.as_secs_f64()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        match Option::<f64>::deserialize(deserializer)? {
            Some(seconds) => Duration::try_from_secs_f64(seconds)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

/// Serialises a `Duration` as milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(value.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> WorkerConfig {
        WorkerConfig {
            queues: vec![QueueConfig {
                url: "http://127.0.0.1:4566/000000000000/jobs".into(),
                weight: 1,
            }],
            ..WorkerConfig::default()
        }
    }

    #[test]
    fn defaults_with_a_queue_are_valid() {
        worker().validate().unwrap();
        LambdaConfig::default().validate().unwrap();
    }

    #[test]
    fn every_problem_is_reported_with_what_to_change() {
        let config = WorkerConfig {
            queues: vec![],
            receive_wait: Duration::from_secs(30),
            drain_deadline: Some(Duration::from_secs(40)),
            ..WorkerConfig::default()
        };
        let error = config.validate().unwrap_err();
        let fields: Vec<&str> = error
            .problems
            .iter()
            .map(|problem| problem.field.as_str())
            .collect();
        assert_eq!(fields, vec!["queues", "receive_wait", "drain_deadline"]);
        let text = error.to_string();
        assert!(text.contains("CONVEYOR_QUEUE_URL"), "{text}");
        assert!(text.contains("20 s"), "{text}");
    }

    #[test]
    fn the_drain_deadline_defaults_to_what_fits_in_the_stop_timeout() {
        let config = worker();
        assert_eq!(
            config.drain_deadline() + defaults::SHUTDOWN_RESERVE,
            config.stop_timeout
        );
        let longer = WorkerConfig {
            stop_timeout: Duration::from_secs(120),
            ..worker()
        };
        assert_eq!(longer.drain_deadline(), Duration::from_secs(113));
        longer.validate().unwrap();
        let too_long = WorkerConfig {
            drain_deadline: Some(Duration::from_secs(25)),
            ..worker()
        };
        let text = too_long.validate().unwrap_err().to_string();
        assert!(
            text.contains("25s of drain") && text.contains("at most 23s"),
            "{text}"
        );
        let short_visibility = WorkerConfig {
            visibility_timeout: Some(Duration::from_secs(5)),
            ..worker()
        };
        let text = short_visibility.validate().unwrap_err().to_string();
        assert!(text.contains("visibility_timeout"), "{text}");
    }

    #[test]
    fn lambda_timeout_must_stay_below_visibility() {
        let config = LambdaConfig {
            function_timeout: Duration::from_secs(60),
            queue_visibility_timeout: Duration::from_secs(30),
            ..LambdaConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert_eq!(error.problems[0].field, "function_timeout");
        assert!(error.to_string().contains("visibility timeout"));
    }

    #[test]
    fn config_files_reject_unknown_fields() {
        let parsed: Result<WorkerConfig, _> = serde_json::from_str(r#"{"max_inflight": 3}"#);
        assert!(parsed.unwrap_err().to_string().contains("unknown field"));
    }
}
