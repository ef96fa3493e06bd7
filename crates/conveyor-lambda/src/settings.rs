//! The Lambda adapter's settings, validated at start-up with errors that say what to change. The
//! queue's visibility timeout is not a setting: the adapter reads each source queue's own and checks it
//! against the invocation's time (`batch::visibility_advice`).

use std::time::Duration;

use conveyor_core::RejectMode;
use conveyor_core::config::{ConfigError, Problems, millis, seconds};
use conveyor_core::runtime::TenantSettings;
use serde::{Deserialize, Serialize};

/// The default [`LambdaConfig::fifo_last_receive_wait`]: a group's last receive comes 2.5 to 5 minutes after
/// the one before, past most store outages.
const FIFO_LAST_RECEIVE_WAIT: Duration = Duration::from_secs(5 * 60);

/// The Lambda adapter's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, derive_setters::Setters)]
#[serde(deny_unknown_fields, default)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct LambdaConfig {
    /// The function's timeout. Also the time each invocation gets when its deadline header cannot be
    /// Lambda's (already past, or beyond Lambda's 15 minutes: an emulator such as cargo lambda).
    #[serde(with = "seconds")]
    pub function_timeout: Duration,
    /// The least time kept after the handlers' cutoff for settling the batch (completions, DLQ sends,
    /// deferred copies): messages that cannot start before the deadline minus the reserve are deferred
    /// or reported as failures, and running handlers are told to stop then. The reserve is a tenth of
    /// the invocation's time when that is more.
    #[serde(with = "millis")]
    pub deadline_margin: Duration,
    /// Records of one batch processed at once (FIFO groups still run in order).
    pub batch_concurrency: usize,
    /// Records processed at once by the whole execution environment, across the invocations it runs
    /// concurrently on Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY`): one process-wide pool of
    /// record slots. `None` (the default): the invocations at once times `batch_concurrency`, capped at
    /// 100 per vCPU (never below either). Start-up refuses fewer slots than invocations (see
    /// `src/concurrency.rs`).
    pub process_concurrency: Option<usize>,
    /// Where permanent failures go.
    pub reject_mode: RejectMode,
    /// When every record of a batch failed, fail the invocation too (after settling every record), so
    /// Lambda's `Errors` metric and its alarms see the outage, as Powertools' `BatchProcessingError`
    /// does. Off by default: the event source mapping then retries the whole batch, including records
    /// that were dead-lettered or deferred (each settled once by its idempotency record).
    pub fail_invocation_when_all_fail: bool,
    /// What a failed record holds back on a FIFO queue.
    pub fifo_failure: FifoFailure,
    /// How long a FIFO message that could not run (its store unreachable, its key in progress
    /// elsewhere) waits before its group's *last* allowed receive (half to all of it, jittered). A FIFO
    /// message cannot be deferred with a copy, so each of its receives counts; earlier receives come back
    /// after the pipeline's short deferral, and the last one is saved for after the outage, so an outage
    /// shorter than this never dead-letters a group unrun.
    #[serde(with = "seconds")]
    pub fifo_last_receive_wait: Duration,
    /// Per-tenant limits and metrics (`NewJob::tenant`): a record whose tenant is at its limit in this
    /// execution environment is deferred unrun (`CONVEYOR_TENANT_*`, as the worker's).
    pub tenants: TenantSettings,
}

/// What a failed record holds back in a Lambda batch from a FIFO queue.
#[non_exhaustive]
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
            deadline_margin: Duration::from_millis(500),
            batch_concurrency: 10,
            process_concurrency: None,
            reject_mode: RejectMode::default(),
            fail_invocation_when_all_fail: false,
            fifo_failure: FifoFailure::default(),
            fifo_last_receive_wait: FIFO_LAST_RECEIVE_WAIT,
            tenants: TenantSettings::default(),
        }
    }
}

impl LambdaConfig {
    /// Checks every setting; the error lists all problems with what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
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
        if let Some(slots) = self.process_concurrency {
            problems.check((1..=10_000).contains(&slots), "process_concurrency", || {
                format!("{slots} is outside 1..=10000")
            });
        }
        if let Err(error) = self.tenants.limits().validate() {
            problems.check(false, "tenants", || error.to_string());
        }
        problems.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        LambdaConfig::default().validate().unwrap();
    }

    #[test]
    fn a_margin_that_leaves_no_time_is_refused() {
        let config = LambdaConfig::default()
            .with_function_timeout(Duration::from_secs(10))
            .with_deadline_margin(Duration::from_secs(10));
        let error = config.validate().unwrap_err();
        assert_eq!(error.problems[0].field, "deadline_margin");
        assert!(error.to_string().contains("leaves no time"), "{error}");
    }
}
