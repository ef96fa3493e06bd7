//! `make chaos`: the example application's real binaries on LocalStack and DynamoDB Local while workers
//! are SIGKILLed and the emulators slowed down at random; exits non-zero unless every effect happened
//! once, the DLQ holds exactly the poison jobs with their reasons and the queue is empty.
//! See `conveyor_demo::chaos`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use conveyor_demo::Binaries;
use conveyor_demo::chaos::{self, ChaosConfig};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(about = "Chaos run: workers SIGKILLed and emulators slowed while the example jobs run")]
struct Args {
    /// Distinct jobs to send (10% are sent twice).
    #[arg(long, default_value_t = 10_000)]
    jobs: u32,
    /// Jobs sent per second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Mean seconds between SIGKILLs of a random worker (each gap 0.5x to 1.5x this).
    #[arg(long, default_value_t = 5.0)]
    kill_every: f64,
    /// Worker processes (the Lambda runner comes on top).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Seed of the job mix, the kills and the slowdowns (random when not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Do not slow the emulators down.
    #[arg(long)]
    no_slowdowns: bool,
    /// Where outboxes and logs go (default: .local/chaos/ in the repository).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let bin_dir = std::env::current_exe()?
        .parent()
        .context("the chaos binary has no folder")?
        .to_path_buf();
    let base = args.work_dir.unwrap_or_else(|| {
        conveyor_testing::localstack::repo_root()
            .join(".local")
            .join("chaos")
    });
    let config = ChaosConfig {
        jobs: args.jobs,
        rate: args.rate,
        kill_every: Duration::try_from_secs_f64(args.kill_every).context("--kill-every")?,
        workers: args.workers,
        seed,
        slowdowns: !args.no_slowdowns,
        binaries: Binaries::in_dir(bin_dir),
        work_dir: chaos::work_dir(&base, seed),
        settle_timeout: Duration::from_secs(300),
    };
    println!(
        "chaos run: {} jobs at {}/s, {} workers + the Lambda runner, a SIGKILL every ~{} s, seed {seed} (replay: --seed {seed})",
        config.jobs, config.rate, config.workers, args.kill_every
    );
    println!("logs and outboxes: {}", config.work_dir.display());
    let report = chaos::run(&config).await?;
    println!("{report}");
    if !report.problems.is_empty() {
        bail!(
            "the chaos run found {} problem(s) (seed {seed})",
            report.problems.len()
        );
    }
    Ok(())
}
