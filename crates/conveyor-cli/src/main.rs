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
    init_tracing(cli.color.enabled());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return errors::report(
                &anyhow::Error::new(error).context("starting the async runtime"),
                None,
            );
        }
    };
    let code = runtime.block_on(async {
        if let Some(result) = cli.command.run_offline() {
            return match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => errors::report(&error, None),
            };
        }
        let aws = match cli.aws.load().await {
            Ok(aws) => aws,
            Err(error) => return errors::report(&anyhow::Error::new(error), None),
        };
        match cli.command.run(&cli, &aws).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => errors::report(&error, Some(&aws)),
        }
    });
    stdio::flush_stdout();
    match stdio::write_error() {
        Some(error) if code == ExitCode::SUCCESS => errors::report(&anyhow::anyhow!(error), None),
        _ => code,
    }
}

/// Logs go to stderr, warnings and errors only unless RUST_LOG says otherwise. `aws_config`'s warnings
/// are off by default: they are its probes of the EC2 instance metadata service for a region or
/// credentials, which fail on every machine that is not an EC2 instance; a missing region or missing
/// credentials is reported once, with its fix, by `AwsArgs::load`. A failed write is dropped silently
/// (`log_internal_errors(false)`): reporting it would write to the same closed stderr.
/// A `RUST_LOG` that does not parse is said once, not silently replaced by the default. Colours only
/// when `ansi` (`--color`; by default only on a terminal), so logs in a file or a pipe stay plain text.
fn init_tracing(ansi: bool) {
    let default = || EnvFilter::new("warn,aws_config=error");
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(&directives).unwrap_or_else(|error| {
            crate::errln!(
                "warning: RUST_LOG={directives:?} is not a valid filter ({error}); logging warnings only. \
                 Examples: RUST_LOG=info, RUST_LOG=conveyor_sqs=debug"
            );
            default()
        }),
        _ => default(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .try_init();
}
