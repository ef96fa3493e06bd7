//! What the worker's start line says is on, beside its queues and limits: idempotency, tracking, the
//! timers relay, schedules, the outbox relay, the flows sweep, tenants and tracing. One line then tells a
//! reader what this worker will and will not do.

use conveyor_core::Pipeline;
use conveyor_core::runtime::{describe_store, describe_tenants, describe_tracking, on_off};

use crate::config::WorkerConfig;

/// The start line's words about what is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WhatIsOn {
    pub(crate) idempotency: String,
    pub(crate) tracking: String,
    pub(crate) timers_relay: &'static str,
    pub(crate) schedules: &'static str,
    pub(crate) outbox_relay: &'static str,
    pub(crate) flows_sweep: &'static str,
    pub(crate) tenants: String,
    pub(crate) tracing: String,
}

impl WhatIsOn {
    /// What is on for `pipeline` and `config`, with the background tasks named `tasks` (the timer relay
    /// not among them: the pipeline's timers say it).
    pub(crate) fn of(pipeline: &Pipeline, config: &WorkerConfig, tasks: &[&'static str]) -> Self {
        let running = |name: &str| tasks.contains(&name);
        let flows_sweep = match (pipeline.flows().is_some(), running("flow sweeper")) {
            (_, true) => "on",
            (false, false) => "off",
            (true, false) => {
                "off (flows are on: add conveyor::core::FlowSweeper with Worker::with_background_task, or sweep elsewhere)"
            }
        };
        Self {
            idempotency: describe_store(pipeline),
            tracking: describe_tracking(pipeline),
            timers_relay: on_off(pipeline.timers().is_some()),
            schedules: on_off(running("scheduler")),
            outbox_relay: on_off(running("outbox relay")),
            flows_sweep,
            tenants: describe_tenants(&config.tenants),
            tracing: tracing_export(),
        }
    }
}

/// Whether spans are exported over OTLP, and where.
fn tracing_export() -> String {
    #[cfg(feature = "otel")]
    return conveyor_otel::describe_export();
    #[cfg(not(feature = "otel"))]
    return "off (built without the otel feature)".to_owned();
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor_core::Router;

    #[test]
    fn a_bare_pipeline_says_everything_is_off() {
        let on = WhatIsOn::of(&Pipeline::new(Router::new()), &WorkerConfig::default(), &[]);
        assert_eq!(on.idempotency, "off");
        assert_eq!(
            (on.timers_relay, on.schedules, on.outbox_relay, on.flows_sweep),
            ("off", "off", "off", "off")
        );
        assert_eq!(on.tenants, "off");
        let on = WhatIsOn::of(
            &Pipeline::new(Router::new()),
            &WorkerConfig::default(),
            &["scheduler", "outbox relay"],
        );
        assert_eq!((on.schedules, on.outbox_relay), ("on", "on"));
    }
}
