//! The `conveyor` binary against LocalStack: every command, and every bad input it must refuse clearly.
//!
//! Each test creates its own queues (unique names) and runs the real binary with the emulator's endpoint
//! and dummy credentials in its environment, as a user would after `source localstack/env.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use conveyor_core::message::{
    FAILURE_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE,
};
use conveyor_core::{port::Queue as _, runtime::Failure};
use conveyor_sqs::SqsQueue;
use conveyor_testing::localstack::{QueueSpec, TestQueue, create_queue, unique_name};
use conveyor_testing::wait_until;
use serde_json::{Value, json};

mod common;
use common::{POLL, Run, SETTLE, conveyor, setup};

/// `conveyor send` of one `job_type` job with `payload` to `url`, plus `extra` arguments.
async fn send(url: &str, job_type: &str, payload: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "send",
        "--queue-url",
        url,
        "--job-type",
        job_type,
        "--payload",
        payload,
    ];
    args.extend_from_slice(extra);
    conveyor(&args).await
}

/// `conveyor send` of the jobs in `file` to `url`, plus `extra` arguments.
async fn send_file(url: &str, file: &std::path::Path, extra: &[&str]) -> Run {
    let file = file.to_str().unwrap();
    let mut args = vec!["send", "--queue-url", url, "--file", file];
    args.extend_from_slice(extra);
    conveyor(&args).await
}

/// A standard queue without a DLQ.
async fn standard_queue(client: &Client, prefix: &str) -> TestQueue {
    create_queue(client, &QueueSpec::standard(prefix)).await.unwrap()
}

/// A standard queue with a DLQ (maxReceiveCount 3).
async fn queue_with_dlq(client: &Client, prefix: &str) -> TestQueue {
    create_queue(client, &QueueSpec::standard(prefix).max_receive_count(3))
        .await
        .unwrap()
}

fn dlq_url(queue: &TestQueue) -> &str {
    queue.dlq_url.as_deref().unwrap()
}

/// (visible, in flight, delayed) as `GetQueueAttributes` reports them.
async fn depth(client: &Client, url: &str) -> (u64, u64, u64) {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    let attributes = output.attributes.unwrap();
    let count = |name: QueueAttributeName| attributes.get(&name).unwrap().parse::<u64>().unwrap();
    (
        count(QueueAttributeName::ApproximateNumberOfMessages),
        count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        count(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
    )
}

async fn wait_for_depth(client: &Client, url: &str, expected: (u64, u64, u64)) {
    let reached = wait_until(SETTLE, POLL, async || depth(client, url).await == expected).await;
    let actual = depth(client, url).await;
    assert!(
        reached.is_ok(),
        "{url}: expected (visible, in flight, delayed) {expected:?}, got {actual:?}"
    );
}

fn string(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

/// Puts a message in `dlq_url` the way a worker dead-letters it: body, `conveyor.type`, and the failure
/// record in `conveyor.failure`.
async fn dead_letter_directly(
    client: &Client,
    dlq_url: &str,
    job_type: &str,
    reason: &str,
    body: &str,
) -> String {
    let failure = Failure::now(reason, 3, "source-queue", job_type);
    client
        .send_message()
        .queue_url(dlq_url)
        .message_body(body)
        .message_attributes(JOB_TYPE_ATTRIBUTE, string(job_type))
        .message_attributes(FAILURE_ATTRIBUTE, string(&failure.to_json()))
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap()
}

/// [`dead_letter_directly`] once per body, in order; the message ids.
async fn dead_letter_all(
    client: &Client,
    dlq_url: &str,
    job_type: &str,
    reason: &str,
    bodies: impl IntoIterator<Item = String>,
) -> HashSet<String> {
    let mut ids = HashSet::new();
    for body in bodies {
        ids.insert(dead_letter_directly(client, dlq_url, job_type, reason, &body).await);
    }
    ids
}

/// Every message of a queue (received with a long visibility timeout, so each is returned once).
async fn drain(client: &Client, url: &str, expected: usize) -> Vec<aws_sdk_sqs::types::Message> {
    let mut messages = Vec::new();
    let _ = wait_until(SETTLE, POLL, async || {
        let received = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(300)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .unwrap();
        messages.extend(received.messages.unwrap_or_default());
        messages.len() >= expected
    })
    .await;
    messages
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("conveyor-cli-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{name}", unique_name("f")));
    std::fs::write(&path, contents).unwrap();
    path
}

// ---------------------------------------------------------------------------------------------------
// help and usage

#[tokio::test]
async fn every_command_has_help() {
    for command in [
        vec!["--help"],
        vec!["send", "--help"],
        vec!["stats", "--help"],
        vec!["dlq", "--help"],
        vec!["dlq", "peek", "--help"],
        vec!["dlq", "redrive", "--help"],
        vec!["dlq", "delete", "--help"],
        vec!["dlq", "tasks", "--help"],
        vec!["purge", "--help"],
        vec!["schedules", "--help"],
        vec!["schedules", "list", "--help"],
        vec!["schedules", "trigger", "--help"],
    ] {
        let run = conveyor(&command).await;
        run.assert_ok();
        assert!(
            run.stdout.contains("Usage: conveyor"),
            "{command:?}:\n{}",
            run.stdout
        );
    }
    // Renamed flags show their new names only (the old ones still parse, hidden).
    let peek = conveyor(&["dlq", "peek", "--help"]).await;
    assert!(
        peek.stdout.contains("--limit") && !peek.stdout.contains("--max <"),
        "{}",
        peek.stdout
    );
    let redrive = conveyor(&["dlq", "redrive", "--help"]).await;
    assert!(redrive.stdout.contains("--reason-contains"));
    assert!(redrive.stdout.contains("StartMessageMoveTask"));
}

/// Completions and man pages come from the same definitions as --help, and need no AWS settings.
#[tokio::test]
async fn completions_and_man_pages_are_generated_offline() {
    let offline = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor"));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .kill_on_drop(true);
        command
    };
    let bash = Run::from(offline(&["completions", "bash"]).output().await.unwrap());
    bash.assert_ok();
    assert!(bash.stdout.contains("complete -F _conveyor"), "{}", bash.stdout);
    assert!(
        bash.stdout.contains("--reason-contains"),
        "the redrive filter is completed"
    );
    let script = temp_file("conveyor.bash", &bash.stdout);
    let parsed = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let zsh = Run::from(offline(&["completions", "zsh"]).output().await.unwrap());
    zsh.assert_ok();
    assert!(zsh.stdout.starts_with("#compdef conveyor"), "{}", zsh.stdout);

    let out = std::env::temp_dir().join(unique_name("conveyor-man"));
    let man = Run::from(
        offline(&["man", "--out", out.to_str().unwrap()])
            .output()
            .await
            .unwrap(),
    );
    man.assert_ok();
    let redrive = std::fs::read_to_string(out.join("conveyor-dlq-redrive.1")).unwrap();
    assert!(redrive.contains(".TH conveyor-dlq-redrive"), "{redrive}");
    assert!(redrive.contains("reason\\-contains"), "{redrive}");
    assert!(out.join("conveyor.1").exists());
    assert!(
        !out.join("conveyor-help.1").exists(),
        "no page for the help pseudo-command"
    );
    assert!(man.stdout.starts_with("wrote "), "{}", man.stdout);
    std::fs::remove_dir_all(&out).unwrap();
}

#[tokio::test]
async fn bad_arguments_are_usage_errors_with_exit_code_2() {
    let no_payload = conveyor(&[
        "send",
        "--queue-url",
        "http://x/000000000000/q",
        "--job-type",
        "t",
    ])
    .await;
    assert_eq!(no_payload.code, 2, "{}", no_payload.stderr);
    assert!(no_payload.stderr.contains("--payload"), "{}", no_payload.stderr);
    let both = conveyor(&[
        "send",
        "--queue-url",
        "http://x/000000000000/q",
        "--job-type",
        "t",
        "--payload",
        "{}",
        "--file",
        "x",
    ])
    .await;
    assert_eq!(both.code, 2, "{}", both.stderr);
    let bad_rate = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        "http://x/000000000000/q",
        "--rate",
        "0",
    ])
    .await;
    assert_eq!(bad_rate.code, 2, "{}", bad_rate.stderr);
    let no_type = conveyor(&[
        "send",
        "--queue-url",
        "http://x/000000000000/q",
        "--payload",
        "{}",
    ])
    .await;
    no_type.assert_failed_with(2, &["--job-type"]);
}

// ---------------------------------------------------------------------------------------------------
// send

