//! How many records one execution environment runs at once, across its concurrent invocations.
//!
//! # Design note: two limits, one process
//!
//! On Lambda Managed Instances one process serves up to `AWS_LAMBDA_MAX_CONCURRENCY` invocations at
//! once (`lambda_runtime::run_concurrent`), and each invocation runs up to
//! [`LambdaConfig::batch_concurrency`] of its records at once. Unbounded, that is N × B handlers in one
//! process (64 invocations of batches of 10: 640), each with its own connections, buffers and memory.
//! So the process also holds one semaphore of *record slots*, shared by every invocation:
//!
//! - its size is [`LambdaConfig::process_concurrency`] (`CONVEYOR_PROCESS_CONCURRENCY`), by default
//!   N × B capped at 100 per vCPU of the environment (the long-poll worker's default `max_in_flight` for
//!   each vCPU), and never below B or N: at AWS's default for Rust (8 invocations per vCPU) and the
//!   default B of 10 nothing waits, every invocation runs its batch as on classic Lambda; a function
//!   configured for many more invocations per environment (up to 1,600) is held to the cap instead of
//!   thousands of handlers; a lone invocation still runs B records at once, and N invocations in flight
//!   each get at least one slot, so none can be starved by the others for its whole time;
//! - a record takes a slot just before it runs (claim, handler, completion) and gives it back before
//!   its settlement's SQS calls, and while a FIFO record waits in the invocation between tries;
//! - a record waits for a slot at most until its own invocation's cutoff: past that it is not started
//!   and is deferred or listed like any record that found no time, so one busy invocation never cuts
//!   into another's deadline, it only delays the start of its records;
//! - tokio's semaphore is fair (first come, first served), so a burst of one invocation cannot starve
//!   a record of another that asked before it.
//!
//! A size below N is refused at start-up: with N invocations in flight some could wait for a slot
//! until their deadline. A size above N × B is allowed and never reached.
//!
//! Everything else shared by the invocations of one process is shared on purpose and safe under
//! concurrency: the pipeline (router, handlers, idempotency store client, payload store), the SQS
//! client and the resolved queues (`SqsQueues`' cache), the per-tenant limits and metrics (`Tenants`:
//! a tenant's limit is per execution environment), the store's health flag, the once-per-queue
//! visibility check, and the once-per-environment warning about an emulator's deadline header. Nothing
//! per invocation (deadline, budget, request id, X-Ray trace header) lives in a `static`, a
//! process-wide variable or the environment: it travels with the invocation's `Context` into its span
//! and its `Invocation` limits.

use conveyor_core::config::{ConfigError, Problems};

use crate::LambdaConfig;
use crate::error::LambdaError;

/// `AWS_LAMBDA_MAX_CONCURRENCY`: the invocations Lambda sends one execution environment at once (set on
/// Lambda Managed Instances from the function's `PerExecutionEnvironmentMaxConcurrency`; unset on
/// classic Lambda, where an environment runs one invocation at a time).
pub const MAX_CONCURRENCY_ENV: &str = "AWS_LAMBDA_MAX_CONCURRENCY";

/// The most record slots a process may have.
const MAX_PROCESS_CONCURRENCY: usize = 10_000;
/// The default's cap: record slots per vCPU (the long-poll worker's default `max_in_flight`, per vCPU).
const DEFAULT_SLOTS_PER_VCPU: usize = 100;

