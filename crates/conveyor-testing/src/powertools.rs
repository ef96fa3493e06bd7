//! The real Powertools for AWS Lambda, Python and TypeScript, as consumers of the same SQS records and
//! idempotency table as Conveyor: for interop tests and the claim benchmark.
//!
//! [`ensure_installed`] runs `localstack/install-powertools.sh` (pinned versions into `.local/powertools/`,
//! idempotent) once per process; [`Consumer`] runs `tests/powertools/python_consumer.py` or
//! `typescript_consumer.cjs` on a [`ConsumerSpec`] and reads the JSON lines it prints. A test that cannot
//! install them fails with what to run; it never skips.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::localstack::{aws_env, dynamodb_endpoint, repo_root};

/// Which Powertools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `aws-lambda-powertools` (PyPI) with boto3.
    Python,
    /// `@aws-lambda-powertools/idempotency` (npm) with the AWS SDK for JavaScript v3.
    TypeScript,
}

impl Language {
    /// Both, for tests that run once per language.
    pub const ALL: [Language; 2] = [Language::Python, Language::TypeScript];

    /// What the consumer's handler returns in `by`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::TypeScript => "typescript",
        }
    }
}

/// What a consumer is asked to do (the JSON its script reads).
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// The idempotency table.
    pub table: String,
    /// Powertools' `key_prefix` / `keyPrefix`.
    pub prefix: String,
    /// Powertools' `event_key_jmespath` / `eventKeyJmesPath`.
    pub key_jmespath: String,
    /// SQS records as Lambda delivers them (`messageId`, `body`, `messageAttributes`...).
    pub records: Vec<Value>,
    /// The Lambda's remaining time: Powertools writes `in_progress_expiration` = now + this.
    pub lease: Option<Duration>,
    /// Powertools' `payload_validation_jmespath`.
    pub validation_jmespath: Option<String>,
    /// `(sort_key_attr, static_pk_value)` for a table with a sort key.
    pub sort_key: Option<(String, String)>,
    /// Powertools' `expires_after_seconds` (3600 when `None`; negative writes `EXPIRED` records).
    pub expires_after_seconds: Option<i64>,
}

impl ConsumerSpec {
    /// A consumer of `records` on `table`, keyed on `messageId` under `prefix`.
    pub fn new(table: &str, prefix: &str, records: Vec<Value>) -> Self {
        Self {
            table: table.to_owned(),
            prefix: prefix.to_owned(),
            key_jmespath: "messageId".to_owned(),
            records,
            lease: None,
            validation_jmespath: None,
            sort_key: None,
            expires_after_seconds: None,
        }
    }

    fn to_json(&self, mode: &str) -> Value {
        let mut spec = json!({
            "endpoint": dynamodb_endpoint(),
            "table": self.table,
            "prefix": self.prefix,
            "key_jmespath": self.key_jmespath,
            "records": self.records,
            "mode": mode,
        });
        if let Some(lease) = self.lease {
            spec["lease_ms"] = json!(lease.as_millis());
        }
        if let Some(validation) = &self.validation_jmespath {
            spec["validation_jmespath"] = json!(validation);
        }
        if let Some((attribute, partition)) = &self.sort_key {
            spec["sort_key_attr"] = json!(attribute);
            spec["static_pk_value"] = json!(partition);
        }
        if let Some(seconds) = self.expires_after_seconds {
            spec["expires_after_seconds"] = json!(seconds);
        }
        spec
    }
}

/// An SQS record as the Lambda event carries it, for a message with this id and body.
pub fn sqs_record(message_id: &str, body: &str) -> Value {
    json!({
        "messageId": message_id,
        "receiptHandle": format!("rh-{message_id}"),
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "awsRegion": "us-east-1",
    })
}

/// Where the installed Powertools live.
#[derive(Debug, Clone)]
struct Installed {
    python: PathBuf,
    node_modules: PathBuf,
    scripts: PathBuf,
}

/// Installs Powertools for Python and TypeScript (pinned, into `.local/powertools/`) unless present:
/// once per process. Fails with what to run when the installer cannot.
pub fn ensure_installed() -> anyhow::Result<()> {
    installed().map(|_| ())
}

fn installed() -> anyhow::Result<&'static Installed> {
    static INSTALLED: OnceLock<Result<Installed, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(install)
        .as_ref()
        .map_err(|message| anyhow::anyhow!("{message}"))
}

