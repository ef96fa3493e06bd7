//! A LocalStack of a test's own: on a free port, with its own state folder, started and stopped by the
//! test, so a test that restarts or kills the emulator never touches the shared one on 4566 (which other
//! tests, or another checkout, are using at the same time).
//!
//! Measured on the development machines: two LocalStack 4.8.1 processes run side by side when each has
//! its own `GATEWAY_LISTEN` port and its own `FILESYSTEM_ROOT` (LocalStack's var/cache/tmp) and
//! `CONFIG_DIR`; with `SERVICES=sqs` and `DNS_ADDRESS=0` neither opens any other port (`ss -ltnp` shows
//! one listener each), and their queues are separate. Start-up takes 2–5 s.
//!
//! The emulator runs under the guard of `localstack::guard`: it dies with the test process even on
//! `kill -9`, and the guard removes its state folder; on a panic, `Drop` kills the whole group and
//! removes the folder.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::guard::{group_alive, guarded, kill_through_guard, signal_group, wait_answering};
use super::{repo_root, unique_name};
use crate::ports::free_port;

/// How long a start (or restart) may take before it fails with the emulator's log.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a graceful stop may take before the group is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// What an [`OwnLocalStack`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Services {
    /// LocalStack's `SERVICES`, comma-separated.
    pub services: &'static str,
    /// LocalStack's `SQS_ENDPOINT_STRATEGY`: `path` as the shared emulator (`localstack/common.sh`), or
    /// `off` (`http://<host>/<account>/<name>` URLs) for clients that refuse path-style queue URLs, such
    /// as Terraform's AWS provider.
    pub sqs_endpoint_strategy: &'static str,
}

impl Services {
    /// SQS only, path-style queue URLs, as the shared emulator.
    pub const SQS: Services = Services {
        services: "sqs",
        sqs_endpoint_strategy: "path",
    };
    /// SQS and S3 (large payloads), path-style queue URLs.
    pub const SQS_S3: Services = Services {
        services: "sqs,s3",
        sqs_endpoint_strategy: "path",
    };
    /// SQS with the services that put messages on queues: SNS (topic subscriptions), EventBridge (rule
    /// targets) and S3 (bucket notifications), path-style queue URLs. Measured on LocalStack 4.8.1 in
    /// host mode, offline: all three deliver to SQS (`tests/tests/aws_events.rs`).
    pub const AWS_EVENTS: Services = Services {
        services: "sqs,sns,events,s3",
        sqs_endpoint_strategy: "path",
    };
}

/// A LocalStack that belongs to one test; see the module docs of `localstack::own`.
#[derive(Debug)]
pub struct OwnLocalStack {
    services: Services,
    port: u16,
    state_dir: PathBuf,
    log_path: PathBuf,
    guard: Option<Child>,
}

