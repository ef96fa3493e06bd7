//! The Terraform in `infra/` run with the real tools: `fmt`, `init` + `validate` of every module and
//! example, `plan` of both examples with the LocalStack override, every precondition refusing its
//! violation (with the intended message, and for the shutdown contract the worker's own verdict), and
//! `apply` of what the emulators accept, with the example worker sending a permanent failure into the
//! applied dead-letter queue, then `destroy`.
//!
//! It needs `terraform` and the `hashicorp/aws` provider (the registry, or a mirror such as
//! `/opt/tf-plugins`, found by `conveyor_e2e::terraform`). Without them each test prints
//! `SKIPPED <step>: <why>` and passes. Run it with `cargo test -p conveyor-e2e --test terraform`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use conveyor_core::port::Queue;
use conveyor_e2e::terraform::{InfraCopy, TERRAFORM_SERVICES, Terraform, run_parallel, write_file};
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::localstack;
use conveyor_worker::config::{QueueConfig, WorkerConfig};

/// Every folder `terraform validate` must accept.
const CONFIGURATIONS: [&str; 11] = [
    "modules/queue",
    "modules/payload-bucket",
    "modules/schedules",
    "modules/idempotency-table",
    "modules/consumer-permissions",
    "modules/lambda-consumer",
    "modules/ecs-consumer",
    "modules/outbox-relay",
    "examples/lambda",
    "examples/ecs",
    "tests/localstack",
];

/// Terraform processes at once: each loads the 700 MB provider; two keep both cores busy.
const PARALLEL: usize = 2;

#[test]
fn fmt_and_validate_every_module_and_example() -> Result<()> {
    let step = "terraform fmt/init/validate";
    let Some(terraform) = Terraform::find(step)? else {
        return Ok(());
    };
    let infra = conveyor_e2e::terraform::infra_dir();
    terraform
        .run(&infra, &["fmt", "-check", "-recursive", "-diff", "-no-color"])
        .context("terraform fmt -check -recursive infra: run `terraform fmt -recursive infra`")?;

    let copy = InfraCopy::new("validate")?;
    let jobs: Vec<Box<dyn FnOnce() -> Result<Option<String>> + Send + '_>> = CONFIGURATIONS
        .iter()
        .map(|relative| {
            let dir = copy.dir(relative);
            let terraform = &terraform;
            Box::new(move || -> Result<Option<String>> {
                if !terraform.init(&dir, step)? {
                    return Ok(None);
                }
                let text = terraform.run(&dir, &["validate", "-no-color"])?;
                // A warning here is a deprecation (or worse) that breaks on the next provider major.
                ensure!(!text.contains("Warning"), "{relative}: validate warns:\n{text}");
                Ok(Some((*relative).to_owned()))
            }) as Box<dyn FnOnce() -> Result<Option<String>> + Send + '_>
        })
        .collect();
    let mut validated = Vec::new();
    for result in run_parallel(PARALLEL, jobs) {
        match result? {
            Some(relative) => validated.push(relative),
            None => return Ok(()),
        }
    }
    eprintln!(
        "terraform validate passed for {} configurations with {}",
        validated.len(),
        terraform.provider_description()
    );
    Ok(())
}

