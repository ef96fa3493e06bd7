//! Per-tenant concurrency and rate limits, shared by the worker and the Lambda adapter.
//!
//! # Design note: deferring an over-limit tenant
//!
//! A job-type limit waits in flight for its slot: every job of the type is held back alike. A tenant
//! limit must not: a noisy tenant's jobs waiting in flight would hold the very slots the quiet tenants
//! need. So a job whose tenant is at its limit (as many of its jobs running in this process as allowed,
//! or its rate spent) goes back unrun as a deferred copy (`src/deferral.rs`): it does not spend a
//! receive, keeps its `MessageGroupId` (its tenant's share in a fair queue) and comes back after a short
//! jittered delay. A FIFO message cannot be copied without breaking its group's order, so it waits in
//! flight instead (the FIFO group is usually the tenant, which runs one job at a time anyway).
//!
//! The limits are per process: a worker counts its own running jobs, a Lambda invocation its own batch.
//! N workers allow a tenant N times its limit; size the limit for one process.
//!
//! Jobs without a tenant are not limited.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::backoff::added_jitter;
use crate::rate::TokenBucket;

/// The most times a tenant deferral doubles.
const MAX_DOUBLINGS: u32 = 5;
/// The longest tenant deferral.
const MAX_DEFERRAL: Duration = Duration::from_secs(300);
/// How many tenants' rate buckets are kept before the full (idle) ones are forgotten.
const MAX_BUCKETS: usize = 10_000;

/// One tenant's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct TenantLimit {
    /// At most this many of the tenant's jobs run at once in this process.
    pub max_concurrent: Option<usize>,
    /// At most this many of the tenant's jobs start a second (a token bucket), with this burst.
    pub per_second: Option<(f64, u32)>,
}

impl TenantLimit {
    /// A limit of `max` running jobs.
    pub fn concurrent(max: usize) -> Self {
        Self {
            max_concurrent: Some(max),
            per_second: None,
        }
    }

    /// The same limit with at most `max` running jobs, or none.
    pub fn with_max_concurrent(mut self, max: Option<usize>) -> Self {
        self.max_concurrent = max;
        self
    }

    /// The same limit with a rate of `per_second` starts and a burst of `burst`.
    pub fn with_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.per_second = Some((per_second, burst));
        self
    }

    fn is_none(&self) -> bool {
        self.max_concurrent.is_none() && self.per_second.is_none()
    }
}

/// The per-tenant limits of a runtime: one for every tenant, and overrides for named tenants.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TenantLimits {
    /// Every tenant's limit, unless overridden.
    pub default: TenantLimit,
    /// Named tenants' own limits.
    pub overrides: HashMap<String, TenantLimit>,
    /// How long an over-limit job is deferred (jittered up to twice this).
    pub defer_for: Duration,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            default: TenantLimit::default(),
            overrides: HashMap::new(),
            defer_for: Duration::from_secs(2),
        }
    }
}

/// Why a limit setting is refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TenantLimitError {
    /// A concurrency limit of 0 would never run the tenant's jobs.
    #[error("tenant limit{0}: a concurrency limit of 0 would never run the tenant's jobs; use 1 or more")]
    ZeroConcurrency(String),
    /// A rate that is not a positive number.
    #[error("tenant limit{0}: the rate must be a positive number of jobs a second, not {1}")]
    BadRate(String, f64),
    /// A deferral of zero would spin.
    #[error("tenant limits: the deferral must be at least 1 ms, so over-limit jobs do not spin")]
    ZeroDeferral,
}

impl TenantLimits {
    /// `default` for every tenant, deferring over-limit jobs by 2 s.
    pub fn new(default: TenantLimit) -> Self {
        Self {
            default,
            ..Self::default()
        }
    }

    /// The same limits with `tenant`'s own `limit`.
    pub fn with_override(mut self, tenant: impl Into<String>, limit: TenantLimit) -> Self {
        self.overrides.insert(tenant.into(), limit);
        self
    }

    /// The same limits deferring over-limit jobs by `defer_for` (jittered up to twice this).
    pub fn with_defer_for(mut self, defer_for: Duration) -> Self {
        self.defer_for = defer_for;
        self
    }

