//! Requests and latency of the idempotency store against DynamoDB Local.
//!
//! ```text
//! cargo run --release -p conveyor-dynamodb --example claim_bench [-- <jobs>]
//! ```
//!
//! Starts the local stack if needed (`localstack/start.sh`), creates a fresh table, then runs the jobs one
//! at a time: a first-time job is claim + complete (target: 2 requests), a duplicate is one claim
//! (target: 1 request), a duplicate of a job this process completed with the cache on is none. Then, on
//! the same table in the same run, the real Powertools for Python and TypeScript (installed on first use
//! by `localstack/install-powertools.sh`) handle the same number of jobs through their idempotent
//! wrappers, timed inside their processes (claim + complete per job; their request counts are not
//! observable from here). Figures, not pass/fail: DynamoDB Local on a laptop is not DynamoDB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use conveyor_core::port::{ClaimOutcome, ClaimRequest, IdempotencyStore, RecordStatus};
use conveyor_dynamodb::{DynamoStore, StoreOptions};
use conveyor_testing::powertools::{self, Consumer, ConsumerSpec, Event, Language, sqs_record};

const DEFAULT_JOBS: usize = 500;
const OUTPUT: &str = r#"{"messageId":"f03c5386-ffaa-4261-84fe-68fdd7caeb19","ok":true}"#;

struct Row {
    scenario: &'static str,
    jobs: usize,
    /// `None` where the requests cannot be counted (Powertools' own process).
    requests: Option<u64>,
    latencies: Vec<Duration>,
}

fn request(key: &str) -> ClaimRequest {
    let now = SystemTime::now();
    ClaimRequest {
        key: key.to_owned(),
        lease_until: now + Duration::from_secs(60),
        expires_at: now + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: false,
    }
}

/// First-time jobs: returns (claim row, claim + complete row).
async fn first_time(store: &DynamoStore, keys: &[String]) -> anyhow::Result<(Row, Row)> {
    let before = store.requests();
    let mut claim_requests = 0;
    let mut claims = Vec::with_capacity(keys.len());
    let mut whole = Vec::with_capacity(keys.len());
    for key in keys {
        let started = Instant::now();
        let before_claim = store.requests();
        let ClaimOutcome::Acquired(claim) = store.claim(&request(key)).await? else {
            bail!("{key} was not free");
        };
        claims.push(started.elapsed());
        claim_requests += store.requests() - before_claim;
        store
            .complete(
                &claim,
                Some(OUTPUT),
                SystemTime::now() + Duration::from_secs(3600),
            )
            .await?;
        whole.push(started.elapsed());
    }
    let requests = store.requests() - before;
    let claim_row = Row {
        scenario: "first-time: claim",
        jobs: keys.len(),
        requests: Some(claim_requests),
        latencies: claims,
    };
    let whole_row = Row {
        scenario: "first-time: claim + complete",
        jobs: keys.len(),
        requests: Some(requests),
        latencies: whole,
    };
    Ok((claim_row, whole_row))
}

/// Duplicates of completed jobs.
async fn duplicates(scenario: &'static str, store: &DynamoStore, keys: &[String]) -> anyhow::Result<Row> {
    let before = store.requests();
    let mut latencies = Vec::with_capacity(keys.len());
    for key in keys {
        let started = Instant::now();
        let ClaimOutcome::Exists(record) = store.claim(&request(key)).await? else {
            bail!("{key} was claimable again");
        };
        latencies.push(started.elapsed());
        if record.status != RecordStatus::Completed || record.output.as_deref() != Some(OUTPUT) {
            bail!("{key}: unexpected record {record:?}");
        }
    }
    Ok(Row {
        scenario,
        jobs: keys.len(),
        requests: Some(store.requests() - before),
        latencies,
    })
}

/// Warm-up calls each Powertools process makes before the measured ones (client creation, imports).
const POWERTOOLS_WARM_UP: usize = 50;

