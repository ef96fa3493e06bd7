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
    let mut child = common::conveyor_command(&["stats", "--queue-url", &queue.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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

/// Runs the binary with only `env` (and PATH, and a HOME without AWS files): no region, credentials or
/// endpoint unless given, and no instance metadata service (a test machine may be an EC2 instance).
async fn conveyor_with_env(args: &[&str], env: &[(&str, &str)]) -> common::Run {
    let home = std::env::temp_dir().join(conveyor_testing::localstack::unique_name("home"));
    std::fs::create_dir_all(&home).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
        .await
        .expect("the command ends")
        .unwrap();
    common::Run::from(output)
}

/// No region, no credentials, a host that does not resolve, a port nobody listens on: each is one
/// `error:` line (and a `hint:` line) saying what to set, with no SDK debug structures, no log noise,
/// and no "retrying" from a command that exits.
#[tokio::test]
async fn configuration_mistakes_say_what_to_set_and_are_not_outages() {
    let send = [
        "send",
        "--queue-url",
        "http://127.0.0.1:4566/000000000000/jobs",
        "--job-type",
        "t",
        "--payload",
        "{}",
    ];
    let credentials = [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")];
    let no_region = conveyor_with_env(&send, &credentials).await;
    // Configuration (the AWS CLI's 253), not usage: the command line was right.
    no_region.assert_failed_with(
        253,
        &[
            "no AWS region",
            "--region",
            "AWS_REGION",
            "source localstack/env.sh",
        ],
    );

    let no_credentials = conveyor_with_env(&send, &[("AWS_REGION", "us-east-1")]).await;
    no_credentials.assert_failed_with(
        253,
        &[
            "no AWS credentials",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "source localstack/env.sh",
        ],
    );

    let mut bad_host = vec![
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL_SQS", "http://sqs.nosuchhost.invalid:4566"),
    ];
    bad_host.extend(credentials);
    let dns = conveyor_with_env(&send, &bad_host).await;
    // No answer from AWS: the AWS CLI's 255 (client-side), not 254 (the service said no).
    dns.assert_failed_with(
        255,
        &[
            "cannot reach SQS at http://sqs.nosuchhost.invalid:4566",
            "does not resolve",
            "AWS_ENDPOINT_URL_SQS",
        ],
    );

    let mut refused = vec![
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:9"),
    ];
    refused.extend(credentials);
    let refused = conveyor_with_env(&send, &refused).await;
    refused.assert_failed_with(
        255,
        &["cannot reach SQS at http://127.0.0.1:9", "nothing listens"],
    );

    for run in [&no_region, &no_credentials, &dns, &refused] {
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert!(lines.len() <= 2, "one error line and a hint:\n{}", run.stderr);
        for noise in ["retrying", "WARN", "DispatchFailure", "{ ", "IMDS"] {
            assert!(!run.stderr.contains(noise), "{noise:?} in:\n{}", run.stderr);
        }
    }
}

/// A mistyped queue URL is refused before any call, with the shape a URL has; a plain queue name is
/// resolved with GetQueueUrl; a bad enumeration value lists the valid ones.
#[tokio::test]
async fn typos_are_caught_and_queue_names_are_resolved() {
    let client = setup().await;
    let queue = create_queue(&client, &QueueSpec::standard("cli-name").max_receive_count(3))
        .await
        .unwrap();
    let typo = queue.url.replacen("http://", "http//", 1);
    let run = common::conveyor(&["stats", "--queue-url", &typo]).await;
    run.assert_failed_with(2, &["is not a queue URL", "ACCOUNT_ID/NAME", "GetQueueUrl"]);
    let no_account =
        common::conveyor(&["stats", "--queue-url", "https://sqs.us-east-1.amazonaws.com/jobs"]).await;
    no_account.assert_failed_with(2, &["/ACCOUNT_ID/QUEUE_NAME"]);
    let short_account = common::conveyor(&[
        "stats",
        "--queue-url",
        "https://sqs.us-east-1.amazonaws.com/1234/jobs",
    ])
    .await;
    short_account.assert_failed_with(2, &["12-digit account id"]);

    let by_name = common::conveyor(&["stats", "--queue-url", &queue.name, "--output", "json"]).await;
    by_name.assert_ok();
    assert_eq!(by_name.json()["queue"]["url"], queue.url.as_str());
    let unknown_name = common::conveyor(&["stats", "--queue-url", "no-such-queue-anywhere"]).await;
    // SQS answered "does not exist": a service error, 254.
    unknown_name.assert_failed_with(254, &["no-such-queue-anywhere", "does not exist"]);

    let output = common::conveyor(&["stats", "--queue-url", &queue.url, "--output", "yaml"]).await;
    output.assert_failed_with(2, &["yaml", "text", "json"]);
    let method = common::conveyor(&["dlq", "redrive", "--queue-url", &queue.url, "--method", "lop"]).await;
    method.assert_failed_with(2, &["lop", "auto", "task", "loop"]);
}

/// Log lines written to a pipe (or a file) carry no ANSI colour codes; `--color always` asks for them.
#[tokio::test]
async fn logs_into_a_pipe_carry_no_colour_codes() {
    let client = setup().await;
    let queue = create_queue(&client, &QueueSpec::standard("cli-color"))
        .await
        .unwrap();
    let mut env: Vec<(&str, String)> = aws_env();
    env.push(("RUST_LOG", "debug".to_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let plain = conveyor_with_env(&["stats", "--queue-url", &queue.url], &env).await;
    plain.assert_ok();
    assert!(plain.stderr.contains("DEBUG"), "debug logs:\n{}", plain.stderr);
    assert!(
        !plain.stderr.contains('\u{1b}'),
        "escape codes in:\n{}",
        plain.stderr
    );

    let coloured = conveyor_with_env(&["stats", "--queue-url", &queue.url, "--color", "always"], &env).await;
    coloured.assert_ok();
    assert!(
        coloured.stderr.contains('\u{1b}'),
        "no escape codes:\n{}",
        coloured.stderr
    );
}

/// Asserts that `local init` reported the queue, its DLQ and the table as `state`.
#[track_caller]
fn assert_init_says(run: &common::Run, name: &str, table: &str, state: &str) {
    for line in [
        format!("queue {name}: {state}"),
        format!("dead-letter queue {name}-dlq: {state}"),
        format!("idempotency table {table}: {state}"),
    ] {
        assert!(run.stderr.contains(&line), "{line:?} missing:\n{}", run.stderr);
    }
}

/// `conveyor local init` creates the queue, its DLQ with the redrive policy and the idempotency table,
/// prints the environment to export, and a second run finds everything in place and says so.
#[tokio::test]
async fn local_init_twice_creates_then_finds_everything() {
    setup().await;
    let name = conveyor_testing::localstack::unique_name("cli-init");
    let table = conveyor_testing::localstack::unique_name("cli-init-table");
    let args = [
        "local",
        "init",
        "--queue",
        &name,
        "--max-receive-count",
        "4",
        "--table",
        &table,
    ];
    let first = common::conveyor(&args).await;
    first.assert_ok();
    assert_init_says(&first, &name, &table, "created");
    let url = first
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("export CONVEYOR_QUEUE_URL="))
        .expect("the queue URL is exported")
        .to_owned();
    assert!(
        first
            .stdout
            .contains(&format!("export CONVEYOR_IDEMPOTENCY_TABLE={table}\n")),
        "{}",
        first.stdout
    );
    assert!(
        first.stdout.contains("export AWS_ENDPOINT_URL_SQS="),
        "{}",
        first.stdout
    );

    let second = common::conveyor(&args).await;
    second.assert_ok();
    assert_init_says(&second, &name, &table, "already existed");
    assert_eq!(first.stdout, second.stdout, "the same environment both times");

    // What was created is what the worker needs: the redrive policy, and the table's key and TTL.
    let stats = common::conveyor(&["stats", "--queue-url", &url, "--output", "json"]).await;
    stats.assert_ok();
    let stats = stats.json();
    assert_eq!(stats["max_receive_count"], 4);
    assert_eq!(stats["dead_letter_queue"]["name"], format!("{name}-dlq"));
    let dynamodb = conveyor_testing::localstack::dynamodb_client().await;
    let described = dynamodb.describe_table().table_name(&table).send().await.unwrap();
    let key = described.table().unwrap().key_schema();
    assert_eq!(key.len(), 1);
    assert_eq!(key[0].attribute_name(), "id");
    let ttl = dynamodb
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description()
            .and_then(|ttl| ttl.attribute_name()),
        Some("expiration")
    );

    let on_aws = conveyor_with_env(
        &["local", "init", "--queue", "jobs"],
        &[
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "x"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
        ],
    )
    .await;
    on_aws.assert_failed_with(2, &["local emulators", "source localstack/env.sh"]);
}