    /// True when no tenant is limited.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.overrides.values().all(TenantLimit::is_none)
    }

    /// Checks the settings: a clear error at start, never a limit that blocks a tenant forever.
    pub fn validate(&self) -> Result<(), TenantLimitError> {
        let named =
            |tenant: Option<&String>| tenant.map_or_else(String::new, |tenant| format!(" of {tenant:?}"));
        let all = std::iter::once((None, &self.default))
            .chain(self.overrides.iter().map(|(tenant, limit)| (Some(tenant), limit)));
        for (tenant, limit) in all {
            if limit.max_concurrent == Some(0) {
                return Err(TenantLimitError::ZeroConcurrency(named(tenant)));
            }
            if let Some((rate, _)) = limit.per_second
                && !(rate.is_finite() && rate > 0.0)
            {
                return Err(TenantLimitError::BadRate(named(tenant), rate));
            }
        }
        if self.defer_for.is_zero() {
            return Err(TenantLimitError::ZeroDeferral);
        }
        Ok(())
    }

    fn limit(&self, tenant: &str) -> TenantLimit {
        self.overrides.get(tenant).copied().unwrap_or(self.default)
    }
}

/// The per-tenant settings of a runtime's configuration (the worker's `[tenants]` table and
/// `CONVEYOR_TENANT_*` variables, the Lambda adapter's `CONVEYOR_TENANT_*` variables).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TenantSettings {
    /// At most this many jobs of one tenant run at once in this process; none: no limit.
    pub max_concurrent: Option<usize>,
    /// At most this many jobs of one tenant start a second in this process; none: no limit.
    pub per_second: Option<f64>,
    /// The burst of `per_second`.
    pub burst: u32,
    /// How long a job over its tenant's limit is deferred (jittered up to twice this).
    #[serde(with = "crate::config::millis")]
    pub defer: Duration,
    /// How many tenants the per-tenant metrics name (the rest are `other`).
    pub metrics_top: usize,
    /// Named tenants' own limits (`[tenants.overrides.acme] max_concurrent = 20`).
    pub overrides: BTreeMap<String, TenantOverride>,
}

/// One named tenant's own limits in [`TenantSettings`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TenantOverride {
    /// At most this many of its jobs at once.
    pub max_concurrent: Option<usize>,
    /// At most this many of its jobs start a second.
    pub per_second: Option<f64>,
    /// The burst of `per_second` (default: the settings' `burst`).
    pub burst: Option<u32>,
}

/// The default number of tenants the per-tenant metrics name.
pub(crate) const DEFAULT_METRICS_TOP: usize = 20;

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            per_second: None,
            burst: 10,
            defer: Duration::from_secs(2),
            metrics_top: DEFAULT_METRICS_TOP,
            overrides: BTreeMap::new(),
        }
    }
}

impl TenantSettings {
    /// The limits these settings describe.
    pub fn limits(&self) -> TenantLimits {
        let limit = |max: Option<usize>, per_second: Option<f64>, burst: u32| {
            let limit = TenantLimit::default().with_max_concurrent(max);
            match per_second {
                Some(rate) => limit.with_rate(rate, burst),
                None => limit,
            }
        };
        let default = limit(self.max_concurrent, self.per_second, self.burst);
        self.overrides
            .iter()
            .fold(TenantLimits::new(default), |limits, (tenant, own)| {
                let burst = own.burst.unwrap_or(self.burst);
                limits.with_override(tenant.clone(), limit(own.max_concurrent, own.per_second, burst))
            })
            .with_defer_for(self.defer)
    }
}

/// What the limits say about a job of a tenant (two answers, and no third to come: not
/// `non_exhaustive`, so runtimes match both).
#[derive(Debug)]
pub enum TenantAdmission {
    /// Run it; the slot is held until dropped.
    Run(TenantSlot),
    /// Do not run it now: defer it by `delay`.
    Defer {
        /// How long to defer it.
        delay: Duration,
        /// Which limit: `concurrency` or `rate`.
        limit: &'static str,
    },
}

/// A running job's place in its tenant's concurrency count; freed on drop.
#[derive(Debug)]
pub struct TenantSlot {
    guards: Option<(Arc<TenantGuards>, String)>,
}

impl TenantSlot {
    /// A slot that counts nothing (no tenant, or no limit).
    pub fn unlimited() -> Self {
        Self { guards: None }
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        if let Some((guards, tenant)) = self.guards.take() {
            guards.release(&tenant);
        }
    }
}

