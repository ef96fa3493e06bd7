#![doc = include_str!("../README.md")]

pub mod check;
pub mod clock;
pub mod delays;
pub mod dwell;
pub mod flows;
pub mod handler;
pub mod io;
pub mod lambda;
pub mod outbox;
pub mod run;
pub mod scenario;
pub mod schedule;
pub mod sink;
pub mod tenants;
pub mod timers;
pub mod trace;

use std::time::Duration;

pub use scenario::Scenario;

/// Runs `run` on every seed of `seeds` on as many threads as the machine has cores and returns the
/// results in seed order. Each seed is a whole simulation of its own (its own virtual clock and
/// runtime), so the results are the same as one after another; only the wall time shrinks.
pub fn map_seeds<R: Send>(
    seeds: impl IntoIterator<Item = u64>,
    run: impl Fn(u64) -> R + Sync,
) -> Vec<(u64, R)> {
    let seeds: Vec<u64> = seeds.into_iter().collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(seeds.len().max(1));
    let mut results: Vec<(u64, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&seed) = seeds.get(index) else {
                            return done;
                        };
                        done.push((seed, run(seed)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            // A seed that panicked panics the test here, as it would have run alone.
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_by_key(|(seed, _)| *seed);
    results
}

/// Runs `run`, with the runtimes' logs on stderr (filtered by `filter`) when environment variable
/// `var` is set (`FLOW_DEBUG=1`, `DELAY_DEBUG=1`): one seed's story, read beside its trace.
pub fn with_debug_logs<R>(var: &str, filter: &str, run: impl FnOnce() -> R) -> R {
    if std::env::var_os(var).is_none() {
        return run();
    }
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .finish();
    tracing::subscriber::with_default(subscriber, run)
}

/// One seed's world: a current-thread runtime on a paused clock, with the global `fastrand` (the
/// runtimes' jitter) seeded by `seed`; `Err` says why the runtime could not be built.
pub fn seeded_paused_runtime(seed: u64) -> Result<tokio::runtime::Runtime, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|error| format!("could not build the runtime: {error}"))?;
    fastrand::seed(seed);
    Ok(runtime)
}

/// The one seed to replay that environment variable `var` names, when it is set (`TIMER_SEED=S`).
pub fn seed_from_env(var: &str) -> Option<u64> {
    std::env::var(var).ok().and_then(|seed| seed.trim().parse().ok())
}

/// How many seeds environment variable `var` asks for (`TIMER_SEEDS=N`), else `default`.
pub fn seeds_from_env(var: &str, default: u64) -> u64 {
    seed_from_env(var).unwrap_or(default)
}

/// The seeds that once failed, replayed by the crate's test (one per line; `#` starts a comment).
pub const FAILED_SEEDS: &str = include_str!("../failed-seeds.txt");

/// The seeds of [`FAILED_SEEDS`].
pub fn failed_seeds() -> Vec<u64> {
    FAILED_SEEDS
        .lines()
        .filter_map(|line| line.split('#').next())
        .filter_map(|seed| seed.trim().parse().ok())
        .collect()
}

/// What one seed did, and what it broke.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Broken invariants (empty: the run passed).
    pub violations: Vec<String>,
    /// Jobs whose effect was applied twice inside the documented at-least-once window (a process
    /// killed between its effect and its completion): counted, not failures.
    pub in_the_window: usize,
    /// Jobs lost to the queue's retention, each past it (`Quirks::retention`): counted, not failures.
    pub expired: usize,
    /// Jobs in the scenario.
    pub jobs: usize,
    /// Messages the producer sent.
    pub sends: usize,
    /// Receives made by all consumers.
    pub receives: usize,
    /// Handler runs.
    pub runs: usize,
    /// Messages in the DLQ at the end.
    pub dead_lettered: usize,
    /// Effects refused by the fenced sink.
    pub refused: usize,
    /// Workers killed.
    pub kills: usize,
    /// Virtual time the run took.
    pub virtual_time: Duration,
}

impl Report {
    /// True when every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The command that replays this seed with a trace of every step.
    pub fn replay_command(&self) -> String {
        replay_command(self.seed)
    }
}

/// The command that replays `seed` with a trace of every step.
pub fn replay_command(seed: u64) -> String {
    format!("cargo run -p conveyor-sim --bin simulate -- --seed {seed} --trace")
}

/// Runs `seed` and checks its invariants; `trace` prints every step to stderr as it happens.
pub fn simulate(seed: u64, trace: bool) -> Report {
    simulate_scenario(&Scenario::generate(seed), trace)
}

/// Runs `scenario` (a seed's, perhaps changed) and checks its invariants.
pub fn simulate_scenario(scenario: &Scenario, trace: bool) -> Report {
    let seed = scenario.seed;
    let observed = match run::run(scenario, trace) {
        Ok(observed) => observed,
        Err(error) => {
            return Report {
                seed,
                violations: vec![format!("could not build the runtime: {error}")],
                in_the_window: 0,
                expired: 0,
                jobs: scenario.jobs.len(),
                sends: 0,
                receives: 0,
                runs: 0,
                dead_lettered: 0,
                refused: 0,
                kills: 0,
                virtual_time: Duration::ZERO,
            };
        }
    };
    let mut violations = check::check(scenario, &observed);
    let outbox = outbox::simulate_outbox(seed);
    if trace {
        for line in &outbox.trace {
            eprintln!("outbox: {line}");
        }
    }
    violations.extend(outbox.violations);
    let timers = timers::simulate_timers(seed);
    if trace {
        for line in &timers.trace {
            eprintln!("timers: {line}");
        }
    }
    violations.extend(timers.violations);
    Report {
        seed,
        violations,
        in_the_window: check::in_the_window(scenario, &observed),
        expired: check::expired_by_retention(scenario, &observed),
        jobs: scenario.jobs.len(),
        sends: observed.log.sent.len(),
        receives: observed.log.received.len(),
        runs: observed.log.runs.len(),
        dead_lettered: observed.dead_lettered.len(),
        refused: observed.log.refused.len(),
        kills: observed.dead_instances.len(),
        virtual_time: observed.virtual_time,
    }
}
