#![doc = include_str!("../README.md")]

pub mod definition;
pub mod export;
pub mod scheduler;
pub mod store;

pub use definition::{DefinitionError, JobTemplate, MissedTicks, Schedule, Timing, tick_key};
pub use export::{ExportError, export, load};
pub use scheduler::{Scheduler, SchedulerClock, SchedulerError, trigger};
pub use store::{ScheduleState, TickClaim, TickStore};
