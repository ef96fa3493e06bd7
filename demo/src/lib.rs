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

    /// `conveyor lambda run --queue-url <queue_url> --bootstrap <the example bootstrap>` with `env` in
    /// the runner's environment (the runner passes it on to the bootstrap, as a function's configured
    /// variables), stdin closed, killed when the handle drops. Add options and the output before
    /// spawning; it stops on SIGINT.
    pub fn lambda_runner(&self, queue_url: &str, env: &[(String, String)]) -> anyhow::Result<Command> {
        let mut command = Command::new(self.path("conveyor")?);
        command
            .args(["lambda", "run", "--queue-url", queue_url])
            .arg("--bootstrap")
            .arg(self.path("bootstrap")?)
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        Ok(command)
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
        let status = self
            .lambda_runner(queue_url, &[])?
            .arg("--until-empty")
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

/// Sends `SIG<signal>` (`"TERM"`, `"INT"`) and waits (40 s at most) for a clean exit (after SIGINT,
/// 130 is one: `conveyor lambda run`'s exit when Ctrl-C stopped it); returns the exit status.
pub async fn signal_and_wait(child: &mut Child, signal: &str) -> anyhow::Result<ExitStatus> {
    let pid = child.id().context("the process already exited")?;
    Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await?;
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .with_context(|| format!("no exit within 40 s of SIG{signal}"))??;
    // `conveyor lambda run` stopped by Ctrl-C exits 130, as a shell reports an interrupted command.
    let interrupted = signal == "INT" && status.code() == Some(130);
    if !status.success() && !interrupted {
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

/// One message read from a DLQ: its body, and Conveyor's failure record when it carries one
/// (`conveyor.failure`; `None` for a message SQS's redrive moved without one).
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The message body.
    pub body: String,
    /// The failure record.
    pub failure: Option<conveyor_core::runtime::Failure>,
}

/// Reads every message of the DLQ at `dlq_url` once (until two receives in a row come back empty): each
/// is hidden for 300 s, longer than the read; on a FIFO DLQ each is also deleted once read, since a FIFO
/// queue hands out a group's next message only then.
pub async fn read_dlq(sqs: &aws_sdk_sqs::Client, dlq_url: &str) -> anyhow::Result<Vec<DeadLetter>> {
    let fifo = dlq_url.ends_with(".fifo");
    let mut read = Vec::new();
    let mut empty_receives = 0;
    while empty_receives < 2 {
        let received = sqs
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(300)
            .message_attribute_names("All")
            .send()
            .await?;
        if received.messages().is_empty() {
            empty_receives += 1;
            continue;
        }
        empty_receives = 0;
        for message in received.messages() {
            let failure = message
                .message_attributes()
                .and_then(|attributes| attributes.get(conveyor_core::message::FAILURE_ATTRIBUTE))
                .and_then(|value| value.string_value())
                .and_then(|json| serde_json::from_str(json).ok());
            read.push(DeadLetter {
                body: message.body().unwrap_or_default().to_owned(),
                failure,
            });
            if let (true, Some(receipt)) = (fifo, message.receipt_handle()) {
                sqs.delete_message()
                    .queue_url(dlq_url)
                    .receipt_handle(receipt)
                    .send()
                    .await?;
            }
        }
    }
    Ok(read)
}
