//! LocalStack (SQS) and DynamoDB Local for tests: start them once per process, build clients that point
//! at them, create per-test queues and tables.
//!
//! Nothing here sets environment variables (edition 2024 makes `set_var` unsafe and the workspace
//! forbids unsafe code): clients are built with an explicit endpoint, dummy static credentials and
//! `us-east-1`. Endpoints come from `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL_DYNAMODB` (or
//! `AWS_ENDPOINT_URL`) when set, else from `CONVEYOR_SQS_PORT` / `CONVEYOR_DYNAMODB_PORT` on 127.0.0.1
//! (defaults 4566 and 8000), as `localstack/start.sh` uses them. [`aws_env`] gives the same settings as
//! variables for child processes.
//!
//! What needs no SDK is always here: [`ensure_local_aws`], the endpoints, [`aws_env`], [`unique_name`],
//! [`repo_root`], [`QueueSpec`] (the conformance suites' input) and [`TestQueue`]. The clients
//! (`sqs_client`, `sqs_client_at`, `dynamodb_client`, `dynamodb_client_at`), `create_queue`,
//! `queue_arn`, `create_table`, `create_idempotency_table`, `OwnLocalStack`, `OwnMoto` (a moto server
//! of a test's own, for the CloudWatch protocol LocalStack 4.8.1 does not speak) and `OwnFauxqs` (the
//! third SQS implementation of the fidelity matrix) need the feature `aws`.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::OnceCell;

pub use crate::wait::{wait_for, wait_until};

#[cfg(feature = "aws")]
mod fauxqs;
#[cfg(feature = "aws")]
mod guard;
#[cfg(feature = "aws")]
mod moto;
#[cfg(feature = "aws")]
mod own;
#[cfg(feature = "aws")]
mod sdk;
#[cfg(feature = "aws")]
pub use fauxqs::OwnFauxqs;
#[cfg(feature = "aws")]
pub use moto::{MotoUser, OwnMoto};
#[cfg(feature = "aws")]
pub use own::{OwnLocalStack, Services};
#[cfg(feature = "aws")]
pub(crate) use sdk::s3_client_at;
#[cfg(feature = "aws")]
pub use sdk::{
    create_idempotency_table, create_queue, create_table, dynamodb_client, dynamodb_client_at, queue_arn,
    s3_client, sqs_client, sqs_client_at,
};

/// The region every client and every child process uses (as `localstack/env.sh` sets it).
pub const REGION: &str = "us-east-1";
/// The dummy access key (and secret) the emulators accept.
pub const DUMMY_CREDENTIAL: &str = "test";

/// What queue to create: a main queue, and a DLQ with a redrive policy when `max_receive_count` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The start of the queue's name; a random suffix (and `.fifo`) is appended.
    pub name_prefix: String,
    /// A FIFO queue (and FIFO DLQ), with content-based deduplication on.
    pub fifo: bool,
    /// The queue's visibility timeout, in seconds.
    pub visibility_timeout_secs: u32,
    /// The redrive policy's `maxReceiveCount`; `None` creates no DLQ.
    pub max_receive_count: Option<u32>,
}

impl Default for QueueSpec {
    fn default() -> Self {
        Self {
            name_prefix: "conveyor-test".to_owned(),
            fifo: false,
            visibility_timeout_secs: 30,
            max_receive_count: None,
        }
    }
}

impl QueueSpec {
    /// A standard queue without a DLQ, 30 s visibility timeout.
    pub fn standard(name_prefix: &str) -> Self {
        Self {
            name_prefix: name_prefix.to_owned(),
            ..Self::default()
        }
    }

    /// A FIFO queue without a DLQ, 30 s visibility timeout.
    pub fn fifo(name_prefix: &str) -> Self {
        Self {
            fifo: true,
            ..Self::standard(name_prefix)
        }
    }

    /// Sets the visibility timeout.
    pub fn visibility_timeout_secs(mut self, secs: u32) -> Self {
        self.visibility_timeout_secs = secs;
        self
    }

    /// Adds a DLQ with this `maxReceiveCount`.
    pub fn max_receive_count(mut self, count: u32) -> Self {
        self.max_receive_count = Some(count);
        self
    }
}

/// A queue created by `create_queue` (feature `aws`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestQueue {
    /// The queue's URL.
    pub url: String,
    /// The queue's name.
    pub name: String,
    /// The queue's ARN, as `GetQueueAttributes` reports it.
    pub arn: String,
    /// The DLQ's URL, when the spec asked for one.
    pub dlq_url: Option<String>,
    /// The DLQ's name.
    pub dlq_name: Option<String>,
    /// The DLQ's ARN.
    pub dlq_arn: Option<String>,
}

static STARTED: OnceCell<Result<(), String>> = OnceCell::const_new();

