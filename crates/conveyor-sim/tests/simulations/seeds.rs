//! The fixed set of seeds `cargo test` (and so `make test`) runs, and every seed that once failed.

use anyhow::{Result, bail};

/// Seeds `0..FIXED_SEEDS` run on every `make test` (`FIXED_SEEDS=N` runs N: `make check` runs fewer). Session
/// 28's 56 minutes were one seed (194) whose copies multiplied under a duplicate of every other delivery;
/// with duplicates at SQS-like rates the simulations binary takes about five minutes again.
const FIXED_SEEDS: u64 = 1500;

fn run_all(seeds: impl IntoIterator<Item = u64>) -> Result<()> {
    let mut failures = Vec::new();
    let mut count = 0;
    for (seed, report) in conveyor_sim::map_seeds(seeds, |seed| conveyor_sim::simulate(seed, false)) {
        count += 1;
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
    run_all(0..conveyor_sim::seeds_from_env("FIXED_SEEDS", FIXED_SEEDS))
}

#[test]
fn seeds_that_once_failed_keep_every_invariant() -> Result<()> {
    run_all(conveyor_sim::failed_seeds())
}

/// The skew model can fail: with clocks 30 s apart (fifteen times the runtimes' allowance, more than
/// half of any scenario's visibility timeout) claims are taken over from holders that still run, and
/// the checks must see it. If this passes no more, the simulator has stopped skewing clocks.
#[test]
fn clocks_far_past_the_allowance_break_the_invariants() {
    let broken = (0..200)
        .map(|seed| {
            conveyor_sim::Scenario::generate(seed).with_clock_skew(std::time::Duration::from_secs(30))
        })
        .filter(|scenario| !conveyor_sim::simulate_scenario(scenario, false).passed())
        .count();
    assert!(
        broken > 0,
        "no seed of 200 broke an invariant with clocks 30 s apart"
    );
}
