//! The worker's settings, validated at start-up with errors that say what to change.

use std::time::Duration;

use conveyor_core::RejectMode;
use conveyor_core::config::{ConfigError, Problems, millis, optional_seconds, seconds};
use conveyor_core::limits::{MAX_VISIBILITY_TIMEOUT, MAX_WAIT_TIME};
use conveyor_core::runtime;
use conveyor_core::runtime::TenantSettings;
use serde::{Deserialize, Serialize};

/// How a worker with several queues shares its capacity between them.
#[non_exhaustive]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, derive_setters::Setters)]
#[serde(deny_unknown_fields)]
#[setters(prefix = "with_")]
#[non_exhaustive]
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

impl QueueConfig {
    /// The queue at `url`, weight 1.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            weight: default_weight(),
        }
    }
}

/// The long-poll worker's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, derive_setters::Setters)]
#[serde(deny_unknown_fields, default)]
#[setters(prefix = "with_")]
#[non_exhaustive]
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
    /// default (`None`) what fits: the stop timeout minus [`runtime::SHUTDOWN_RESERVE`].
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
    /// Per-tenant limits and metrics (`[tenants]`; `CONVEYOR_TENANT_*`): see `NewJob::tenant`.
    pub tenants: TenantSettings,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            max_in_flight: 100,
            receive_wait: MAX_WAIT_TIME,
            visibility_timeout: None,
            max_processing_time: Duration::from_secs(2 * 3600),
            stop_timeout: Duration::from_secs(runtime::ECS_STOP_TIMEOUT_SECS),
            drain_deadline: None,
            delete_flush_interval: Duration::from_millis(50),
            priority: PriorityMode::default(),
            reject_mode: RejectMode::default(),
            listen_addr: Some("127.0.0.1:9090".to_owned()),
            stats_interval: Duration::from_secs(30),
            tenants: TenantSettings::default(),
        }
    }
}

impl WorkerConfig {
    /// The drain deadline in force: the configured one, or what fits in the stop timeout.
    pub fn drain_deadline(&self) -> Duration {
        self.drain_deadline
            .unwrap_or_else(|| self.stop_timeout.saturating_sub(runtime::SHUTDOWN_RESERVE))
    }

    /// Checks every setting; the error lists all problems with what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        problems.check(!self.queues.is_empty(), "queues", || {
            "no queue configured: set CONVEYOR_QUEUE_URL or add [[queues]] url = \"...\"".to_owned()
        });
        for (index, queue) in self.queues.iter().enumerate() {
            let field = format!("queues[{index}].url");
            problems.check(is_queue_url_or_name(&queue.url), &field, || {
                not_a_queue(&queue.url)
            });
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
                visibility >= runtime::MIN_VISIBILITY_TIMEOUT && visibility <= MAX_VISIBILITY_TIMEOUT;
            problems.check(visibility_ok, "visibility_timeout", || {
                format!(
                    "{visibility:?} is outside {:?}..=12 h: the heartbeat extends when half is left and \
                     needs that time to reach SQS; leave it unset to use each queue's own",
                    runtime::MIN_VISIBILITY_TIMEOUT
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
        let reserve = runtime::SHUTDOWN_RESERVE;
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
        if let Err(error) = self.tenants.limits().validate() {
            problems.check(false, "tenants", || error.to_string());
        }
        problems.finish()
    }
}

/// A queue URL (`http://` or `https://`, used as is) or a queue name (resolved with `GetQueueUrl` when
/// the worker connects).
fn is_queue_url_or_name(given: &str) -> bool {
    given.starts_with("http://") || given.starts_with("https://") || conveyor_sqs::admin::is_queue_name(given)
}

/// Why `given` is refused as a queue, with the forms that work and where a local queue's URL comes from.
fn not_a_queue(given: &str) -> String {
    format!(
        "{given:?} is neither a queue URL nor a queue name: a URL looks like \
         https://sqs.REGION.amazonaws.com/ACCOUNT_ID/NAME (LocalStack: \
         http://127.0.0.1:4566/queue/REGION/000000000000/NAME or http://127.0.0.1:4566/000000000000/NAME); a name \
         (letters, digits, - and _, at most 80 characters, .fifo for a FIFO queue) is looked up with GetQueueUrl in \
         the worker's region; `conveyor local init --queue NAME` creates a local queue and prints its URL"
    )
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
    }

    /// A queue name is taken (the worker resolves it with GetQueueUrl when it connects); a value that
    /// is neither a URL nor a name is refused with AWS's and LocalStack's URL forms and the local init.
    #[test]
    fn a_queue_name_is_taken_and_anything_else_is_refused_with_the_forms_that_work() {
        for name in ["jobs", "orders.fifo", "greetings_2-b"] {
            let config = WorkerConfig {
                queues: vec![QueueConfig::new(name)],
                ..worker()
            };
            config
                .validate()
                .unwrap_or_else(|error| panic!("{name}: {error}"));
        }
        let config = WorkerConfig {
            queues: vec![QueueConfig::new("jobs queue")],
            ..worker()
        };
        let error = config.validate().unwrap_err().to_string();
        for expected in [
            "\"jobs queue\" is neither a queue URL nor a queue name",
            "https://sqs.REGION.amazonaws.com/ACCOUNT_ID/NAME",
            "http://127.0.0.1:4566/queue/REGION/000000000000/NAME",
            "conveyor local init --queue NAME",
        ] {
            assert!(error.contains(expected), "{expected} missing: {error}");
        }
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
            config.drain_deadline() + runtime::SHUTDOWN_RESERVE,
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
    fn config_files_reject_unknown_fields() {
        let parsed: Result<WorkerConfig, _> = serde_json::from_str(r#"{"max_inflight": 3}"#);
        assert!(parsed.unwrap_err().to_string().contains("unknown field"));
    }
}