/// Powertools' latencies for `jobs` first-time jobs, then for the same jobs again (duplicates).
async fn powertools_rows(language: Language, table: &str, jobs: usize) -> anyhow::Result<[Row; 2]> {
    let name = language.name();
    let records = (0..POWERTOOLS_WARM_UP + jobs)
        .map(|i| sqs_record(&format!("{name}-{i}"), "{}"))
        .collect();
    let mut spec = ConsumerSpec::new(table, &format!("bench.{name}"), records);
    // As inside Lambda: the remaining time becomes the in-progress lease, as Conveyor writes one.
    spec.lease = Some(Duration::from_secs(60));
    let first = bench_latencies(language, &spec).await?;
    let again = bench_latencies(language, &spec).await?;
    let (first_scenario, duplicate_scenario) = match language {
        Language::Python => (
            "Powertools Python: claim + complete",
            "Powertools Python: duplicate",
        ),
        Language::TypeScript => (
            "Powertools TypeScript: claim + complete",
            "Powertools TypeScript: duplicate",
        ),
    };
    Ok([
        Row {
            scenario: first_scenario,
            jobs,
            requests: None,
            latencies: first,
        },
        Row {
            scenario: duplicate_scenario,
            jobs,
            requests: None,
            latencies: again,
        },
    ])
}

/// One bench run of a Powertools process, warm-up calls dropped.
async fn bench_latencies(language: Language, spec: &ConsumerSpec) -> anyhow::Result<Vec<Duration>> {
    let events = Consumer::start(language, spec, "bench")?.finish().await?;
    let Some(Event::Bench(millis)) = events.into_iter().last() else {
        bail!("the {} consumer printed no latencies", language.name());
    };
    Ok(millis
        .into_iter()
        .skip(POWERTOOLS_WARM_UP)
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .collect())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn print(rows: &mut [Row]) {
    println!(
        "{:<44} {:>6} {:>13} {:>9} {:>9}",
        "scenario", "jobs", "requests/job", "p50 ms", "p99 ms"
    );
    for row in rows {
        row.latencies.sort();
        let requests = row.requests.map_or_else(
            || "-".to_owned(),
            |requests| format!("{:.2}", requests as f64 / row.jobs as f64),
        );
        println!(
            "{:<44} {:>6} {:>13} {:>9.2} {:>9.2}",
            row.scenario,
            row.jobs,
            requests,
            millis(percentile(&row.latencies, 0.50)),
            millis(percentile(&row.latencies, 0.99)),
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let jobs = match std::env::args().nth(1) {
        Some(text) => text.parse().context("the argument is the number of jobs")?,
        None => DEFAULT_JOBS,
    };
    let client = support::local_client().await?;
    let table = support::create_table(&client, "claim-bench").await?;
    let plain = DynamoStore::new(client.clone(), &table);
    let cached = DynamoStore::new(client, &table)
        .with_options(StoreOptions::default().with_completed_cache(Some(jobs)));

    // Warm up connections and DynamoDB Local's JIT, off the record.
    let warm: Vec<String> = (0..50).map(|i| format!("conveyor:bench#warm-{i}")).collect();
    first_time(&plain, &warm).await?;
    duplicates("warm-up", &plain, &warm).await?;

    let keys: Vec<String> = (0..jobs).map(|i| format!("conveyor:bench#job-{i}")).collect();
    let (claim, whole) = first_time(&plain, &keys).await?;
    let duplicate = duplicates("duplicate: claim", &plain, &keys).await?;

    let cached_keys: Vec<String> = (0..jobs).map(|i| format!("conveyor:bench#cached-{i}")).collect();
    let (_, cached_whole) = first_time(&cached, &cached_keys).await?;
    let cached_duplicate = duplicates(
        "duplicate, cache on, completed here: claim",
        &cached,
        &cached_keys,
    )
    .await?;

    powertools::ensure_installed()?;
    let [python_first, python_duplicate] = powertools_rows(Language::Python, &table, jobs).await?;
    let [ts_first, ts_duplicate] = powertools_rows(Language::TypeScript, &table, jobs).await?;

    println!("DynamoDB Local, table {table}, {jobs} jobs each, one at a time\n");
    let mut rows = [
        claim,
        whole,
        duplicate,
        Row {
            scenario: "first-time with cache: claim + complete",
            ..cached_whole
        },
        cached_duplicate,
        python_first,
        python_duplicate,
        ts_first,
        ts_duplicate,
    ];
    print(&mut rows);
    Ok(())
}
