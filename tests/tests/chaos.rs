//! The chaos run, short: the example application's real `worker` processes and the Lambda runner on
//! LocalStack and DynamoDB Local, while workers are SIGKILLed every few seconds and the emulators are
//! slowed down at random (through delay proxies). `make chaos` runs the long version (10,000 jobs).
//!
//! Every effect once (a repeat only when a SIGKILL landed between the effect and its settling, by the
//! very process for outbox effects), the DLQ holds exactly the poison jobs with their reasons, the
//! queue is empty, and every process the run started is stopped. See `conveyor_demo::chaos`.

use std::time::Duration;

use conveyor_demo::chaos::{self, ChaosConfig};
use conveyor_e2e::binaries;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_jobs_survive_kills_and_slowdowns_with_each_effect_once() -> anyhow::Result<()> {
    let seed = std::env::var("CONVEYOR_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let config = ChaosConfig {
        jobs: 600,
        rate: 40,
        kill_every: Duration::from_secs(3),
        workers: 3,
        seed,
        slowdowns: true,
        binaries: binaries(),
        work_dir: chaos::work_dir(&std::env::temp_dir(), seed),
        settle_timeout: Duration::from_secs(120),
    };
    let report = chaos::run(&config).await?;
    println!("seed {seed} (replay: CONVEYOR_CHAOS_SEED={seed})\n{report}");
    assert!(
        report.kills >= 3,
        "the run killed only {} worker(s)",
        report.kills
    );
    assert!(
        report.delayed_requests.values().sum::<u64>() > 0,
        "no request was slowed down"
    );
    assert!(report.poison > 0 && report.long_jobs > 0, "{report}");
    assert!(
        report.problems.is_empty(),
        "seed {seed} (replay: CONVEYOR_CHAOS_SEED={seed}):\n{report}"
    );
    // Reached only when the run passed: a failed run keeps its work directory for the logs.
    let _ = std::fs::remove_dir_all(&config.work_dir);
    Ok(())
}
