//! An emulator process of a test's own that dies with the test process: what [`OwnLocalStack`] and
//! [`OwnMoto`] share.
//!
//! The emulator runs under a small `bash` guard in a process group of its own. The guard holds a pipe
//! from the test process and kills the emulator when the pipe closes, so the emulator dies with the test
//! process even on `kill -9` (where no `Drop` runs), and removes the emulator's state folder when it has
//! one; on a panic, `Drop` kills the whole group.
//!
//! [`OwnLocalStack`]: super::OwnLocalStack
//! [`OwnMoto`]: super::OwnMoto

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::tail;

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