#[derive(Debug, Default)]
struct State {
    running: HashMap<String, usize>,
    buckets: HashMap<String, Arc<TokenBucket>>,
}

/// The live per-tenant limits of one process.
#[derive(Debug, Default)]
pub struct TenantGuards {
    limits: TenantLimits,
    state: Mutex<State>,
}

impl TenantGuards {
    /// The guards for `limits` (validate them first).
    pub fn new(limits: TenantLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    /// True when no tenant is limited (the hot path skips the lookups).
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many of `tenant`'s jobs hold a slot now.
    pub fn running(&self, tenant: &str) -> usize {
        self.lock().running.get(tenant).copied().unwrap_or(0)
    }

    /// Asks to start a job of `tenant` now: a slot, or how long to defer it.
    pub fn admit(self: &Arc<Self>, tenant: Option<&str>) -> TenantAdmission {
        self.admit_after(tenant, 0)
    }

    /// [`TenantGuards::admit`] for a job deferred `deferrals` times before: each deferral doubles the
    /// window the next is drawn from (up to 32 times `defer_for`, at most 5 minutes), so a tenant's
    /// backlog far over its limit spreads out instead of coming round every `defer_for`, each time a
    /// send and a delete.
    pub fn admit_after(self: &Arc<Self>, tenant: Option<&str>, deferrals: u32) -> TenantAdmission {
        let Some(tenant) = tenant.filter(|_| !self.is_empty()) else {
            return TenantAdmission::Run(TenantSlot::unlimited());
        };
        let limit = self.limits.limit(tenant);
        let mut state = self.lock();
        let running = state.running.get(tenant).copied().unwrap_or(0);
        if limit.max_concurrent.is_some_and(|max| running >= max) {
            return self.defer(Duration::ZERO, deferrals, "concurrency");
        }
        if let Some((per_second, burst)) = limit.per_second {
            let bucket = bucket(&mut state.buckets, tenant, per_second, burst);
            let wait = bucket.reserve();
            if !wait.is_zero() {
                bucket.give_back();
                return self.defer(wait, deferrals, "rate");
            }
        }
        if limit.max_concurrent.is_none() {
            return TenantAdmission::Run(TenantSlot::unlimited());
        }
        *state.running.entry(tenant.to_owned()).or_insert(0) += 1;
        TenantAdmission::Run(TenantSlot {
            guards: Some((Arc::clone(self), tenant.to_owned())),
        })
    }

    /// The deferral: at least `wait` (a rate's) and `defer_for`, plus a jitter over the doubled
    /// window. Spread over the whole window, not around its end: a backlog deferred together would
    /// otherwise come back together, fill the tenant's slots in an instant and be deferred again, all
    /// but a few of it, at every round.
    fn defer(&self, wait: Duration, deferrals: u32, limit: &'static str) -> TenantAdmission {
        let base = self.limits.defer_for;
        let window = base
            .saturating_mul(1 << deferrals.min(MAX_DOUBLINGS))
            .min(MAX_DEFERRAL);
        TenantAdmission::Defer {
            delay: added_jitter(wait.max(base), window).min(MAX_DEFERRAL),
            limit,
        }
    }

    fn release(&self, tenant: &str) {
        let mut state = self.lock();
        let Some(count) = state.running.get_mut(tenant) else {
            return;
        };
        *count = count.saturating_sub(1);
        if *count == 0 {
            state.running.remove(tenant);
        }
    }
}

/// `tenant`'s rate bucket, created on first use; past [`MAX_BUCKETS`] the full ones are forgotten.
fn bucket(
    buckets: &mut HashMap<String, Arc<TokenBucket>>,
    tenant: &str,
    per_second: f64,
    burst: u32,
) -> Arc<TokenBucket> {
    if let Some(bucket) = buckets.get(tenant) {
        return Arc::clone(bucket);
    }
    if buckets.len() >= MAX_BUCKETS {
        buckets.retain(|_, bucket| !bucket.is_full());
    }
    let bucket = Arc::new(TokenBucket::new(per_second, burst));
    buckets.insert(tenant.to_owned(), Arc::clone(&bucket));
    bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(default: TenantLimit) -> TenantLimits {
        TenantLimits {
            default,
            overrides: HashMap::from([("vip".to_owned(), TenantLimit::concurrent(3))]),
            ..TenantLimits::default()
        }
    }

    #[test]
    fn a_tenant_at_its_limit_is_deferred_and_its_slot_comes_back() {
        let guards = TenantGuards::new(limits(TenantLimit::concurrent(1)));
        let TenantAdmission::Run(first) = guards.admit(Some("acme")) else {
            panic!("the first runs")
        };
        let TenantAdmission::Defer { delay, limit } = guards.admit(Some("acme")) else {
            panic!("the second is over the limit")
        };
        assert_eq!(limit, "concurrency");
        assert!(
            (Duration::from_secs(2)..=Duration::from_secs(4)).contains(&delay),
            "{delay:?}"
        );
        assert!(
            matches!(guards.admit(Some("globex")), TenantAdmission::Run(_)),
            "other tenants run"
        );
        assert!(
            matches!(guards.admit(None), TenantAdmission::Run(_)),
            "no tenant, no limit"
        );
        let vip: Vec<_> = (0..3).map(|_| guards.admit(Some("vip"))).collect();
        assert!(
            vip.iter()
                .all(|admission| matches!(admission, TenantAdmission::Run(_))),
            "an override"
        );
        assert!(matches!(guards.admit(Some("vip")), TenantAdmission::Defer { .. }));
        assert_eq!(guards.running("acme"), 1);
        drop(first);
        assert_eq!(guards.running("acme"), 0);
        assert!(matches!(guards.admit(Some("acme")), TenantAdmission::Run(_)));
    }

    #[test]
    fn each_deferral_doubles_the_next_up_to_a_cap() {
        let guards = TenantGuards::new(limits(TenantLimit::concurrent(1)));
        let _running = guards.admit(Some("acme"));
        let delay = |deferrals| match guards.admit_after(Some("acme"), deferrals) {
            TenantAdmission::Defer { delay, .. } => delay,
            TenantAdmission::Run(_) => panic!("over the limit"),
        };
        assert!((Duration::from_secs(2)..=Duration::from_secs(4)).contains(&delay(0)));
        let third: Vec<Duration> = (0..200).map(|_| delay(3)).collect();
        let (low, high) = (Duration::from_secs(2), Duration::from_secs(18));
        assert!(third.iter().all(|delay| (low..=high).contains(delay)));
        assert!(
            third.iter().any(|delay| *delay < Duration::from_secs(6))
                && third.iter().any(|delay| *delay > Duration::from_secs(14)),
            "spread over the whole doubled window: {third:?}"
        );
        let ninth: Vec<Duration> = (0..200).map(|_| delay(9)).collect();
        assert!(
            ninth.iter().all(|delay| *delay <= Duration::from_secs(66)),
            "at most 32 × 2 s after the base"
        );
        assert!(ninth.iter().any(|delay| *delay > Duration::from_secs(50)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_over_its_rate_is_deferred_for_the_wait() {
        let guards = TenantGuards::new(limits(TenantLimit::default().with_rate(0.5, 1)));
        assert!(matches!(guards.admit(Some("acme")), TenantAdmission::Run(_)));
        let TenantAdmission::Defer { delay, limit } = guards.admit(Some("acme")) else {
            panic!("the burst is spent")
        };
        assert_eq!(limit, "rate");
        assert!(delay >= Duration::from_secs(2), "{delay:?}");
        assert!(matches!(guards.admit(Some("globex")), TenantAdmission::Run(_)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(
            matches!(guards.admit(Some("acme")), TenantAdmission::Run(_)),
            "refilled"
        );
    }

    #[test]
    fn settings_mistakes_are_named() {
        assert!(TenantLimits::default().is_empty());
        assert_eq!(TenantLimits::default().validate(), Ok(()));
        let zero = limits(TenantLimit::concurrent(0)).validate().unwrap_err();
        assert_eq!(zero, TenantLimitError::ZeroConcurrency(String::new()));
        let mut bad = limits(TenantLimit::default());
        bad.overrides
            .insert("acme".into(), TenantLimit::default().with_rate(-1.0, 1));
        assert!(bad.validate().unwrap_err().to_string().contains("\"acme\""));
    }
}