/// The vCPUs this process may use (its cgroup's quota included); 1 when unknown.
pub(crate) fn vcpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The invocations one execution environment runs at once: `AWS_LAMBDA_MAX_CONCURRENCY` (read from
/// `var`), 1 when unset. A value that is not a positive integer is an error that names it (the Rust
/// runtime would silently run one invocation at a time).
pub(crate) fn invocations_at_once(var: impl Fn(&str) -> Option<String>) -> Result<usize, LambdaError> {
    let Some(value) = var(MAX_CONCURRENCY_ENV) else {
        return Ok(1);
    };
    match value.trim().parse::<u32>() {
        Ok(count) if count > 0 => Ok(count as usize),
        _ => Err(LambdaError::Environment {
            name: MAX_CONCURRENCY_ENV,
            value,
            problem: "expected a positive integer (Lambda sets it from the function's \
                      PerExecutionEnvironmentMaxConcurrency; leave it unset to run one invocation at a time)"
                .to_owned(),
        }),
    }
}

/// The record slots of a process serving `invocations` at once on `vcpus` with `config`: the configured
/// [`LambdaConfig::process_concurrency`], else `invocations` × `batch_concurrency` capped at 100 per
/// vCPU, never below either (see the module's design note). Refused when below `invocations` or
/// outside 1..=10000.
pub(crate) fn record_slots(
    config: &LambdaConfig,
    invocations: usize,
    vcpus: usize,
) -> Result<usize, ConfigError> {
    let batch = config.batch_concurrency;
    let slots = config.process_concurrency.unwrap_or_else(|| {
        let cap = (DEFAULT_SLOTS_PER_VCPU * vcpus).max(batch).max(invocations);
        invocations
            .saturating_mul(batch)
            .min(cap)
            .min(MAX_PROCESS_CONCURRENCY)
    });
    let mut problems = Problems::default();
    problems.check(
        (1..=MAX_PROCESS_CONCURRENCY).contains(&slots),
        "process_concurrency",
        || format!("{slots} is outside 1..={MAX_PROCESS_CONCURRENCY}"),
    );
    problems.check(slots >= invocations, "process_concurrency", || {
        format!(
            "{slots} record slots for {invocations} concurrent invocations ({MAX_CONCURRENCY_ENV}): some \
             invocations could wait for a slot until their deadline; set CONVEYOR_PROCESS_CONCURRENCY to at \
             least {invocations}, or lower the function's PerExecutionEnvironmentMaxConcurrency"
        )
    });
    problems.finish()?;
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(value: Option<&str>) -> impl Fn(&str) -> Option<String> {
        let value = value.map(str::to_owned);
        move |name| (name == MAX_CONCURRENCY_ENV).then(|| value.clone()).flatten()
    }

    #[test]
    fn the_invocations_at_once_come_from_lambdas_variable() {
        assert_eq!(invocations_at_once(var(None)).unwrap(), 1);
        assert_eq!(invocations_at_once(var(Some("64"))).unwrap(), 64);
        for bad in ["0", "-1", "many", ""] {
            let error = invocations_at_once(var(Some(bad))).unwrap_err().to_string();
            assert!(
                error.contains(MAX_CONCURRENCY_ENV) && error.contains("positive integer"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn the_default_slots_are_every_batch_capped_per_vcpu_and_fewer_than_the_invocations_are_refused() {
        let config = LambdaConfig::default().with_batch_concurrency(10);
        // Classic Lambda: one invocation, its batch concurrency.
        assert_eq!(record_slots(&config, 1, 2).unwrap(), 10);
        // AWS's default for Rust, 8 invocations per vCPU: every batch at full speed.
        assert_eq!(record_slots(&config, 16, 2).unwrap(), 160);
        // Many more invocations per environment: 100 per vCPU, but never fewer than the invocations.
        assert_eq!(record_slots(&config, 64, 2).unwrap(), 200);
        assert_eq!(record_slots(&config, 400, 2).unwrap(), 400);
        assert_eq!(record_slots(&config, 1600, 1000).unwrap(), 10_000);
        let set = config.clone().with_process_concurrency(Some(16));
        assert_eq!(record_slots(&set, 4, 2).unwrap(), 16);
        let error = record_slots(&set, 32, 2).unwrap_err().to_string();
        assert!(
            error.contains("process_concurrency") && error.contains("at least 32"),
            "{error}"
        );
        let zero = config.with_process_concurrency(Some(0));
        assert!(
            record_slots(&zero, 1, 2)
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
    }
}