#[tokio::test]
async fn send_from_arguments_sets_type_version_key_and_attributes() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-send").await;
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--job-type",
        "welcome_email",
        "--payload",
        r#"{"user_id":42}"#,
        "--key",
        "welcome_email:user:42",
        "--version",
        "2",
        "--attribute",
        "tenant=acme",
        "--output",
        "json",
    ])
    .await;
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["sent"], 1);
    assert_eq!(output["failed"], 0);
    let message_id = output["results"][0]["message_id"].as_str().unwrap().to_owned();

    let messages = drain(&client, &queue.url, 1).await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.message_id(), Some(message_id.as_str()));
    assert_eq!(message.body(), Some(r#"{"user_id":42}"#));
    let attributes = message.message_attributes().unwrap();
    let value = |name: &str| {
        attributes
            .get(name)
            .and_then(|value| value.string_value())
            .map(str::to_owned)
    };
    assert_eq!(value(JOB_TYPE_ATTRIBUTE).as_deref(), Some("welcome_email"));
    assert_eq!(value(SCHEMA_VERSION_ATTRIBUTE).as_deref(), Some("2"));
    assert_eq!(
        value(IDEMPOTENCY_KEY_ATTRIBUTE).as_deref(),
        Some("welcome_email:user:42")
    );
    assert_eq!(value("tenant").as_deref(), Some("acme"));

    let text = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--job-type",
        "t",
        "--payload",
        "{}",
    ])
    .await;
    text.assert_ok();
    assert!(
        text.stdout
            .starts_with(&format!("sent t job to {}: message id ", queue.name)),
        "{}",
        text.stdout
    );
}

#[tokio::test]
async fn send_from_a_file_sends_one_job_or_a_batch_with_per_job_results() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-file").await;

    let single = temp_file(
        "one.json",
        r#"{"job_type": "report", "payload": {"id": 1}, "key": "report:1"}"#,
    );
    conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        single.to_str().unwrap(),
    ])
    .await
    .assert_ok();
    wait_for_depth(&client, &queue.url, (1, 0, 0)).await;

    // 12 jobs: more than one SendMessageBatch call of 10. The default job type comes from --job-type.
    let jobs: Vec<Value> = (0..12)
        .map(|index| {
            if index % 2 == 0 {
                json!({ "payload": { "n": index }, "key": format!("k{index}"), "attributes": { "n": index } })
            } else {
                json!({ "job_type": "odd", "payload": { "n": index } })
            }
        })
        .collect();
    let batch = temp_file("batch.json", &serde_json::to_string_pretty(&jobs).unwrap());
    let run = send_file(&queue.url, &batch, &["--job-type", "even", "--output", "json"]).await;
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["sent"], 12);
    let results = output["results"].as_array().unwrap();
    assert_eq!(results.len(), 12);
    let ids: HashSet<&str> = results
        .iter()
        .map(|result| result["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 12, "one distinct message id per job");
    assert_eq!(results[0]["job_type"], "even");
    assert_eq!(results[0]["key"], "k0");
    assert_eq!(results[1]["job_type"], "odd");
    wait_for_depth(&client, &queue.url, (13, 0, 0)).await;

    let messages = drain(&client, &queue.url, 13).await;
    let types: Vec<String> = messages
        .iter()
        .map(|message| {
            message.message_attributes().unwrap()[JOB_TYPE_ATTRIBUTE]
                .string_value()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(types.iter().filter(|job_type| *job_type == "even").count(), 6);
    assert_eq!(types.iter().filter(|job_type| *job_type == "odd").count(), 6);
    assert_eq!(types.iter().filter(|job_type| *job_type == "report").count(), 1);

    // Text output: a table with one row per job and a summary.
    let small = temp_file(
        "two.json",
        r#"[{"job_type":"a","payload":1},{"job_type":"b","payload":2}]"#,
    );
    let text = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        small.to_str().unwrap(),
    ])
    .await;
    text.assert_ok();
    assert!(text.stdout.contains("JOB TYPE"), "{}", text.stdout);
    assert!(
        text.stdout
            .contains(&format!("sent 2 of 2 jobs to {}", queue.name)),
        "{}",
        text.stdout
    );
}

/// Each message's `MessageGroupId` (`-` when it has none) and its `conveyor.tenant` attribute, by body.
fn tenants_by_body(messages: &[aws_sdk_sqs::types::Message]) -> Vec<(String, String, Option<String>)> {
    let mut tenants: Vec<(String, String, Option<String>)> = messages
        .iter()
        .map(|message| {
            let group = message
                .attributes()
                .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId))
                .cloned()
                .unwrap_or_else(|| "-".to_owned());
            let attribute = message
                .message_attributes()
                .and_then(|attributes| attributes.get(conveyor_core::message::TENANT_ATTRIBUTE))
                .and_then(|value| value.string_value())
                .map(str::to_owned);
            (message.body().unwrap().to_owned(), group, attribute)
        })
        .collect();
    tenants.sort();
    tenants
}

#[tokio::test]
async fn a_tenant_is_sent_from_arguments_and_per_job_from_a_file_and_a_bad_one_is_refused() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-tenant").await;
    let run = send(&queue.url, "invoice", r#"{"id":1}"#, &["--tenant", "acme-42"]).await;
    run.assert_ok();
    assert!(
        run.stdout.starts_with(&format!(
            "sent invoice job for tenant acme-42 to {}: message id ",
            queue.name
        )),
        "{}",
        run.stdout
    );
    // A file: a job's own tenant wins over --tenant, which the others take.
    let jobs = json!([
        { "payload": {"id": 2}, "tenant": "globex" },
        { "payload": {"id": 3} },
    ]);
    let file = temp_file("tenants.json", &jobs.to_string());
    let extra = ["--job-type", "invoice", "--tenant", "initech", "--output", "json"];
    let run = send_file(&queue.url, &file, &extra).await;
    run.assert_ok();
    let results = run.json()["results"].clone();
    assert_eq!(results[0]["tenant"], "globex");
    assert_eq!(results[1]["tenant"], "initech");
    // On a standard queue the tenant is the MessageGroupId (SQS fair queues), and no attribute.
    let messages = drain(&client, &queue.url, 3).await;
    assert_eq!(
        tenants_by_body(&messages),
        [
            (r#"{"id":1}"#.to_owned(), "acme-42".to_owned(), None),
            (r#"{"id":2}"#.to_owned(), "globex".to_owned(), None),
            (r#"{"id":3}"#.to_owned(), "initech".to_owned(), None),
        ]
    );

    // A tenant SQS would refuse gets NewJob::tenant's words, and nothing is sent.
    send(&queue.url, "invoice", "{}", &["--tenant", "acme corp"])
        .await
        .assert_failed_with(
            1,
            &[
                r#"tenant "acme corp" cannot be sent"#,
                "' ' at position 4",
                "ASCII letters, digits and punctuation",
            ],
        );
    let bad = temp_file(
        "bad-tenant.json",
        &json!([{ "payload": {}, "tenant": "ok" }, { "payload": {}, "tenant": "é" }]).to_string(),
    );
    send_file(&queue.url, &bad, &["--job-type", "t"])
        .await
        .assert_failed_with(1, &["1 of 2 jobs", "nothing was sent", "job #1", r#"tenant "é""#]);
    wait_for_depth(&client, &queue.url, (0, 3, 0)).await;

    // On a FIFO queue the group stays the FIFO group; a different tenant rides in conveyor.tenant.
    let fifo_url = client
        .create_queue()
        .queue_name(format!("{}.fifo", unique_name("cli-tenant")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    send(
        &fifo_url,
        "t",
        r#"{"id":4}"#,
        &["--group-id", "g", "--tenant", "acme-42"],
    )
    .await
    .assert_ok();
    let messages = drain(&client, &fifo_url, 1).await;
    assert_eq!(
        tenants_by_body(&messages),
        [(
            r#"{"id":4}"#.to_owned(),
            "g".to_owned(),
            Some("acme-42".to_owned())
        )]
    );
}

#[tokio::test]
async fn a_long_file_shows_progress_and_sends_every_job() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-long").await;
    let jobs: Vec<Value> = (0..250)
        .map(|index| json!({ "payload": { "n": index } }))
        .collect();
    let file = temp_file("long.json", &Value::Array(jobs).to_string());
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--job-type",
        "bulk",
        "--file",
        file.to_str().unwrap(),
        "--output",
        "json",
    ])
    .await;
    run.assert_ok();
    assert_eq!(run.json()["sent"], 250);
    for line in [
        "sent 100 of 250 jobs",
        "sent 200 of 250 jobs",
        "sent 250 of 250 jobs",
    ] {
        assert!(
            run.stderr.contains(line),
            "progress line {line:?} missing:\n{}",
            run.stderr
        );
    }
    wait_for_depth(&client, &queue.url, (250, 0, 0)).await;
}

#[tokio::test]
async fn a_batch_with_a_bad_job_names_it_and_sends_nothing() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-badjob").await;
    let jobs = json!([
        { "job_type": "ok", "payload": {} },
        { "job_type": "grouped", "payload": {}, "group_id": "g" },
        { "job_type": "late", "payload": {}, "delay_secs": 1_209_601 },
    ]);
    let file = temp_file("bad.json", &jobs.to_string());
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        file.to_str().unwrap(),
    ])
    .await;
    run.assert_failed_with(
        1,
        // The file is refused as it is read: the delay past SQS's longest retention is named with
        // its job, before any job is sent.
        &["job #2", "\"delay_secs\" is 1209601", "at most 1209600 seconds"],
    );
    wait_for_depth(&client, &queue.url, (0, 0, 0)).await;

    let unknown_field = temp_file("typo.json", r#"[{"job_type":"a","payload":1,"dealy_secs":5}]"#);
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        unknown_field.to_str().unwrap(),
    ])
    .await;
    run.assert_failed_with(1, &["job #0", "dealy_secs"]);
}