/// Makes sure LocalStack (SQS) and DynamoDB Local answer, running `localstack/start.sh` once per process
/// when either does not. Every test that needs them calls this first.
pub async fn ensure_local_aws() -> anyhow::Result<()> {
    STARTED
        .get_or_init(start_local_aws)
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

async fn start_local_aws() -> Result<(), String> {
    let endpoints = [sqs_endpoint(), dynamodb_endpoint()];
    if answers_all(&endpoints).await {
        return Ok(());
    }
    let root = repo_root();
    let script = root.join("localstack").join("start.sh");
    let log_dir = root.join(".local").join("logs");
    std::fs::create_dir_all(&log_dir)
        .map_err(|error| format!("cannot create {}: {error}", log_dir.display()))?;
    let log_path = log_dir.join("start-from-tests.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|error| format!("cannot create {}: {error}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|error| format!("cannot reuse {}: {error}", log_path.display()))?;
    tracing::info!(script = %script.display(), "starting the local AWS emulators");
    // Output goes to a file, not a pipe: the emulators outlive the script and must not hold our pipe open.
    let status = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .status()
        .await
        .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    if !status.success() {
        return Err(format!(
            "{} failed ({status}); its output ({}):\n{}",
            script.display(),
            log_path.display(),
            tail(&output, 40)
        ));
    }
    if !answers_all(&endpoints).await {
        return Err(format!(
            "{} succeeded but {endpoints:?} do not answer; its output:\n{}",
            script.display(),
            tail(&output, 40)
        ));
    }
    Ok(())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The repository root: two levels above this crate's manifest.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

async fn answers_all(endpoints: &[String]) -> bool {
    for endpoint in endpoints {
        if !answers(endpoint).await {
            return false;
        }
    }
    true
}

async fn answers(endpoint: &str) -> bool {
    let Some(address) = host_port(endpoint) else {
        return false;
    };
    let connect = tokio::net::TcpStream::connect(address);
    matches!(
        tokio::time::timeout(Duration::from_secs(2), connect).await,
        Ok(Ok(_))
    )
}

/// `host:port` of an `http(s)://host[:port][/...]` URL.
fn host_port(url: &str) -> Option<String> {
    let (default_port, rest) = match url.split_once("://") {
        Some(("https", rest)) => (443, rest),
        Some((_, rest)) => (80, rest),
        None => (80, url),
    };
    let authority = rest.split('/').next().filter(|authority| !authority.is_empty())?;
    if authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        return Some(authority.to_owned());
    }
    Some(format!("{authority}:{default_port}"))
}

fn endpoint(specific: &str, port_variable: &str, default_port: u16) -> String {
    let from_env = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
    if let Some(url) = from_env(specific).or_else(|| from_env("AWS_ENDPOINT_URL")) {
        return url;
    }
    let port = from_env(port_variable)
        .and_then(|port| port.parse::<u16>().ok())
        .unwrap_or(default_port);
    format!("http://127.0.0.1:{port}")
}

/// The SQS endpoint the clients use.
pub fn sqs_endpoint() -> String {
    endpoint("AWS_ENDPOINT_URL_SQS", "CONVEYOR_SQS_PORT", 4566)
}

/// The DynamoDB endpoint the clients use.
pub fn dynamodb_endpoint() -> String {
    endpoint("AWS_ENDPOINT_URL_DYNAMODB", "CONVEYOR_DYNAMODB_PORT", 8000)
}

/// The environment a child process (a worker binary, a Lambda bootstrap) needs to reach the emulators:
/// `AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL_DYNAMODB`, dummy credentials and the region.
pub fn aws_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL_SQS", sqs_endpoint()),
        ("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_endpoint()),
        ("AWS_ACCESS_KEY_ID", DUMMY_CREDENTIAL.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", DUMMY_CREDENTIAL.to_owned()),
        ("AWS_REGION", REGION.to_owned()),
        ("AWS_DEFAULT_REGION", REGION.to_owned()),
    ]
}

/// `prefix` plus a short random suffix, using only characters valid in queue and table names
/// (others become `-`); at most 60 characters, leaving room for `-dlq` and `.fifo`.
pub fn unique_name(prefix: &str) -> String {
    let clean: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    if clean.is_empty() {
        return format!("t-{suffix}");
    }
    format!("{clean}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_valid_and_distinct() {
        let one = unique_name("conveyor test/é");
        let two = unique_name("conveyor test/é");
        assert_ne!(one, two);
        assert!(one.starts_with("conveyor-test--"), "{one}");
        assert!(
            one.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
        assert!(unique_name(&"x".repeat(200)).len() <= 60);
        assert!(unique_name("").starts_with("t-"));
    }

    #[test]
    fn endpoints_parse_to_host_and_port() {
        assert_eq!(
            host_port("http://127.0.0.1:4566").as_deref(),
            Some("127.0.0.1:4566")
        );
        assert_eq!(
            host_port("http://localhost:8000/").as_deref(),
            Some("localhost:8000")
        );
        assert_eq!(
            host_port("https://sqs.example").as_deref(),
            Some("sqs.example:443")
        );
        assert_eq!(host_port("http://"), None);
    }
}
