//! One module per command group.

pub(crate) mod console;
pub(crate) mod delays;
pub(crate) mod dlq;
pub(crate) mod dlq_delete;
pub(crate) mod jobs;
pub(crate) mod local;
pub(crate) mod outbox;
pub(crate) mod payloads;
pub(crate) mod purge;
pub(crate) mod schedules;
pub(crate) mod send;
pub(crate) mod shell_docs;
pub(crate) mod stats;
