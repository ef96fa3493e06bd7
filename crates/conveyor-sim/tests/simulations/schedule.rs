//! Schedules under faults (`conveyor_sim::schedule`): several workers with skewed clocks, kills,
//! stalls, pauses and resumes, `max_runs`, failed sends, store outages, a migration to EventBridge.
//! `SCHEDULE_SEEDS=N` runs N seeds (default 300); `SCHEDULE_SEED=S` runs one with its trace.

use conveyor_sim::schedule::simulate_schedule;

#[test]
fn schedules_keep_their_invariants_over_many_seeds() {
    if let Some(seed) = conveyor_sim::seed_from_env("SCHEDULE_SEED") {
        let report = simulate_schedule(seed);
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
    let seeds: u64 = conveyor_sim::seeds_from_env("SCHEDULE_SEEDS", 300);
    let mut failed = Vec::new();
    let (mut ticks, mut accepted, mut requests) = (0, 0, 0);
    for (seed, report) in conveyor_sim::map_seeds(0..seeds, simulate_schedule) {
        ticks += report.ticks;
        accepted += report.accepted;
        requests += report.store_requests;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds: {ticks} ticks sent, {accepted} sends accepted, {requests} store requests, {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?} (replay: SCHEDULE_SEED={seed} \
             cargo test -p conveyor-sim --test simulations schedule:: -- --nocapture)",
            failed.len()
        );
    }
}
