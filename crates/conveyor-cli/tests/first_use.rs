//! What a new user and an operator hit first (issue 19): a closed output pipe, configuration mistakes,
//! typos in a queue URL, setting up the local stack, log colours. The real binary, against LocalStack
//! and DynamoDB Local where it needs them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::process::Stdio;

use conveyor_testing::localstack::{QueueSpec, aws_env, create_queue};

mod common;
use common::setup;

/// `conveyor stats | head -0`: the reader is gone before the first line is written. The command exits 0
/// without a panic or a `Broken pipe` message, as other Unix tools do.
#[tokio::test]
async fn a_closed_stdout_ends_the_output_quietly() {
    let client = setup().await;
    let queue = create_queue(&client, &QueueSpec::standard("cli-pipe").max_receive_count(3))
        .await
        .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
    command
        .args(["stats", "--queue-url", &queue.url])
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in aws_env() {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    // Close the read end of stdout before the command has printed anything.
    drop(child.stdout.take());
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the command ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("broken pipe"),
        "stderr:\n{stderr}"
    );
}
