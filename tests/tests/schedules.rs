//! The example application's schedules: the file the Lambda example's Terraform reads
//! (`infra/examples/lambda/schedules.json`, planned in tests/terraform.rs) is exactly what the code
//! exports, and an EventBridge-style enveloped tick (no attributes) runs through the real pipeline
//! with the tick's key.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use conveyor_core::{
    Pipeline,
    message::Message,
    runtime::{AckReason, Budget, Lease, Outcome},
};

#[test]
fn the_committed_schedules_file_is_what_the_code_exports() -> Result<()> {
    let path = conveyor_e2e::terraform::infra_dir().join("examples/lambda/schedules.json");
    let committed = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let exported = conveyor_schedule::export(&conveyor_examples::schedules::schedules()?)? + "\n";
    ensure!(
        committed == exported,
        "{} is out of date: run `target/debug/worker --export-schedules {}`",
        path.display(),
        path.display()
    );
    Ok(())
}

#[tokio::test]
async fn an_enveloped_tick_without_attributes_runs_with_the_ticks_key() -> Result<()> {
    let file: serde_json::Value = serde_json::from_str(&conveyor_schedule::export(
        &conveyor_examples::schedules::schedules()?,
    )?)?;
    let input = file["schedules"][0]["input"].as_str().context("no input")?;
    // What EventBridge Scheduler sends: the input with the scheduled time filled in, no attributes.
    let body = input.replace("<aws.scheduler.scheduled-time>", "2026-11-30T01:00:00Z");
    let outbox = std::env::temp_dir().join(format!("conveyor-schedules-{}.jsonl", std::process::id()));
    let settings = conveyor_examples::AppSettings {
        outbox: outbox.clone(),
        webhook_secret: b"test".to_vec(),
        webhook_timeout: Duration::from_secs(1),
    };
    let store = Arc::new(conveyor_testing::MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(conveyor_examples::router(&settings)?).with_store(store.clone());
    let run = async |id: &str| {
        let lease = Lease::new(tokio::time::Instant::now() + Duration::from_secs(30));
        let message = Arc::new(Message::new(id, body.clone()));
        pipeline
            .process(message, Arc::from("jobs"), &lease, Budget::default())
            .await
    };
    let first = run("m-1").await;
    ensure!(
        first.outcome == Outcome::Ack(AckReason::Completed),
        "{:?}",
        first.outcome
    );
    ensure!(first.job_type == Some("report"));
    // The same tick delivered again (EventBridge retries at least once): a duplicate, by the key.
    let again = run("m-2").await;
    ensure!(
        again.outcome == Outcome::Ack(AckReason::Duplicate),
        "{:?}",
        again.outcome
    );
    let key = conveyor_core::port::idempotency_key(
        "report",
        Some("schedule:nightly-sales-report@2026-11-30T01:00:00Z"),
        "",
    );
    ensure!(
        conveyor_core::port::IdempotencyStore::get(store.as_ref(), &key)
            .await?
            .is_some()
    );
    let _ = std::fs::remove_file(outbox);
    Ok(())
}
