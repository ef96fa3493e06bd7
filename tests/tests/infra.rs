//! Holds the Terraform in `infra/` to the names and numbers the Rust code relies on, by parsing every
//! `.tf` file with the `hcl` crate (no terraform needed; `tests/tests/terraform.rs` runs the real
//! `validate`, `plan`, `test` and `apply`). It checks what would otherwise drift silently:
//!
//! - every file parses, and every module has its five files;
//! - the idempotency table uses the attribute names of `conveyor_dynamodb::defaults`;
//! - the queue and ECS defaults and limits equal the constants in `conveyor_core`;
//! - IAM policies name every action and resource (no `"*"`, but for denials and X-Ray), and come
//!   from policy documents;
//! - the IAM actions the policies grant are the lists in `conveyor_sqs::iam` and
//!   `conveyor_dynamodb::iam`, and those lists cover every SDK call the code makes;
//! - the environment variables the modules set are ones the worker and the Lambda adapter read;
//! - the Lambda example keeps the queue's visibility timeout at least 6x the function timeout;
//! - the Lambda consumer reports batch item failures;
//! - the queue's fair-queue alarms and dashboard name the CloudWatch metrics SQS emits for fair queues
//!   (`conveyor_core::metric_names::FAIR_QUEUE_METRICS`).
//!
//! Run it with `cargo test -p conveyor-e2e --test infra`; it needs no AWS and no emulator.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use conveyor_core::runtime;
use conveyor_dynamodb::defaults as table_defaults;
use conveyor_e2e::hcl_walk::{
    as_number, as_string, attr, blocks, blocks_in, files_under, first_label, infra_dir, module_dir,
    parse_file, parse_module, required_attr, single_block, single_resource, string_attr, string_literals,
    traversal_path, variable_default, variable_default_number,
};
use hcl::{Block, Body, Expression};

/// The files every module directory must have.
const MODULE_FILES: [&str; 5] = [
    "main.tf",
    "variables.tf",
    "outputs.tf",
    "versions.tf",
    "README.md",
];

/// The modules the rest of the project (examples, docs) refers to.
const EXPECTED_MODULES: [&str; 5] = [
    "queue",
    "idempotency-table",
    "consumer-permissions",
    "lambda-consumer",
    "ecs-consumer",
];

// ---------------------------------------------------------------------------------------------
// Files and parsing
// ---------------------------------------------------------------------------------------------

