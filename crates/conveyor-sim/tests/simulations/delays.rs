//! Long delays, cancel and large payloads on the real worker and Lambda batch processor, over many seeds. `DELAY_SEEDS=N` runs N seeds (default
//! 200).

use conveyor_sim::delays::simulate_delays;

#[test]
fn delays_and_cancel_keep_their_invariants_over_many_seeds() {
    let seeds: u64 = conveyor_sim::seeds_from_env("DELAY_SEEDS", 200);
    let first: u64 = conveyor_sim::seed_from_env("DELAY_FIRST_SEED").unwrap_or(0);
    let mut failed = Vec::new();
    let (mut jobs, mut sends, mut runs, mut cancelled, mut on_lambda) = (0, 0, 0, 0, 0);
    for (seed, report) in conveyor_sim::map_seeds(first..first + seeds, simulate_delays) {
        jobs += report.jobs;
        sends += report.sends;
        runs += report.runs;
        cancelled += report.cancelled;
        on_lambda += usize::from(report.lambda);
        if !report.violations.is_empty() {
            failed.push((seed, report.violations));
        }
    }
    println!(
        "{seeds} seeds ({on_lambda} on Lambda): {jobs} jobs ({cancelled} cancelled), {sends} sends (hops included), {runs} runs, {} seeds failed",
        failed.len()
    );
    if let Some((seed, violations)) = failed.first() {
        panic!(
            "{} of {seeds} seeds failed; the first, seed {seed}: {violations:?}",
            failed.len()
        );
    }
}
