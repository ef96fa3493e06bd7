#![doc = include_str!("../README.md")]

pub mod definition;
pub mod export;
mod lease;
pub mod memory;
pub mod scheduler;
pub mod store;

pub use definition::{DefinitionError, JobTemplate, MissedTicks, Schedule, Timing, tick_key};
pub use export::{ExportError, export, from_definition_json, load, to_definition_json};
pub use memory::MemoryScheduleStore;
pub use scheduler::{DEFAULT_SET, Scheduler, SchedulerClock, SchedulerError, TickSender, trigger};
pub use store::{Advance, HistoryEntry, LeaseRecord, ScheduleState, ScheduleStore, StoreError, TickStore};
