//! The outbox's simulation on its own, over more seeds than the full runs give it (each full seed runs
//! one outbox seed too). `OUTBOX_SEEDS=N` runs N seeds (default 400).

use conveyor_sim::outbox::simulate_outbox;

#[test]
fn the_outbox_keeps_its_invariants_over_many_seeds() {
    let seeds: u64 = conveyor_sim::seeds_from_env("OUTBOX_SEEDS", 400);
    let mut failed = Vec::new();
    let mut committed = 0;
    let mut accepted = 0;
    for (seed, report) in conveyor_sim::map_seeds(0..seeds, simulate_outbox) {
        committed += report.committed;
        accepted += report.accepted;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds: {committed} jobs committed, {accepted} sends accepted, {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?} (replay: cargo run -p conveyor-sim \
             --bin simulate -- --seed {seed} --trace)",
            failed.len()
        );
    }
}
