#![doc = include_str!("../README.md")]

pub mod chaos;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use conveyor_core::port::Queue as _;
use conveyor_examples::{OUTBOX_ENV, TABLE_ENV, WEBHOOK_SECRET_ENV};
use conveyor_sqs::SqsQueue;
use tokio::process::{Child, Command};

/// The environment a child process of the example application (the `worker` or the `bootstrap`) needs
/// on the local AWS stack: emulator endpoints and credentials, the table, the webhook secret, the outbox,
/// and the log filter.
pub fn local_app_env(table: &str, outbox: &Path, secret: &str, log_filter: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = conveyor_testing::localstack::aws_env()
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
    env.push((TABLE_ENV.to_owned(), table.to_owned()));
    env.push((WEBHOOK_SECRET_ENV.to_owned(), secret.to_owned()));
    env.push((OUTBOX_ENV.to_owned(), outbox.display().to_string()));
    env.push(("RUST_LOG".to_owned(), log_filter.to_owned()));
    env
}

/// The folder holding the built `worker`, `bootstrap` and `conveyor` binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The binaries in `dir` (`target/debug` after `make demo` or `make test`).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// A built binary, or an error saying how to build it.
    pub fn path(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(name);
        if !path.exists() {
            bail!(
                "{} is missing: `make demo` and `make test` build it; by hand: \
                 cargo build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins",
                path.display()
            );
        }
        Ok(path)
    }

    /// Starts the example `worker` on `queue_url`, killed when the handle drops. Its logs go to `log`
    /// (inherited stderr when `None`); `listen_addr` serves `/metrics` (`None`: off). The worker takes
    /// the queue's own visibility timeout, as a deployment does.
    pub fn spawn_worker(
        &self,
        queue_url: &str,
        listen_addr: Option<&str>,
        env: &[(String, String)],
        log: Option<File>,
    ) -> anyhow::Result<Child> {
        Command::new(self.path("worker")?)
            .envs(env.iter().cloned())
            .env("CONVEYOR_QUEUE_URL", queue_url)
            .env("CONVEYOR_LISTEN_ADDR", listen_addr.unwrap_or("off"))
            .stdout(Stdio::null())
            .stderr(log.map_or_else(Stdio::inherit, Stdio::from))
            .kill_on_drop(true)
            .spawn()
            .context("starting the worker binary")
    }

    /// Runs `conveyor lambda run` with the example `bootstrap` until the queue is empty. The runner's
    /// output and the bootstrap's logs go to `log` (stdout dropped, stderr inherited when `None`).
    pub async fn run_lambda(
        &self,
        queue_url: &str,
        env: &[(String, String)],
        log: Option<File>,
    ) -> anyhow::Result<()> {
        let (stdout, stderr) = match log {
            Some(file) => (Stdio::from(file.try_clone()?), Stdio::from(file)),
            None => (Stdio::null(), Stdio::inherit()),
        };
        let status = Command::new(self.path("conveyor")?)
            .args(["lambda", "run", "--queue-url", queue_url, "--until-empty"])
            .arg("--bootstrap")
            .arg(self.path("bootstrap")?)
            .args(
                env.iter()
                    .flat_map(|(key, value)| ["--env".to_owned(), format!("{key}={value}")]),
            )
            .envs(conveyor_testing::localstack::aws_env())
            .stdout(stdout)
            .stderr(stderr)
            .status()
            .await
            .context("starting conveyor lambda run")?;
        if !status.success() {
            bail!("conveyor lambda run exited with {status}");
        }
        Ok(())
    }
}

/// Sends SIGTERM and waits (40 s at most) for a clean exit; returns the exit status.
pub async fn terminate(child: &mut Child) -> anyhow::Result<ExitStatus> {
    signal_and_wait(child, "TERM").await
}

/// Sends `SIG<signal>` (`"TERM"`, `"INT"`) and waits (40 s at most) for a clean exit; returns the
/// exit status.
pub async fn signal_and_wait(child: &mut Child, signal: &str) -> anyhow::Result<ExitStatus> {
    let pid = child.id().context("the process already exited")?;
    Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await?;
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .with_context(|| format!("no exit within 40 s of SIG{signal}"))??;
    if !status.success() {
        bail!("exited with {status} after SIG{signal}");
    }
    Ok(status)
}

/// True when nothing is visible, in flight or delayed in `queue`.
pub async fn queue_is_empty(queue: &SqsQueue) -> bool {
    queue
        .depth()
        .await
        .is_ok_and(|depth| depth.visible + depth.in_flight + depth.delayed == 0)
}