fn install() -> Result<Installed, String> {
    let root = repo_root();
    let script = root.join("localstack").join("install-powertools.sh");
    let output = std::process::Command::new(&script).output().map_err(|error| {
        format!(
            "cannot run {}: {error}; run it by hand and see what it needs",
            script.display()
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "{} failed (needs python3 with venv, npm, and access to PyPI and npm); run it by hand to see \
             why:\n{}{}",
            script.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let local = root.join(".local").join("powertools");
    Ok(Installed {
        python: local.join("venv").join("bin").join("python"),
        node_modules: local.join("node").join("node_modules"),
        scripts: root.join("tests").join("powertools"),
    })
}

/// One line a consumer printed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The handler started for this message id.
    Started(String),
    /// The idempotent call returned this value (the handler's, or the stored one).
    Result(Value),
    /// The idempotent call raised this Powertools error (class name) with this message.
    Error(String, String),
    /// Benchmark latencies in milliseconds, one per record.
    Bench(Vec<f64>),
}

impl Event {
    fn parse(line: &str) -> anyhow::Result<Self> {
        let value: Value =
            serde_json::from_str(line).with_context(|| format!("consumer printed {line:?}"))?;
        let text = |field: &str| value[field].as_str().unwrap_or_default().to_owned();
        Ok(match value["event"].as_str() {
            Some("started") => Event::Started(text("messageId")),
            Some("result") => Event::Result(value["value"].clone()),
            Some("error") => Event::Error(text("error"), text("message")),
            Some("bench") => Event::Bench(
                value["latencies_ms"]
                    .as_array()
                    .map(|items| items.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default(),
            ),
            _ => bail!("consumer failed: {line}"),
        })
    }
}

/// How long a consumer may take to say anything (interpreter start and imports included).
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A running Powertools consumer process.
#[derive(Debug)]
pub struct Consumer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    events: Vec<Event>,
}

impl Consumer {
    /// Starts `language`'s consumer on `spec`; `mode` is `run`, `hold` or `bench`.
    pub fn start(language: Language, spec: &ConsumerSpec, mode: &str) -> anyhow::Result<Self> {
        let paths = installed()?;
        let spec = spec.to_json(mode).to_string();
        let mut command = match language {
            Language::Python => {
                let mut command = Command::new(&paths.python);
                // Powertools warns on every call made outside Lambda without a context; not news here.
                command.env("PYTHONWARNINGS", "ignore::UserWarning");
                command.arg(paths.scripts.join("python_consumer.py"));
                command
            }
            Language::TypeScript => {
                let mut command = Command::new("node");
                command
                    .arg("--no-warnings")
                    .arg(paths.scripts.join("typescript_consumer.cjs"))
                    .env("NODE_PATH", &paths.node_modules);
                command
            }
        };
        command
            .arg(spec)
            .envs(aws_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting the {} Powertools consumer", language.name()))?;
        let stdout = child.stdout.take().context("consumer stdout")?;
        Ok(Self {
            stdin: child.stdin.take(),
            child,
            lines: BufReader::new(stdout).lines(),
            events: Vec::new(),
        })
    }

    /// Runs `language`'s consumer on `spec` to the end and returns what it printed.
    pub async fn run(language: Language, spec: &ConsumerSpec) -> anyhow::Result<Vec<Event>> {
        Self::start(language, spec, "run")?.finish().await
    }

    async fn next_event(&mut self) -> anyhow::Result<Option<Event>> {
        let line = tokio::time::timeout(LINE_TIMEOUT, self.lines.next_line())
            .await
            .context("the Powertools consumer said nothing for 60 s")??;
        let Some(line) = line else {
            return Ok(None);
        };
        let event = Event::parse(&line)?;
        self.events.push(event.clone());
        Ok(Some(event))
    }

    /// Waits until the handler has started (a `hold` consumer then holds its claim in progress).
    pub async fn wait_started(&mut self) -> anyhow::Result<()> {
        loop {
            match self.next_event().await? {
                Some(Event::Started(_)) => return Ok(()),
                Some(_) => {}
                None => bail!("the consumer ended before its handler started: {:?}", self.events),
            }
        }
    }

    /// Lets a held handler return, and reads everything up to the process's end.
    pub async fn finish(mut self) -> anyhow::Result<Vec<Event>> {
        if let Some(mut stdin) = self.stdin.take() {
            // A consumer that is not holding never reads it; a closed pipe is fine then.
            let _ = stdin.write_all(b"finish\n").await;
        }
        while self.next_event().await?.is_some() {}
        let status = tokio::time::timeout(LINE_TIMEOUT, self.child.wait()).await??;
        if !status.success() {
            bail!("the Powertools consumer exited with {status}: {:?}", self.events);
        }
        Ok(self.events)
    }

    /// Kills the process: a Lambda that died with its claim in progress.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing the consumer")
    }
}

/// How many handler runs `events` shows.
pub fn runs(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|event| matches!(event, Event::Started(_)))
        .count()
}

/// The values the idempotent calls returned, in order.
pub fn results(events: &[Event]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::Result(value) => Some(value.clone()),
            _ => None,
        })
        .collect()
}

/// The Powertools errors (class names) the calls raised, in order.
pub fn errors(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::Error(name, _) => Some(name.clone()),
            _ => None,
        })
        .collect()
}
