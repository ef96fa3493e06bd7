//! One test of the running test binary, run again in a child process with its own environment: for
//! what the AWS SDK reads from the process environment (`AWS_ENDPOINT_URL_SQS`), which a test cannot
//! set in its own process (`std::env::set_var` is unsafe, and the workspace forbids unsafe code).
//!
//! The child test is `#[ignore]`d (so it runs only when asked for) and returns at once unless
//! [`is_child`]:
//!
//! ```ignore
//! #[test]
//! fn parent() {
//!     let printed = conveyor_testing::child::run_test_in_child("child", &[("AWS_REGION", "us-east-1".into())]).unwrap();
//!     assert!(printed.contains("..."));
//! }
//!
//! #[test]
//! #[ignore = "run by parent"]
//! fn child() {
//!     if !conveyor_testing::child::is_child() {
//!         return;
//!     }
//!     println!("...");
//! }
//! ```

use anyhow::Context as _;

/// Set in the child's environment.
const CHILD_VARIABLE: &str = "CONVEYOR_TEST_CHILD";

/// Variables of the parent that would point the child's AWS clients elsewhere when `env` does not
/// name them.
const REMOVED: &[&str] = &[
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_PROFILE",
];

/// True in a child started by [`run_test_in_child`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_VARIABLE).is_some()
}

/// Runs the test `name` of this test binary in a child process with `env` (after removing the
/// parent's endpoint variables); returns what it printed (stdout, then stderr). Fails when the child
/// test fails.
pub fn run_test_in_child(name: &str, env: &[(&str, String)]) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("the test binary's path")?;
    let mut child = std::process::Command::new(exe);
    for name in REMOVED {
        child.env_remove(name);
    }
    let output = child
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .env(CHILD_VARIABLE, "1")
        .output()
        .with_context(|| format!("running test {name} in a child process"))?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    anyhow::ensure!(
        output.status.success(),
        "the child test {name} failed ({}):\n{printed}",
        output.status
    );
    Ok(printed)
}

/// What the child prints before the error [`error_at_a_closed_sqs_port`] returns.
pub const ERROR_MARKER: &str = "child error: ";

/// Runs the test `name` in a child whose `AWS_ENDPOINT_URL_SQS` is a local port nothing listens on
/// (with a region and dummy credentials); returns the port and what the child printed after
/// [`ERROR_MARKER`] on its line.
pub fn error_at_a_closed_sqs_port(name: &str) -> anyhow::Result<(u16, String)> {
    let port = crate::free_port()?;
    let printed = run_test_in_child(
        name,
        &[
            ("AWS_ENDPOINT_URL_SQS", format!("http://127.0.0.1:{port}")),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ],
    )?;
    let error = printed
        .lines()
        .find_map(|line| Some(line.split_once(ERROR_MARKER)?.1.to_owned()))
        .with_context(|| format!("the child printed no {ERROR_MARKER:?} line:\n{printed}"))?;
    Ok((port, error))
}
