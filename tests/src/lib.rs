//! Helpers for the end-to-end tests: the real binaries (`worker`, `bootstrap`, `conveyor`) run as child
//! processes against LocalStack and DynamoDB Local.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use conveyor_testing::localstack;
use tokio::process::{Child, Command};

/// The webhook signing secret the example application is started with.
pub const SECRET: &str = "e2e-secret";

/// The folder holding the workspace's debug binaries.
pub fn bin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"),
        PathBuf::from,
    );
    target.join("debug")
}

/// A built binary, or an error saying how to build it.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!(
            "{} is missing: `make test` builds it first; by hand: cargo build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins",
            path.display()
        );
    }
    Ok(path)
}

/// The environment of the example application: emulator endpoints, table, secret, outbox.
pub fn app_env(table: &str, outbox: &Path) -> Vec<(String, String)> {
    let mut env = conveyor_demo::local_app_env(table, outbox, SECRET);
    env.push(("RUST_LOG".to_owned(), "warn".to_owned()));
    env
}

/// Starts the example `worker` binary on `queue_url`; it is killed when the handle drops.
pub fn spawn_worker(
    queue_url: &str,
    visibility_secs: u32,
    env: &[(String, String)],
) -> anyhow::Result<Child> {
    Command::new(binary("worker")?)
        .envs(env.iter().cloned())
        .env("CONVEYOR_QUEUE_URL", queue_url)
        .env("CONVEYOR_VISIBILITY_TIMEOUT_SECS", visibility_secs.to_string())
        .env("CONVEYOR_LISTEN_ADDR", "off")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the worker binary")
}

/// Sends SIGTERM and waits for a clean exit.
pub async fn terminate(child: &mut Child) -> anyhow::Result<()> {
    let pid = child.id().context("the process already exited")?;
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .context("no exit within 40 s of SIGTERM")??;
    if !status.success() {
        bail!("exited with {status} after SIGTERM");
    }
    Ok(())
}

/// Runs `conveyor lambda run` with the example `bootstrap` until the queue is empty.
pub async fn run_lambda(queue_url: &str, env: &[(String, String)]) -> anyhow::Result<()> {
    let status = Command::new(binary("conveyor")?)
        .args(["lambda", "run", "--queue-url", queue_url, "--until-empty"])
        .arg("--bootstrap")
        .arg(binary("bootstrap")?)
        .args(
            env.iter()
                .flat_map(|(key, value)| ["--env".to_owned(), format!("{key}={value}")]),
        )
        .envs(localstack::aws_env())
        .stdout(Stdio::null())
        .status()
        .await
        .context("starting conveyor lambda run")?;
    if !status.success() {
        bail!("conveyor lambda run exited with {status}");
    }
    Ok(())
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
