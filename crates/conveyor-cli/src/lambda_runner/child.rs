//! The bootstrap as a child process, with the environment Lambda gives a `provided.al2023` function.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// What the child is told about itself.
#[derive(Debug, Clone)]
pub(crate) struct FunctionSettings {
    /// The bootstrap executable.
    pub bootstrap: PathBuf,
    /// `AWS_LAMBDA_FUNCTION_NAME`.
    pub function_name: String,
    /// `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`.
    pub memory_mb: u32,
    /// `AWS_REGION` and `AWS_DEFAULT_REGION`.
    pub region: String,
    /// `--env K=V` pairs, applied last.
    pub env: Vec<(String, String)>,
    /// `AWS_LAMBDA_MAX_CONCURRENCY` (`--concurrency`): the invocations the process is sent at once, as on
    /// Lambda Managed Instances; unset as on classic Lambda.
    pub max_concurrency: Option<usize>,
}

/// Variables Lambda reserves for itself (a function's configuration cannot set them): the runner sets
/// its own values (see `lambda_environment`) and never passes the caller's through.
const RESERVED: &[&str] = &[
    "_HANDLER",
    "_X_AMZN_TRACE_ID",
    "AWS_EXECUTION_ENV",
    "LAMBDA_TASK_ROOT",
    "LAMBDA_RUNTIME_DIR",
];

/// True for a variable of the caller's environment that reaches the bootstrap: everything but what
/// Lambda reserves. On AWS a function sees the variables of its configuration (the console's
/// "Environment variables", Terraform's `environment` block); locally, the caller's shell plays that
/// part, so `WEBHOOK_SIGNING_SECRET=... conveyor lambda run ...` works as the deployed function would
/// with that variable configured. `--env NAME=VALUE` adds or overrides variables on top.
fn passes_through(name: &str) -> bool {
    !name.starts_with("AWS_LAMBDA_") && !RESERVED.contains(&name)
}

/// A running bootstrap.
pub(crate) struct Bootstrap {
    child: Child,
    spawned_at: Instant,
}

/// How often a start refused with "text file busy" is tried again, 20 ms apart.
const BUSY_TRIES: u32 = 10;

/// Starts `command`, trying again while the executable is busy (ETXTBSY): a bootstrap just rebuilt or
/// written (`cargo lambda watch`, a test's script) can be held open for writing for a moment by the
/// writer, or by a process forked while the writer had it open, and exec refuses it until then.
async fn spawn_when_not_busy(command: &mut Command) -> std::io::Result<tokio::process::Child> {
    let mut tries = 1;
    loop {
        match command.spawn() {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < BUSY_TRIES => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            spawned => return spawned,
        }
    }
}

impl Bootstrap {
    /// Starts the bootstrap against the Runtime API at `api`. Its stdout and stderr are forwarded to
    /// the runner's stderr, prefixed `bootstrap| `.
    pub(crate) async fn spawn(settings: &FunctionSettings, api: SocketAddr) -> anyhow::Result<Self> {
        let mut command = Command::new(&settings.bootstrap);
        command.env_clear();
        for (name, value) in std::env::vars_os() {
            if name.to_str().is_some_and(passes_through) {
                command.env(name, value);
            }
        }
        for (name, value) in lambda_environment(settings, api) {
            command.env(name, value);
        }
        for (name, value) in &settings.env {
            command.env(name, value);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawned_at = Instant::now();
        let mut child = spawn_when_not_busy(&mut command)
            .await
            .with_context(|| format!("cannot start the bootstrap {}", settings.bootstrap.display()))?;
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(forward(stdout));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward(stderr));
        }
        Ok(Self { child, spawned_at })
    }

    /// When the process was started.
    pub(crate) fn spawned_at(&self) -> Instant {
        self.spawned_at
    }

    /// Waits for the process to exit.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// The process's peak resident memory so far (`VmHWM`, Linux only), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()?)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Kills the process and reaps it.
    pub(crate) async fn kill(&mut self) {
        if let Err(error) = self.child.kill().await {
            tracing::debug!(%error, "bootstrap already gone");
        }
    }
}

/// The variables Lambda sets for a custom runtime.
fn lambda_environment(settings: &FunctionSettings, api: SocketAddr) -> Vec<(&'static str, String)> {
    let task_root = settings
        .bootstrap
        .parent()
        .map_or_else(|| ".".to_owned(), |dir| dir.display().to_string());
    let mut variables = vec![
        ("AWS_LAMBDA_RUNTIME_API", api.to_string()),
        ("AWS_LAMBDA_FUNCTION_NAME", settings.function_name.clone()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", settings.memory_mb.to_string()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        (
            "AWS_LAMBDA_LOG_GROUP_NAME",
            format!("/aws/lambda/{}", settings.function_name),
        ),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "local".to_owned()),
        ("AWS_REGION", settings.region.clone()),
        ("AWS_DEFAULT_REGION", settings.region.clone()),
        ("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023".to_owned()),
        ("_HANDLER", handler_name(&settings.bootstrap)),
        ("LAMBDA_TASK_ROOT", task_root),
    ];
    if let Some(invocations) = settings.max_concurrency {
        variables.push(("AWS_LAMBDA_MAX_CONCURRENCY", invocations.to_string()));
    }
    variables
}

fn handler_name(bootstrap: &Path) -> String {
    bootstrap.file_name().map_or_else(
        || "bootstrap".to_owned(),
        |name| name.to_string_lossy().into_owned(),
    )
}

async fn forward(stream: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        crate::errln!("bootstrap| {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_lambda_sets_for_a_custom_runtime() {
        let settings = FunctionSettings {
            bootstrap: PathBuf::from("/opt/fn/bootstrap"),
            function_name: "jobs".to_owned(),
            memory_mb: 256,
            region: "eu-west-1".to_owned(),
            env: Vec::new(),
            max_concurrency: None,
        };
        let env = lambda_environment(&settings, "127.0.0.1:9001".parse().unwrap());
        let get = |name: &str| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(get("AWS_LAMBDA_RUNTIME_API"), Some("127.0.0.1:9001"));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_NAME"), Some("jobs"));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), Some("256"));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_VERSION"), Some("$LATEST"));
        assert_eq!(get("AWS_REGION"), Some("eu-west-1"));
        assert_eq!(get("_HANDLER"), Some("bootstrap"));
        assert_eq!(get("LAMBDA_TASK_ROOT"), Some("/opt/fn"));
        assert_eq!(get("AWS_LAMBDA_MAX_CONCURRENCY"), None, "classic Lambda");
        let managed = FunctionSettings {
            max_concurrency: Some(4),
            ..settings
        };
        let env = lambda_environment(&managed, "127.0.0.1:9001".parse().unwrap());
        assert!(env.contains(&("AWS_LAMBDA_MAX_CONCURRENCY", "4".to_owned())));
    }

    #[test]
    fn the_callers_variables_pass_except_those_lambda_reserves() {
        for name in [
            "WEBHOOK_SIGNING_SECRET",
            "CONVEYOR_IDEMPOTENCY_TABLE",
            "AWS_ENDPOINT_URL_SQS",
            "PATH",
        ] {
            assert!(passes_through(name), "{name}");
        }
        for name in [
            "AWS_LAMBDA_RUNTIME_API",
            "AWS_LAMBDA_FUNCTION_NAME",
            "_HANDLER",
            "LAMBDA_TASK_ROOT",
        ] {
            assert!(!passes_through(name), "{name}");
        }
    }
}