#[tokio::test]
async fn malformed_json_is_refused_with_line_and_column() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-json").await;
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--job-type",
        "t",
        "--payload",
        r#"{"user_id": 42"#,
    ])
    .await;
    run.assert_failed_with(1, &["--payload is not valid JSON", "line 1, column 14"]);

    let file = temp_file(
        "broken.json",
        "[\n  {\"job_type\": \"a\", \"payload\": {}},\n  {\"job_type\" \"b\"}\n]\n",
    );
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        file.to_str().unwrap(),
    ])
    .await;
    run.assert_failed_with(1, &["is not valid JSON", "line 3, column 15"]);
    wait_for_depth(&client, &queue.url, (0, 0, 0)).await;
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_its_size_and_the_limit() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-big").await;
    // The body is the payload's JSON: a string of 1 MiB plus its two quotes (1,048,578 bytes). SQS counts
    // the attributes too: conveyor.type = String "big" (13 + 6 + 3) and conveyor.version = Number "1"
    // (16 + 6 + 1), 45 bytes in all.
    let big = json!({ "job_type": "big", "payload": "x".repeat(1024 * 1024) });
    let file = temp_file("big.json", &big.to_string());
    let run = conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        file.to_str().unwrap(),
    ])
    .await;
    run.assert_failed_with(1, &["1048623 bytes", "over SQS's limit of 1048576 bytes"]);

    // Exactly at the limit passes (1,048,576 - 45 - 2 characters of payload), and only that one is sent.
    let fits = json!({ "job_type": "big", "payload": "x".repeat(1024 * 1024 - 47) });
    let file = temp_file("fits.json", &fits.to_string());
    conveyor(&[
        "send",
        "--queue-url",
        &queue.url,
        "--file",
        file.to_str().unwrap(),
    ])
    .await
    .assert_ok();
    wait_for_depth(&client, &queue.url, (1, 0, 0)).await;
}

