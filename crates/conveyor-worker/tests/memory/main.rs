//! The worker on the in-memory queue and store, one test binary (no AWS needed): the receive loop,
//! retries and budgets, flows, large payloads, readiness and the operations endpoint.

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod budgets;
mod memory;
mod memory_flows;
mod ops;
mod payloads;
mod readiness;
mod tenants;
