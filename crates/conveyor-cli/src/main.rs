#![doc = include_str!("../README.md")]

mod aws;
mod cli;
mod commands;
mod errors;
mod lambda_runner;
mod output;
mod stdio;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return errors::report(&anyhow::Error::new(error).context("starting the async runtime"));
        }
    };
    let code = match runtime.block_on(cli.command.run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => errors::report(&error),
    };
    stdio::flush_stdout();
    match stdio::write_error() {
        Some(error) if code == ExitCode::SUCCESS => errors::report(&anyhow::anyhow!(error)),
        _ => code,
    }
}

/// Logs go to stderr, warnings and errors only unless RUST_LOG says otherwise. A failed write is dropped
/// silently (`log_internal_errors(false)`): reporting it would write to the same closed stderr.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
}