#[tokio::test]
async fn fifo_parameters_are_checked_against_the_queue_kind() {
    let client = setup().await;
    let standard = standard_queue(&client, "cli-std").await;
    // A FIFO queue without content-based deduplication.
    let fifo_name = format!("{}.fifo", unique_name("cli-fifo"));
    let fifo_url = client
        .create_queue()
        .queue_name(&fifo_name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    send(&fifo_url, "t", "{}", &[])
        .await
        .assert_failed_with(1, &[&fifo_name, "message group id", "--group-id"]);
    send(&fifo_url, "t", "{}", &["--group-id", "g"])
        .await
        .assert_failed_with(1, &["content-based deduplication", "--dedup-id"]);
    let delayed_fifo = ["--group-id", "g", "--dedup-id", "d", "--delay-secs", "5"];
    send(&fifo_url, "t", "{}", &delayed_fifo)
        .await
        .assert_failed_with(1, &["FIFO queue", "no per-message delay"]);
    send(&standard.url, "t", "{}", &["--group-id", "g"])
        .await
        .assert_failed_with(1, &["standard queue", "--group-id", "only for FIFO"]);
    send(&standard.url, "t", "{}", &["--dedup-id", "d"])
        .await
        .assert_failed_with(1, &["standard queue", "--dedup-id"]);
    wait_for_depth(&client, &fifo_url, (0, 0, 0)).await;
    wait_for_depth(&client, &standard.url, (0, 0, 0)).await;

    send(&fifo_url, "t", "{}", &["--group-id", "g", "--dedup-id", "d1"])
        .await
        .assert_ok();
    let delayed = send(&standard.url, "t", "{}", &["--delay-secs", "60"]).await;
    delayed.assert_ok();
    wait_for_depth(&client, &fifo_url, (1, 0, 0)).await;
    wait_for_depth(&client, &standard.url, (0, 0, 1)).await;
}

#[tokio::test]
async fn an_unknown_queue_is_named_with_how_to_create_it() {
    let client = setup().await;
    let existing = standard_queue(&client, "cli-known").await;
    let missing = format!("{}-missing", existing.url);
    let missing_name = format!("{}-missing", existing.name);
    let commands: Vec<Vec<&str>> = vec![
        vec![
            "send",
            "--queue-url",
            &missing,
            "--job-type",
            "t",
            "--payload",
            "{}",
        ],
        vec!["stats", "--queue-url", &missing],
        vec!["dlq", "peek", "--queue-url", &missing],
        vec!["dlq", "redrive", "--queue-url", &missing, "--yes"],
        vec!["purge", "--queue-url", &missing, "--yes-i-really-mean-it"],
    ];
    for command in commands {
        let run = conveyor(&command).await;
        // SQS answered "does not exist": the AWS CLI's 254 (the service returned an error).
        run.assert_failed_with(
            254,
            &[
                &missing_name,
                "does not exist",
                "aws sqs create-queue --queue-name",
            ],
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// stats

#[tokio::test]
async fn stats_report_what_was_put_in_the_queue_and_its_dlq() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-stats").await;
    for index in 0..4 {
        send(&queue.url, "t", &index.to_string(), &[]).await.assert_ok();
    }
    for _ in 0..2 {
        send(&queue.url, "t", "1", &["--delay-secs", "300"])
            .await
            .assert_ok();
    }
    // One message in flight.
    let received = client
        .receive_message()
        .queue_url(&queue.url)
        .max_number_of_messages(1)
        .visibility_timeout(300)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages.unwrap_or_default().len(), 1);
    dead_letter_all(
        &client,
        dlq_url(&queue),
        "t",
        "boom",
        (0..3).map(|i| i.to_string()),
    )
    .await;
    wait_for_depth(&client, &queue.url, (3, 1, 2)).await;
    wait_for_depth(&client, dlq_url(&queue), (3, 0, 0)).await;

    let run = conveyor(&["stats", "--queue-url", &queue.url, "--output", "json"]).await;
    run.assert_ok();
    let stats = run.json();
    assert_eq!(stats["queue"]["name"], queue.name.as_str());
    assert_eq!(stats["queue"]["visible"], 3);
    assert_eq!(stats["queue"]["in_flight"], 1);
    assert_eq!(stats["queue"]["delayed"], 2);
    assert_eq!(stats["queue"]["oldest_message_age_secs"], Value::Null);
    assert_eq!(stats["max_receive_count"], 3);
    assert_eq!(
        stats["dead_letter_queue"]["name"],
        queue.dlq_name.as_deref().unwrap()
    );
    assert_eq!(stats["dead_letter_queue"]["visible"], 3);
    assert_eq!(stats["dead_letter_queue"]["in_flight"], 0);

    let text = conveyor(&["stats", "--queue-url", &queue.url]).await;
    text.assert_ok();
    assert!(text.stdout.contains("n/a (CloudWatch metric)"), "{}", text.stdout);
    assert!(
        text.stdout
            .contains(&format!("{} (DLQ)", queue.dlq_name.as_deref().unwrap())),
        "{}",
        text.stdout
    );

    // --output text: the table as tab-separated values without its header, for cut and awk.
    let tsv = conveyor(&["stats", "--queue-url", &queue.url, "--output", "text"]).await;
    tsv.assert_ok();
    let rows = tsv_rows(&tsv.stdout, 5);
    assert_eq!(rows.len(), 2, "{}", tsv.stdout);
    assert!(
        tsv.stderr.contains("messages move to the DLQ after 3 receives"),
        "the sentence under the table goes to stderr: {}",
        tsv.stderr
    );
    assert_eq!(
        rows[0][..4],
        [queue.name.as_str(), "3", "1", "2"],
        "{}",
        tsv.stdout
    );
    assert!(!tsv.stdout.contains("QUEUE"), "no header row: {}", tsv.stdout);

    // Asked about the DLQ itself: its own numbers, and whose DLQ it is.
    let of_dlq = conveyor(&["stats", "--queue-url", dlq_url(&queue)]).await;
    of_dlq.assert_ok();
    let expected = format!(
        "{} is the DLQ of {}",
        queue.dlq_name.as_deref().unwrap(),
        queue.name
    );
    assert!(of_dlq.stdout.contains(&expected), "{}", of_dlq.stdout);

    // --peek-age derives the age from a peek and leaves the counts as they were.
    let peeked = conveyor(&[
        "stats",
        "--queue-url",
        &queue.url,
        "--peek-age",
        "--output",
        "json",
    ])
    .await;
    peeked.assert_ok();
    let peeked = peeked.json();
    assert_eq!(peeked["queue"]["oldest_message_age_source"], "peek");
    assert_eq!(peeked["queue"]["peeked"], 3);
    assert!(peeked["queue"]["oldest_message_age_secs"].as_u64().unwrap() < 120);
    assert_eq!(peeked["dead_letter_queue"]["peeked"], 3);
    wait_for_depth(&client, &queue.url, (3, 1, 2)).await;
    wait_for_depth(&client, dlq_url(&queue), (3, 0, 0)).await;
}

// ---------------------------------------------------------------------------------------------------
// dlq peek

#[tokio::test]
async fn dlq_peek_shows_the_reason_and_leaves_the_messages() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-peek").await;
    // Dead-letter two messages the way the worker does: receive, then SqsQueue::dead_letter.
    let secret = "jane.doe@example.com";
    for job_type in ["welcome_email", "webhook"] {
        send(&queue.url, job_type, &json!({ "email": secret }).to_string(), &[])
            .await
            .assert_ok();
    }
    let sqs_queue = SqsQueue::connect(client.clone(), queue.url.clone())
        .await
        .unwrap();
    let mut dead_lettered = HashSet::new();
    wait_until(SETTLE, POLL, async || {
        for message in sqs_queue.receive(10, Duration::from_secs(1)).await.unwrap() {
            let job_type = message.job_type().unwrap_or_default().to_owned();
            let failure = Failure::now(
                format!("{job_type}: permanent failure 410 Gone"),
                1,
                &queue.name,
                &job_type,
            );
            sqs_queue.dead_letter(&message, &failure).await.unwrap();
            sqs_queue
                .delete_batch(std::slice::from_ref(&message.receipt_handle))
                .await
                .unwrap();
            dead_lettered.insert(message.id);
        }
        dead_lettered.len() == 2
    })
    .await
    .unwrap();
    wait_for_depth(&client, dlq_url(&queue), (2, 0, 0)).await;

    let first = conveyor(&["dlq", "peek", "--queue-url", &queue.url, "--output", "json"]).await;
    first.assert_ok();
    let first = first.json();
    assert_eq!(first["shown"], 2);
    let messages = first["messages"].as_array().unwrap();
    for message in messages {
        let job_type = message["job_type"].as_str().unwrap();
        assert!(["welcome_email", "webhook"].contains(&job_type));
        assert_eq!(
            message["reason"],
            format!("{job_type}: permanent failure 410 Gone")
        );
        assert_eq!(message["failure"]["handler"], job_type);
        assert_eq!(message["failure"]["source_queue"], queue.name.as_str());
        assert_eq!(message["receive_count"], 1);
        assert!(message["sent_at"].as_str().unwrap().ends_with('Z'));
        assert!(
            message.get("body").is_none(),
            "no body without --show-body: {message}"
        );
    }
    assert!(
        !first.to_string().contains(secret),
        "the body must not leak: {first}"
    );
    // Left in place: visible again at once, and a second peek sees the same messages.
    wait_for_depth(&client, dlq_url(&queue), (2, 0, 0)).await;
    let ids = |output: &Value| -> HashSet<String> {
        output["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["message_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let second = conveyor(&["dlq", "peek", "--queue-url", dlq_url(&queue), "--output", "json"]).await;
    second.assert_ok();
    assert_eq!(ids(&second.json()), ids(&first));
    wait_for_depth(&client, dlq_url(&queue), (2, 0, 0)).await;

    // Text: a table with the reason; the body only with --show-body.
    let text = conveyor(&["dlq", "peek", "--queue-url", &queue.url]).await;
    text.assert_ok();
    assert!(text.stdout.contains("REASON"), "{}", text.stdout);
    assert!(
        text.stdout.contains("webhook: permanent failure 410 Gone"),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains(secret), "{}", text.stdout);
    let with_body = conveyor(&[
        "dlq",
        "peek",
        "--queue-url",
        &queue.url,
        "--show-body",
        "--max", // the old name of --limit, kept as a hidden alias
        "1",
    ])
    .await;
    with_body.assert_ok();
    assert!(with_body.stdout.contains(secret), "{}", with_body.stdout);
    wait_for_depth(&client, dlq_url(&queue), (2, 0, 0)).await;
}

#[tokio::test]
async fn dlq_commands_need_a_dead_letter_queue() {
    let client = setup().await;
    let plain = standard_queue(&client, "cli-nodlq").await;
    for command in [["dlq", "peek"], ["dlq", "redrive"]] {
        let run = conveyor(&[command[0], command[1], "--queue-url", &plain.url]).await;
        run.assert_failed_with(1, &[&plain.name, "has no dead-letter queue"]);
    }
}

// ---------------------------------------------------------------------------------------------------
// dlq redrive

#[tokio::test]
async fn redrive_with_a_move_task_moves_everything_back() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-task").await;
    let bodies = (0..15).map(|i| format!("{{\"n\":{i}}}"));
    dead_letter_all(&client, dlq_url(&queue), "email", "smtp down", bodies).await;
    wait_for_depth(&client, dlq_url(&queue), (15, 0, 0)).await;

    let run = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--yes",
        "--rate",
        "50",
        "--wait",
        "--output",
        "json",
    ])
    .await;
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["method"], "move_task");
    assert_eq!(output["status"], "COMPLETED");
    assert_eq!(output["moved"], 15);
    assert_eq!(output["destination"], queue.name.as_str());
    assert!(!output["task_handle"].as_str().unwrap().is_empty());
    assert!(
        run.stderr.contains("moved"),
        "progress lines on stderr:\n{}",
        run.stderr
    );
    wait_for_depth(&client, &queue.url, (15, 0, 0)).await;
    wait_for_depth(&client, dlq_url(&queue), (0, 0, 0)).await;

    let tasks = conveyor(&["dlq", "tasks", "--queue-url", &queue.url, "--output", "json"]).await;
    tasks.assert_ok();
    let tasks = tasks.json();
    assert_eq!(tasks["tasks"][0]["status"], "COMPLETED");
    assert_eq!(tasks["tasks"][0]["moved"], 15);

    // A second redrive of the same DLQ follows its own task, not the finished one listed before it.
    let bodies = (0..5).map(|i| format!("again-{i}"));
    dead_letter_all(&client, dlq_url(&queue), "email", "smtp down", bodies).await;
    wait_for_depth(&client, dlq_url(&queue), (5, 0, 0)).await;
    let again = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--yes",
        "--wait",
        "--output",
        "json",
    ])
    .await;
    again.assert_ok();
    assert_eq!(again.json()["moved"], 5);
    wait_for_depth(&client, &queue.url, (20, 0, 0)).await;
    wait_for_depth(&client, dlq_url(&queue), (0, 0, 0)).await;
}

#[tokio::test]
async fn redrive_without_wait_prints_the_task_handle() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-nowait").await;
    dead_letter_all(
        &client,
        dlq_url(&queue),
        "email",
        "x",
        (0..3).map(|i| i.to_string()),
    )
    .await;
    wait_for_depth(&client, dlq_url(&queue), (3, 0, 0)).await;
    // Every message, no filter: refused without --yes, saying what would move and how to confirm.
    let refused = conveyor(&["dlq", "redrive", "--queue-url", dlq_url(&queue)]).await;
    refused.assert_failed_with(
        2,
        &[
            "refusing to move every message",
            "(3 visible)",
            "--yes",
            "--dry-run",
        ],
    );
    assert_eq!(depth(&client, dlq_url(&queue)).await, (3, 0, 0), "nothing moved");
    let run = conveyor(&["dlq", "redrive", "--queue-url", dlq_url(&queue), "--yes"]).await;
    run.assert_ok();
    assert!(run.stdout.contains("task handle"), "{}", run.stdout);
    assert!(run.stdout.contains("conveyor dlq tasks"), "{}", run.stdout);
    wait_for_depth(&client, &queue.url, (3, 0, 0)).await;
    wait_for_depth(&client, dlq_url(&queue), (0, 0, 0)).await;
}

