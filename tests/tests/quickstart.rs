//! The local quickstart in `docs/running.md`, run as a new user would paste it: the first `sh` block,
//! line by line, in bash, against the emulators. Three changes, each said where it is made: the
//! `cargo build` line is left out (`make test` built the binaries), the worker's output goes to a log
//! file, and the idempotency key gets a unique suffix (so a second run of this test is not a duplicate).
//! Then it waits for the job and checks what the commands printed and did: the queue and table were
//! set up, the job ran once (its email is in the outbox), nothing reached the DLQ.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use std::path::Path;
use std::time::Duration;

use conveyor_testing::localstack::{self, repo_root, unique_name};

/// The first ```sh block of `markdown`.
fn first_sh_block(markdown: &str) -> Vec<String> {
    markdown
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("docs/running.md has a ```sh block")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The block as a script: the three changes the module docs list, and a wait for the job at the end.
fn script(block: &[String], worker_log: &Path, key_suffix: &str) -> String {
    let mut lines = vec!["set -euo pipefail".to_owned()];
    for line in block {
        let command = line.split(" #").next().unwrap_or_default().trim_end();
        if command.starts_with('#') || command.is_empty() {
            continue;
        }
        if command.starts_with("cargo build") {
            continue; // built by `make test`
        }
        if command.ends_with("target/debug/worker &") {
            lines.push(format!(
                "{} > {} 2>&1 &",
                command.trim_end_matches('&').trim_end(),
                worker_log.display()
            ));
            lines.push("worker_pid=$!".to_owned());
            lines.push("trap 'kill $worker_pid 2>/dev/null || true' EXIT".to_owned());
            continue;
        }
        if command.contains("conveyor send") {
            // What the DLQ holds before (an earlier run may have left something there).
            lines.push("echo \"== before\"; target/debug/conveyor dlq peek --queue-url jobs".to_owned());
        }
        if command.contains("conveyor send") || line.trim_start().starts_with("--payload") {
            lines.push(command.replace(
                "welcome_email:user:42",
                &format!("welcome_email:user:42:{key_suffix}"),
            ));
            continue;
        }
        lines.push(command.to_owned());
    }
    // The job is done when its email is in the outbox (at most a minute); then the DLQ is looked at and
    // the worker stopped as ECS would stop it.
    lines.push(
        r#"for _ in $(seq 1 120); do
  if grep -qs '"to_user":42' "$CONVEYOR_DEMO_OUTBOX"; then break; fi
  sleep 0.5
done
echo "== settled"
target/debug/conveyor dlq peek --queue-url jobs
kill -TERM $worker_pid
wait $worker_pid || true"#
            .to_owned(),
    );
    lines.join("\n")
}

#[tokio::test]
async fn the_local_quickstart_runs_its_job_once_as_shown() {
    localstack::ensure_local_aws().await.unwrap();
    let root = repo_root();
    let block = first_sh_block(&std::fs::read_to_string(root.join("docs/running.md")).unwrap());
    assert!(
        block.iter().any(|line| line.contains("conveyor send")),
        "the quickstart sends a job: {block:?}"
    );
    let worker_log = conveyor_e2e::log_path("quickstart-worker");
    let outbox = conveyor_e2e::outbox_path("quickstart-outbox");
    let suffix = unique_name("run");
    let script = script(&block, &worker_log, &suffix);
    let output = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(&root)
            .env("CONVEYOR_DEMO_OUTBOX", &outbox)
            .env_remove("RUST_LOG")
            .output(),
    )
    .await
    .expect("the quickstart finishes within 3 minutes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let log = std::fs::read_to_string(&worker_log).unwrap_or_default();
    let said = format!("script:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}\nworker log:\n{log}");
    assert!(output.status.success(), "the quickstart failed: {said}");
    assert!(
        stderr.contains("queue jobs:") && stderr.contains("idempotency table conveyor-idempotency:"),
        "local init says what it set up: {said}"
    );
    assert!(stdout.contains("== settled"), "{said}");
    let in_dlq = |section: &str| {
        stdout
            .split(section)
            .nth(1)
            .and_then(|text| text.split(" visible before the peek").next())
            .and_then(|text| text.rsplit(' ').next())
            .and_then(|count| count.trim().parse::<u64>().ok())
    };
    let (before, after) = (in_dlq("== before"), in_dlq("== settled"));
    assert!(
        before.is_some() && before == after,
        "nothing more in the DLQ: {said}"
    );
    assert!(
        log.contains("worker started"),
        "the worker says it started: {said}"
    );
    let emails = conveyor_e2e::emails_per_user(&outbox).unwrap_or_default();
    assert_eq!(
        emails.get(&42),
        Some(&1),
        "the welcome email was sent once: {said}"
    );
}
