//! Helpers shared by the CLI's test binaries: run the real `conveyor` binary against LocalStack and look
//! at what it printed.
#![allow(dead_code)] // each test binary uses a different part

use std::time::Duration;

use aws_sdk_sqs::Client;
use conveyor_testing::localstack::{aws_env, ensure_local_aws, sqs_client};
use serde_json::Value;

/// How long a test waits for SQS's approximate counts to settle.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Run {
    fn from(output: std::process::Output) -> Self {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "stdout is not one JSON document ({error}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    #[track_caller]
    pub(crate) fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub(crate) fn assert_failed_with(&self, code: i32, words: &[&str]) {
        assert_eq!(
            self.code, code,
            "exit code\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.starts_with("error: "),
            "errors start with `error: `:\n{}",
            self.stderr
        );
        for word in words {
            assert!(
                self.stderr.contains(word),
                "stderr lacks {word:?}:\n{}",
                self.stderr
            );
        }
    }
}

/// The `conveyor` command with `args`, pointed at LocalStack.
pub(crate) fn conveyor_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
    command
        .args(args)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .kill_on_drop(true);
    for (name, value) in aws_env() {
        command.env(name, value);
    }
    command
}

/// Runs `conveyor` with `args`, pointed at LocalStack.
pub(crate) async fn conveyor(args: &[&str]) -> Run {
    let output = conveyor_command(args)
        .output()
        .await
        .expect("the conveyor binary runs");
    Run::from(output)
}

/// Starts the emulators (once per process) and returns an SQS client for them.
pub(crate) async fn setup() -> Client {
    ensure_local_aws().await.expect("LocalStack starts");
    sqs_client().await
}
