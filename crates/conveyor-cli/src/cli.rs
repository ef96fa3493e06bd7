//! The command line: global options and one subcommand per command group.

use clap::{Parser, Subcommand};

use crate::aws::{Aws, AwsArgs};
use crate::commands::console::ConsoleArgs;
use crate::commands::delays::DelaysArgs;
use crate::commands::dlq::DlqArgs;
use crate::commands::jobs::JobsArgs;
use crate::commands::local::LocalArgs;
use crate::commands::outbox::OutboxArgs;
use crate::commands::purge::PurgeArgs;
use crate::commands::schedules::SchedulesArgs;
use crate::commands::send::SendArgs;
use crate::commands::shell_docs::{CompletionsArgs, ManArgs};
use crate::commands::stats::StatsArgs;
use crate::lambda_runner::LambdaArgs;
use crate::output::{Color, Format};

/// Operate Conveyor's SQS queues: send jobs, read queue stats, inspect and redrive dead letters, purge.
///
/// AWS endpoints, region and credentials come from the standard AWS environment and profiles
/// (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_SQS, SSO, ...); `source localstack/env.sh` points
/// everything at LocalStack.
#[derive(Debug, Parser)]
#[command(name = "conveyor", version, propagate_version = false)]
pub(crate) struct Cli {
    /// Output format: aligned tables for people; tab-separated values (text) or JSON for scripts.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Colours in log lines: `auto` colours only when stderr is a terminal and NO_COLOR is not set;
    /// logs written to a file or a pipe carry no escape codes.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = Color::Auto)]
    pub color: Color,
    /// AWS settings.
    #[command(flatten)]
    pub aws: AwsArgs,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Send a job (from arguments) or jobs (from a JSON file) to a queue.
    Send(SendArgs),
    /// Show a queue's and its DLQ's depth: visible, in flight, delayed, oldest message.
    Stats(StatsArgs),
    /// Inspect and redrive the dead-letter queue.
    Dlq(DlqArgs),
    /// Delete every message of a queue (needs --yes-i-really-mean-it).
    Purge(PurgeArgs),
    /// Run a Lambda bootstrap locally behind an emulated SQS event source mapping.
    Lambda(LambdaArgs),
    /// Serve the web console: queues and DLQs live, dead letters (peek, filter, redrive, delete), jobs.
    Console(ConsoleArgs),
    /// Show, list and watch tracked jobs (status, attempts, last error, progress, output).
    Jobs(JobsArgs),
    /// Set up the local emulators: a queue with its DLQ and redrive policy, and the idempotency table.
    Local(LocalArgs),
    /// Export the application's schedules; list, pause, resume and trigger them.
    Schedules(SchedulesArgs),
    /// List, run now, reschedule and cancel the long-delayed jobs kept in the timer table.
    Delays(DelaysArgs),
    /// Relay the transactional outbox from its table's stream to SQS; count its backlog.
    Outbox(OutboxArgs),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Write the man pages (conveyor.1 and one per subcommand) into a directory.
    Man(ManArgs),
}

impl Command {
    /// Runs the commands that need no AWS configuration; `None` for the others.
    pub(crate) fn run_offline(&self) -> Option<anyhow::Result<()>> {
        match self {
            Command::Completions(args) => Some(crate::commands::shell_docs::completions(args)),
            Command::Man(args) => Some(crate::commands::shell_docs::man(args)),
            _ => None,
        }
    }

    /// Runs the command with the loaded AWS configuration.
    pub(crate) async fn run(&self, cli: &Cli, aws: &Aws) -> anyhow::Result<()> {
        let format = cli.output;
        let client = aws.sqs_client();
        match self {
            Command::Send(args) => crate::commands::send::run(args, aws, format).await,
            Command::Stats(args) => crate::commands::stats::run(args, client, format).await,
            Command::Dlq(args) => crate::commands::dlq::run(args, aws, format).await,
            Command::Purge(args) => crate::commands::purge::run(args, client, format).await,
            Command::Lambda(args) => crate::lambda_runner::run_command(args, client, format).await,
            Command::Local(args) => crate::commands::local::run(args, aws, format).await,
            Command::Schedules(args) => crate::commands::schedules::run(args, aws, format).await,
            Command::Console(args) => crate::commands::console::run(args, aws, format).await,
            Command::Jobs(args) => crate::commands::jobs::run(args, aws, format).await,
            Command::Delays(args) => crate::commands::delays::run(args, aws, format).await,
            Command::Outbox(args) => crate::commands::outbox::run(args, aws, format).await,
            Command::Completions(_) | Command::Man(_) => self.run_offline().unwrap_or(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    /// The names flags had before they were made consistent still parse, for one release.
    #[test]
    fn old_flag_names_are_hidden_aliases() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map_err(|error| error.to_string());
        let Command::Jobs(jobs) = parse(&["conveyor", "jobs", "show", "r-1", "--type", "report"])
            .unwrap()
            .command
        else {
            panic!("jobs");
        };
        let crate::commands::jobs::JobsCommand::Show(key) = &jobs.command else {
            panic!("jobs show");
        };
        assert_eq!(key.job_type.as_deref(), Some("report"));
        let Command::Dlq(dlq) = parse(&["conveyor", "dlq", "peek", "--queue-url", "q", "--max", "7"])
            .unwrap()
            .command
        else {
            panic!("dlq");
        };
        let crate::commands::dlq::DlqCommand::Peek(peek) = &dlq.command else {
            panic!("dlq peek");
        };
        assert_eq!(peek.limit, 7);
        let relay = parse(&[
            "conveyor",
            "outbox",
            "relay",
            "--lease-seconds",
            "5",
            "--progress-every",
            "2",
        ]);
        assert!(relay.is_ok(), "{relay:?}");
    }
}
