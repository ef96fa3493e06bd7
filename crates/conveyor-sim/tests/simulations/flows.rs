//! Flows' simulation on its own: `FLOW_SEEDS=N` runs N seeds (default 40; each is five virtual hours
//! of three workers).

use conveyor_sim::flows::simulate_flows;

#[test]
fn flows_keep_their_invariants_over_many_seeds() {
    let seeds: u64 = conveyor_sim::seeds_from_env("FLOW_SEEDS", 40);
    let first: u64 = conveyor_sim::seed_from_env("FLOW_FIRST_SEED").unwrap_or(0);
    let mut failed = Vec::new();
    let (mut flows, mut parents, mut overdue) = (0, 0, 0);
    for (seed, report) in conveyor_sim::map_seeds(first..first + seeds, simulate_flows) {
        flows += report.flows;
        parents += report.parent_runs;
        overdue += report.overdue;
        if !report.violations.is_empty() {
            eprintln!("seed {seed}: {:?}", report.violations);
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds: {flows} flows, {parents} parent runs, {overdue} swept past their deadline, {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?} (replay: FLOW_FIRST_SEED={seed} \
             FLOW_SEEDS=1 cargo test -p conveyor-sim --test simulations flows::)",
            failed.len()
        );
    }
}