impl OwnLocalStack {
    /// Installs the emulators if needed (`localstack/install.sh --quiet`, idempotent), then starts a
    /// LocalStack serving SQS on a free port and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Services::SQS).await
    }

    /// [`OwnLocalStack::start`] serving `services` (LocalStack loads each on its first request; the
    /// start waits until SQS answers).
    pub async fn start_with(services: Services) -> anyhow::Result<Self> {
        install().await?;
        let port = free_port()?;
        let state_dir = std::env::temp_dir().join(unique_name("conveyor-own-localstack"));
        let mut own = Self {
            services,
            port,
            log_path: state_dir.join("localstack.log"),
            state_dir,
            guard: None,
        };
        own.launch()?;
        own.wait_healthy().await?;
        Ok(own)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The instance's state folder (its log is `localstack.log` there); removed when dropped.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// An SQS client for this instance (dummy credentials, `us-east-1`).
    pub fn sqs_client(&self) -> aws_sdk_sqs::Client {
        super::sqs_client_at(&self.endpoint())
    }

    /// An S3 client for this instance (start it with `s3` among its services).
    pub fn s3_client(&self) -> aws_sdk_s3::Client {
        super::s3_client_at(&self.endpoint())
    }

    /// Stops the emulator (SIGTERM, or SIGKILL when `kill`, a crash) and starts it again on the same
    /// port, waiting until it serves SQS. LocalStack runs without persistence: every queue is gone.
    /// Returns how long the emulator was down.
    pub async fn restart(&mut self, kill: bool) -> anyhow::Result<Duration> {
        let stopped_at = Instant::now();
        self.stop(kill).await?;
        // The port must be free again before relaunching; a stopped LocalStack can take a moment.
        super::wait_until(START_TIMEOUT, Duration::from_millis(50), async || {
            std::net::TcpListener::bind(("0.0.0.0", self.port)).is_ok()
        })
        .await
        .with_context(|| format!("port {} still taken after the emulator stopped", self.port))?;
        self.launch()?;
        self.wait_healthy().await?;
        Ok(stopped_at.elapsed())
    }

    /// Stops the emulator (SIGTERM to its group, SIGKILL after 15 s, or SIGKILL at once when `kill`)
    /// and waits until its guard has exited.
    pub async fn stop(&mut self, kill: bool) -> anyhow::Result<()> {
        let Some(mut guard) = self.guard.take() else {
            return Ok(());
        };
        let group = guard.id();
        if !kill {
            signal_group(group, "TERM");
            // The guard is reaped first (a zombie still counts as a member of the group).
            let exited = super::wait_until(STOP_TIMEOUT, Duration::from_millis(50), async || {
                guard.try_wait().is_ok_and(|status| status.is_some()) && !group_alive(group)
            })
            .await;
            if exited.is_ok() {
                return Ok(());
            }
        }
        kill_through_guard(guard);
        super::wait_until(STOP_TIMEOUT, Duration::from_millis(20), async || {
            !group_alive(group)
        })
        .await
        .context("the emulator's process group survived SIGKILL")
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        // (Again on a restart: the guard of a killed instance removes the folder.)
        std::fs::create_dir_all(self.state_dir.join("config"))
            .with_context(|| format!("cannot create {}", self.state_dir.display()))?;
        let python = repo_root().join(".local").join("venv").join("bin").join("python");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("cannot open {}", self.log_path.display()))?;
        let log_err = log.try_clone()?;
        let listen = format!("127.0.0.1:{}", self.port);
        let guard = guarded("conveyor-own-localstack", &python)
            .args(["-m", "localstack.runtime.main"])
            .current_dir(&self.state_dir)
            .env("CONVEYOR_OWN_STATE_DIR", &self.state_dir)
            // The same settings as localstack/common.sh's launch_sqs, on this instance's port and folder.
            .env("OVERRIDE_IN_DOCKER", "0")
            .env("GATEWAY_LISTEN", &listen)
            .env("LOCALSTACK_HOST", &listen)
            .env("SERVICES", self.services.services)
            .env("DISABLE_EVENTS", "1")
            .env("SKIP_SSL_CERT_DOWNLOAD", "1")
            .env("DNS_ADDRESS", "0")
            .env("SQS_ENDPOINT_STRATEGY", self.services.sqs_endpoint_strategy)
            .env("PERSISTENCE", "0")
            .env("FILESYSTEM_ROOT", &self.state_dir)
            .env("CONFIG_DIR", self.state_dir.join("config"))
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("cannot start {} -m localstack.runtime.main", python.display()))?;
        self.guard = Some(guard);
        Ok(())
    }

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let client = self.sqs_client();
        let what = format!("LocalStack on port {}", self.port);
        wait_answering(
            &what,
            &mut self.guard,
            &self.log_path,
            START_TIMEOUT,
            async || {
                let answered =
                    tokio::time::timeout(Duration::from_secs(2), client.list_queues().send()).await;
                matches!(answered, Ok(Ok(_)))
            },
        )
        .await
    }
}

impl Drop for OwnLocalStack {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            kill_through_guard(guard);
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Runs `localstack/install.sh --quiet` (a no-op taking ~0.1 s when installed): the shared emulators
/// may come from another checkout, so this checkout's venv may not exist yet.
async fn install() -> anyhow::Result<()> {
    let script = repo_root().join("localstack").join("install.sh");
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .arg("--quiet")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed ({}):\n{}{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
