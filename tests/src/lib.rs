//! Helpers for the end-to-end tests: the real binaries (`worker`, `bootstrap`, `conveyor`) run as child
//! processes against LocalStack and DynamoDB Local.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use conveyor_demo::Binaries;

pub mod first_hour;
pub mod hcl_walk;
pub mod terraform;
use conveyor_testing::localstack;

/// A contact list for the example's `import_contacts` job of about `bytes` bytes: `header` (a CSV header
/// line; without an `email` column the job fails permanently), then one contact per line; with its number
/// of rows.
pub fn contact_list(
    list_id: &str,
    bytes: usize,
    header: &str,
) -> (conveyor_examples::jobs::import_contacts::ContactImport, usize) {
    let mut csv = format!("{header}\n");
    let mut rows = 0;
    while csv.len() < bytes {
        csv.push_str(&format!("user{rows}@example.com,Contact {rows}\n"));
        rows += 1;
    }
    let job = conveyor_examples::jobs::import_contacts::ContactImport {
        list_id: list_id.to_owned(),
        csv,
    };
    (job, rows)
}

/// The SHA-256 of `text` in lowercase hex, as the example's import handler records a CSV's.
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The webhook signing secret the example application is started with.
pub const SECRET: &str = "e2e-secret";

/// The workspace's debug binaries (`make test` builds them before the tests run).
pub fn binaries() -> Binaries {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"),
        PathBuf::from,
    );
    Binaries::in_dir(target.join("debug"))
}

/// The environment of the example application: emulator endpoints, table, secret, outbox; quiet logs.
pub fn app_env(table: &str, outbox: &Path) -> Vec<(String, String)> {
    conveyor_demo::local_app_env(table, outbox, SECRET, "warn")
}

/// A fresh outbox path under the system's temp folder.
pub fn outbox_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.jsonl", localstack::unique_name(name)))
}

/// How many emails the outbox recorded for each user.
pub fn emails_per_user(outbox: &Path) -> anyhow::Result<std::collections::BTreeMap<u64, usize>> {
    let mut counts = std::collections::BTreeMap::new();
    for effect in conveyor_examples::outbox::Outbox::read_all(outbox)? {
        if let Some(user) = effect["to_user"].as_u64() {
            *counts.entry(user).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// A fresh log path under the system's temp folder.
pub fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.log", localstack::unique_name(name)))
}

/// The JSON log lines in `path` (the worker's with `CONVEYOR_LOG_FORMAT=json`; the bootstrap's with
/// `AWS_LAMBDA_LOG_FORMAT=json`, which `conveyor lambda run` prefixes `bootstrap| `). Other lines are
/// skipped.
pub fn log_lines(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(&line[line.find('{')?..]).ok())
        .collect())
}

/// The message of a JSON log line: the worker's (`fields.message`, tracing-subscriber's shape) or a
/// Lambda function's (`message`, flat, as Lambda's own JSON lines).
pub fn message_of(line: &serde_json::Value) -> &str {
    line["fields"]["message"]
        .as_str()
        .or_else(|| line["message"].as_str())
        .unwrap_or("")
}

/// The event field `name` of a JSON log line, in either runtime's shape (see [`message_of`]).
pub fn field_of<'line>(line: &'line serde_json::Value, name: &str) -> &'line serde_json::Value {
    match &line["fields"][name] {
        serde_json::Value::Null => &line[name],
        value => value,
    }
}

/// `receive_count` of the `message` span a log line was written in (a Lambda line carries its
/// innermost span's fields flat).
pub fn receive_count(line: &serde_json::Value) -> Option<u64> {
    line["receive_count"]
        .as_u64()
        .or_else(|| line["span"]["receive_count"].as_u64())
        .or_else(|| {
            line["spans"]
                .as_array()?
                .iter()
                .find_map(|span| span["receive_count"].as_u64())
        })
}

/// Variables of the test process that would point a child elsewhere, or change what it does, when its
/// `env` does not name them.
pub const INHERITED: &[&str] = &[
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "CONVEYOR_IDEMPOTENCY_TABLE",
    "CONVEYOR_PAYLOAD_CLEANUP",
];

/// Runs `conveyor lambda run --until-empty` on `queue_url` with the example `bootstrap`, as a user
/// would: `env` is the runner's environment and is passed to the bootstrap with `--env`. Returns what
/// the runner printed; fails with that output when it exits unsuccessfully or runs past `timeout`.
pub async fn lambda_run_until_empty(
    queue_url: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<std::process::Output> {
    lambda_run_until_empty_with(&binaries().path("bootstrap")?, queue_url, env, timeout).await
}

/// [`lambda_run_until_empty`] with another function's `bootstrap` binary than the example application's.
pub async fn lambda_run_until_empty_with(
    bootstrap: &Path,
    queue_url: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<std::process::Output> {
    let binaries = binaries();
    let mut runner = tokio::process::Command::new(binaries.path("conveyor")?);
    for name in INHERITED {
        runner.env_remove(name);
    }
    runner
        .args([
            "lambda",
            "run",
            "--until-empty",
            "--queue-url",
            queue_url,
            "--bootstrap",
        ])
        .arg(bootstrap)
        .envs(env.iter().map(|(name, value)| (name.as_str(), value.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        runner.arg("--env").arg(format!("{name}={value}"));
    }
    let output = tokio::time::timeout(timeout, runner.output())
        .await
        .with_context(|| format!("conveyor lambda run took more than {timeout:?}"))??;
    anyhow::ensure!(
        output.status.success(),
        "conveyor lambda run failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}