/// A running move task can be cancelled by its handle: what moved stays moved, the rest stays in the
/// DLQ, and a second cancel says the task is not running.
#[tokio::test]
async fn a_slow_move_task_is_cancelled_by_its_handle() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-cancel").await;
    let bodies = (0..30).map(|i| i.to_string());
    dead_letter_all(&client, dlq_url(&queue), "email", "x", bodies).await;
    wait_for_depth(&client, dlq_url(&queue), (30, 0, 0)).await;
    let started = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--yes",
        "--rate",
        "1",
        "--output",
        "json",
    ])
    .await;
    started.assert_ok();
    let handle = started.json()["task_handle"].as_str().unwrap().to_owned();
    let cancel = |handle: String| {
        let url = queue.url.clone();
        async move {
            conveyor(&[
                "dlq",
                "tasks",
                "--queue-url",
                &url,
                "--cancel",
                &handle,
                "--output",
                "json",
            ])
            .await
        }
    };
    let cancelled = cancel(handle).await;
    cancelled.assert_ok();
    let moved = cancelled.json()["moved"].as_u64().unwrap();
    assert!(moved < 30, "{}", cancelled.stdout);
    let listed = conveyor_testing::wait_for(SETTLE, POLL, async || {
        let tasks = conveyor(&["dlq", "tasks", "--queue-url", &queue.url, "--output", "json"]).await;
        let tasks = tasks.json();
        (tasks["tasks"][0]["status"] == "CANCELLED").then_some(tasks)
    })
    .await
    .expect("the task is listed as CANCELLED");
    let moved = listed["tasks"][0]["moved"].as_u64().unwrap();
    assert!(moved < 30, "{listed}");
    let (visible, in_flight, _) = depth(&client, dlq_url(&queue)).await;
    assert_eq!(visible + in_flight, 30 - moved, "the rest stays in the DLQ");
    // A handle that names no running task (LocalStack lets a cancelled task be cancelled again, so a
    // made-up one): said as such, with where the handles are listed.
    cancel("bm90LWEtdGFzaw==".to_owned())
        .await
        .assert_failed_with(254, &["no running message move task", "conveyor dlq tasks"]);
}

/// `conveyor dlq redrive` of the DLQ's `webhook` jobs whose failure contains `reason`, in JSON.
async fn redrive_webhooks(queue_url: &str, reason: &str) -> Run {
    conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        queue_url,
        "--job-type",
        "webhook",
        "--reason-contains",
        reason,
        "--output",
        "json",
    ])
    .await
}

#[tokio::test]
async fn filtered_redrive_moves_only_matching_messages() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-filter").await;
    // The non-matching messages come first, so the scan has to get past them.
    let dlq = dlq_url(&queue);
    let mut keep = dead_letter_all(
        &client,
        dlq,
        "email",
        "no valid email address",
        (0..12).map(|i| format!("e{i}")),
    )
    .await;
    dead_letter_all(
        &client,
        dlq,
        "webhook",
        "HTTP 503 Service Unavailable",
        (0..4).map(|i| format!("w{i}")),
    )
    .await;
    keep.extend(
        dead_letter_all(
            &client,
            dlq,
            "webhook",
            "HTTP 410 Gone",
            (0..3).map(|i| format!("g{i}")),
        )
        .await,
    );
    wait_for_depth(&client, dlq_url(&queue), (19, 0, 0)).await;

    let run = redrive_webhooks(&queue.url, "503").await;
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["method"], "move_loop");
    assert_eq!(output["moved"], 4);
    assert_eq!(output["examined"], 19);
    assert_eq!(output["not_matching"], 15);
    assert!(run.stderr.contains("examined"), "progress lines:\n{}", run.stderr);
    // Non-matching messages are visible again as soon as the command returns.
    assert_eq!(depth(&client, dlq_url(&queue)).await, (15, 0, 0));
    wait_for_depth(&client, &queue.url, (4, 0, 0)).await;

    let moved = drain(&client, &queue.url, 4).await;
    assert_eq!(moved.len(), 4);
    for message in &moved {
        let attributes = message.message_attributes().unwrap();
        assert!(
            !attributes.contains_key(FAILURE_ATTRIBUTE),
            "the failure record is dropped"
        );
        assert_eq!(attributes[JOB_TYPE_ATTRIBUTE].string_value(), Some("webhook"));
        assert!(
            message.body().unwrap().starts_with('w'),
            "body kept: {:?}",
            message.body()
        );
    }
    let left = drain(&client, dlq_url(&queue), 15).await;
    let left: HashSet<String> = left
        .iter()
        .map(|message| message.message_id().unwrap().to_owned())
        .collect();
    assert_eq!(left, keep);

    // A reason filter alone, case-insensitive.
    let queue = queue_with_dlq(&client, "cli-reason").await;
    dead_letter_directly(&client, dlq_url(&queue), "email", "SMTP timeout", "a").await;
    dead_letter_directly(&client, dlq_url(&queue), "email", "bad address", "b").await;
    wait_for_depth(&client, dlq_url(&queue), (2, 0, 0)).await;
    let run = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--reason-contains",
        "smtp",
    ])
    .await;
    run.assert_ok();
    assert!(
        run.stdout.contains("moved 1 of 2 examined messages"),
        "{}",
        run.stdout
    );
    wait_for_depth(&client, &queue.url, (1, 0, 0)).await;
    wait_for_depth(&client, dlq_url(&queue), (1, 0, 0)).await;
}

#[tokio::test]
async fn the_move_loop_moves_everything_when_asked_to() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-loop").await;
    let bodies = (0..23).map(|i| format!("body-{i}"));
    dead_letter_all(&client, dlq_url(&queue), "email", "x", bodies).await;
    wait_for_depth(&client, dlq_url(&queue), (23, 0, 0)).await;
    let run = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--yes",
        "--method",
        "loop",
        "--output",
        "json",
    ])
    .await;
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["moved"], 23);
    assert_eq!(output["failed"].as_array().unwrap().len(), 0);
    wait_for_depth(&client, &queue.url, (23, 0, 0)).await;
    wait_for_depth(&client, dlq_url(&queue), (0, 0, 0)).await;
    let bodies: HashSet<String> = drain(&client, &queue.url, 23)
        .await
        .iter()
        .map(|message| message.body().unwrap().to_owned())
        .collect();
    assert_eq!(bodies, (0..23).map(|index| format!("body-{index}")).collect());

    let task_with_filter = conveyor(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--method",
        "task",
        "--job-type",
        "x",
    ])
    .await;
    task_with_filter.assert_failed_with(2, &["--method task moves every message"]);
}