#[test]
fn both_examples_plan_with_the_localstack_override() -> Result<()> {
    let step = "terraform plan of infra/examples";
    let Some(terraform) = Terraform::find(step)? else {
        return Ok(());
    };
    let copy = InfraCopy::new("plan")?;
    let package = copy.scratch().join("bootstrap.zip");
    write_file(&package, "not a real zip: plan only hashes it")?;
    let package_var = format!("package_path={}", package.display());
    let relay_package_var = format!("outbox_relay_package_path={}", package.display());
    let examples: [(&str, Vec<String>); 2] = [
        ("examples/lambda", vec![package_var, relay_package_var]),
        (
            "examples/ecs",
            vec![
                "container_image=example/worker:latest".to_owned(),
                "execution_role_arn=arn:aws:iam::000000000000:role/ecsTaskExecutionRole".to_owned(),
                "subnet_ids=[\"subnet-0abc\"]".to_owned(),
                "security_group_ids=[\"sg-0abc\"]".to_owned(),
            ],
        ),
    ];
    let jobs: Vec<Box<dyn FnOnce() -> Result<bool> + Send + '_>> = examples
        .iter()
        .map(|(relative, vars)| {
            let dir = copy.dir(relative);
            let terraform = &terraform;
            Box::new(move || -> Result<bool> {
                let example = std::fs::read_to_string(dir.join("localstack_override.tf.example"))?;
                write_file(&dir.join("localstack_override.tf"), &example)?;
                if !terraform.init(&dir, step)? {
                    return Ok(false);
                }
                let mut args = vec!["plan", "-input=false", "-no-color", "-lock=false"];
                let var_args: Vec<String> = vars.iter().map(|var| format!("-var={var}")).collect();
                args.extend(var_args.iter().map(String::as_str));
                let text = terraform.run(&dir, &args)?;
                ensure!(
                    text.contains("to add, 0 to change, 0 to destroy"),
                    "{relative}: unexpected plan:\n{text}"
                );
                ensure!(!text.contains("Warning"), "{relative}: plan warns:\n{text}");
                Ok(true)
            }) as Box<dyn FnOnce() -> Result<bool> + Send + '_>
        })
        .collect();
    for planned in run_parallel(PARALLEL, jobs) {
        if !planned? {
            return Ok(());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Preconditions: each violation refused with its message
// ---------------------------------------------------------------------------------------------

/// One plan of one module: the inputs that differ from the module's valid baseline, and the message
/// the plan must fail with (`None`: it must pass).
struct Case {
    name: String,
    module: &'static str,
    inputs: Vec<(&'static str, String)>,
    refused_with: Option<&'static str>,
    /// `assert` blocks of the run: (condition, error message), on the planned values.
    asserts: Vec<(String, String)>,
}

fn case(
    name: &str,
    module: &'static str,
    inputs: &[(&'static str, &str)],
    refused_with: Option<&'static str>,
) -> Case {
    Case {
        name: name.to_owned(),
        module,
        inputs: inputs
            .iter()
            .map(|(key, value)| (*key, (*value).to_owned()))
            .collect(),
        refused_with,
        asserts: Vec::new(),
    }
}

const QUEUE_ARN: &str = "\"arn:aws:sqs:us-east-1:123456789012:jobs\"";
const FIFO_QUEUE_ARN: &str = "\"arn:aws:sqs:us-east-1:123456789012:jobs.fifo\"";
const DLQ_ARN: &str = "\"arn:aws:sqs:us-east-1:123456789012:jobs-dlq\"";
const TABLE_ARN: &str = "\"arn:aws:dynamodb:us-east-1:123456789012:table/jobs-idempotency\"";

/// Valid inputs of each module, which every case starts from.
fn baseline(module: &str, package: &str) -> Vec<(&'static str, String)> {
    let common = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        pairs
            .iter()
            .map(|(key, value)| (*key, (*value).to_owned()))
            .collect()
    };
    match module {
        // 256 KiB: the module's default, 1 MiB, needs the AWS provider 6.8 or later; the mirror here is 5.x,
        // whose plan refuses more than 262144 (modules/queue/README.md).
        "queue" => common(&[("name", "\"jobs\""), ("max_message_size", "262144")]),
        "schedules" => {
            // The example application's exported schedules (checked against the code in tests/schedules.rs).
            let file = conveyor_e2e::terraform::infra_dir().join("examples/lambda/schedules.json");
            let mut inputs = common(&[("queue_arn", QUEUE_ARN)]);
            inputs.push(("schedules_file", format!("{:?}", file.display().to_string())));
            inputs
        }
        "idempotency-table" => common(&[("name", "\"jobs-idempotency\"")]),
        "payload-bucket" => common(&[("name", "\"jobs-payloads\"")]),
        "consumer-permissions" => common(&[
            ("queue_arn", QUEUE_ARN),
            ("dlq_arn", DLQ_ARN),
            ("idempotency_table_arn", TABLE_ARN),
        ]),
        "lambda-consumer" => {
            let mut inputs = common(&[
                ("function_name", "\"jobs\""),
                ("queue_arn", QUEUE_ARN),
                ("dlq_arn", DLQ_ARN),
                ("idempotency_table_name", "\"jobs-idempotency\""),
                ("idempotency_table_arn", TABLE_ARN),
                ("queue_visibility_timeout_seconds", "60"),
                ("timeout_seconds", "10"),
            ]);
            inputs.push(("package_path", format!("{package:?}")));
            inputs
        }
        "outbox-relay" => {
            let mut inputs = common(&[
                ("name", "\"jobs-outbox-relay\""),
                ("table_name", "\"jobs-outbox\""),
                ("queue_arns", "[\"arn:aws:sqs:us-east-1:123456789012:jobs\"]"),
            ]);
            inputs.push(("package_path", format!("{package:?}")));
            inputs
        }
        "ecs-consumer" => common(&[
            ("name", "\"jobs\""),
            (
                "cluster_arn",
                "\"arn:aws:ecs:us-east-1:123456789012:cluster/jobs\"",
            ),
            ("container_image", "\"example/worker:latest\""),
            (
                "execution_role_arn",
                "\"arn:aws:iam::123456789012:role/ecsTaskExecutionRole\"",
            ),
            ("subnet_ids", "[\"subnet-0abc\"]"),
            ("security_group_ids", "[\"sg-0abc\"]"),
            ("queue_arn", QUEUE_ARN),
            (
                "queue_url",
                "\"https://sqs.us-east-1.amazonaws.com/123456789012/jobs\"",
            ),
            ("queue_name", "\"jobs\""),
            ("queue_visibility_timeout_seconds", "60"),
            ("dlq_arn", DLQ_ARN),
            ("idempotency_table_name", "\"jobs-idempotency\""),
            ("idempotency_table_arn", TABLE_ARN),
        ]),
        _ => Vec::new(),
    }
}

/// The stop-timeout/drain pairs planned against `ecs-consumer` and validated by the worker: Terraform
/// must accept exactly what `WorkerConfig::validate` accepts (`None`: drain left to the worker).
const SHUTDOWN_CASES: [(u64, Option<u64>); 10] = [
    (30, None),
    (30, Some(23)),
    (30, Some(24)),
    (90, Some(60)),
    (90, Some(84)),
    (8, Some(0)),
    (8, Some(1)),
    (7, None),
    (120, Some(113)),
    (120, Some(114)),
];

fn worker_accepts(stop: u64, drain: Option<u64>) -> bool {
    let config = WorkerConfig::default()
        .with_queues(vec![
            QueueConfig::new("https://sqs.us-east-1.amazonaws.com/123456789012/jobs").with_weight(1),
        ])
        .with_stop_timeout(Duration::from_secs(stop))
        .with_drain_deadline(drain.map(Duration::from_secs));
    config.validate().is_ok()
}

const DRAIN_MESSAGE: &str = "drain_deadline_seconds plus 7 s";
const STOP_MESSAGE: &str = "stop_timeout_seconds must be a whole number from 8 to 120";

fn cases() -> Vec<Case> {
    let long_name = format!("\"{}\"", "q".repeat(72));
    let longest_standard = format!("\"{}\"", "q".repeat(76));
    let long_role = format!("\"{}\"", "r".repeat(65));
    let mut cases = vec![
        // queue
        case("queue_valid", "queue", &[], None),
        case(
            "queue_longest_standard_name",
            "queue",
            &[("name", &longest_standard)],
            None,
        ),
        case(
            "queue_fifo_name_too_long",
            "queue",
            &[("name", &long_name), ("fifo", "true")],
            Some("the dead-letter queue's name"),
        ),
        case(
            "queue_content_deduplication_without_fifo",
            "queue",
            &[("content_based_deduplication", "true")],
            Some("content_based_deduplication applies only to FIFO queues"),
        ),
        case(
            "queue_dlq_retention_shorter",
            "queue",
            &[("dlq_message_retention_seconds", "60")],
            Some("dlq_message_retention_seconds must be at least message_retention_seconds"),
        ),
        case(
            "queue_kms_wildcard",
            "queue",
            &[("kms_master_key_id", "\"*\"")],
            Some("kms_master_key_id must be a KMS key ARN"),
        ),
        case(
            "queue_alarm_action_star",
            "queue",
            &[(
                "alarm_actions",
                "[\"arn:aws:sns:us-east-1:123456789012:oncall\", \"*\"]",
            )],
            Some("alarm_actions must list ARNs"),
        ),
        case(
            "queue_max_message_size_above_1_mib",
            "queue",
            &[("max_message_size", "1048577")],
            Some("max_message_size must be between 1024 and 1048576"),
        ),
        case(
            "queue_max_message_size_below_1_kib",
            "queue",
            &[("max_message_size", "1023")],
            Some("max_message_size must be between 1024 and 1048576"),
        ),
        case(
            "queue_max_message_size_smallest",
            "queue",
            &[("max_message_size", "1024")],
            None,
        ),
        case(
            "queue_alarm_action_topic",
            "queue",
            &[("alarm_actions", "[\"arn:aws:sns:us-east-1:123456789012:oncall\"]")],
            None,
        ),
        // schedules
        case("schedules_valid", "schedules", &[], None),
        case(
            "schedules_fifo_queue",
            "schedules",
            &[("queue_arn", "\"arn:aws:sqs:us-east-1:123456789012:jobs.fifo\"")],
            Some("queue_arn must be a standard SQS queue ARN"),
        ),
        case(
            "schedules_retries_over_the_limit",
            "schedules",
            &[("maximum_retry_attempts", "186")],
            Some("maximum_retry_attempts must be between 0 and 185"),
        ),
        // idempotency-table
        case("table_valid", "idempotency-table", &[], None),
        case(
            "table_kms_wildcard",
            "idempotency-table",
            &[("kms_key_arn", "\"arn:aws:kms:us-east-1:123456789012:key/*\"")],
            Some("kms_key_arn must be a KMS key ARN"),
        ),
        // payload-bucket
        case("payload_bucket_valid", "payload-bucket", &[], None),
        case(
            "payload_bucket_uppercase_name",
            "payload-bucket",
            &[("name", "\"Jobs_Payloads\"")],
            Some("name must be a valid S3 bucket name"),
        ),
        case(
            "payload_bucket_no_expiration",
            "payload-bucket",
            &[("expiration_days", "0")],
            Some("expiration_days must be a whole number of days, at least 1"),
        ),
        case(
            "payload_bucket_with_kms_key",
            "payload-bucket",
            &[(
                "kms_key_arn",
                "\"arn:aws:kms:us-east-1:123456789012:key/0b1c2d3e\"",
            )],
            None,
        ),
        // consumer-permissions
        case("permissions_valid", "consumer-permissions", &[], None),
        case(
            "permissions_table_wildcard",
            "consumer-permissions",
            &[(
                "idempotency_table_arn",
                "\"arn:aws:dynamodb:us-east-1:123456789012:table/*\"",
            )],
            Some("idempotency_table_arn must be one DynamoDB table ARN"),
        ),
        case(
            "permissions_kms_star",
            "consumer-permissions",
            &[("kms_key_arns", "[\"*\"]")],
            Some("kms_key_arns must list KMS key ARNs"),
        ),
        case(
            "permissions_payload_bucket",
            "consumer-permissions",
            &[("payload_bucket_arn", "\"arn:aws:s3:::jobs-payloads\"")],
            None,
        ),
        case(
            "permissions_payload_bucket_objects_wildcard",
            "consumer-permissions",
            &[("payload_bucket_arn", "\"arn:aws:s3:::jobs-payloads/*\"")],
            Some("payload_bucket_arn must be one S3 bucket ARN"),
        ),
        // outbox-relay
        case("outbox_lambda_valid", "outbox-relay", &[], None),
        case(
            "outbox_ecs_on_the_apps_table_valid",
            "outbox-relay",
            &[
                ("deploy_lambda", "false"),
                ("package_path", "null"),
                ("create_table", "false"),
                (
                    "table_arn",
                    "\"arn:aws:dynamodb:us-east-1:123456789012:table/app\"",
                ),
                ("max_attempts", "5"),
                ("lease_seconds", "10"),
            ],
            None,
        ),
        case(
            "outbox_lambda_on_the_apps_table_valid",
            "outbox-relay",
            &[
                ("create_table", "false"),
                (
                    "table_arn",
                    "\"arn:aws:dynamodb:us-east-1:123456789012:table/app\"",
                ),
                (
                    "stream_arn",
                    "\"arn:aws:dynamodb:us-east-1:123456789012:table/app/stream/2024-01-01T00:00:00.000\"",
                ),
            ],
            None,
        ),
        case(
            "outbox_existing_table_needs_its_arn",
            "outbox-relay",
            &[
                ("create_table", "false"),
                ("deploy_lambda", "false"),
                ("package_path", "null"),
            ],
            Some("set table_arn, and stream_arn when deploy_lambda"),
        ),
        case(
            "outbox_lambda_on_an_existing_table_needs_its_stream",
            "outbox-relay",
            &[
                ("create_table", "false"),
                (
                    "table_arn",
                    "\"arn:aws:dynamodb:us-east-1:123456789012:table/app\"",
                ),
            ],
            Some("set table_arn, and stream_arn when deploy_lambda"),
        ),
        case(
            "outbox_created_table_takes_no_stream",
            "outbox-relay",
            &[(
                "stream_arn",
                "\"arn:aws:dynamodb:us-east-1:123456789012:table/app/stream/2024-01-01T00:00:00.000\"",
            )],
            Some("create_table is true"),
        ),
        case(
            "outbox_lambda_needs_a_package",
            "outbox-relay",
            &[("package_path", "null")],
            Some("set package_path to the relay's zip"),
        ),
        case(
            "outbox_table_needs_a_sort_key",
            "outbox-relay",
            &[("sort_key", "\"\"")],
            Some("sort_key must name the table's sort key"),
        ),
        case(
            "outbox_retries_bounded",
            "outbox-relay",
            &[("maximum_retry_attempts", "-1")],
            Some("maximum_retry_attempts must be 0 to 10000"),
        ),
        case(
            "outbox_retries_in_range",
            "outbox-relay",
            &[("maximum_retry_attempts", "20000")],
            Some("maximum_retry_attempts must be 0 to 10000"),
        ),
        case(
            "outbox_record_age_bounded",
            "outbox-relay",
            &[("maximum_record_age_seconds", "-1")],
            Some("maximum_record_age_seconds must be 60 to 86400"),
        ),
        case(
            "outbox_parallel_shards_valid",
            "outbox-relay",
            &[("parallelization_factor", "10")],
            None,
        ),
        case(
            "outbox_parallelization_in_range",
            "outbox-relay",
            &[("parallelization_factor", "11")],
            Some("parallelization_factor must be 1 to 10"),
        ),
        case(
            "outbox_alarm_action_star",
            "outbox-relay",
            &[("alarm_actions", "[\"*\"]")],
            Some("alarm_actions must list ARNs"),
        ),
        case(
            "outbox_lease_at_least_three_seconds",
            "outbox-relay",
            &[("lease_seconds", "2")],
            Some("lease_seconds must be null or whole seconds, at least 3"),
        ),
        case(
            "outbox_queue_arns_checked",
            "outbox-relay",
            &[("queue_arns", "[\"jobs\"]")],
            Some("queue_arns must list at least one SQS queue ARN"),
        ),
        // lambda-consumer
        case("lambda_valid", "lambda-consumer", &[], None),
        case(
            "lambda_with_flow_sweep",
            "lambda-consumer",
            &[("flow_sweep", "true")],
            None,
        ),
        case(
            "lambda_with_timer_relay",
            "lambda-consumer",
            &[("timer_relay", "true")],
            None,
        ),
        case(
            "lambda_flow_sweep_kms_wildcard",
            "lambda-consumer",
            &[
                ("flow_sweep", "true"),
                (
                    "flow_sweep_kms_key_arn",
                    "\"arn:aws:kms:us-east-1:123456789012:key/*\"",
                ),
            ],
            Some("flow_sweep_kms_key_arn must be a KMS key ARN"),
        ),
        case(
            "lambda_with_payload_bucket",
            "lambda-consumer",
            &[(
                "payload_bucket",
                "{ name = \"jobs-payloads\", arn = \"arn:aws:s3:::jobs-payloads\" }",
            )],
            None,
        ),
        case(
            "lambda_window_counts_toward_visibility",
            "lambda-consumer",
            &[("maximum_batching_window_in_seconds", "1")],
            Some("at least 6 times the function timeout (timeout_seconds) plus the batching window"),
        ),
        case(
            "lambda_window_fits",
            "lambda-consumer",
            &[
                ("maximum_batching_window_in_seconds", "1"),
                ("queue_visibility_timeout_seconds", "61"),
            ],
            None,
        ),
        case(
            "lambda_six_times_rule",
            "lambda-consumer",
            &[("timeout_seconds", "11")],
            Some("at least 6 times the function timeout"),
        ),
        case(
            "lambda_reserved_below_maximum_concurrency",
            "lambda-consumer",
            &[
                ("reserved_concurrent_executions", "5"),
                ("maximum_concurrency", "10"),
            ],
            Some("reserved_concurrent_executions must be -1 (none reserved) or at least maximum_concurrency"),
        ),
        case(
            "lambda_reserved_at_maximum_concurrency",
            "lambda-consumer",
            &[
                ("reserved_concurrent_executions", "10"),
                ("maximum_concurrency", "10"),
            ],
            None,
        ),
        case(
            "lambda_provisioned_pollers_with_maximum_concurrency",
            "lambda-consumer",
            &[
                ("provisioned_pollers", "{ minimum = 2, maximum = 20 }"),
                ("maximum_concurrency", "10"),
            ],
            Some("provisioned_pollers and maximum_concurrency cannot be set together"),
        ),
        case(
            "lambda_provisioned_pollers_minimum_above_maximum",
            "lambda-consumer",
            &[("provisioned_pollers", "{ minimum = 30, maximum = 20 }")],
            Some("provisioned_pollers needs 2 <= minimum <= 200"),
        ),
        Case {
            asserts: vec![
                (
                    "length(aws_lambda_event_source_mapping.this.scaling_config) == 0".to_owned(),
                    "provisioned mode sets no maximum concurrency".to_owned(),
                ),
                (
                    "aws_lambda_event_source_mapping.this.provisioned_poller_config[0].minimum_pollers == 2 && aws_lambda_event_source_mapping.this.provisioned_poller_config[0].maximum_pollers == 20".to_owned(),
                    "the pollers as given".to_owned(),
                ),
            ],
            ..case(
                "lambda_provisioned_pollers",
                "lambda-consumer",
                &[("provisioned_pollers", "{ minimum = 2, maximum = 20 }")],
                None,
            )
        },
        Case {
            asserts: vec![(
                "aws_lambda_event_source_mapping.this.scaling_config[0].maximum_concurrency == 10 && length(aws_lambda_event_source_mapping.this.provisioned_poller_config) == 0".to_owned(),
                "on demand by default, at most 10 invocations".to_owned(),
            )],
            ..case("lambda_on_demand_by_default", "lambda-consumer", &[], None)
        },
        case(
            "lambda_fifo_batch_above_ten",
            "lambda-consumer",
            &[
                ("queue_arn", FIFO_QUEUE_ARN),
                ("batch_size", "11"),
                ("maximum_batching_window_in_seconds", "1"),
                ("queue_visibility_timeout_seconds", "61"),
            ],
            Some("The queue is a FIFO queue"),
        ),
        case(
            "lambda_fifo_window",
            "lambda-consumer",
            &[
                ("queue_arn", FIFO_QUEUE_ARN),
                ("maximum_batching_window_in_seconds", "1"),
                ("queue_visibility_timeout_seconds", "61"),
            ],
            Some("The queue is a FIFO queue"),
        ),
        case(
            "lambda_fifo_valid",
            "lambda-consumer",
            &[("queue_arn", FIFO_QUEUE_ARN)],
            None,
        ),
        case(
            "lambda_batch_above_ten_without_window",
            "lambda-consumer",
            &[("batch_size", "11")],
            Some("batch_size above 10 needs maximum_batching_window_in_seconds of at least 1"),
        ),
        case(
            "lambda_queue_arn_star",
            "lambda-consumer",
            &[("queue_arn", "\"*\"")],
            Some("queue_arn must be one SQS queue ARN"),
        ),
        case(
            "lambda_kms_star_in_list",
            "lambda-consumer",
            &[(
                "kms_key_arns",
                "[\"arn:aws:kms:us-east-1:123456789012:key/k\", \"*\"]",
            )],
            Some("kms_key_arns must list KMS key ARNs"),
        ),
        case(
            "lambda_ok_action_wildcard",
            "lambda-consumer",
            &[("ok_actions", "[\"arn:aws:sns:us-east-1:123456789012:*\"]")],
            Some("ok_actions must list ARNs"),
        ),
        case(
            "lambda_role_name_too_long",
            "lambda-consumer",
            &[("role_name", &long_role)],
            Some("role_name must be 1-64 characters"),
        ),
        // ecs-consumer
        case(
            "ecs_fargate_pair",
            "ecs-consumer",
            &[("cpu", "256"), ("memory", "4096")],
            Some("cpu and memory must form a Fargate pair"),
        ),
        case(
            "ecs_fargate_pair_valid",
            "ecs-consumer",
            &[("cpu", "1024"), ("memory", "3072")],
            None,
        ),
        case(
            "ecs_queue_visibility_below_worker_minimum",
            "ecs-consumer",
            &[("queue_visibility_timeout_seconds", "5")],
            Some("is below 10 s, the shortest the worker's heartbeat can keep"),
        ),
        case(
            "ecs_min_capacity_zero_without_scale_to_zero",
            "ecs-consumer",
            &[("min_capacity", "0")],
            Some("min_capacity 0 needs scale_to_zero = true"),
        ),
        case(
            "ecs_scale_to_zero",
            "ecs-consumer",
            &[
                ("min_capacity", "0"),
                ("desired_count", "0"),
                ("scale_to_zero", "true"),
                ("use_fargate_spot", "true"),
            ],
            None,
        ),
        case(
            "ecs_alarm_action_star",
            "ecs-consumer",
            &[("alarm_actions", "[\"*\"]")],
            Some("alarm_actions must list ARNs"),
        ),
        case(
            "ecs_execution_role_star",
            "ecs-consumer",
            &[("execution_role_arn", "\"*\"")],
            Some("execution_role_arn must be one IAM role ARN"),
        ),
        case(
            "ecs_dlq_arn_wildcard",
            "ecs-consumer",
            &[("dlq_arn", "\"arn:aws:sqs:us-east-1:123456789012:*\"")],
            Some("dlq_arn must be one SQS queue ARN"),
        ),
        case(
            "ecs_visibility_override_below_minimum",
            "ecs-consumer",
            &[("visibility_timeout_seconds", "9")],
            Some("visibility_timeout_seconds must be null or 10-43200"),
        ),
    ];
    for (stop, drain) in SHUTDOWN_CASES {
        let mut inputs = vec![("stop_timeout_seconds", stop.to_string())];
        if let Some(drain) = drain {
            inputs.push(("drain_deadline_seconds", drain.to_string()));
        }
        let drain_text = drain.map_or_else(|| "default".to_owned(), |drain| drain.to_string());
        let refused_with = if worker_accepts(stop, drain) {
            None
        } else if stop <= conveyor_core::runtime::SHUTDOWN_RESERVE.as_secs() {
            Some(STOP_MESSAGE)
        } else {
            Some(DRAIN_MESSAGE)
        };
        cases.push(Case {
            name: format!("ecs_shutdown_stop_{stop}_drain_{drain_text}"),
            module: "ecs-consumer",
            inputs,
            refused_with,
            asserts: Vec::new(),
        });
    }
    cases
}

/// One `.tftest.hcl` per case (a failed run skips the rest of its file): a mock AWS provider, one
/// `command = plan` run of the module with the baseline inputs and the case's overrides.
fn test_file(case: &Case, package: &str) -> String {
    let mut inputs: BTreeMap<&str, String> = baseline(case.module, package).into_iter().collect();
    inputs.extend(case.inputs.iter().cloned());
    // Mocked data sources return random strings; policy documents must be JSON for the resources
    // that take them.
    let mut text = String::from(
        "mock_provider \"aws\" {\n  mock_data \"aws_iam_policy_document\" {\n    defaults = {\n      \
         json = \"{\\\"Version\\\":\\\"2012-10-17\\\",\\\"Statement\\\":[]}\"\n    }\n  }\n}\n\n",
    );
    let _ = writeln!(text, "run \"{}\" {{\n  command = plan\n", case.name);
    let _ = writeln!(
        text,
        "  module {{\n    source = \"../../modules/{}\"\n  }}\n",
        case.module
    );
    text.push_str("  variables {\n");
    for (key, value) in &inputs {
        let _ = writeln!(text, "    {key} = {value}");
    }
    text.push_str("  }\n");
    for (condition, message) in &case.asserts {
        let _ = writeln!(
            text,
            "\n  assert {{\n    condition     = {condition}\n    error_message = {message:?}\n  }}"
        );
    }
    text.push_str("}\n");
    text
}

/// The schedules module given a file with a tenant (format 2): the schedule with the tenant gets the
/// universal SendMessage target with the tenant as `MessageGroupId`, the body as exported (its
/// Scheduler placeholder unescaped) and the queue's URL; the one without keeps the templated target.
fn schedules_with_a_tenant(scratch: &std::path::Path) -> Result<Case> {
    use conveyor_schedule::{MissedTicks, Schedule};
    let start = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let schedule = |name: &str| -> Result<Schedule> {
        Ok(Schedule::every(name, Duration::from_secs(3600))?
            .job_of("report", 1, &serde_json::json!({"kind": "sales"}))?
            .missed_ticks(MissedTicks::All)
            .starting(start))
    };
    let schedules = [schedule("tenant-hourly")?.tenant("acme-42")?, schedule("plain")?];
    let text = conveyor_schedule::export(&schedules)?;
    let file: serde_json::Value = serde_json::from_str(&text)?;
    let path = scratch.join("schedules-with-a-tenant.json");
    write_file(&path, &text)?;
    // HCL string literals of the two bodies (JSON's escapes are HCL's; the bodies hold no `${`).
    let body = |index: usize| serde_json::to_string(&file["schedules"][index]["input"]);
    let (tenant_body, plain_body) = (body(0)?, body(1)?);
    let target = |name: &str| format!("aws_scheduler_schedule.this[\"{name}\"].target[0]");
    let sent = format!("jsondecode({}.input)", target("tenant-hourly"));
    let asserts = [
        (
            format!(
                "{}.arn == \"arn:aws:scheduler:::aws-sdk:sqs:sendMessage\"",
                target("tenant-hourly")
            ),
            "a schedule with a tenant has the universal SendMessage target",
        ),
        (
            format!("{sent}.MessageGroupId == \"acme-42\""),
            "the tenant is the MessageGroupId",
        ),
        (
            format!("{sent}.QueueUrl == \"https://sqs.us-east-1.amazonaws.com/123456789012/jobs\""),
            "the queue's URL comes from its ARN",
        ),
        (
            format!("{sent}.MessageBody == {tenant_body}"),
            "the body is the exported input",
        ),
        (
            format!(
                "strcontains({}.input, \"<aws.scheduler.scheduled-time>\")",
                target("tenant-hourly")
            ),
            "the placeholder reaches Scheduler unescaped",
        ),
        (
            format!("{}.arn == var.queue_arn", target("plain")),
            "no tenant: the templated target",
        ),
        (
            format!("{}.input == {plain_body}", target("plain")),
            "no tenant: the input as it was",
        ),
    ];
    Ok(Case {
        name: "schedules_with_a_tenant".to_owned(),
        module: "schedules",
        inputs: vec![("schedules_file", format!("{:?}", path.display().to_string()))],
        refused_with: None,
        asserts: asserts
            .into_iter()
            .map(|(condition, message)| (condition, message.to_owned()))
            .collect(),
    })
}

/// A run's outcome in `terraform test -json`: its status and the error details it printed.
#[derive(Default, Debug)]
struct RunOutcome {
    status: Option<String>,
    errors: Vec<String>,
}

fn parse_test_json(text: &str) -> BTreeMap<String, RunOutcome> {
    let mut runs: BTreeMap<String, RunOutcome> = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(run) = event["@testrun"].as_str() else {
            continue;
        };
        let outcome = runs.entry(run.to_owned()).or_default();
        if event["test_run"]["progress"] == "complete" {
            outcome.status = event["test_run"]["status"].as_str().map(str::to_owned);
        }
        if event["diagnostic"]["severity"] == "error" {
            outcome.errors.push(format!(
                "{}: {}",
                event["diagnostic"]["summary"].as_str().unwrap_or_default(),
                event["diagnostic"]["detail"].as_str().unwrap_or_default()
            ));
        }
    }
    runs
}

#[test]
fn every_precondition_refuses_its_violation_with_its_message() -> Result<()> {
    let step = "terraform test of the preconditions";
    let Some(terraform) = Terraform::find(step)? else {
        return Ok(());
    };
    let copy = InfraCopy::new("preconditions")?;
    let harness = copy.dir("tests/preconditions");
    let package = copy.scratch().join("bootstrap.zip");
    write_file(&package, "not a real zip: plan only hashes it")?;
    let package = package.display().to_string();
    write_file(
        &harness.join("main.tf"),
        "# Generated by tests/tests/terraform.rs: runs the modules' plans with a mock provider.\n\
         terraform {\n  required_providers {\n    aws = {\n      source = \"hashicorp/aws\"\n    }\n  }\n}\n",
    )?;
    let mut cases = cases();
    cases.push(schedules_with_a_tenant(&copy.scratch())?);
    for case in &cases {
        write_file(
            &harness.join("tests").join(format!("{}.tftest.hcl", case.name)),
            &test_file(case, &package),
        )?;
    }
    if !terraform.init(&harness, step)? {
        return Ok(());
    }
    // Fails overall (the refused cases fail their run); the verdicts are read per run.
    let output = terraform.output(&harness, &["test", "-json", "-no-color"])?;
    let text = String::from_utf8_lossy(&output.stdout);
    let runs = parse_test_json(&text);

    let mut problems = Vec::new();
    for case in &cases {
        let Some(outcome) = runs.get(&case.name) else {
            problems.push(format!("{}: no result from terraform test", case.name));
            continue;
        };
        let passed = outcome.status.as_deref() == Some("pass");
        match case.refused_with {
            None if !passed => problems.push(format!(
                "{}: must plan, but {:?}: {:?}",
                case.name, outcome.status, outcome.errors
            )),
            Some(message) if passed => {
                problems.push(format!(
                    "{}: must be refused with {message:?}, but planned",
                    case.name
                ));
            }
            Some(message) => {
                let ours = outcome.errors.iter().any(|error| error.contains(message));
                let only_ours = outcome.errors.len() == 1;
                if !ours || !only_ours {
                    problems.push(format!(
                        "{}: must be refused with exactly {message:?}; errors: {:?}",
                        case.name, outcome.errors
                    ));
                }
            }
            None => {}
        }
    }
    ensure!(
        problems.is_empty(),
        "{} of {} precondition cases went wrong:\n{}\n\nterraform test output:\n{}{}",
        problems.len(),
        cases.len(),
        problems.join("\n"),
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "{} precondition cases planned or refused as intended",
        cases.len()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The outbox relay: the table, stream, sweep and alarms the code expects
// ---------------------------------------------------------------------------------------------

/// The EMF line the relay's sweep prints: its namespace and metric names, read from the code.
fn outbox_emf_metrics() -> Result<(String, Vec<String>)> {
    let line = conveyor_lambda::outbox::backlog_emf(
        &conveyor_outbox::Backlog::default(),
        std::time::SystemTime::now(),
    );
    let emf: serde_json::Value = serde_json::from_str(&line).context("the sweep's EMF line is not JSON")?;
    let directive = &emf["_aws"]["CloudWatchMetrics"][0];
    let namespace = directive["Namespace"]
        .as_str()
        .context("the EMF line has no namespace")?
        .to_owned();
    let metrics = directive["Metrics"]
        .as_array()
        .context("the EMF line has no metrics")?
        .iter()
        .filter_map(|metric| metric["Name"].as_str().map(str::to_owned))
        .collect();
    Ok((namespace, metrics))
}

/// `terraform test` runs of `modules/outbox-relay` (plans with a mock provider) whose assertions hold
/// the module to the code: the table's keys, the `outbox-pending` index (keys only), a KEYS_ONLY
/// stream and no TTL; the stream mapping's bounded retries and its filter on job inserts; the
/// one-minute sweep schedule and its sweep event; the two alarms on the sweep's EMF metrics; the
/// environment the relay reads (no TTL attribute, no state table); and nothing Lambda-only for an
/// ECS relay.
fn outbox_design_test(package: &str) -> Result<String> {
    use conveyor_outbox::table::{
        CREATED_AT, PARTITION_KEY_ENV, PENDING, PENDING_INDEX, SORT_KEY_ENV, TABLE_ENV,
    };
    use conveyor_outbox::{LEASE_SECONDS_ENV, MAX_ATTEMPTS_ENV};

    let (namespace, metrics) = outbox_emf_metrics()?;
    for metric in ["OldestUnsentSeconds", "ParkedJobs"] {
        ensure!(
            metrics.iter().any(|name| name == metric),
            "the sweep's EMF line no longer has {metric} ({metrics:?}): the outbox-relay alarms watch it"
        );
    }
    let mut variables = String::new();
    for (key, value) in baseline("outbox-relay", package) {
        let _ = writeln!(variables, "  {key} = {value}");
    }
    Ok(format!(
        r#"mock_provider "aws" {{
  mock_data "aws_iam_policy_document" {{
    defaults = {{
      json = "{{\"Version\":\"2012-10-17\",\"Statement\":[]}}"
    }}
  }}
}}

variables {{
{variables}}}

run "outbox_lambda_design" {{
  command = plan

  module {{
    source = "../../modules/outbox-relay"
  }}

  assert {{
    condition     = length(aws_dynamodb_table.this[0].ttl) == 0
    error_message = "the outbox table has a TTL: a committed job must never expire"
  }}
  assert {{
    condition     = aws_dynamodb_table.this[0].hash_key == "pk" && aws_dynamodb_table.this[0].range_key == "sk"
    error_message = "the outbox table's keys are not pk/sk"
  }}
  assert {{
    condition     = toset([for a in aws_dynamodb_table.this[0].attribute : "${{a.name}}:${{a.type}}"]) == toset(["pk:S", "sk:S", "{PENDING}:S", "{CREATED_AT}:N"])
    error_message = "the outbox table's attributes are not pk, sk, {PENDING} (S) and {CREATED_AT} (N)"
  }}
  assert {{
    condition = anytrue([for index in aws_dynamodb_table.this[0].global_secondary_index :
    index.name == "{PENDING_INDEX}" && index.hash_key == "{PENDING}" && index.range_key == "{CREATED_AT}" && index.projection_type == "KEYS_ONLY"])
    error_message = "the outbox table lacks the keys-only index {PENDING_INDEX} over {PENDING} and {CREATED_AT}"
  }}
  assert {{
    condition     = aws_dynamodb_table.this[0].stream_enabled && aws_dynamodb_table.this[0].stream_view_type == "KEYS_ONLY"
    error_message = "the outbox table's stream is not KEYS_ONLY"
  }}
  assert {{
    condition     = output.pending_index_name == "{PENDING_INDEX}"
    error_message = "the module's index name is not the code's"
  }}
  assert {{
    condition     = contains(aws_lambda_event_source_mapping.this[0].function_response_types, "ReportBatchItemFailures")
    error_message = "the stream mapping does not use ReportBatchItemFailures"
  }}
  assert {{
    condition     = aws_lambda_event_source_mapping.this[0].maximum_retry_attempts >= 0 && aws_lambda_event_source_mapping.this[0].maximum_record_age_in_seconds >= 60
    error_message = "the stream mapping retries until the records expire: records only trigger, the sweep covers a skipped batch"
  }}
  assert {{
    condition     = jsonencode(jsondecode(one(aws_lambda_event_source_mapping.this[0].filter_criteria[0].filter).pattern)) == jsonencode({{ eventName = ["INSERT"], dynamodb = {{ Keys = {{ sk = {{ S = [{{ prefix = "outbox#job#" }}] }} }} }} }})
    error_message = "the stream mapping does not invoke on job inserts only (a KEYS_ONLY stream has no images to filter on)"
  }}
  assert {{
    condition     = length(aws_scheduler_schedule.sweep) == 1 && aws_scheduler_schedule.sweep[0].schedule_expression == "rate(1 minute)" && aws_scheduler_schedule.sweep[0].state == "ENABLED"
    error_message = "no enabled one-minute sweep schedule"
  }}
  assert {{
    condition     = !can(jsondecode(aws_scheduler_schedule.sweep[0].target[0].input).Records)
    error_message = "the sweep's event has Records: the relay would take it for a stream event"
  }}
  assert {{
    condition     = aws_cloudwatch_metric_alarm.oldest_unsent[0].namespace == "{namespace}" && aws_cloudwatch_metric_alarm.oldest_unsent[0].metric_name == "OldestUnsentSeconds" && aws_cloudwatch_metric_alarm.oldest_unsent[0].threshold == 300 && aws_cloudwatch_metric_alarm.oldest_unsent[0].comparison_operator == "GreaterThanThreshold"
    error_message = "no alarm on OldestUnsentSeconds above 300 s in {namespace}"
  }}
  assert {{
    condition     = aws_cloudwatch_metric_alarm.parked_jobs[0].namespace == "{namespace}" && aws_cloudwatch_metric_alarm.parked_jobs[0].metric_name == "ParkedJobs" && aws_cloudwatch_metric_alarm.parked_jobs[0].threshold == 0 && aws_cloudwatch_metric_alarm.parked_jobs[0].comparison_operator == "GreaterThanThreshold"
    error_message = "no alarm on ParkedJobs above 0 in {namespace}"
  }}
  assert {{
    condition     = toset([for name in keys(aws_lambda_function.this[0].environment[0].variables) : name if startswith(name, "CONVEYOR_OUTBOX_")]) == toset(["{TABLE_ENV}", "{PARTITION_KEY_ENV}", "{SORT_KEY_ENV}"])
    error_message = "the relay function's outbox environment is not the table and its key names"
  }}
}}

run "outbox_ecs_design" {{
  command = plan

  module {{
    source = "../../modules/outbox-relay"
  }}

  variables {{
    deploy_lambda = false
    package_path  = null
    lease_seconds = 10
    max_attempts  = 5
  }}

  assert {{
    condition     = length(aws_dynamodb_table.this) == 1 && length(aws_dynamodb_table.this[0].ttl) == 0
    error_message = "an ECS relay's table must exist without a TTL"
  }}
  assert {{
    condition     = length(aws_lambda_function.this) + length(aws_lambda_event_source_mapping.this) + length(aws_scheduler_schedule.sweep) + length(aws_cloudwatch_metric_alarm.oldest_unsent) + length(aws_cloudwatch_metric_alarm.parked_jobs) == 0
    error_message = "an ECS relay got Lambda-only resources (function, mapping, sweep, EMF alarms)"
  }}
  assert {{
    condition     = jsonencode(output.ecs_environment) == jsonencode({{ {TABLE_ENV} = "jobs-outbox", {PARTITION_KEY_ENV} = "pk", {SORT_KEY_ENV} = "sk", {LEASE_SECONDS_ENV} = "10", {MAX_ATTEMPTS_ENV} = "5" }})
    error_message = "the ECS environment is not the relay's variables"
  }}
}}

run "outbox_on_the_apps_table" {{
  command = plan

  module {{
    source = "../../modules/outbox-relay"
  }}

  variables {{
    create_table = false
    table_arn    = "arn:aws:dynamodb:us-east-1:123456789012:table/app"
    stream_arn   = "arn:aws:dynamodb:us-east-1:123456789012:table/app/stream/2024-01-01T00:00:00.000"
  }}

  assert {{
    condition     = length(aws_dynamodb_table.this) == 0 && aws_lambda_event_source_mapping.this[0].event_source_arn == "arn:aws:dynamodb:us-east-1:123456789012:table/app/stream/2024-01-01T00:00:00.000"
    error_message = "an existing table's stream is not the mapping's source"
  }}
  assert {{
    condition     = length(aws_scheduler_schedule.sweep) == 1 && length(aws_cloudwatch_metric_alarm.oldest_unsent) == 1 && length(aws_cloudwatch_metric_alarm.parked_jobs) == 1
    error_message = "the Lambda relay of an existing table lacks its sweep or alarms"
  }}
}}
"#
    ))
}

#[test]
fn outbox_relay_plans_the_table_stream_sweep_and_alarms_the_code_expects() -> Result<()> {
    let step = "terraform test of the outbox relay's design";
    let Some(terraform) = Terraform::find(step)? else {
        return Ok(());
    };
    let copy = InfraCopy::new("outbox-design")?;
    let harness = copy.dir("tests/outbox-design");
    let package = copy.scratch().join("bootstrap.zip");
    write_file(&package, "not a real zip: plan only hashes it")?;
    write_file(
        &harness.join("main.tf"),
        "# Generated by tests/tests/terraform.rs: plans modules/outbox-relay with a mock provider.\n\
         terraform {\n  required_providers {\n    aws = {\n      source = \"hashicorp/aws\"\n    }\n  }\n}\n",
    )?;
    write_file(
        &harness.join("tests").join("outbox_relay.tftest.hcl"),
        &outbox_design_test(&package.display().to_string())?,
    )?;
    if !terraform.init(&harness, step)? {
        return Ok(());
    }
    let text = terraform.run(&harness, &["test", "-no-color"])?;
    ensure!(
        text.contains("3 passed, 0 failed"),
        "the outbox relay's design runs did not all pass:\n{text}"
    );
    eprintln!("outbox-relay: table, stream, sweep, alarms and environment as the code expects");
    Ok(())
}

/// A policy's statements by sid: their actions and resources.
type Statements = BTreeMap<String, (BTreeSet<String>, Vec<String>)>;

/// The actions of each statement of `data "aws_iam_policy_document" "<document>"` in
/// `modules/outbox-relay`, by sid, with its resources as written.
fn outbox_statements(document: &str) -> Result<Statements> {
    use conveyor_e2e::hcl_walk::{
        as_string, attr, blocks, blocks_in, first_label, module_dir, parse_module, string_literals,
    };

    let bodies = parse_module(&module_dir("outbox-relay"))?;
    let block = blocks_in(&bodies, "data")
        .find(|block| {
            first_label(block) == Some("aws_iam_policy_document")
                && block.labels().get(1).map(|label| label.as_str()) == Some(document)
        })
        .with_context(|| format!("outbox-relay has no aws_iam_policy_document \"{document}\""))?;
    let mut bodies: Vec<&hcl::Body> = blocks(block.body(), "statement").map(hcl::Block::body).collect();
    for dynamic in blocks(block.body(), "dynamic") {
        if first_label(dynamic) == Some("statement") {
            bodies.extend(blocks(dynamic.body(), "content").map(hcl::Block::body));
        }
    }
    let mut statements = BTreeMap::new();
    for statement in bodies {
        let sid = attr(statement, "sid")
            .and_then(as_string)
            .with_context(|| format!("a statement of {document} has no sid"))?;
        let mut actions = Vec::new();
        if let Some(expr) = attr(statement, "actions") {
            string_literals(expr, &mut actions);
        }
        let resources = match attr(statement, "resources") {
            Some(expr) => vec![
                hcl::format::to_string(expr)?
                    .split_whitespace()
                    .collect::<String>(),
            ],
            None => Vec::new(),
        };
        statements.insert(sid, (actions.into_iter().collect(), resources));
    }
    Ok(statements)
}

#[test]
fn outbox_relay_policies_grant_what_the_relay_calls() -> Result<()> {
    let set = |actions: &[&str]| -> BTreeSet<String> {
        actions.iter().map(|action| (*action).to_owned()).collect()
    };
    // Both runtimes: the table's outbox items, the pending index, the queues (and KMS when given).
    let relay = outbox_statements("relay")?;
    let expected: BTreeMap<&str, (BTreeSet<String>, &str)> = [
        (
            "RelayOutboxItems",
            (
                set(&[
                    "dynamodb:DeleteItem",
                    "dynamodb:GetItem",
                    "dynamodb:PutItem",
                    "dynamodb:Query",
                    "dynamodb:UpdateItem",
                ]),
                "[local.table_arn]",
            ),
        ),
        (
            "FindPendingJobs",
            (set(&["dynamodb:Query"]), "[local.pending_index_arn]"),
        ),
        ("SendTheJobs", (set(&["sqs:SendMessage"]), "var.queue_arns")),
        (
            "UseTheQueuesAndTablesKeys",
            (set(&["kms:Decrypt", "kms:GenerateDataKey"]), "var.kms_key_arns"),
        ),
    ]
    .into_iter()
    .collect();
    let sids: BTreeSet<&str> = relay.keys().map(String::as_str).collect();
    let expected_sids: BTreeSet<&str> = expected.keys().copied().collect();
    ensure!(
        sids == expected_sids,
        "the relay's policy (the ECS task's) has statements {sids:?}; expected {:?} (no stream reads, no state table)",
        expected.keys().collect::<Vec<_>>()
    );
    for (sid, (actions, resource)) in &expected {
        let (granted, resources) = &relay[*sid];
        ensure!(
            granted == actions,
            "relay/{sid} grants {granted:?}; the relay calls {actions:?}"
        );
        ensure!(
            resources.as_slice() == [resource.to_string()],
            "relay/{sid} is on {resources:?}, not {resource}"
        );
    }
    // The index ARN is the code's index of the table.
    let bodies = conveyor_e2e::hcl_walk::parse_module(&conveyor_e2e::hcl_walk::module_dir("outbox-relay"))?;
    let local = |name: &str| -> Option<String> {
        conveyor_e2e::hcl_walk::blocks_in(&bodies, "locals")
            .find_map(|block| conveyor_e2e::hcl_walk::attr(block.body(), name))
            .and_then(conveyor_e2e::hcl_walk::as_string)
    };
    ensure!(
        local("pending_index").as_deref() == Some(conveyor_outbox::table::PENDING_INDEX),
        "local.pending_index is {:?}, the code queries {}",
        local("pending_index"),
        conveyor_outbox::table::PENDING_INDEX
    );
    ensure!(
        local("pending_index_arn").as_deref() == Some("${local.table_arn}/index/${local.pending_index}"),
        "local.pending_index_arn is {:?}",
        local("pending_index_arn")
    );

    // The Lambda adds the stream its mapping reads, its logs and the skipped-batch report.
    let lambda = outbox_statements("lambda")?;
    let stream = &lambda
        .get("ReadTheOutboxStream")
        .context("the Lambda's policy cannot read the stream")?;
    ensure!(
        stream.0
            == set(&[
                "dynamodb:DescribeStream",
                "dynamodb:GetRecords",
                "dynamodb:GetShardIterator",
            ])
            && stream.1 == ["[local.stream_arn]"],
        "the Lambda's stream statement is {stream:?}"
    );
    let list = &lambda
        .get("ListTheTablesStreams")
        .context("the Lambda's policy cannot list the table's streams")?;
    ensure!(
        list.0 == set(&["dynamodb:ListStreams"]),
        "the Lambda's ListStreams statement is {list:?}"
    );
    let schedule = outbox_statements("schedule")?;
    ensure!(
        schedule.len() == 1
            && schedule
                .get("InvokeTheRelay")
                .is_some_and(|(actions, resources)| {
                    *actions == set(&["lambda:InvokeFunction"])
                        && resources.as_slice() == ["[aws_lambda_function.this[0].arn]"]
                }),
        "the sweep's role may do {schedule:?}; it needs lambda:InvokeFunction on the relay function only"
    );
    // The sweep invokes that function (a plan cannot know the ARN, so this reads the configuration).
    let sweep = conveyor_e2e::hcl_walk::blocks_in(&bodies, "resource")
        .find(|block| {
            block
                .labels()
                .iter()
                .map(|label| label.as_str())
                .eq(["aws_scheduler_schedule", "sweep"])
        })
        .context("outbox-relay has no aws_scheduler_schedule \"sweep\"")?;
    let target = conveyor_e2e::hcl_walk::single_block(sweep.body(), "target")?;
    let arn = hcl::format::to_string(conveyor_e2e::hcl_walk::required_attr(target.body(), "arn")?)?;
    ensure!(
        arn.trim() == "aws_lambda_function.this[0].arn",
        "the sweep schedule targets {arn}, not the relay function"
    );
    Ok(())
}

#[test]
fn the_shutdown_cases_cover_both_verdicts_and_both_messages() {
    let verdicts: Vec<bool> = SHUTDOWN_CASES
        .iter()
        .map(|(stop, drain)| worker_accepts(*stop, *drain))
        .collect();
    assert!(
        verdicts.contains(&true) && verdicts.contains(&false),
        "{verdicts:?}"
    );
    // The issue's case: a 60 s drain inside a 90 s stop timeout works end to end.
    assert!(worker_accepts(90, Some(60)));
    assert!(!worker_accepts(90, Some(84)));
    assert!(!worker_accepts(7, None));
}

// ---------------------------------------------------------------------------------------------
// Apply: the worker on the applied queue
// ---------------------------------------------------------------------------------------------

/// The applied configuration; `terraform destroy` when dropped unless [`Applied::destroy`] ran.
struct Applied {
    terraform: Terraform,
    dir: std::path::PathBuf,
    vars: Vec<String>,
    destroyed: bool,
}

impl Applied {
    fn args<'s>(&'s self, command: &'s str) -> Vec<&'s str> {
        let mut args = vec![command, "-auto-approve", "-input=false", "-no-color"];
        args.extend(self.vars.iter().map(String::as_str));
        args
    }

    /// `terraform destroy`. LocalStack 4.8.1 answers a removed `RedriveAllowPolicy` with an empty
    /// string instead of leaving the attribute out, so the provider would wait forever for its removal:
    /// the policy leaves the state first, and deleting the DLQ deletes it.
    fn destroy(&mut self) -> Result<()> {
        self.destroyed = true;
        // Fails harmlessly when an apply that failed early never created it.
        self.terraform.output(
            &self.dir,
            &[
                "state",
                "rm",
                "-no-color",
                "module.queue.aws_sqs_queue_redrive_allow_policy.dlq",
            ],
        )?;
        self.terraform.run(&self.dir, &self.args("destroy")).map(drop)
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        if !self.destroyed
            && let Err(error) = self.destroy()
        {
            eprintln!("terraform destroy after a failure failed too: {error:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_queue_sends_a_permanent_failure_to_the_applied_dlq() -> Result<()> {
    let step = "terraform apply/destroy against LocalStack and DynamoDB Local";
    let Some(terraform) = Terraform::find(step)? else {
        return Ok(());
    };
    localstack::ensure_local_aws().await?;
    let emulator = localstack::OwnLocalStack::start_with(TERRAFORM_SERVICES).await?;
    let copy = InfraCopy::new("apply")?;
    let dir = copy.dir("tests/localstack");
    let init_dir = dir.clone();
    let init_terraform = terraform.clone();
    if !tokio::task::spawn_blocking(move || init_terraform.init(&init_dir, step)).await?? {
        return Ok(());
    }
    let name = localstack::unique_name("tf-apply");
    let visibility_secs = 30_u64;
    let max_receive_count = 3_u32;
    // Neither SQS's old default (262144) nor its new one: only Terraform can have set it.
    let max_message_size = 200_000_u32;
    let vars = vec![
        format!("-var=name={name}"),
        format!("-var=localstack_endpoint={}", emulator.endpoint()),
        format!("-var=dynamodb_endpoint={}", localstack::dynamodb_endpoint()),
        format!("-var=visibility_timeout_seconds={visibility_secs}"),
        format!("-var=max_receive_count={max_receive_count}"),
        format!("-var=max_message_size={max_message_size}"),
    ];
    let mut applied = Applied {
        terraform: terraform.clone(),
        dir: dir.clone(),
        vars,
        destroyed: false,
    };
    let apply_args: Vec<String> = applied.args("apply").into_iter().map(str::to_owned).collect();
    let apply_terraform = terraform.clone();
    let apply_dir = dir.clone();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = apply_args.iter().map(String::as_str).collect();
        apply_terraform.run(&apply_dir, &args)
    })
    .await??;
    let outputs: serde_json::Value =
        serde_json::from_str(&terraform.run(&dir, &["output", "-json", "-no-color"])?)
            .context("terraform output -json is not JSON")?;
    let output = |key: &str| -> Result<String> {
        let value = &outputs[key]["value"];
        value
            .as_str()
            .map(str::to_owned)
            .or_else(|| value.as_u64().map(|number| number.to_string()))
            .with_context(|| format!("no output {key} in {outputs}"))
    };
    let queue_url = output("queue_url")?;
    let dlq_url = output("dlq_url")?;
    let table = output("idempotency_table_name")?;
    ensure!(output("visibility_timeout_seconds")? == visibility_secs.to_string());
    ensure!(output("max_receive_count")? == max_receive_count.to_string());

    // What the code reads from the applied queue is what Terraform set.
    let client = localstack::sqs_client_at(&emulator.endpoint());
    let queue = SqsQueue::connect(client.clone(), &queue_url).await?;
    ensure!(
        queue.visibility_timeout() == Duration::from_secs(visibility_secs),
        "the worker would use a visibility timeout of {:?}, Terraform set {visibility_secs} s",
        queue.visibility_timeout()
    );
    ensure!(
        queue.max_receive_count() == Some(max_receive_count),
        "the redrive policy says {:?} receives, Terraform set {max_receive_count}",
        queue.max_receive_count()
    );
    for url in [&queue_url, &dlq_url] {
        let size = maximum_message_size(&client, url).await?;
        ensure!(
            size == max_message_size.to_string(),
            "{url} has MaximumMessageSize {size}, Terraform set {max_message_size} (queue and DLQ alike)"
        );
    }
    ensure!(
        queue.dead_letter_queue_url() == Some(dlq_url.as_str()),
        "the code finds the DLQ at {:?}, Terraform made {dlq_url}",
        queue.dead_letter_queue_url()
    );

    // The example worker on the applied queue and table: a permanent failure lands in the applied DLQ.
    let outbox = conveyor_e2e::outbox_path("tf-apply");
    let mut env = conveyor_e2e::app_env(&table, &outbox);
    env.retain(|(key, _)| key != "AWS_ENDPOINT_URL_SQS");
    env.push(("AWS_ENDPOINT_URL_SQS".to_owned(), emulator.endpoint()));
    let mut worker = conveyor_e2e::binaries().spawn_worker(&queue_url, None, &env, None)?;
    let poison = NewJob::new(
        "welcome_email",
        serde_json::json!({ "user_id": 7, "name": "Ada", "email": "no-at-sign" }),
    );
    Producer::new(client.clone(), queue_url.clone())
        .send(&poison)
        .await?;

    let received = wait_for_dead_letter(&client, &dlq_url, Duration::from_secs(60)).await?;
    let failure = received
        .failure()
        .with_context(|| format!("the dead letter carries no failure record: {received:?}"))?;
    ensure!(
        failure.error.contains("no valid email address") && !failure.retries_exhausted,
        "unexpected failure record {failure:?}"
    );
    ensure!(
        failure.source_queue.ends_with(&name),
        "the failure names {} as its source, not {name}",
        failure.source_queue
    );
    conveyor_demo::terminate(&mut worker).await?;
    let _ = std::fs::remove_file(&outbox);

    tokio::task::spawn_blocking(move || applied.destroy()).await??;
    let gone = client.get_queue_url().queue_name(&name).send().await;
    ensure!(
        gone.is_err(),
        "the queue {name} still exists after terraform destroy"
    );
    drop(emulator);
    Ok(())
}

/// Peeks at the DLQ until a message is there, `timeout` at most.
/// A queue's `MaximumMessageSize`, as `GetQueueAttributes` reports it.
async fn maximum_message_size(client: &aws_sdk_sqs::Client, url: &str) -> Result<String> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::MaximumMessageSize)
        .send()
        .await
        .with_context(|| format!("GetQueueAttributes of {url}"))?;
    output
        .attributes()
        .and_then(|attributes| attributes.get(&QueueAttributeName::MaximumMessageSize))
        .cloned()
        .with_context(|| format!("{url} reports no MaximumMessageSize"))
}

async fn wait_for_dead_letter(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    timeout: Duration,
) -> Result<conveyor_sqs::admin::Received> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let options = conveyor_sqs::admin::PeekOptions::default()
            .with_max(1)
            .with_hold(Duration::from_secs(5))
            .with_wait(Duration::from_secs(2));
        let peeked = conveyor_sqs::admin::peek(client, dlq_url, options).await?;
        if let Some(received) = peeked.messages.into_iter().next() {
            return Ok(received);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("nothing reached the DLQ {dlq_url} within {timeout:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// checkov
// ---------------------------------------------------------------------------------------------

#[test]
fn checkov_finds_no_failed_check_in_infra() -> Result<()> {
    let python = std::env::var("CONVEYOR_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let has_python = std::process::Command::new(&python)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_python {
        conveyor_e2e::terraform::skip(
            "checkov on infra/",
            &format!("no {python} to install checkov into .local/checkov-venv (set CONVEYOR_PYTHON)"),
        );
        return Ok(());
    }
    let script = conveyor_e2e::terraform::infra_dir()
        .join("checkov")
        .join("run.sh");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "checkov found failed checks in infra/ (fix them, or skip one with its reason in infra/checkov/skipped.txt):\n{text}"
    );
    ensure!(
        text.contains("Failed checks: 0"),
        "checkov printed no summary:\n{text}"
    );
    Ok(())
}
