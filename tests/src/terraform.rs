//! Running the real `terraform` on a copy of `infra/`: finding the binary and a provider, copying the
//! modules into a scratch folder (so `.terraform/`, lock and state files never land in the source tree),
//! and a LocalStack of its own that Terraform can apply to.
//!
//! A machine without `terraform`, or without any way to get the `hashicorp/aws` provider (the
//! registry, a provider mirror), skips the Terraform steps: [`Terraform::find`] returns `None` after
//! printing which step is skipped and why.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};
use conveyor_testing::localstack;

/// Folders that may hold an unpacked provider mirror (`registry.terraform.io/hashicorp/aws/...`),
/// checked in order after `CONVEYOR_TF_PROVIDER_MIRROR`.
const MIRROR_CANDIDATES: [&str; 3] = [
    "/opt/tf-plugins",
    "/usr/local/share/terraform/plugins",
    "/usr/share/terraform/plugins",
];

/// The AWS provider's address inside a mirror.
const AWS_PROVIDER: &str = "registry.terraform.io/hashicorp/aws";

pub use crate::hcl_walk::infra_dir;

/// Where a provider comes from.
#[derive(Debug, Clone)]
enum ProviderSource {
    /// A CLI config the user set (`TF_CLI_CONFIG_FILE`).
    UserConfig(PathBuf),
    /// A filesystem mirror found on this machine, and the CLI config written for it.
    Mirror { mirror: PathBuf, config: PathBuf },
    /// Terraform's default: the public registry.
    Registry,
}

/// A `terraform` binary and a way to get the AWS provider.
#[derive(Debug, Clone)]
pub struct Terraform {
    binary: PathBuf,
    provider: ProviderSource,
}

/// Prints that a step is skipped and why, in a form that stands out in `cargo test` output. Written to
/// the process's stderr directly, not through `eprintln!`, which the test harness captures and hides
/// for passing tests.
pub fn skip(step: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {step}: {why}");
}

impl Terraform {
    /// The machine's Terraform (`TERRAFORM`, else `terraform` on `PATH`) and provider source, or `None`
    /// (printed, naming `step`) when there is no binary.
    pub fn find(step: &str) -> Result<Option<Self>> {
        let Some(binary) = find_binary() else {
            skip(
                step,
                "no terraform binary (set TERRAFORM or put terraform on PATH; see infra/README.md)",
            );
            return Ok(None);
        };
        let provider = provider_source()?;
        Ok(Some(Self { binary, provider }))
    }

    /// What the provider comes from, for messages.
    pub fn provider_description(&self) -> String {
        match &self.provider {
            ProviderSource::UserConfig(path) => format!("the CLI config {}", path.display()),
            ProviderSource::Mirror { mirror, .. } => format!("the provider mirror {}", mirror.display()),
            ProviderSource::Registry => "registry.terraform.io".to_owned(),
        }
    }

    /// A `terraform` command with the provider configuration and non-interactive settings.
    pub fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg(format!("-chdir={}", dir.display()))
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("CHECKPOINT_DISABLE", "1")
            .stdin(Stdio::null());
        match &self.provider {
            ProviderSource::UserConfig(config) | ProviderSource::Mirror { config, .. } => {
                command.env("TF_CLI_CONFIG_FILE", config);
            }
            ProviderSource::Registry => {
                command.env_remove("TF_CLI_CONFIG_FILE");
            }
        }
        command
    }

    /// Runs `terraform <args>` in `dir` and returns its output, successful or not.
    pub fn output(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        self.command(dir)
            .args(args)
            .output()
            .with_context(|| format!("cannot run {} {}", self.binary.display(), args.join(" ")))
    }

    /// Runs `terraform <args>` in `dir`; an error carries its output.
    pub fn run(&self, dir: &Path, args: &[&str]) -> Result<String> {
        let output = self.output(dir, args)?;
        let text = combined(&output);
        if !output.status.success() {
            bail!(
                "terraform {} in {} failed ({}):\n{text}",
                args.join(" "),
                dir.display(),
                output.status
            );
        }
        Ok(text)
    }

    /// `terraform init -backend=false` in `dir`. `Ok(false)` (printed, naming `step`) when the
    /// provider cannot be had: from the registry on an offline machine. With a mirror or the user's
    /// own config, a failing init is an error.
    pub fn init(&self, dir: &Path, step: &str) -> Result<bool> {
        let output = self.output(dir, &["init", "-backend=false", "-input=false", "-no-color"])?;
        if output.status.success() {
            return Ok(true);
        }
        let text = combined(&output);
        if matches!(self.provider, ProviderSource::Registry) {
            skip(
                step,
                &format!(
                    "no provider mirror on this machine and the registry does not answer \
                     (set CONVEYOR_TF_PROVIDER_MIRROR or TF_CLI_CONFIG_FILE); terraform init said:\n{text}"
                ),
            );
            return Ok(false);
        }
        bail!(
            "terraform init in {} failed with {}:\n{text}",
            dir.display(),
            self.provider_description()
        );
    }
}

