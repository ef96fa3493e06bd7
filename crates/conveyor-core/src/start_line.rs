//! The words of a runtime's start line: what is on, so one line says what the worker (or the Lambda
//! function, at its first invocation) will and will not do. The runtimes add what only they know
//! (queues, background tasks, tracing) and log the line themselves.

use crate::Pipeline;
use crate::tenant_limits::TenantSettings;

/// The pipeline's idempotency: `table NAME`, `on (a store without a table)`, or `off`.
pub fn describe_store(pipeline: &Pipeline) -> String {
    match pipeline.store() {
        None => "off".to_owned(),
        Some(store) => match store.table() {
            Some(table) => format!("table {table}"),
            None => "on (a store without a table)".to_owned(),
        },
    }
}

/// The job types whose status is tracked (`HandlerSettings::tracked`), comma-separated, or `off`
/// (and why, when handlers ask for it without a store).
pub fn describe_tracking(pipeline: &Pipeline) -> String {
    let tracked: Vec<&str> = pipeline
        .router()
        .settings()
        .into_iter()
        .filter(|(_, settings)| settings.tracked)
        .map(|(job_type, _)| job_type)
        .collect();
    match (tracked.is_empty(), pipeline.store().is_some()) {
        (true, _) => "off".to_owned(),
        (false, true) => tracked.join(","),
        (false, false) => format!("off (no idempotency store; tracked: {})", tracked.join(",")),
    }
}

/// The per-tenant limits: `max_concurrent=N per_second=R` (and `overrides=N`), or `off`.
pub fn describe_tenants(tenants: &TenantSettings) -> String {
    let mut parts = Vec::new();
    if let Some(max) = tenants.max_concurrent {
        parts.push(format!("max_concurrent={max}"));
    }
    if let Some(rate) = tenants.per_second {
        parts.push(format!("per_second={rate}"));
    }
    if !tenants.overrides.is_empty() {
        parts.push(format!("overrides={}", tenants.overrides.len()));
    }
    if parts.is_empty() {
        return "off".to_owned();
    }
    parts.join(" ")
}

/// `on` or `off`.
pub fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Router;
    use crate::store_env::tests::OnTable;

    #[test]
    fn the_start_line_names_the_table_and_the_limits() {
        assert_eq!(describe_store(&Pipeline::new(Router::new())), "off");
        let on_jobs = Pipeline::new(Router::new()).with_store(Arc::new(OnTable(Some("jobs"))));
        assert_eq!(describe_store(&on_jobs), "table jobs");
        let in_memory = Pipeline::new(Router::new()).with_store(Arc::new(OnTable(None)));
        assert_eq!(describe_store(&in_memory), "on (a store without a table)");
        assert_eq!(describe_tracking(&on_jobs), "off");
        let mut tenants = TenantSettings::default();
        assert_eq!(describe_tenants(&tenants), "off");
        tenants.max_concurrent = Some(4);
        tenants.per_second = Some(2.5);
        assert_eq!(describe_tenants(&tenants), "max_concurrent=4 per_second=2.5");
    }
}
