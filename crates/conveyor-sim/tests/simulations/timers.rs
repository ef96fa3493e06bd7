//! The timer table under faults (`conveyor_sim::timers`): relays with skewed clocks that crash after a
//! claim or a send, failed sends, lost replies, store outages; cancels, reschedules and run-nows.
//! `TIMER_SEEDS=N` runs N seeds (default 300); `TIMER_SEED=S` runs one with its trace.

use conveyor_sim::timers::simulate_timers;

#[test]
fn timers_keep_their_invariants_over_many_seeds() {
    if let Some(seed) = conveyor_sim::seed_from_env("TIMER_SEED") {
        let report = simulate_timers(seed);
        for line in &report.trace {
            println!("{line}");
        }
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        return;
    }
    let seeds: u64 = conveyor_sim::seeds_from_env("TIMER_SEEDS", 300);
    let mut failed = Vec::new();
    let (mut timers, mut copies, mut cancelled, mut requests) = (0, 0, 0, 0);
    for (seed, report) in conveyor_sim::map_seeds(0..seeds, simulate_timers) {
        timers += report.timers;
        copies += report.copies;
        cancelled += report.cancelled;
        requests += report.store_requests;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds: {timers} timers ({cancelled} cancelled in time), {copies} copies sent, {requests} store calls, \
         {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?} (replay: TIMER_SEED={seed} cargo test \
             -p conveyor-sim --test simulations timers:: -- --nocapture)",
            failed.len()
        );
    }
}
