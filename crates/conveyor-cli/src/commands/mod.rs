//! One module per command group.

pub mod console;
pub mod dlq;
pub mod jobs;
pub mod local;
pub mod outbox;
pub mod payloads;
pub mod purge;
pub mod schedules;
pub mod send;
pub mod stats;
