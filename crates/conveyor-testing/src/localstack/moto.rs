//! A moto server of a test's own, for what LocalStack 4.8.1 cannot serve: CloudWatch as the current
//! `aws-sdk-cloudwatch` speaks it (Smithy RPC v2 CBOR since 1.102; LocalStack 4.8.1 models CloudWatch as
//! `query` only and answers "Missing Action in request for query-protocol service"). moto 5.2.6
//! (`moto[server]` from PyPI, botocore 1.44.18) answers it. The fidelity matrix
//! (`tests/emulators/fidelity/`) also runs the queue suite on its SQS and the store suites on its DynamoDB.
//!
//! [`OwnMoto::start`] runs `localstack/install-moto.sh` once per process (pinned, into
//! `.local/moto/venv`; a no-op when installed), then `moto_server` on a free loopback port under the
//! guard of `localstack::guard` (it dies with the test process, even on `kill -9`), and waits until it
//! answers. One process serves every service moto emulates, SQS included, on that port; nothing is
//! shared with other tests. Its log is `.local/logs/own-moto-<port>.log`.
//!
//! moto checks no credentials unless told: [`OwnMoto::create_user`] makes IAM users with an inline
//! policy, then [`OwnMoto::enforce_iam`] turns moto's IAM checks on, so a test sees real `AccessDenied`
//! answers (moto names CloudWatch's actions `monitoring:*`, the service's endpoint prefix, where IAM
//! says `cloudwatch:*`). Do not judge idempotency on moto's DynamoDB: its conditional writes are not
//! atomic under concurrency (the fidelity matrix's DynamoDB table shows what that breaks).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use tokio::sync::OnceCell;

use super::guard::OwnChild;
use super::{REGION, repo_root};

/// A moto server that belongs to one test; see the module docs of `localstack::moto`.
#[derive(Debug)]
pub struct OwnMoto {
    child: OwnChild,
    python: PathBuf,
}

/// An IAM user [`OwnMoto::create_user`] made, with its access key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MotoUser {
    /// The user's name.
    pub name: String,
    /// Its access key id.
    pub access_key_id: String,
    /// Its secret access key.
    pub secret_access_key: String,
}

impl OwnMoto {
    /// Installs moto if needed (`localstack/install-moto.sh`, once per process), then starts a
    /// `moto_server` on a free port and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        let server = installed_server().await?;
        let venv_bin = server.parent().context("moto_server has no folder")?;
        let child = OwnChild::start("own-moto", &server, |command, port| {
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("PYTHONUNBUFFERED", "1");
        })
        .await?;
        Ok(Self {
            child,
            python: venv_bin.join("python"),
        })
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.child.port()
    }

    /// Its endpoint, `http://127.0.0.1:<port>`, for every service.
    pub fn endpoint(&self) -> String {
        self.child.endpoint()
    }

    /// Its log, `.local/logs/own-moto-<port>.log` (kept after the server stops).
    pub fn log_path(&self) -> &Path {
        self.child.log_path()
    }

    /// An SQS client for this server (dummy credentials, `us-east-1`).
    pub fn sqs_client(&self) -> aws_sdk_sqs::Client {
        super::sqs_client_at(&self.endpoint())
    }

    /// A DynamoDB client for this server (dummy credentials, `us-east-1`).
    pub fn dynamodb_client(&self) -> aws_sdk_dynamodb::Client {
        super::dynamodb_client_at(&self.endpoint())
    }

    /// An SQS client for this server signing as `user` (after [`OwnMoto::enforce_iam`], only what its
    /// policy allows passes).
    pub fn sqs_client_as(&self, user: &MotoUser) -> aws_sdk_sqs::Client {
        use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(self.endpoint())
            .credentials_provider(Credentials::new(
                &user.access_key_id,
                &user.secret_access_key,
                None,
                None,
                "conveyor-testing",
            ))
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// Creates the IAM user `name` with an inline policy allowing `actions` on `*` (none: a user
    /// allowed nothing) and an access key. Call it before [`OwnMoto::enforce_iam`]: the call itself
    /// signs with the dummy credentials.
    pub async fn create_user(&self, name: &str, actions: &[&str]) -> anyhow::Result<MotoUser> {
        const SCRIPT: &str = r#"
import json, sys, boto3
endpoint, name, actions = sys.argv[1], sys.argv[2], sys.argv[3:]
iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                   aws_access_key_id="test", aws_secret_access_key="test")
iam.create_user(UserName=name)
if actions:
    statement = {"Effect": "Allow", "Action": actions, "Resource": "*"}
    document = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    iam.put_user_policy(UserName=name, PolicyName="allowed", PolicyDocument=document)
key = iam.create_access_key(UserName=name)["AccessKey"]
print(key["AccessKeyId"], key["SecretAccessKey"])
"#;
        let mut args = vec![self.endpoint(), name.to_owned()];
        args.extend(actions.iter().map(|action| (*action).to_owned()));
        let printed = self.python(SCRIPT, &args).await?;
        let Some((access_key_id, secret_access_key)) = printed.trim().split_once(' ') else {
            bail!("creating the IAM user {name} on moto printed {printed:?}, not a key pair");
        };
        Ok(MotoUser {
            name: name.to_owned(),
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
        })
    }

    /// Turns moto's IAM checks on (`POST /moto-api/reset-auth` with 0 requests left unchecked): from now
    /// on a request must be signed by a user [`OwnMoto::create_user`] made, and its policy must allow
    /// the action, or moto answers `AccessDenied` (unknown keys: `InvalidClientTokenId`).
    pub async fn enforce_iam(&self) -> anyhow::Result<()> {
        const SCRIPT: &str = r#"
import sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "text/plain"})
print(urllib.request.urlopen(request, timeout=10).read().decode())
"#;
        let printed = self.python(SCRIPT, &[self.endpoint()]).await?;
        if !printed.contains("\"ok\"") {
            bail!("moto did not turn its IAM checks on: {printed}");
        }
        Ok(())
    }

    /// Runs `script` with the moto venv's Python (which has boto3) and `args`; its standard output.
    async fn python(&self, script: &str, args: &[String]) -> anyhow::Result<String> {
        let output = tokio::process::Command::new(&self.python)
            .arg("-c")
            .arg(script)
            .args(args)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.python.display()))?;
        if !output.status.success() {
            bail!(
                "{} failed ({}): {}",
                self.python.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// `.local/moto/venv/bin/moto_server`, after `localstack/install-moto.sh` (once per process; it
/// prints that path, and does nothing when the pinned moto is installed).
async fn installed_server() -> anyhow::Result<PathBuf> {
    static INSTALLED: OnceCell<Result<PathBuf, String>> = OnceCell::const_new();
    INSTALLED
        .get_or_init(install)
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

async fn install() -> Result<PathBuf, String> {
    let script = repo_root().join("localstack").join("install-moto.sh");
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|error| format!("moto is not installed: cannot run {}: {error}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "moto is not installed: {} failed ({}; it needs python3 with venv, and PyPI the first time); \
             run it by hand:\n{}{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let server = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !server.is_file() {
        return Err(format!(
            "moto is not installed: run localstack/install-moto.sh ({} said {} but there is nothing there)",
            script.display(),
            server.display()
        ));
    }
    Ok(server)
}