fn combined(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TERRAFORM").map(PathBuf::from) {
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("terraform"))
        .find(|candidate| candidate.is_file())
}

fn provider_source() -> Result<ProviderSource> {
    // A TF_CLI_CONFIG_FILE naming no file (some machines export one) counts as unset.
    if let Some(config) = std::env::var_os("TF_CLI_CONFIG_FILE").map(PathBuf::from)
        && config.is_file()
    {
        return Ok(ProviderSource::UserConfig(config));
    }
    let explicit = std::env::var_os("CONVEYOR_TF_PROVIDER_MIRROR").map(PathBuf::from);
    let mirror = explicit
        .into_iter()
        .chain(MIRROR_CANDIDATES.iter().map(PathBuf::from))
        .find(|dir| dir.join(AWS_PROVIDER).is_dir());
    let Some(mirror) = mirror else {
        return Ok(ProviderSource::Registry);
    };
    let config = write_mirror_config(&mirror)?;
    Ok(ProviderSource::Mirror { mirror, config })
}

/// Writes `.local/terraform/cli.tfrc` pointing the AWS provider at `mirror` (atomically: concurrent
/// tests may write it at once).
fn write_mirror_config(mirror: &Path) -> Result<PathBuf> {
    let dir = localstack::repo_root().join(".local").join("terraform");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let config = dir.join("cli.tfrc");
    let text = format!(
        "# Written by tests/src/terraform.rs: the AWS provider from the machine's mirror, nothing from the network.\n\
         provider_installation {{\n  filesystem_mirror {{\n    path    = \"{}\"\n    include = [\"{AWS_PROVIDER}\"]\n  }}\n  \
         direct {{\n    exclude = [\"{AWS_PROVIDER}\"]\n  }}\n}}\n",
        mirror.display()
    );
    let temporary = dir.join(format!("cli.tfrc.{}", localstack::unique_name("tmp")));
    fs::write(&temporary, text).with_context(|| format!("cannot write {}", temporary.display()))?;
    fs::rename(&temporary, &config).with_context(|| format!("cannot write {}", config.display()))?;
    Ok(config)
}

/// A private copy of `infra/` under `.local/terraform/runs/`, removed when dropped.
#[derive(Debug)]
pub struct InfraCopy {
    root: PathBuf,
}

impl InfraCopy {
    /// Copies `infra/` (without `.terraform/`, lock, state or override files) for one test.
    pub fn new(purpose: &str) -> Result<Self> {
        let root = localstack::repo_root()
            .join(".local")
            .join("terraform")
            .join("runs")
            .join(localstack::unique_name(purpose));
        copy_tree(&infra_dir(), &root.join("infra"))?;
        Ok(Self { root })
    }

    /// A folder of the copy, e.g. `modules/queue` or `examples/lambda`.
    pub fn dir(&self, relative: &str) -> PathBuf {
        self.root.join("infra").join(relative)
    }

    /// The copy's scratch folder (outside `infra/`), for generated inputs.
    pub fn scratch(&self) -> PathBuf {
        self.root.clone()
    }
}

impl Drop for InfraCopy {
    fn drop(&mut self) {
        if let Err(error) = fs::remove_dir_all(&self.root) {
            eprintln!("cannot remove {}: {error}", self.root.display());
        }
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("cannot list {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        let skipped = name_text == ".terraform"
            || name_text == ".terraform.lock.hcl"
            || name_text.contains(".tfstate")
            || name_text.ends_with("_override.tf");
        if skipped {
            continue;
        }
        let source = entry.path();
        if entry.file_type()?.is_dir() {
            copy_tree(&source, &to.join(&name))?;
        } else {
            fs::copy(&source, to.join(&name)).with_context(|| format!("cannot copy {}", source.display()))?;
        }
    }
    Ok(())
}

/// Runs `jobs` (each a closure starting and waiting for one command) at most `parallel` at a time and
/// returns their results in order.
pub fn run_parallel<T: Send>(parallel: usize, jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let mut results = Vec::with_capacity(jobs.len());
    let mut pending = jobs.into_iter();
    loop {
        let batch: Vec<_> = pending.by_ref().take(parallel.max(1)).collect();
        if batch.is_empty() {
            return results;
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch.into_iter().map(|job| scope.spawn(job)).collect();
            for handle in handles {
                match handle.join() {
                    Ok(result) => results.push(result),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
    }
}

/// What a LocalStack of its own serves for Terraform: the project's LocalStack (`localstack/start.sh`)
/// serves SQS and S3 only and returns path-style queue URLs (`SQS_ENDPOINT_STRATEGY=path`), which the AWS
/// provider refuses ("SQS Queue URL ... is in the incorrect format"). This serves SQS, IAM, STS and
/// CloudWatch with the `off` strategy (`http://127.0.0.1:<port>/<account>/<name>`); start it with
/// `localstack::OwnLocalStack::start_with`.
pub const TERRAFORM_SERVICES: localstack::Services = localstack::Services {
    services: "sqs,iam,sts,cloudwatch",
    sqs_endpoint_strategy: "off",
};

/// Writes `text` to `path`, creating its folder.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut file = fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