#[test]
fn every_terraform_file_parses() -> Result<()> {
    // `.tf.example` files are `.tf` files waiting to be copied; they must parse too.
    let files = files_under(&infra_dir(), &[".tf", ".tf.example"])?;
    ensure!(
        files.len() >= 20,
        "found only {} Terraform files under infra/",
        files.len()
    );

    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| parse_file(path).err().map(|error| format!("{error:#}")))
        .collect();
    ensure!(
        failures.is_empty(),
        "Terraform files that do not parse:\n{}",
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn every_module_has_its_five_files() -> Result<()> {
    let modules = infra_dir().join("modules");
    let mut names = Vec::new();
    for entry in fs::read_dir(&modules).with_context(|| format!("cannot list {}", modules.display()))? {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        for file in MODULE_FILES {
            ensure!(
                path.join(file).is_file(),
                "module {} lacks {file}",
                path.display()
            );
        }
        names.extend(path.file_name().and_then(|name| name.to_str()).map(str::to_owned));
    }
    for expected in EXPECTED_MODULES {
        ensure!(
            names.iter().any(|name| name == expected),
            "module {expected} is missing"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Names and numbers shared with conveyor_core::runtime
// ---------------------------------------------------------------------------------------------

#[test]
fn idempotency_table_uses_the_record_attribute_names() -> Result<()> {
    let bodies = parse_module(&module_dir("idempotency-table"))?;
    let table = single_resource(&bodies, "aws_dynamodb_table")?.body();

    let key = table_defaults::IDEMPOTENCY_KEY_ATTRIBUTE;
    ensure!(
        string_attr(table, "hash_key")? == key,
        "the table's hash_key must be `{key}`"
    );

    let key_attribute = blocks(table, "attribute")
        .find(|attribute| attr(attribute.body(), "name").and_then(as_string).as_deref() == Some(key))
        .with_context(|| format!("the table declares no `attribute` named `{key}`"))?;
    ensure!(
        string_attr(key_attribute.body(), "type")? == "S",
        "the `{key}` attribute must be a string (type \"S\")"
    );

    let ttl = single_block(table, "ttl")?.body();
    let expiration = table_defaults::EXPIRATION_ATTRIBUTE;
    ensure!(
        string_attr(ttl, "attribute_name")? == expiration,
        "the table's TTL attribute must be `{expiration}`"
    );
    ensure!(
        matches!(attr(ttl, "enabled"), Some(Expression::Bool(true))),
        "the table's TTL must be enabled"
    );
    Ok(())
}

#[test]
fn idempotency_table_has_the_jobs_index_the_cli_queries() -> Result<()> {
    use conveyor_dynamodb::jobs::{JOB_SHARD, JOB_SORT};
    let bodies = parse_module(&module_dir("idempotency-table"))?;
    let table = single_resource(&bodies, "aws_dynamodb_table")?.body();
    let index = single_block(table, "global_secondary_index")?.body();
    ensure!(
        string_attr(index, "name")? == table_defaults::JOBS_INDEX,
        "the jobs index must be named `{}`",
        table_defaults::JOBS_INDEX
    );
    ensure!(
        string_attr(index, "hash_key")? == JOB_SHARD,
        "its hash_key must be `{JOB_SHARD}`"
    );
    ensure!(
        string_attr(index, "range_key")? == JOB_SORT,
        "its range_key must be `{JOB_SORT}`"
    );
    ensure!(
        string_attr(index, "projection_type")? == "INCLUDE",
        "it must project only the small job attributes (INCLUDE), never outputs or progress"
    );
    let projected: Vec<String> = match attr(index, "non_key_attributes") {
        Some(Expression::Array(items)) => items.iter().filter_map(as_string).collect(),
        _ => Vec::new(),
    };
    let expected: Vec<String> = table_defaults::JOBS_INDEX_PROJECTION
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
    ensure!(
        projected == expected,
        "its non_key_attributes must be conveyor_dynamodb::defaults::JOBS_INDEX_PROJECTION: {expected:?}, found {projected:?}"
    );
    let main = std::fs::read_to_string(module_dir("idempotency-table").join("main.tf"))?;
    let shards = table_defaults::JOBS_INDEX_SHARDS;
    ensure!(
        main.contains(&format!("modulo {shards}")),
        "main.tf must document the shard count ({shards}, JOBS_INDEX_SHARDS)"
    );
    for (name, kind) in [(JOB_SHARD, "S"), (JOB_SORT, "S")] {
        let attribute = blocks(table, "attribute")
            .find(|attribute| attr(attribute.body(), "name").and_then(as_string).as_deref() == Some(name))
            .with_context(|| format!("the table declares no `attribute` named `{name}`"))?;
        ensure!(
            string_attr(attribute.body(), "type")? == kind,
            "the `{name}` attribute must be of type {kind}"
        );
    }
    Ok(())
}

#[test]
fn queue_defaults_match_the_code() -> Result<()> {
    let bodies = parse_module(&module_dir("queue"))?;

    let max_receive_count = variable_default_number(&bodies, "max_receive_count")?;
    ensure!(
        max_receive_count == u64::from(runtime::MAX_RECEIVE_COUNT),
        "queue max_receive_count defaults to {max_receive_count}, the code to {}",
        runtime::MAX_RECEIVE_COUNT
    );

    let visibility = variable_default_number(&bodies, "visibility_timeout_seconds")?;
    ensure!(
        visibility == runtime::QUEUE_VISIBILITY_TIMEOUT_SECS,
        "queue visibility_timeout_seconds defaults to {visibility}, the code to {}",
        runtime::QUEUE_VISIBILITY_TIMEOUT_SECS
    );
    Ok(())
}

/// The `resource "<kind>" "<name>"` block of a module.
fn resource<'a>(bodies: &'a [Body], kind: &str, name: &str) -> Result<&'a Block> {
    blocks_in(bodies, "resource")
        .find(|block| {
            let labels: Vec<&str> = block.labels().iter().map(|label| label.as_str()).collect();
            labels == [kind, name]
        })
        .with_context(|| format!("no resource {kind}.{name}"))
}

/// Every string literal in a block's attributes, nested blocks included.
fn body_strings(body: &Body, out: &mut Vec<String>) {
    for attribute in body.attributes() {
        string_literals(attribute.expr(), out);
    }
    for block in body.blocks() {
        body_strings(block.body(), out);
    }
}

#[test]
fn the_fair_queue_alarms_and_dashboard_use_the_metric_names_sqs_emits() -> Result<()> {
    use conveyor_core::metric_names::FAIR_QUEUE_METRICS;
    let bodies = parse_module(&module_dir("queue"))?;
    let fair = |name: &str| name.ends_with("InQuietGroups") || name.ends_with("NoisyGroups");
    let mut named = Vec::new();
    for block in blocks_in(&bodies, "resource") {
        body_strings(block.body(), &mut named);
    }
    for name in named.iter().filter(|name| fair(name)) {
        ensure!(
            FAIR_QUEUE_METRICS.contains(&name.as_str()),
            "the queue module names {name}, which is not a fair-queue metric SQS emits ({FAIR_QUEUE_METRICS:?})"
        );
    }
    let mut dashboard = Vec::new();
    body_strings(
        resource(&bodies, "aws_cloudwatch_dashboard", "this")?.body(),
        &mut dashboard,
    );
    for metric in FAIR_QUEUE_METRICS {
        ensure!(
            dashboard.iter().any(|name| name == metric),
            "the tenants dashboard has no widget for {metric}"
        );
    }
    for (alarm, metric) in [
        ("noisy_groups", "ApproximateNumberOfNoisyGroups"),
        (
            "quiet_groups_oldest_message_age",
            "ApproximateAgeOfOldestMessageInQuietGroups",
        ),
    ] {
        let body = resource(&bodies, "aws_cloudwatch_metric_alarm", alarm)?.body();
        ensure!(
            string_attr(body, "metric_name")? == metric && string_attr(body, "namespace")? == "AWS/SQS",
            "alarm {alarm} must watch AWS/SQS {metric}"
        );
    }
    Ok(())
}

#[test]
fn ecs_shutdown_defaults_match_the_code() -> Result<()> {
    let bodies = parse_module(&module_dir("ecs-consumer"))?;

    let stop_timeout = variable_default_number(&bodies, "stop_timeout_seconds")?;
    ensure!(
        stop_timeout == runtime::ECS_STOP_TIMEOUT_SECS,
        "ecs-consumer stop_timeout_seconds defaults to {stop_timeout}, the code to {}",
        runtime::ECS_STOP_TIMEOUT_SECS
    );

    // The drain is left to the worker (stop timeout - reserve) unless the user sets one: not decided twice.
    let drain_default = variable_default(&bodies, "drain_deadline_seconds")?;
    ensure!(
        matches!(drain_default, Expression::Null),
        "ecs-consumer drain_deadline_seconds must default to null (the worker derives it from the stop timeout)"
    );
    let drain_deadline = stop_timeout.saturating_sub(runtime::SHUTDOWN_RESERVE.as_secs());
    ensure!(
        drain_deadline == runtime::DRAIN_DEADLINE.as_secs(),
        "the default stop timeout leaves a {drain_deadline} s drain, the code's DRAIN_DEADLINE is {:?}",
        runtime::DRAIN_DEADLINE
    );
    let locals = blocks_in(&bodies, "locals")
        .find_map(|block| attr(block.body(), "shutdown_reserve_seconds"))
        .context("ecs-consumer has no local shutdown_reserve_seconds")?;
    let reserve = as_number(locals).context("shutdown_reserve_seconds is not a number")?;
    ensure!(
        reserve == runtime::SHUTDOWN_RESERVE.as_secs(),
        "ecs-consumer's shutdown_reserve_seconds is {reserve}, the code's SHUTDOWN_RESERVE {:?}",
        runtime::SHUTDOWN_RESERVE
    );
    ensure!(
        drain_deadline + reserve <= stop_timeout,
        "the stop timeout must hold the drain deadline and the shutdown reserve"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// IAM: least privilege
// ---------------------------------------------------------------------------------------------

/// Whether a string in an IAM action, resource or principal may contain `*`.
///
/// Only one form may: `"${aws_cloudwatch_log_group.<name>.arn}:*"`. CloudWatch Logs addresses the
/// log streams of a group as `<log group ARN>:*`, and `logs:CreateLogStream` / `logs:PutLogEvents`
/// act on streams, so that suffix grants the streams of one named log group and nothing else.
/// Any other `*` (a bare `"*"`, `"sqs:*"`, `"arn:aws:sqs:*:*:jobs"`, a `*` inside the group's
/// name) is a wildcard over things we did not name, and fails.
fn wildcard_is_log_stream_suffix(text: &str) -> bool {
    let Some(group) = text.strip_suffix(":*") else {
        return false;
    };
    let Some(reference) = group.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) else {
        return false;
    };
    let parts: Vec<&str> = reference.trim().split('.').collect();
    matches!(
        parts.as_slice(),
        ["aws_cloudwatch_log_group", name, "arn"] if !name.is_empty() && !name.contains('*')
    )
}

/// Whether a resource is `"${local.table_arn}/stream/*"`: the streams of the outbox relay's one table
/// (`dynamodb:ListStreams`, which the event source mapping needs; a table's stream ARN ends in a
/// creation time, so no narrower ARN exists before the stream does).
fn wildcard_is_table_streams_suffix(text: &str) -> bool {
    text == "${local.table_arn}/stream/*"
}

/// Whether a resource is `"${<one bucket's ARN>}/*"`: the objects of one named bucket (a payload
/// bucket's objects have random UUID keys, so no narrower ARN exists). The bucket is a resource of the
/// module (`aws_s3_bucket.<name>.arn`) or `var.payload_bucket_arn`, which its validation holds to one
/// bucket ARN without wildcards.
fn wildcard_is_bucket_objects_suffix(text: &str) -> bool {
    let Some(bucket) = text.strip_suffix("/*") else {
        return false;
    };
    let Some(reference) = bucket.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) else {
        return false;
    };
    let parts: Vec<&str> = reference.trim().split('.').collect();
    matches!(
        parts.as_slice(),
        ["aws_s3_bucket", name, "arn"] if !name.is_empty() && !name.contains('*')
    ) || parts.as_slice() == ["var", "payload_bucket_arn"]
}

#[test]
fn the_bucket_objects_exception_is_narrow() {
    assert!(wildcard_is_bucket_objects_suffix("${aws_s3_bucket.this.arn}/*"));
    assert!(wildcard_is_bucket_objects_suffix("${var.payload_bucket_arn}/*"));
    for wildcard in [
        "*",
        "s3:*",
        "arn:aws:s3:::*",
        "arn:aws:s3:::payloads/*",
        "${aws_s3_bucket.this.arn}*",
        "${aws_s3_bucket.this.arn}/*/*",
        "${var.queue_arn}/*",
        "${statement.value}/*",
    ] {
        assert!(
            !wildcard_is_bucket_objects_suffix(wildcard),
            "{wildcard} must not be allowed"
        );
    }
}

/// The `statement` bodies of a policy document, including `dynamic "statement"` contents.
fn statements(document: &Body) -> Vec<&Body> {
    let mut found: Vec<&Body> = blocks(document, "statement").map(Block::body).collect();
    for dynamic in blocks(document, "dynamic") {
        if first_label(dynamic) == Some("statement") {
            found.extend(blocks(dynamic.body(), "content").map(Block::body));
        }
    }
    found
}

/// The string literals of one attribute of a statement (`actions`, `resources`, ...).
fn statement_strings(statement: &Body, key: &str) -> Vec<String> {
    let mut strings = Vec::new();
    if let Some(expr) = attr(statement, key) {
        string_literals(expr, &mut strings);
    }
    strings
}

/// Wildcards in one statement's actions, resources and principals, described for the error.
///
/// Two kinds of statement may use `*`: a `Deny` (denying more than named is safe: the queues' TLS-only
/// policy denies `sqs:*` to `*` without `aws:SecureTransport`), and one whose actions are all X-Ray's,
/// which AWS offers on resource `"*"` only.
fn statement_wildcards(statement: &Body) -> Vec<String> {
    let denies = attr(statement, "effect").and_then(as_string).as_deref() == Some("Deny");
    if denies {
        return Vec::new();
    }
    let actions = statement_strings(statement, "actions");
    // X-Ray's actions and CloudWatch's GetMetricData have no resource-level permissions: AWS grants
    // them on "*" only.
    let xray_only = !actions.is_empty()
        && actions.iter().all(|action| {
            (action.starts_with("xray:") && !action.contains('*')) || action == "cloudwatch:GetMetricData"
        });
    let mut strings = Vec::new();
    for key in ["actions", "resources", "not_actions", "not_resources"] {
        if key == "resources" && xray_only {
            continue;
        }
        if let Some(expr) = attr(statement, key) {
            string_literals(expr, &mut strings);
        }
    }
    for principals in blocks(statement, "principals") {
        if let Some(expr) = attr(principals.body(), "identifiers") {
            string_literals(expr, &mut strings);
        }
    }
    strings
        .into_iter()
        .filter(|text| {
            text.contains('*')
                && !wildcard_is_log_stream_suffix(text)
                && !wildcard_is_bucket_objects_suffix(text)
                && !wildcard_is_table_streams_suffix(text)
        })
        .collect()
}

#[test]
fn the_log_stream_exception_is_narrow() {
    assert!(wildcard_is_log_stream_suffix(
        "${aws_cloudwatch_log_group.this.arn}:*"
    ));
    for wildcard in [
        "*",
        "sqs:*",
        "arn:aws:logs:*:*:*",
        "arn:aws:logs:us-east-1:123456789012:log-group:*",
        "${aws_cloudwatch_log_group.this.arn}*",
        "${aws_cloudwatch_log_group.this.arn}:*:*",
        "${aws_sqs_queue.this.arn}:*",
        "${var.log_group_arn}:*",
    ] {
        assert!(
            !wildcard_is_log_stream_suffix(wildcard),
            "{wildcard} must not be allowed"
        );
    }
}

#[test]
fn iam_policies_name_every_action_and_resource() -> Result<()> {
    let mut documents = 0;
    let mut statement_count = 0;
    let mut problems = Vec::new();
    for path in files_under(&infra_dir(), &[".tf"])? {
        let body = parse_file(&path)?;
        for document in blocks(&body, "data") {
            if first_label(document) != Some("aws_iam_policy_document") {
                continue;
            }
            documents += 1;
            let name = document
                .labels()
                .get(1)
                .map(|label| label.as_str())
                .unwrap_or_default();
            let document_statements = statements(document.body());
            statement_count += document_statements.len();
            for wildcard in document_statements.into_iter().flat_map(statement_wildcards) {
                problems.push(format!(
                    "{}: policy document {name}: {wildcard:?}",
                    path.display()
                ));
            }
        }
        problems.extend(policies_not_from_documents(&body, &path));
    }
    // Guards against a walk that silently finds nothing to check.
    ensure!(
        documents >= 5,
        "found only {documents} aws_iam_policy_document blocks under infra/"
    );
    ensure!(
        statement_count >= 6,
        "found only {statement_count} IAM statements under infra/"
    );
    ensure!(
        problems.is_empty(),
        "IAM wildcards or unchecked policies:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// Policies the wildcard check cannot see: inline JSON instead of a policy document, and managed
/// policies (AWS's own use `"*"` resources). Every `policy` / `assume_role_policy` must read
/// `data.aws_iam_policy_document.<name>.json`.
/// The names along a reference such as `data.aws_iam_policy_document.lambda[0].json`, skipping
/// indexes (a document made with `count`); `None` for anything but a plain reference.
fn reference_path(expr: &Expression) -> Option<Vec<String>> {
    let Expression::Traversal(traversal) = expr else {
        return traversal_path(expr);
    };
    let Expression::Variable(root) = &traversal.expr else {
        return None;
    };
    let mut path = vec![root.as_str().to_owned()];
    for operator in &traversal.operators {
        match operator {
            hcl::expr::TraversalOperator::GetAttr(name) => path.push(name.as_str().to_owned()),
            hcl::expr::TraversalOperator::Index(_) | hcl::expr::TraversalOperator::LegacyIndex(_) => {}
            _ => return None,
        }
    }
    Some(path)
}

fn policies_not_from_documents(body: &Body, path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for resource in blocks(body, "resource") {
        let kind = first_label(resource).unwrap_or_default();
        let policy_keys: &[&str] = match kind {
            "aws_iam_role" => &["assume_role_policy"],
            "aws_iam_role_policy" | "aws_iam_policy" | "aws_iam_user_policy" | "aws_iam_group_policy" => {
                &["policy"]
            }
            "aws_iam_role_policy_attachment" | "aws_iam_policy_attachment" => {
                problems.push(format!("{}: {kind} attaches a managed policy", path.display()));
                continue;
            }
            _ => continue,
        };
        if attr(resource.body(), "managed_policy_arns").is_some() {
            problems.push(format!("{}: {kind} sets managed_policy_arns", path.display()));
        }
        if blocks(resource.body(), "inline_policy").next().is_some() {
            problems.push(format!("{}: {kind} has an inline_policy block", path.display()));
        }
        for key in policy_keys {
            let Some(expr) = attr(resource.body(), key) else {
                continue;
            };
            let from_document = reference_path(expr).is_some_and(|parts| {
                let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                match parts.as_slice() {
                    ["data", "aws_iam_policy_document", _, "json"] => true,
                    // A module's ready-made policy: its documents are walked by this same test.
                    ["module", _, output] => output.ends_with("_policy_json"),
                    _ => false,
                }
            });
            if !from_document {
                problems.push(format!(
                    "{}: {kind}.{key} is not data.aws_iam_policy_document.<name>.json",
                    path.display()
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The Lambda consumer
// ---------------------------------------------------------------------------------------------

/// The one `module` block in `bodies` whose `source` ends with `modules/<name>`.
fn module_call<'a>(bodies: &'a [Body], name: &str) -> Result<&'a Block> {
    let suffix = format!("modules/{name}");
    let calls: Vec<&Block> = blocks_in(bodies, "module")
        .filter(|call| {
            attr(call.body(), "source")
                .and_then(as_string)
                .is_some_and(|source| source.trim_end_matches('/').ends_with(&suffix))
        })
        .collect();
    match calls.as_slice() {
        [call] => Ok(call),
        _ => bail!(
            "expected exactly one call of modules/{name}, found {}",
            calls.len()
        ),
    }
}

/// The number a module call passes for `input`: a literal, a `var.x` of the calling module (its
/// default), or, when the call does not set it, the called module's own default.
fn module_input_number(caller: &[Body], call: &Block, module: &str, input: &str) -> Result<u64> {
    let Some(expr) = attr(call.body(), input) else {
        let called = parse_module(&module_dir(module))?;
        return variable_default_number(&called, input);
    };
    if let Some(number) = as_number(expr) {
        return Ok(number);
    }
    match traversal_path(expr).as_deref() {
        Some([root, name]) if root == "var" => variable_default_number(caller, name),
        _ => bail!("{module}'s {input} is neither a number literal nor a var.<name> with a default"),
    }
}

#[test]
fn lambda_example_keeps_visibility_at_six_times_the_timeout() -> Result<()> {
    let example = parse_module(&infra_dir().join("examples/lambda"))?;
    let queue = module_call(&example, "queue")?;
    let consumer = module_call(&example, "lambda-consumer")?;

    let visibility = module_input_number(&example, queue, "queue", "visibility_timeout_seconds")?;
    let timeout = module_input_number(&example, consumer, "lambda-consumer", "timeout_seconds")?;
    ensure!(
        visibility >= runtime::LAMBDA_VISIBILITY_RATIO * timeout,
        "the queue's visibility timeout ({visibility} s) must be at least {}x the Lambda timeout \
         ({timeout} s)",
        runtime::LAMBDA_VISIBILITY_RATIO
    );

    // The consumer's own precondition must see the same number: the queue module's output.
    let passed = required_attr(consumer.body(), "queue_visibility_timeout_seconds")?;
    let queue_label = first_label(queue).unwrap_or_default();
    let from_queue = traversal_path(passed)
        .is_some_and(|parts| parts == ["module", queue_label, "visibility_timeout_seconds"]);
    ensure!(
        from_queue || as_number(passed) == Some(visibility),
        "queue_visibility_timeout_seconds must be module.{queue_label}.visibility_timeout_seconds"
    );
    Ok(())
}

#[test]
fn lambda_consumer_checks_the_six_times_rule() -> Result<()> {
    let bodies = parse_module(&module_dir("lambda-consumer"))?;
    let function = single_resource(&bodies, "aws_lambda_function")?.body();
    let lifecycle = single_block(function, "lifecycle")?.body();

    let wanted = format!(
        "var.queue_visibility_timeout_seconds >= {} * var.timeout_seconds + var.maximum_batching_window_in_seconds",
        runtime::LAMBDA_VISIBILITY_RATIO
    );
    let mut conditions = Vec::new();
    for precondition in blocks(lifecycle, "precondition") {
        conditions.push(hcl::format::to_string(required_attr(
            precondition.body(),
            "condition",
        )?)?);
    }
    ensure!(
        conditions
            .iter()
            .any(|condition| condition.split_whitespace().eq(wanted.split_whitespace())),
        "aws_lambda_function needs the precondition `{wanted}`; found {conditions:?}"
    );
    Ok(())
}

#[test]
fn lambda_consumer_reports_batch_item_failures() -> Result<()> {
    let bodies = parse_module(&module_dir("lambda-consumer"))?;
    let mapping = single_resource(&bodies, "aws_lambda_event_source_mapping")?.body();

    let mut response_types = Vec::new();
    string_literals(
        required_attr(mapping, "function_response_types")?,
        &mut response_types,
    );
    ensure!(
        response_types
            .iter()
            .any(|kind| kind == "ReportBatchItemFailures"),
        "the event source mapping must set function_response_types = [\"ReportBatchItemFailures\"]"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// IAM actions: the policies, the lists in the code, and the SDK calls behind them
// ---------------------------------------------------------------------------------------------

/// Every `aws_sdk_sqs::Client` operation, as the method the code calls.
const SQS_OPERATIONS: [&str; 23] = [
    "add_permission",
    "cancel_message_move_task",
    "change_message_visibility",
    "change_message_visibility_batch",
    "create_queue",
    "delete_message",
    "delete_message_batch",
    "delete_queue",
    "get_queue_attributes",
    "get_queue_url",
    "list_dead_letter_source_queues",
    "list_message_move_tasks",
    "list_queue_tags",
    "list_queues",
    "purge_queue",
    "receive_message",
    "remove_permission",
    "send_message",
    "send_message_batch",
    "set_queue_attributes",
    "start_message_move_task",
    "tag_queue",
    "untag_queue",
];

/// The `aws_sdk_dynamodb::Client` operations an item store could call.
const DYNAMODB_OPERATIONS: [&str; 13] = [
    "batch_get_item",
    "batch_write_item",
    "create_table",
    "delete_item",
    "delete_table",
    "describe_table",
    "get_item",
    "put_item",
    "query",
    "scan",
    "transact_get_items",
    "transact_write_items",
    "update_item",
];

/// The `aws_sdk_cloudwatch::Client` metric reads the console could call.
const CLOUDWATCH_OPERATIONS: [&str; 3] = ["get_metric_data", "get_metric_statistics", "list_metrics"];

/// The `aws_sdk_s3::Client` object operations a payload store could call.
const S3_OPERATIONS: [&str; 6] = [
    "copy_object",
    "delete_object",
    "delete_objects",
    "get_object",
    "head_object",
    "put_object",
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates")
}

/// The SDK operations called (`.operation()`) in the non-test code of `files` (relative to `crates/`).
fn sdk_calls(files: &[&str], operations: &[&str]) -> Result<BTreeSet<String>> {
    let mut called = BTreeSet::new();
    for file in files {
        let path = crates_dir().join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        // Unit tests at the end of a file call whatever they like.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for operation in operations {
            if code.contains(&format!(".{operation}()")) {
                called.insert((*operation).to_owned());
            }
        }
    }
    Ok(called)
}

/// The operations of a permission list.
fn operations(list: &[(&str, &str)]) -> BTreeSet<String> {
    list.iter()
        .map(|(operation, _)| (*operation).to_owned())
        .collect()
}

/// The IAM actions of a permission list.
fn actions(list: &[(&str, &str)]) -> BTreeSet<String> {
    list.iter().map(|(_, action)| (*action).to_owned()).collect()
}

/// The actions of the statement with `sid` in `data "aws_iam_policy_document" "<document>"`.
fn statement_actions(bodies: &[Body], document: &str, sid: &str) -> Result<BTreeSet<String>> {
    let block = blocks_in(bodies, "data")
        .find(|block| {
            first_label(block) == Some("aws_iam_policy_document")
                && block.labels().get(1).map(|label| label.as_str()) == Some(document)
        })
        .with_context(|| format!("no aws_iam_policy_document \"{document}\""))?;
    let statement = statements(block.body())
        .into_iter()
        .find(|statement| attr(statement, "sid").and_then(as_string).as_deref() == Some(sid))
        .with_context(|| format!("policy document {document} has no statement {sid}"))?;
    Ok(statement_strings(statement, "actions").into_iter().collect())
}

/// A role, the source files of its calls, the SDK's operations, and the operations its list names.
type CallGroup<'a> = (&'a str, &'a [&'a str], &'a [&'a str], BTreeSet<String>);

/// A module's files, a policy document, a statement id, and the list it must grant.
type PolicyCheck<'a> = (&'a [Body], &'a str, &'a str, &'a [(&'a str, &'a str)]);

#[test]
fn the_code_lists_every_sdk_call_it_makes() -> Result<()> {
    use conveyor_dynamodb::iam::CONSUMER_TABLE;
    use conveyor_sqs::iam::{
        CONSUMER_DEAD_LETTER_QUEUE, CONSUMER_QUEUE, OPERATOR, OPERATOR_ACCOUNT, PRODUCER,
    };

    let consumer_files = [
        "conveyor-sqs/src/queue.rs",
        "conveyor-sqs/src/send.rs",
        "conveyor-lambda/src/queues.rs",
    ];
    let mut consumer = operations(CONSUMER_QUEUE);
    consumer.extend(operations(CONSUMER_DEAD_LETTER_QUEUE));
    let producer_files = [
        "conveyor-sqs/src/producer.rs",
        "conveyor-sqs/src/send.rs",
        "conveyor-sqs/src/admin/queue_ref.rs",
    ];
    let admin_dir = crates_dir().join("conveyor-sqs/src/admin");
    let mut operator_files = Vec::new();
    for path in files_under(&admin_dir, &[".rs"])? {
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        // `create.rs` is `conveyor local init` (emulators only); `tests.rs` is tests.
        if name != "create.rs" && name != "tests.rs" {
            operator_files.push(format!("conveyor-sqs/src/admin/{name}"));
        }
    }
    let operator_files: Vec<&str> = operator_files.iter().map(String::as_str).collect();

    let mut payload_calls = operations(conveyor_s3::iam::CONSUMER);
    payload_calls.extend(operations(conveyor_s3::iam::PRODUCER));
    let groups: [CallGroup; 6] = [
        ("consumer (SQS)", &consumer_files, &SQS_OPERATIONS, consumer),
        ("producer", &producer_files, &SQS_OPERATIONS, operations(PRODUCER)),
        (
            "operator",
            &operator_files,
            &SQS_OPERATIONS,
            // ListQueues is listed apart: IAM grants it on `*` only, which infra/ never does.
            operations(OPERATOR)
                .union(&operations(OPERATOR_ACCOUNT))
                .cloned()
                .collect(),
        ),
        (
            "consumer (DynamoDB)",
            // The worker's scheduler claims ticks in the same table with the same permissions.
            &[
                "conveyor-dynamodb/src/store.rs",
                "conveyor-dynamodb/src/flows.rs",
                "conveyor-schedule/src/store.rs",
            ],
            &DYNAMODB_OPERATIONS,
            operations(CONSUMER_TABLE),
        ),
        (
            "payload store (S3)",
            &["conveyor-s3/src/store.rs"],
            &S3_OPERATIONS,
            payload_calls,
        ),
        (
            "console (CloudWatch)",
            &["conveyor-console/src/fair_queues.rs"],
            &CLOUDWATCH_OPERATIONS,
            operations(conveyor_console::iam::CLOUDWATCH),
        ),
    ];
    let mut problems = Vec::new();
    for (role, files, known, listed) in groups {
        let called = sdk_calls(files, known)?;
        ensure!(!called.is_empty(), "{role}: found no SDK call in {files:?}");
        for missing in called.difference(&listed) {
            problems.push(format!(
                "{role}: the code calls {missing} but the iam list does not name it (add it, and its action to the policy)"
            ));
        }
        for stale in listed.difference(&called) {
            problems.push(format!(
                "{role}: the iam list names {stale}, which {files:?} never call"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn the_policies_grant_exactly_the_listed_actions() -> Result<()> {
    use conveyor_dynamodb::iam::{CONSUMER_TABLE, OPERATOR_TABLE, PRODUCER_TABLE};
    use conveyor_sqs::iam::{CONSUMER_DEAD_LETTER_QUEUE, CONSUMER_QUEUE, OPERATOR, PRODUCER};

    let permissions = parse_module(&module_dir("consumer-permissions"))?;
    let queue = parse_module(&module_dir("queue"))?;
    let table = parse_module(&module_dir("idempotency-table"))?;
    let payload_bucket = parse_module(&module_dir("payload-bucket"))?;
    let checks: [PolicyCheck; 10] = [
        (&permissions, "this", "ConsumeQueue", CONSUMER_QUEUE),
        (
            &permissions,
            "this",
            "SendToDeadLetterQueue",
            CONSUMER_DEAD_LETTER_QUEUE,
        ),
        (&permissions, "this", "IdempotencyRecords", CONSUMER_TABLE),
        (&queue, "producer", "SendJobs", PRODUCER),
        (&queue, "operator", "OperateQueues", OPERATOR),
        (
            &queue,
            "operator",
            "ReadFairQueueMetrics",
            conveyor_console::iam::CLOUDWATCH,
        ),
        (&table, "producer", "TrackJobs", PRODUCER_TABLE),
        (&table, "operator", "OperateJobs", OPERATOR_TABLE),
        (
            &permissions,
            "this",
            "ReadAndDeletePayloads",
            conveyor_s3::iam::CONSUMER,
        ),
        (
            &payload_bucket,
            "producer",
            "WritePayloads",
            conveyor_s3::iam::PRODUCER,
        ),
    ];
    for (bodies, document, sid, list) in checks {
        let granted = statement_actions(bodies, document, sid)?;
        let needed = actions(list);
        ensure!(
            granted == needed,
            "policy {document}/{sid} grants {granted:?}; the code needs {needed:?}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Environment variables the modules set
// ---------------------------------------------------------------------------------------------

/// The literal keys of every object inside `expr` (through `merge(...)` and conditionals).
fn object_keys(expr: &Expression, out: &mut BTreeSet<String>) {
    match expr {
        Expression::Object(object) => {
            for (key, value) in object {
                let key = match key {
                    hcl::expr::ObjectKey::Identifier(identifier) => Some(identifier.as_str().to_owned()),
                    hcl::expr::ObjectKey::Expression(expr) => as_string(expr),
                    _ => None,
                };
                out.extend(key);
                object_keys(value, out);
            }
        }
        Expression::FuncCall(call) => call.args.iter().for_each(|arg| object_keys(arg, out)),
        Expression::Conditional(conditional) => {
            object_keys(&conditional.true_expr, out);
            object_keys(&conditional.false_expr, out);
        }
        Expression::Parenthesis(inner) => object_keys(inner, out),
        _ => {}
    }
}

fn conveyor_keys(expr: &Expression) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    object_keys(expr, &mut keys);
    keys.into_iter()
        .filter(|key| key.starts_with("CONVEYOR_"))
        .collect()
}

#[test]
fn the_modules_set_only_variables_the_code_reads() -> Result<()> {
    use conveyor_worker::config::{
        ENV_DRAIN_DEADLINE_SECS, ENV_LISTEN_ADDR, ENV_QUEUE_URL, ENV_STOP_TIMEOUT_SECS,
        ENV_VISIBILITY_TIMEOUT_SECS, OTHER_CONVEYOR_VARIABLES, WORKER_VARIABLES,
    };
    let log_format = conveyor_core::runtime::ENV_LOG_FORMAT;
    let table = conveyor_examples::TABLE_ENV;

    let ecs = parse_module(&module_dir("ecs-consumer"))?;
    let environment = blocks_in(&ecs, "locals")
        .find_map(|block| attr(block.body(), "environment"))
        .context("ecs-consumer has no local environment")?;
    let set: BTreeSet<String> = conveyor_keys(environment);
    let read: BTreeSet<&str> = WORKER_VARIABLES
        .iter()
        .map(|variable| variable.name)
        .chain(OTHER_CONVEYOR_VARIABLES.iter().copied())
        .collect();
    for name in &set {
        ensure!(
            read.contains(name.as_str()),
            "ecs-consumer sets {name}, which the worker does not read"
        );
    }
    let expected: BTreeSet<String> = [
        ENV_QUEUE_URL,
        table,
        ENV_STOP_TIMEOUT_SECS,
        ENV_DRAIN_DEADLINE_SECS,
        ENV_VISIBILITY_TIMEOUT_SECS,
        ENV_LISTEN_ADDR,
        log_format,
        conveyor_s3::BUCKET_ENV,
    ]
    .iter()
    .map(|name| (*name).to_owned())
    .collect();
    ensure!(
        set == expected,
        "ecs-consumer sets {set:?}; expected {expected:?}"
    );

    let lambda = parse_module(&module_dir("lambda-consumer"))?;
    let function = single_resource(&lambda, "aws_lambda_function")?.body();
    let environment = single_block(function, "environment")?.body();
    let set = conveyor_keys(required_attr(environment, "variables")?);
    let lambda_reads: BTreeSet<&str> = [
        conveyor_lambda::BATCH_CONCURRENCY_ENV,
        conveyor_lambda::DEADLINE_MARGIN_ENV,
        conveyor_lambda::FAIL_WHEN_ALL_FAIL_ENV,
        conveyor_lambda::FIFO_FAILURE_ENV,
        conveyor_lambda::REJECT_MODE_ENV,
        table,
        log_format,
        conveyor_s3::BUCKET_ENV,
    ]
    .into_iter()
    .collect();
    for name in &set {
        ensure!(
            lambda_reads.contains(name.as_str()),
            "lambda-consumer sets {name}, which the Lambda adapter does not read (it finds its queue from the event)"
        );
    }
    ensure!(
        set.contains(table) && set.contains(log_format),
        "lambda-consumer must set {table} and {log_format}; sets {set:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Limits: the numbers Terraform checks are the code's
// ---------------------------------------------------------------------------------------------

/// Every `validation` condition of `variable "<name>"`, formatted, without whitespace.
fn validation_conditions(bodies: &[Body], name: &str) -> Result<Vec<String>> {
    let variable = blocks_in(bodies, "variable")
        .find(|block| first_label(block) == Some(name))
        .with_context(|| format!("variable \"{name}\" is not declared"))?;
    let mut conditions = Vec::new();
    for validation in blocks(variable.body(), "validation") {
        let condition = hcl::format::to_string(required_attr(validation.body(), "condition")?)?;
        conditions.push(condition.split_whitespace().collect());
    }
    Ok(conditions)
}

/// Every precondition of every resource of a module, formatted, without whitespace.
fn preconditions(bodies: &[Body]) -> Result<Vec<String>> {
    let mut conditions = Vec::new();
    for resource in blocks_in(bodies, "resource") {
        for lifecycle in blocks(resource.body(), "lifecycle") {
            for precondition in blocks(lifecycle.body(), "precondition") {
                let condition = hcl::format::to_string(required_attr(precondition.body(), "condition")?)?;
                conditions.push(condition.split_whitespace().collect());
            }
        }
    }
    Ok(conditions)
}

fn ensure_mentions(conditions: &[String], needle: &str, what: &str) -> Result<()> {
    let needle: String = needle.split_whitespace().collect();
    ensure!(
        conditions.iter().any(|condition| condition.contains(&needle)),
        "{what}: no condition contains `{needle}`; found {conditions:?}"
    );
    Ok(())
}

fn local_number(bodies: &[Body], name: &str) -> Result<u64> {
    let value = blocks_in(bodies, "locals")
        .find_map(|block| attr(block.body(), name))
        .with_context(|| format!("no local {name}"))?;
    as_number(value).with_context(|| format!("local {name} is not a number"))
}

#[test]
fn the_limits_terraform_checks_are_the_codes() -> Result<()> {
    use conveyor_core::limits::{MAX_RECEIVE_MESSAGES, MAX_VISIBILITY_TIMEOUT, MAX_WAIT_TIME};
    let max_visibility = MAX_VISIBILITY_TIMEOUT.as_secs();

    let queue = parse_module(&module_dir("queue"))?;
    ensure_mentions(
        &validation_conditions(&queue, "visibility_timeout_seconds")?,
        &format!("var.visibility_timeout_seconds <= {max_visibility}"),
        "queue visibility_timeout_seconds",
    )?;
    let max_message = conveyor_core::limits::MAX_MESSAGE_BYTES;
    ensure_mentions(
        &validation_conditions(&queue, "max_message_size")?,
        &format!("var.max_message_size <= {max_message}"),
        "queue max_message_size",
    )?;
    let default = variable_default_number(&queue, "max_message_size")?;
    ensure!(
        default == max_message as u64,
        "queue max_message_size defaults to {default}, SQS's limit (MAX_MESSAGE_BYTES) is {max_message}"
    );
    ensure_mentions(
        &validation_conditions(&queue, "receive_wait_time_seconds")?,
        &format!("var.receive_wait_time_seconds <= {}", MAX_WAIT_TIME.as_secs()),
        "queue receive_wait_time_seconds",
    )?;
    ensure!(
        local_number(&queue, "max_queue_name_length")? == 80,
        "SQS names hold 80 characters"
    );

    let ecs = parse_module(&module_dir("ecs-consumer"))?;
    let reserve = runtime::SHUTDOWN_RESERVE.as_secs();
    let min_visibility = runtime::MIN_VISIBILITY_TIMEOUT.as_secs();
    ensure!(local_number(&ecs, "shutdown_reserve_seconds")? == reserve);
    ensure!(local_number(&ecs, "min_visibility_timeout_seconds")? == min_visibility);
    // The worker refuses a stop timeout of the reserve or less: whole seconds start at reserve + 1.
    ensure_mentions(
        &validation_conditions(&ecs, "stop_timeout_seconds")?,
        &format!("var.stop_timeout_seconds >= {}", reserve + 1),
        "ecs-consumer stop_timeout_seconds",
    )?;
    let visibility = validation_conditions(&ecs, "visibility_timeout_seconds")?;
    ensure_mentions(
        &visibility,
        &format!(">= {min_visibility}"),
        "ecs-consumer visibility_timeout_seconds",
    )?;
    ensure_mentions(
        &visibility,
        &format!("<= {max_visibility}"),
        "ecs-consumer visibility_timeout_seconds",
    )?;
    let ecs_preconditions = preconditions(&ecs)?;
    ensure_mentions(
        &ecs_preconditions,
        "coalesce(var.drain_deadline_seconds, 0) + local.shutdown_reserve_seconds <= var.stop_timeout_seconds",
        "ecs-consumer drain precondition",
    )?;
    ensure_mentions(
        &ecs_preconditions,
        ">= local.min_visibility_timeout_seconds",
        "ecs-consumer queue visibility precondition",
    )?;

    let lambda = parse_module(&module_dir("lambda-consumer"))?;
    let lambda_preconditions = preconditions(&lambda)?;
    ensure_mentions(
        &lambda_preconditions,
        &format!("var.batch_size <= {MAX_RECEIVE_MESSAGES}"),
        "lambda-consumer FIFO batch precondition",
    )?;
    ensure_mentions(
        &lambda_preconditions,
        "var.reserved_concurrent_executions >= coalesce(local.maximum_concurrency, 0)",
        "lambda-consumer reserved concurrency precondition",
    )?;
    ensure_mentions(
        &lambda_preconditions,
        "var.provisioned_pollers == null || var.maximum_concurrency == null",
        "lambda-consumer provisioned mode precondition",
    )?;
    Ok(())
}
