#![doc = include_str!("../README.md")]

mod apply;
mod capacity;
pub mod config;
pub mod connect;
mod deleter;
mod entry;
mod error;
pub mod heartbeat;
mod job;
mod logging;
mod ops;
mod prometheus;
pub mod protect;
mod receiver;
mod report;
mod retry;
mod runtime;
mod settings;
mod signals;
mod start_line;
mod stats;
mod store_env;
pub mod telemetry;
mod worker;

pub use config::{load_config, load_config_with};
pub use entry::{Runner, run};
pub use error::WorkerError;
pub use logging::init_logging;
pub use ops::healthcheck;
pub use protect::BreakerSettings;
pub use report::{WorkerReport, WorkerStatus};
pub use worker::Worker;
