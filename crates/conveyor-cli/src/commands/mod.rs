//! One module per command group.

pub mod dlq;
pub mod local;
pub mod purge;
pub mod send;
pub mod stats;
