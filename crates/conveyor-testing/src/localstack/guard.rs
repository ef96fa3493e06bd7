//! An emulator process of a test's own that dies with the test process: what [`OwnLocalStack`],
//! [`OwnMoto`] and [`OwnFauxqs`] share, and [`OwnChild`], the whole of a start on a free port for the
//! last two.
//!
//! The emulator runs under a small `bash` guard in a process group of its own. The guard holds a pipe
//! from the test process and kills the emulator when the pipe closes, so the emulator dies with the test
//! process even on `kill -9` (where no `Drop` runs), and removes the emulator's state folder when it has
//! one; on a panic, `Drop` kills the whole group.
//!
//! [`OwnLocalStack`]: super::OwnLocalStack
//! [`OwnMoto`]: super::OwnMoto
//! [`OwnFauxqs`]: super::OwnFauxqs

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use super::{repo_root, tail};
use crate::ports::free_port;

/// How long an [`OwnChild`] start may take before it fails with the emulator's log.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// An emulator of a test's own on a free loopback port, run under the guard, its output in
/// `.local/logs/<name>-<port>.log`: the part of [`OwnMoto`](super::OwnMoto) and
/// [`OwnFauxqs`](super::OwnFauxqs) that is the same. Dropping it kills the emulator.
#[derive(Debug)]
pub(super) struct OwnChild {
    port: u16,
    log_path: PathBuf,
    guard: Option<Child>,
}

impl OwnChild {
    /// Starts `program` under the guard (named `conveyor-<name>` in `ps`) with the arguments and
    /// environment `configure` adds for the port it is given, and waits until it answers SQS's
    /// `ListQueues` there.
    pub(super) async fn start(
        name: &str,
        program: &Path,
        configure: impl FnOnce(&mut Command, u16),
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let log_dir = repo_root().join(".local").join("logs");
        std::fs::create_dir_all(&log_dir).with_context(|| format!("cannot create {}", log_dir.display()))?;
        let log_path = log_dir.join(format!("{name}-{port}.log"));
        let log = File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let log_err = log.try_clone()?;
        let mut command = guarded(&format!("conveyor-{name}"), program);
        configure(&mut command, port);
        let guard = command
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let mut own = Self {
            port,
            log_path,
            guard: Some(guard),
        };
        let client = super::sqs_client_at(&own.endpoint());
        let what = format!("{name} on port {port}");
        wait_answering(&what, &mut own.guard, &own.log_path, START_TIMEOUT, async || {
            let answered = tokio::time::timeout(Duration::from_secs(2), client.list_queues().send()).await;
            matches!(answered, Ok(Ok(_)))
        })
        .await?;
        tracing::debug!(emulator = name, port, log = %own.log_path.display(), "own emulator answers");
        Ok(own)
    }

    /// The port it listens on.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub(super) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its log (kept after the emulator stops).
    pub(super) fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for OwnChild {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            kill_through_guard(guard);
        }
    }
}

/// The guard: starts the emulator, then blocks reading its stdin (the test's pipe); EOF means the test
/// process is gone, and the emulator goes with it (and its state folder, when one is named).
const GUARD: &str = concat!(
    r#""$@" </dev/null & pid=$!; read -r _; kill -KILL "$pid" 2>/dev/null; wait "$pid"; "#,
    r#"if [ -n "$CONVEYOR_OWN_STATE_DIR" ]; then rm -rf "$CONVEYOR_OWN_STATE_DIR"; fi"#
);

/// A command that runs `program` under the guard, named `name` in `ps`, in a process group of its own
/// with its stdin piped from this process. The caller adds the program's arguments, environment
/// (`CONVEYOR_OWN_STATE_DIR`: the folder the guard removes) and output, then spawns it.
pub(super) fn guarded(name: &str, program: &Path) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(GUARD)
        .arg(name)
        .arg(program)
        .env_remove("CONVEYOR_OWN_STATE_DIR")
        .stdin(Stdio::piped())
        .process_group(0);
    command
}

/// Polls until `answers` says the emulator serves requests, every 100 ms, failing early when the guard
/// has exited and after `timeout`, either way with the tail of the emulator's log.
pub(super) async fn wait_answering<F>(
    what: &str,
    guard: &mut Option<Child>,
    log_path: &Path,
    timeout: Duration,
    mut answers: F,
) -> anyhow::Result<()>
where
    F: AsyncFnMut() -> bool,
{
    let outcome = crate::wait::wait_for(timeout, Duration::from_millis(100), async || {
        if answers().await {
            return Some(Ok(()));
        }
        let exited = match guard.as_mut() {
            Some(guard) => guard.try_wait().map(|status| status.is_some()).unwrap_or(true),
            None => true,
        };
        exited.then_some(Err("exited"))
    })
    .await
    .unwrap_or(Err("did not answer in time"));
    outcome.or_else(|failure| {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        anyhow::bail!("{what} {failure}; {}:\n{}", log_path.display(), tail(&log, 40))
    })
}

/// Closes the guard's stdin: it SIGKILLs the emulator, waits for it and exits, so once the guard is
/// reaped the emulator is gone and its port closed. The group is then killed too, for anything left.
pub(super) fn kill_through_guard(mut guard: Child) {
    drop(guard.stdin.take());
    let _ = guard.wait();
    signal_group(guard.id(), "KILL");
}

/// Sends `signal` (`TERM`, `KILL`) to the process group `pgid`.
pub(super) fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// True while any process of the group `pgid` lives (`kill -0` on the group).
pub(super) fn group_alive(pgid: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
