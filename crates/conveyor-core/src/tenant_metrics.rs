//! Metrics by tenant with a bounded number of series.
//!
//! A queue may serve thousands of tenants; a label per tenant would make as many series in every
//! worker's `/metrics`. So at most `top` tenants get a label of their own, the heavy hitters: a
//! Space-Saving sketch (Metwally et al.) of `4 × top` counters follows the busiest tenants, and a
//! tenant whose count reaches `1 / (2 × top)` of the jobs seen (and at least 50 jobs) takes a free
//! label. A label, once given, is kept for the process's life (a series that came and went would be
//! cardinality too). Everyone else is `other`; jobs without a tenant are `none`. So there are at most
//! `top + 2` tenant series per metric.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::metric_names::{TENANT_DEFERRALS, TENANT_DWELL, TENANT_JOBS_STARTED};

/// The label of tenants without one of their own.
pub const OTHER: &str = "other";
/// The label of jobs without a tenant.
pub const NONE: &str = "none";
/// The fewest jobs before a tenant gets its own label.
const MIN_JOBS_FOR_A_LABEL: u64 = 50;

#[derive(Debug, Default)]
struct Sketch {
    counts: HashMap<String, u64>,
    seen: u64,
    labelled: HashSet<String>,
}

/// Per-tenant metrics with at most `top` tenants labelled by name.
#[derive(Debug)]
pub struct TenantMetrics {
    top: usize,
    sketch: Mutex<Sketch>,
}

impl TenantMetrics {
    /// Metrics that name at most `top` tenants (0: every tenant is `other`).
    pub fn new(top: usize) -> Self {
        Self {
            top,
            sketch: Mutex::new(Sketch::default()),
        }
    }

    /// The label to record one job of `tenant` under, counting it.
    pub fn label(&self, tenant: Option<&str>) -> String {
        let Some(tenant) = tenant else {
            return NONE.to_owned();
        };
        let mut sketch = self.sketch.lock().unwrap_or_else(PoisonError::into_inner);
        sketch.seen += 1;
        if sketch.labelled.contains(tenant) {
            return tenant.to_owned();
        }
        if self.top == 0 {
            return OTHER.to_owned();
        }
        let count = observe(&mut sketch.counts, tenant, self.top * 4);
        let share = sketch.seen / (2 * self.top as u64);
        if sketch.labelled.len() < self.top && count >= share.max(MIN_JOBS_FOR_A_LABEL) {
            sketch.labelled.insert(tenant.to_owned());
            return tenant.to_owned();
        }
        OTHER.to_owned()
    }

    /// The label `tenant`'s jobs are recorded under now, without counting a job: its own when it has
    /// one, else `other` (`none` without a tenant). For figures about jobs [`label`](Self::label)
    /// counted already (the Lambda adapter's per-tenant EMF documents). It runs for every record of a
    /// Lambda batch, so it allocates only for a labelled tenant.
    pub fn label_of(&self, tenant: Option<&str>) -> Cow<'static, str> {
        let Some(tenant) = tenant else {
            return Cow::Borrowed(NONE);
        };
        let sketch = self.sketch.lock().unwrap_or_else(PoisonError::into_inner);
        if sketch.labelled.contains(tenant) {
            Cow::Owned(tenant.to_owned())
        } else {
            Cow::Borrowed(OTHER)
        }
    }

    /// A job of `tenant` starts, `dwell` after it was first sent.
    pub fn started(&self, tenant: Option<&str>, dwell: Option<Duration>) {
        let label = self.label(tenant);
        if let Some(dwell) = dwell {
            metrics::histogram!(TENANT_DWELL, "tenant" => label.clone()).record(dwell.as_secs_f64());
        }
        metrics::counter!(TENANT_JOBS_STARTED, "tenant" => label).increment(1);
    }

    /// A job of `tenant` was deferred by its tenant's `limit`.
    pub fn deferred(&self, tenant: Option<&str>, limit: &'static str) {
        let label = self.label(tenant);
        metrics::counter!(TENANT_DEFERRALS, "tenant" => label, "limit" => limit).increment(1);
    }
}

/// Space-Saving: counts `tenant`, replacing the smallest counter when `capacity` are taken (the
/// newcomer inherits its count, an upper bound of its own); returns its count.
fn observe(counts: &mut HashMap<String, u64>, tenant: &str, capacity: usize) -> u64 {
    if let Some(count) = counts.get_mut(tenant) {
        *count += 1;
        return *count;
    }
    let mut inherited = 0;
    if counts.len() >= capacity
        && let Some((smallest, count)) = counts
            .iter()
            .min_by_key(|(_, count)| **count)
            .map(|(name, count)| (name.clone(), *count))
    {
        counts.remove(&smallest);
        inherited = count;
    }
    counts.insert(tenant.to_owned(), inherited + 1);
    inherited + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_tenants_get_labels_and_the_rest_are_other() {
        let metrics = TenantMetrics::new(3);
        let mut labels = HashSet::new();
        for round in 0..2_000 {
            labels.insert(metrics.label(Some("noisy")));
            labels.insert(metrics.label(Some("noisy")));
            labels.insert(metrics.label(Some("busy")));
            labels.insert(metrics.label(Some(&format!("quiet-{round}"))));
        }
        labels.insert(metrics.label(None));
        assert!(labels.contains("noisy") && labels.contains("busy"), "{labels:?}");
        assert!(labels.contains(OTHER) && labels.contains(NONE));
        assert_eq!(
            labels.len(),
            4,
            "the 2 heavy tenants + other + none, out of 2,002 tenants: {labels:?}"
        );
        assert_eq!(metrics.label(Some("quiet-1")), OTHER);
    }

    #[test]
    fn label_of_names_what_label_gave_without_counting() {
        let metrics = TenantMetrics::new(2);
        for _ in 0..MIN_JOBS_FOR_A_LABEL - 1 {
            assert_eq!(metrics.label(Some("busy")), OTHER);
        }
        // Asking does not count: however often, "busy" stays one job short of its label.
        for _ in 0..100 {
            assert_eq!(metrics.label_of(Some("busy")), OTHER);
        }
        assert_eq!(metrics.label(Some("busy")), "busy");
        assert_eq!(metrics.label_of(Some("busy")), "busy");
        assert_eq!(metrics.label_of(Some("unseen")), OTHER);
        assert_eq!(metrics.label_of(None), NONE);
    }

    #[test]
    fn no_labels_when_top_is_zero() {
        let metrics = TenantMetrics::new(0);
        assert!((0..100).all(|_| metrics.label(Some("noisy")) == OTHER));
    }
}
