//! Tenants and per-tenant limits on the real workers and Lambda batch processors, over many seeds
//! (see `src/tenants.rs` for the invariants). `TENANT_SEEDS=N` runs N seeds (default 200);
//! `TENANT_FIRST_SEED=S` starts at S.

use conveyor_sim::tenants::simulate_tenants;

#[test]
fn tenant_limits_keep_their_invariants_over_many_seeds() {
    let seeds: u64 = conveyor_sim::seeds_from_env("TENANT_SEEDS", 200);
    let first: u64 = conveyor_sim::seed_from_env("TENANT_FIRST_SEED").unwrap_or(0);
    let mut failed = Vec::new();
    let (mut jobs, mut runs, mut copies) = (0, 0, 0);
    for (seed, report) in conveyor_sim::map_seeds(first..first + seeds, simulate_tenants) {
        jobs += report.jobs;
        runs += report.runs;
        copies += report.copies;
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds: {jobs} jobs, {runs} runs, {copies} deferred copies, {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?}",
            failed.len()
        );
    }
}
