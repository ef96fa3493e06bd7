//! The fixed set of seeds `cargo test` (and so `make test`) runs, and every seed that once failed.

use anyhow::{Result, bail};

/// Seeds `0..FIXED_SEEDS` run on every test run.
const FIXED_SEEDS: u64 = 1500;

fn run_all(seeds: impl IntoIterator<Item = u64>) -> Result<()> {
    let mut failures = Vec::new();
    let mut count = 0;
    for seed in seeds {
        count += 1;
        let report = conveyor_sim::simulate(seed, false);
        if !report.passed() {
            failures.push(format!(
                "seed {seed}:\n  {}\n  replay: {}",
                report.violations.join("\n  "),
                report.replay_command()
            ));
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {count} seeds failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

#[test]
fn the_fixed_seeds_keep_every_invariant() -> Result<()> {
    run_all(0..FIXED_SEEDS)
}

#[test]
fn seeds_that_once_failed_keep_every_invariant() -> Result<()> {
    run_all(conveyor_sim::failed_seeds())
}
