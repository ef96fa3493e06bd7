//! The in-memory doubles and the pipeline on them, one test binary (no AWS needed): the doubles'
//! conformance and their broken twins, the pipeline, large payloads, timers and job tracking.

mod broken_doubles;
mod memory_conformance;
mod payload_pipeline;
mod pipeline;
mod timers;
mod tracking;