/// A consumer standing in for a worker whose handler fails every job permanently: it receives from the
/// source queue, sends a copy to the DLQ under a new message id (with a fresh failure record, as the
/// worker's `dead_letter` does), then deletes the original. Counts the calls per body.
async fn dead_lettering_consumer(
    client: Client,
    queue_url: String,
    dlq_url: String,
    stop: Arc<AtomicBool>,
) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let received = client
            .receive_message()
            .queue_url(&queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        for message in received.messages.unwrap_or_default() {
            let body = message.body().unwrap().to_owned();
            *calls.entry(body.clone()).or_insert(0) += 1;
            dead_letter_directly(&client, &dlq_url, "webhook", "HTTP 410 Gone again", &body).await;
            client
                .delete_message()
                .queue_url(&queue_url)
                .receipt_handle(message.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    calls
}

#[tokio::test]
async fn a_filtered_redrive_moves_each_message_once_while_a_consumer_dead_letters_them_again() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-storm").await;
    let dlq = dlq_url(&queue).to_owned();
    dead_letter_all(
        &client,
        &dlq,
        "email",
        "bad address",
        (0..3).map(|i| format!("e{i}")),
    )
    .await;
    let gone: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
    dead_letter_all(&client, &dlq, "webhook", "HTTP 410 Gone", gone.clone()).await;
    wait_for_depth(&client, &dlq, (8, 0, 0)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let consumer = tokio::spawn(dead_lettering_consumer(
        client.clone(),
        queue.url.clone(),
        dlq.clone(),
        Arc::clone(&stop),
    ));
    let run = tokio::time::timeout(Duration::from_secs(60), redrive_webhooks(&queue.url, "410")).await;
    // The consumer finishes what was moved, then stops.
    let drained = wait_until(SETTLE, POLL, async || {
        depth(&client, &queue.url).await == (0, 0, 0)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let calls = consumer.await.unwrap();
    let run = run.expect("the redrive ends while the consumer dead-letters the moved copies again");
    drained.unwrap();
    run.assert_ok();
    let output = run.json();
    assert_eq!(output["moved"], 5, "{output:#}");
    assert_eq!(output["not_matching"], 3, "{output:#}");
    let expected: HashMap<String, usize> = gone.iter().map(|body| (body.clone(), 1)).collect();
    assert_eq!(calls, expected, "the consumer ran once per original message");
    // Left in the DLQ: the 3 that do not match, and the 5 copies the consumer dead-lettered (those that
    // arrived before the scan ended are reported as such, the others came after it).
    let arrived = output["arrived_after_start"].as_u64().unwrap_or(u64::MAX);
    assert!(arrived <= 5, "{output:#}");
    wait_for_depth(&client, &dlq, (8, 0, 0)).await;
}

// ---------------------------------------------------------------------------------------------------
// purge

#[tokio::test]
async fn purge_is_refused_without_the_flag_and_empties_the_queue_with_it() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-purge").await;
    for index in 0..5 {
        send(&queue.url, "t", &index.to_string(), &[]).await.assert_ok();
    }
    wait_for_depth(&client, &queue.url, (5, 0, 0)).await;

    let refused = conveyor(&["purge", "--queue-url", &queue.url]).await;
    refused.assert_failed_with(
        2,
        &["refusing to purge", "--yes-i-really-mean-it", "cannot be undone"],
    );
    assert_eq!(depth(&client, &queue.url).await, (5, 0, 0));

    let purged = conveyor(&[
        "purge",
        "--queue-url",
        &queue.url,
        "--yes-i-really-mean-it",
        "--output",
        "json",
    ])
    .await;
    purged.assert_ok();
    assert_eq!(purged.json()["before"]["visible"], 5);
    wait_for_depth(&client, &queue.url, (0, 0, 0)).await;
}

/// `conveyor send --timers` keeps a long-delayed job in the timer table; `conveyor delays` lists it,
/// moves it, runs one now (it arrives in the queue at once) and cancels another; changes to a job that
/// is gone fail with a clear message.
#[tokio::test]
async fn delays_lists_runs_reschedules_and_cancels_jobs_kept_in_the_timer_table() {
    let client = setup().await;
    let dynamodb = conveyor_testing::localstack::dynamodb_client().await;
    let table = conveyor_testing::localstack::create_table(&dynamodb, "cli-timers")
        .await
        .unwrap();
    let queue = standard_queue(&client, "cli-timers").await;
    let table_args = ["--table", table.as_str()];
    let mut ids = Vec::new();
    for report in ["r-1", "r-2"] {
        let payload = format!(r#"{{"report":"{report}"}}"#);
        let sent = send(
            &queue.url,
            "report",
            &payload,
            &[
                &["--delay-secs", "86400", "--timers", "--output", "json"][..],
                &table_args,
            ]
            .concat(),
        )
        .await;
        sent.assert_ok();
        let id = sent.json()["results"][0]["timer_id"].as_str().unwrap().to_owned();
        ids.push(id);
    }
    let delays = |args: &[&str]| {
        let mut all = vec![
            "delays",
            "--queue-url",
            queue.url.as_str(),
            "--table",
            table.as_str(),
        ];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        conveyor(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
    };
    let listed = run(delays(&["list", "--output", "json"])).await;
    listed.assert_ok();
    let listed = listed.json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed[0]["job_type"], "report");

    // The endpoint flags reach every service the command calls: with the environment's endpoints
    // dead, --endpoint-url (SQS) and --dynamodb-endpoint-url (DynamoDB Local) list the same jobs...
    let dead = "http://127.0.0.1:9";
    let sqs_endpoint = conveyor_testing::localstack::sqs_endpoint();
    let dynamodb_endpoint = conveyor_testing::localstack::dynamodb_endpoint();
    let with_dead_environment = |extra: &[&str]| {
        let mut args = delays(&["list", "--output", "json"]);
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let output = common::conveyor_command(&args)
                .env("AWS_ENDPOINT_URL_SQS", dead)
                .env("AWS_ENDPOINT_URL_DYNAMODB", dead)
                .output()
                .await
                .unwrap();
            Run::from(output)
        }
    };
    let by_flags = with_dead_environment(&[
        "--endpoint-url",
        &sqs_endpoint,
        "--dynamodb-endpoint-url",
        &dynamodb_endpoint,
    ])
    .await;
    by_flags.assert_ok();
    assert_eq!(by_flags.json(), listed);
    // ... and without the flags the dead endpoints are what is called.
    let by_environment = with_dead_environment(&[]).await;
    assert_ne!(by_environment.code, 0, "{}", by_environment.stdout);

    let text = run(delays(&["list"])).await;
    text.assert_ok();
    assert!(
        text.stdout.contains(&ids[0]) && text.stdout.contains("23h 59m"),
        "{}",
        text.stdout
    );

    run(delays(&["reschedule", &ids[1], "--in-secs", "7200"]))
        .await
        .assert_ok();
    let listed = run(delays(&["list", "--output", "json"])).await.json();
    assert_eq!(
        listed[0]["id"],
        ids[1].as_str(),
        "the rescheduled one is now the soonest: {listed}"
    );

    let ran = run(delays(&["run", &ids[0]])).await;
    ran.assert_ok();
    assert!(ran.stdout.contains("sent delayed job"), "{}", ran.stdout);
    let received = drain(&client, &queue.url, 1).await;
    let bodies: Vec<&str> = received.iter().filter_map(|message| message.body()).collect();
    assert_eq!(bodies, [r#"{"report":"r-1"}"#], "run now: in the queue at once");
    run(delays(&["run", &ids[0]]))
        .await
        .assert_failed_with(1, &["no delayed job", "sent or cancelled already"]);

    run(delays(&["cancel", &ids[1]])).await.assert_ok();
    run(delays(&["cancel", &ids[1]]))
        .await
        .assert_failed_with(1, &["no delayed job", "sent or cancelled already"]);
    let empty = run(delays(&["list"])).await;
    empty.assert_ok();
    assert!(empty.stdout.contains("no delayed jobs"), "{}", empty.stdout);
}

/// A timer-table job past its due time with no relay running is flagged by `delays list`: marked
/// OVERDUE, with the fix (`conveyor::Pipeline::with_timers`) and that no relay was ever seen; once a
/// relay pass has run, the listing says when it was seen (issue 55, "nothing waits silently").
#[tokio::test]
async fn delays_list_flags_a_job_overdue_when_no_relay_runs() {
    use conveyor_core::port::OutgoingMessage;
    use std::time::SystemTime;

    let client = setup().await;
    let dynamodb = conveyor_testing::localstack::dynamodb_client().await;
    let table = conveyor_testing::localstack::create_table(&dynamodb, "cli-overdue")
        .await
        .unwrap();
    let queue = standard_queue(&client, "cli-overdue").await;
    let store = Arc::new(conveyor_dynamodb::DynamoStore::new(dynamodb, &table));
    let timers = conveyor_core::Timers::new(
        store,
        Arc::new(conveyor_sqs::SqsSender::new(client.clone())),
        queue.url.as_str(),
    );
    let body = || OutgoingMessage {
        body: "{}".to_owned(),
        ..OutgoingMessage::default()
    };
    let now = SystemTime::now();
    let stuck = timers
        .put("report", now - Duration::from_secs(600), body())
        .await
        .unwrap();
    let later = timers
        .put("report", now + Duration::from_secs(7200), body())
        .await
        .unwrap();
    let list = |extra: &[&str]| {
        let mut args = vec![
            "delays",
            "--queue-url",
            queue.url.as_str(),
            "--table",
            table.as_str(),
            "list",
        ];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move { conveyor(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };

    let text = list(&[]).await;
    text.assert_ok();
    let line_of = |id: &str| {
        text.stdout
            .lines()
            .find(|line| line.contains(id))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line_of(&stuck).contains("OVERDUE"), "{}", text.stdout);
    assert!(!line_of(&later).contains("OVERDUE"), "{}", text.stdout);
    assert!(
        text.stdout.contains("1 OVERDUE")
            && text.stdout.contains("conveyor::Pipeline::with_timers")
            && text.stdout.contains("relay: NEVER SEEN"),
        "{}",
        text.stdout
    );
    let json = list(&["--output", "json"]).await;
    json.assert_ok();
    let listed = json.json();
    let overdue: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|timer| timer["overdue"] == true)
        .filter_map(|timer| timer["id"].as_str())
        .collect();
    assert_eq!(overdue, [stuck.as_str()], "{listed}");
    assert!(
        json.stderr.contains("1 OVERDUE"),
        "the hint goes to stderr: {}",
        json.stderr
    );

    // A relay pass (as a worker with timers on runs) sends the overdue job and leaves its mark.
    conveyor(&[
        "delays",
        "--queue-url",
        queue.url.as_str(),
        "--table",
        table.as_str(),
        "relay",
    ])
    .await
    .assert_ok();
    let after = list(&[]).await;
    after.assert_ok();
    assert!(
        !after.stdout.contains("OVERDUE") && after.stdout.contains("relay: seen at"),
        "{}",
        after.stdout
    );
}

/// The next line `jobs watch --output json` prints, parsed on its own (NDJSON).
async fn next_json(lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("jobs watch printed a line within 30 s")
        .unwrap()
        .expect("jobs watch is still printing");
    serde_json::from_str(&line).unwrap_or_else(|error| panic!("not one JSON object ({error}): {line}"))
}

/// `jobs watch --output json` prints one JSON object per line each time the record changes (NDJSON,
/// as a stream should), and ends when the job does.
#[tokio::test]
async fn jobs_watch_prints_one_json_object_per_change_and_ends_with_the_job() {
    use conveyor_core::port::{
        ClaimOutcome, ClaimRequest, IdempotencyStore as _, JobChange, idempotency_key,
    };
    use conveyor_core::{JobStatus, Progress};
    use tokio::io::AsyncBufReadExt as _;

    setup().await;
    let dynamodb = conveyor_testing::localstack::dynamodb_client().await;
    let table = conveyor_testing::localstack::create_table(&dynamodb, "cli-watch")
        .await
        .unwrap();
    let store = conveyor_dynamodb::DynamoStore::new(dynamodb, &table);
    let now = std::time::SystemTime::now();
    let request = ClaimRequest {
        key: idempotency_key("report", Some("r-1"), ""),
        lease_until: now + Duration::from_secs(300),
        expires_at: now + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: false,
    };
    let running = JobChange::now("report", JobStatus::Running, 1);
    let ClaimOutcome::Acquired(claim) = store.claim_tracked(&request, &running).await.unwrap() else {
        panic!("the key is free");
    };

    let mut watch = common::conveyor_command(&[
        "jobs",
        "watch",
        "r-1",
        "--job-type",
        "report",
        "--table",
        &table,
        "--output",
        "json",
    ])
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    assert_eq!(next_json(&mut lines).await["status"], "running");

    let progress = Progress {
        percent: 50,
        message: "half the rows".to_owned(),
        at: std::time::SystemTime::now(),
    };
    store.record_progress(&claim, &progress).await.unwrap();
    let halfway = next_json(&mut lines).await;
    assert_eq!(halfway["progress"]["percent"], 50, "{halfway}");

    let succeeded = JobChange::now("report", JobStatus::Succeeded, 1);
    store
        .complete_tracked(
            &claim,
            Some(r#"{"rows":3}"#),
            now + Duration::from_secs(3600),
            &succeeded,
        )
        .await
        .unwrap();
    assert_eq!(next_json(&mut lines).await["status"], "succeeded");
    let exit = tokio::time::timeout(Duration::from_secs(30), watch.wait())
        .await
        .expect("jobs watch ends with the job")
        .unwrap();
    assert!(exit.success());
    assert_eq!(
        lines.next_line().await.unwrap(),
        None,
        "nothing after the final status"
    );
}

/// `conveyor console --output json` prints where it listens and the address to open as one JSON line,
/// and that address opens it.
#[tokio::test]
async fn console_with_output_json_prints_the_address_to_open() {
    use tokio::io::AsyncBufReadExt as _;

    let client = setup().await;
    let queue = standard_queue(&client, "cli-console").await;
    let mut console = common::conveyor_command(&[
        "console",
        "--listen",
        "127.0.0.1:0",
        "--queue-url",
        &queue.url,
        "--output",
        "json",
    ])
    .env_remove(conveyor_console::TOKEN_ENV)
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(console.stdout.take().unwrap()).lines();
    let started = next_json(&mut lines).await;
    let listening = started["listening"].as_str().unwrap();
    let open = started["open"].as_str().unwrap();
    assert!(
        open.starts_with(listening) && open.contains("/?token="),
        "{started}"
    );
    let addr = listening.trim_start_matches("http://").trim_end_matches('/');
    let path = &open[listening.len() - 1..];
    let answer = conveyor_http::testing::raw_request(
        addr.parse().unwrap(),
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
    .await
    .unwrap();
    // The token sets the session cookie and is dropped from the address (a redirect to `/`).
    assert!(answer.starts_with("HTTP/1.1 30"), "{answer}");
    assert!(answer.to_lowercase().contains("set-cookie:"), "{answer}");
    console.kill().await.unwrap();
}

/// `conveyor console --endpoint-url` reads the fair-queue metrics from that endpoint's CloudWatch: a
/// moto server of the test's own serves the queue and the metrics (LocalStack 4.8.1 does not speak the
/// CloudWatch SDK's protocol), and the queues page shows them.
#[tokio::test]
async fn console_reads_the_fair_queue_metrics_at_the_endpoint_url() {
    use aws_sdk_cloudwatch::types::{Dimension, MetricDatum};
    use conveyor_core::metric_names::FAIR_QUEUE_METRICS;
    use tokio::io::AsyncBufReadExt as _;

    const TOKEN: &str = "0123456789abcdef0123";
    let moto = conveyor_testing::localstack::OwnMoto::start().await.unwrap();
    let queue = create_queue(&moto.sqs_client(), &QueueSpec::standard("cli-fair"))
        .await
        .unwrap();
    let cloudwatch = aws_sdk_cloudwatch::Client::from_conf(
        aws_sdk_cloudwatch::Config::builder()
            .behavior_version(aws_sdk_cloudwatch::config::BehaviorVersion::latest())
            .region(aws_sdk_cloudwatch::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_cloudwatch::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .endpoint_url(moto.endpoint())
            .build(),
    );
    let mut put = cloudwatch.put_metric_data().namespace("AWS/SQS");
    for (metric, value) in FAIR_QUEUE_METRICS.iter().zip([4.0, 9.0, 1.0, 0.0, 17.0]) {
        put = put.metric_data(
            MetricDatum::builder()
                .metric_name(*metric)
                .dimensions(Dimension::builder().name("QueueName").value(&queue.name).build())
                .value(value)
                .build(),
        );
    }
    put.send().await.unwrap();

    let mut console = common::conveyor_command(&[
        "console",
        "--endpoint-url",
        &moto.endpoint(),
        "--listen",
        "127.0.0.1:0",
        "--queue-url",
        &queue.url,
        "--token",
        TOKEN,
        "--output",
        "json",
    ])
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(console.stdout.take().unwrap()).lines();
    let started = next_json(&mut lines).await;
    let addr = started["listening"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let page = conveyor_http::testing::raw_request(
        addr.parse().unwrap(),
        &format!(
            "GET / HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
    .unwrap();
    console.kill().await.unwrap();
    let table = page
        .split("id=\"fair-queues\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no fair-queue table:\n{page}"));
    let row = table
        .split("<tr")
        .find(|row| row.contains(&queue.name))
        .unwrap_or_else(|| panic!("no row for {}:\n{table}", queue.name));
    for value in [">4<", ">9<", ">1<", ">0<", ">17<"] {
        assert!(row.contains(value), "{value} in {row}");
    }
}

/// `dlq peek`, `dlq redrive --dry-run` and `dlq delete` take the same filter and touch the same
/// messages: the peek shows them, the dry run counts them and moves nothing, the delete (only with a
/// filter or --all, and --yes) removes exactly them.
#[tokio::test]
async fn a_filtered_peek_a_dry_run_and_a_delete_touch_the_same_messages() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-delete").await;
    let dlq = dlq_url(&queue);
    let webhooks = dead_letter_all(
        &client,
        dlq,
        "webhook",
        "HTTP 503",
        (0..3).map(|i| format!("w{i}")),
    )
    .await;
    let emails = dead_letter_all(
        &client,
        dlq,
        "email",
        "bad address",
        (0..2).map(|i| format!("e{i}")),
    )
    .await;
    wait_for_depth(&client, dlq, (5, 0, 0)).await;
    let filter = ["--job-type", "webhook"];
    let with = |command: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = ["--output", "json", "dlq"]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
        args.extend(command.iter().map(|arg| (*arg).to_owned()));
        args.extend(["--queue-url".to_owned(), queue.url.clone()]);
        args.extend(filter.iter().map(|arg| (*arg).to_owned()));
        args
    };
    let run_with = async |command: &[&'static str]| {
        let args = with(command);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        conveyor(&args).await
    };
    let ids = |value: &Value| -> HashSet<String> {
        value["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| message["message_id"].as_str().unwrap().to_owned())
            .collect()
    };

    let peek = run_with(&["peek", "--limit", "100"]).await;
    peek.assert_ok();
    assert_eq!(
        (peek.json()["looked_at"].as_u64(), ids(&peek.json())),
        (Some(5), webhooks.clone())
    );

    let dry = run_with(&["redrive", "--dry-run"]).await;
    dry.assert_ok();
    assert_eq!(
        (dry.json()["matching"].as_u64(), ids(&dry.json())),
        (Some(3), webhooks.clone())
    );
    assert_eq!(
        depth(&client, &queue.url).await,
        (0, 0, 0),
        "a dry run moves nothing"
    );
    wait_for_depth(&client, dlq, (5, 0, 0)).await;

    let unconfirmed = run_with(&["delete"]).await;
    unconfirmed.assert_failed_with(2, &["cannot be undone", "--yes", "--dry-run"]);
    let unfiltered = conveyor(&["dlq", "delete", "--queue-url", &queue.url, "--yes"]).await;
    unfiltered.assert_failed_with(2, &["--job-type", "--all"]);
    wait_for_depth(&client, dlq, (5, 0, 0)).await;

    let deleted = run_with(&["delete", "--yes"]).await;
    deleted.assert_ok();
    assert_eq!(deleted.json()["deleted"], 3, "{}", deleted.stdout);
    wait_for_depth(&client, dlq, (2, 0, 0)).await;
    let left: HashSet<String> = drain(&client, dlq, 2)
        .await
        .iter()
        .map(|message| message.message_id().unwrap().to_owned())
        .collect();
    assert_eq!(left, emails);
    assert_eq!(depth(&client, &queue.url).await, (0, 0, 0), "deleted, not moved");
}

/// The rows of `--output text`: every line of stdout is a row of `columns` tab-separated cells (no
/// sentence, no header).
#[track_caller]
fn tsv_rows(stdout: &str, columns: usize) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split('\t').collect();
            assert_eq!(
                cells.len(),
                columns,
                "not a row of {columns} cells: {line:?} in:\n{stdout}"
            );
            cells
        })
        .collect()
}

/// `dlq peek --output text`: stdout holds only the table's rows; the sentences (the DLQ's summary, the
/// filter's count) go to stderr.
#[tokio::test]
async fn peek_as_text_prints_rows_only_on_stdout() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-peek-tsv").await;
    let dlq = dlq_url(&queue);
    dead_letter_all(&client, dlq, "webhook", "HTTP 503", ["a", "b"].map(str::to_owned)).await;
    wait_for_depth(&client, dlq, (2, 0, 0)).await;
    let peeked = conveyor(&[
        "--output",
        "text",
        "dlq",
        "peek",
        "--queue-url",
        &queue.url,
        "--job-type",
        "webhook",
    ])
    .await;
    peeked.assert_ok();
    let rows = tsv_rows(&peeked.stdout, 8);
    assert_eq!(rows.len(), 2, "{}", peeked.stdout);
    assert!(rows.iter().all(|row| row[1] == "webhook"), "{}", peeked.stdout);
    assert!(peeked.stderr.contains("dead-letter queue"), "{}", peeked.stderr);
    assert!(
        peeked
            .stderr
            .contains("2 of the 2 messages looked at match the filter"),
        "{}",
        peeked.stderr
    );
}

/// Starts `conveyor` with `args`, reads its stderr until a line contains `ready` (within a minute), sends
/// it SIGINT as Ctrl-C does, and returns what it did, with all of stderr.
async fn interrupt_when(args: &[&str], ready: &str) -> Run {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = common::conveyor_command(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            let found = line.contains(ready);
            seen.push(line);
            if found {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "no stderr line with {ready:?}:\n{}",
        seen.join("\n")
    );
    let pid = child.id().unwrap();
    let signalled = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    while let Some(line) = stderr.next_line().await.unwrap() {
        seen.push(line);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the command ends after Ctrl-C")
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: seen.join("\n"),
    }
}

/// Ctrl-C while `dlq redrive --wait` follows a move task: the task goes on in SQS, and the command says
/// so with its handle and the command that cancels it (which works), and exits with 130.
#[tokio::test]
async fn ctrl_c_while_following_a_move_task_says_how_to_cancel_it() {
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-task-int").await;
    let dlq = dlq_url(&queue);
    dead_letter_all(&client, dlq, "email", "x", (0..30).map(|i| i.to_string())).await;
    wait_for_depth(&client, dlq, (30, 0, 0)).await;
    let run = interrupt_when(
        &[
            "dlq",
            "redrive",
            "--queue-url",
            &queue.url,
            "--yes",
            "--rate",
            "1",
            "--wait",
        ],
        "RUNNING: moved",
    )
    .await;
    assert_eq!(run.code, 130, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("goes on in SQS"), "{}", run.stderr);
    let cancel = run
        .stderr
        .split("`conveyor dlq tasks --queue-url ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no cancel command in:\n{}", run.stderr));
    let (url, handle) = cancel
        .split_once(" --cancel ")
        .unwrap_or_else(|| panic!("no --cancel in {cancel:?}"));
    assert!(
        run.stderr.contains(&format!("task handle {handle}")),
        "{}",
        run.stderr
    );
    let listed = conveyor(&["dlq", "tasks", "--queue-url", url, "--output", "json"]).await;
    assert_eq!(
        listed.json()["tasks"][0]["status"],
        "RUNNING",
        "{}",
        listed.stdout
    );
    conveyor(&["dlq", "tasks", "--queue-url", url, "--cancel", handle])
        .await
        .assert_ok();
}

/// `conveyor lambda run` stopped by Ctrl-C prints its summary and exits with 130, as an interrupted
/// command does (it exited 0).
#[tokio::test]
async fn ctrl_c_stops_lambda_run_with_exit_code_130() {
    let client = setup().await;
    let queue = standard_queue(&client, "cli-lambda-int").await;
    // An empty queue: no invocation starts, so any executable does as the bootstrap.
    let run = interrupt_when(
        &[
            "lambda",
            "run",
            "--queue-url",
            &queue.url,
            "--bootstrap",
            "/bin/true",
        ],
        "Ctrl-C stops",
    )
    .await;
    assert_eq!(run.code, 130, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("summary: 0 batches"), "{}", run.stdout);
    assert!(run.stderr.contains("error: stopped by Ctrl-C"), "{}", run.stderr);
}

/// Ctrl-C during a redrive stops it after the current batch, says what moved and exits with 130.
#[tokio::test]
async fn ctrl_c_stops_a_redrive_with_exit_code_130_and_says_what_moved() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let client = setup().await;
    let queue = queue_with_dlq(&client, "cli-interrupt").await;
    let dlq = dlq_url(&queue);
    dead_letter_all(
        &client,
        dlq,
        "webhook",
        "HTTP 503",
        (0..30).map(|i| format!("w{i}")),
    )
    .await;
    wait_for_depth(&client, dlq, (30, 0, 0)).await;
    // One message a second: the redrive is far from done when the first progress line comes.
    let mut child = common::conveyor_command(&[
        "dlq",
        "redrive",
        "--queue-url",
        &queue.url,
        "--yes",
        "--method",
        "loop",
        "--rate",
        "1",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    while let Some(line) = stderr.next_line().await.unwrap() {
        let progress = line.contains("examined");
        seen.push(line);
        if progress {
            break;
        }
    }
    let pid = child.id().unwrap();
    let signalled = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    while let Some(line) = stderr.next_line().await.unwrap() {
        seen.push(line);
    }
    let output = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = seen.join("\n");
    assert_eq!(
        output.status.code(),
        Some(130),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("stopped by Ctrl-C"), "{stdout}");
    assert!(
        stderr.contains("error: stopped by Ctrl-C after moving"),
        "{stderr}"
    );
    let (in_dlq, _, _) = depth(&client, dlq).await;
    assert!(
        in_dlq > 0 && in_dlq < 30,
        "some moved, some stay: {in_dlq} in the DLQ"
    );
}
