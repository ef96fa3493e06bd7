//! `conveyor send`: one job from arguments, or one or many jobs from a JSON file.
//!
//! Every job is checked before anything is sent (FIFO parameters against the queue's kind, SQS's size and
//! attribute limits, the schema version): if one is wrong, the command names each wrong job and sends
//! nothing, so fixing the file and running it again does not send the good jobs twice.

use std::collections::{BTreeMap, HashSet};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::Args;
use conveyor_core::message::AttributeValue;
use conveyor_sqs::admin::{QueueInfo, QueueRef, describe, resolve_queue_url};
use conveyor_sqs::{BatchingConfig, BatchingProducer, NewJob, ProduceError, Producer};
use futures_util::{StreamExt as _, stream};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::errors::UsageError;
use crate::output::{Format, Table, print_json, progress};

/// The longest delay a job may ask for: SQS's longest retention (a longer one could never be delivered).
const MAX_DELAY_SECS: u64 = conveyor_core::runtime::MAX_TOTAL_DELAY.as_secs();

/// A file with more jobs than this shows a progress line per this many jobs.
const PROGRESS_EVERY: usize = 100;

/// Arguments of `conveyor send`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor send --queue-url $URL --job-type welcome_email --payload '{\"user_id\":42}' --key welcome_email:user:42
  conveyor send --queue-url $URL --job-type invoice --payload '{\"id\":7}' --tenant acme-42
  conveyor send --queue-url $URL --file jobs.json        # one job object, or an array sent in batches of 10

A job in a file: {\"job_type\": \"...\", \"payload\": {...}, \"key\": \"...\", \"version\": 1, \"delay_secs\": 0,
\"tenant\": \"...\", \"group_id\": \"...\", \"dedup_id\": \"...\", \"attributes\": {\"name\": \"value\"}}; only payload is
required.
Options given on the command line apply to every job of the file that does not set that field.
With CONVEYOR_PAYLOAD_BUCKET set, a job too large for the queue is stored in that S3 bucket and sent as a
pointer (the SQS Extended Client Library's format; the consumers need the same variable).")]
pub(crate) struct SendArgs {
    /// URL (or name) of the queue to send to.
    #[arg(long, value_name = "URL")]
    pub queue_url: QueueRef,
    /// Job type (the `conveyor.type` attribute the consumer's router dispatches on). Required with
    /// --payload; with --file, the type of jobs that do not set `job_type`.
    #[arg(long, value_name = "TYPE")]
    pub job_type: Option<String>,
    /// The job's payload as JSON (the message body).
    #[arg(
        long,
        value_name = "JSON",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub payload: Option<String>,
    /// A JSON file with one job object or an array of jobs; `-` reads standard input.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Idempotency key (`conveyor.key`), e.g. welcome_email:user:42: the consumer runs a key once.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Payload schema version (`conveyor.version`, 1 or more).
    #[arg(long = "version", value_name = "N")]
    pub schema_version: Option<u32>,
    /// Delivery delay in seconds (standard queues only, up to the queue's retention, at most 1209600 =
    /// 14 days; past 900 it travels as a due time and the consumers re-send it every 15 minutes until due).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=MAX_DELAY_SECS))]
    pub delay_secs: Option<u64>,
    /// The tenant the job belongs to (`NewJob::tenant`): sent as `MessageGroupId` on a standard queue
    /// (SQS fair queues), as the `conveyor.tenant` attribute on a FIFO queue unless it is the group.
    /// 1 to 128 ASCII letters, digits and punctuation.
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,
    /// FIFO message group id (required on FIFO queues, refused on standard queues: there the tenant is
    /// the group, see --tenant).
    #[arg(long, value_name = "GROUP")]
    pub group_id: Option<String>,
    /// FIFO deduplication id (required on FIFO queues without content-based deduplication).
    #[arg(long, value_name = "ID")]
    pub dedup_id: Option<String>,
    /// Keep jobs due later than 15 minutes in the timer table (the consumers' idempotency table, --table)
    /// instead of hopping them through the queue: `conveyor delays` then lists, runs, reschedules and
    /// cancels them, and the consumers' timer relay sends each when due. That relay runs only where the
    /// consumers' pipeline has timers on (conveyor::Pipeline::with_timers); `conveyor delays list` marks
    /// OVERDUE the jobs no relay sent.
    #[arg(long)]
    pub timers: bool,
    /// The idempotency table that keeps timers (with --timers).
    #[arg(long, env = "CONVEYOR_IDEMPOTENCY_TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
    pub table: String,
    /// Extra string message attribute; repeat for more (names starting with `conveyor.` are reserved).
    #[arg(long = "attribute", value_name = "NAME=VALUE", value_parser = parse_attribute)]
    pub attributes: Vec<(String, String)>,
}

/// One job as written in a file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJob {
    job_type: Option<String>,
    payload: Value,
    key: Option<String>,
    version: Option<u32>,
    delay_secs: Option<u64>,
    tenant: Option<String>,
    group_id: Option<String>,
    #[serde(alias = "deduplication_id")]
    dedup_id: Option<String>,
    #[serde(default)]
    attributes: BTreeMap<String, Value>,
}

/// One job to send, with every field the checks and the output need.
#[derive(Debug, Clone, PartialEq)]
struct JobSpec {
    job_type: String,
    payload: Value,
    version: Option<u32>,
    key: Option<String>,
    delay: Option<Duration>,
    tenant: Option<String>,
    group_id: Option<String>,
    dedup_id: Option<String>,
    attributes: Vec<(String, AttributeValue)>,
}

impl JobSpec {
    /// The producer's job.
    fn to_job(&self) -> NewJob<Value> {
        let mut job = NewJob::new(self.job_type.clone(), self.payload.clone());
        if let Some(version) = self.version {
            job = job.version(version);
        }
        if let Some(key) = &self.key {
            job = job.key(key.clone());
        }
        if let Some(delay) = self.delay {
            job = job.delay(delay);
        }
        if let Some(tenant) = &self.tenant {
            job = job.tenant(tenant.clone());
        }
        if let Some(group) = &self.group_id {
            job = job.group_id(group.clone());
        }
        if let Some(dedup) = &self.dedup_id {
            job = job.deduplication_id(dedup.clone());
        }
        for (name, value) in &self.attributes {
            job = job.attribute(name.clone(), value.clone());
        }
        job
    }
}

/// What the user asked to send.
enum Request {
    /// One job (from arguments, or a file holding one object): sent with `send`.
    One(Box<JobSpec>),
    /// An array from a file: sent through a `BatchingProducer`.
    Many(Vec<JobSpec>),
}

impl Request {
    fn jobs(&self) -> &[JobSpec] {
        match self {
            Request::One(job) => std::slice::from_ref(job.as_ref()),
            Request::Many(jobs) => jobs,
        }
    }
}

/// Runs `conveyor send`.
pub(crate) async fn run(args: &SendArgs, aws: &crate::aws::Aws, format: Format) -> anyhow::Result<()> {
    let client = aws.sqs_client();
    let request = read_request(args)?;
    let url = resolve_queue_url(&client, &args.queue_url).await?;
    let queue = describe(&client, &url).await?;
    check_jobs(&queue, request.jobs())?;
    let mut producer = Producer::new(client, &url);
    if let Some(bucket) = conveyor_s3::payload_bucket_from_env() {
        let store = Arc::new(conveyor_s3::S3PayloadStore::new(aws.s3_client()));
        producer = producer.with_large_payloads(store, bucket);
    }
    if args.timers {
        let store = Arc::new(conveyor_dynamodb::DynamoStore::new(
            aws.dynamodb_client(),
            &args.table,
        ));
        producer = producer.with_timers(store);
    }
    let results: Vec<Result<String, String>> = match &request {
        Request::One(job) => vec![
            producer
                .send(&job.to_job())
                .await
                .map_err(|error| error.to_string()),
        ],
        Request::Many(jobs) => send_many(producer, jobs).await?,
    };
    print_results(&queue, request.jobs(), &results, args.timers, format)?;
    let failed = results.iter().filter(|result| result.is_err()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} jobs were not sent to {}",
            results.len(),
            queue.name()
        );
    }
    Ok(())
}

/// Sends an array of jobs through a [`BatchingProducer`]: [`PROGRESS_EVERY`] jobs handed over at once,
/// in the file's order, so several `SendMessageBatch` calls run together and a long file shows progress
/// on stderr. On a FIFO queue a group's jobs are stored in the file's order, and none after one of its
/// jobs that was not sent (the producer holds back what it had taken; this holds back the rest).
async fn send_many(producer: Producer, jobs: &[JobSpec]) -> anyhow::Result<Vec<Result<String, String>>> {
    let fifo = producer.name().ends_with(".fifo");
    let batching = BatchingProducer::new(producer, BatchingConfig::default())?;
    let failed_groups: Mutex<HashSet<String>> = Mutex::default();
    let send_one = async |spec: &JobSpec| {
        let group = spec.group_id.as_ref().or(spec.tenant.as_ref()).filter(|_| fifo);
        let held = group.filter(|group| lock(&failed_groups).contains(*group));
        if let Some(group) = held {
            return Err(ProduceError::GroupHeld { group: group.clone() }.to_string());
        }
        let result = batching.send(&spec.to_job()).await;
        if let (Err(_), Some(group)) = (&result, group) {
            lock(&failed_groups).insert(group.clone());
        }
        result.map_err(|error| error.to_string())
    };
    let mut sending = stream::iter(jobs).map(send_one).buffered(PROGRESS_EVERY);
    let mut results = Vec::with_capacity(jobs.len());
    while let Some(result) = sending.next().await {
        results.push(result);
        let step = results.len() % PROGRESS_EVERY == 0 || results.len() == jobs.len();
        if jobs.len() > PROGRESS_EVERY && step {
            let sent = results.iter().filter(|result| result.is_ok()).count();
            progress(&format!(
                "sent {sent} of {} jobs ({} done)",
                jobs.len(),
                results.len()
            ));
        }
    }
    drop(sending);
    batching.shutdown().await;
    Ok(results)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The jobs to send, from `--payload` or `--file`, with the command-line options applied.
fn read_request(args: &SendArgs) -> anyhow::Result<Request> {
    if let Some(payload) = &args.payload {
        let payload: Value = serde_json::from_str(payload)
            .map_err(|error| anyhow!("--payload is not valid JSON: {}", describe_json_error(&error)))?;
        let job = to_job(
            args,
            FileJob {
                payload,
                ..FileJob::default()
            },
        )
        .map_err(UsageError)?;
        return Ok(Request::One(Box::new(job)));
    }
    let Some(path) = &args.file else {
        return Err(UsageError("give the job with --payload JSON or --file PATH".to_owned()).into());
    };
    let text = read_file(path)?;
    let name = path.display();
    let document: Value = serde_json::from_str(&text)
        .map_err(|error| anyhow!("{name} is not valid JSON: {}", describe_json_error(&error)))?;
    match document {
        Value::Array(items) => {
            if items.is_empty() {
                bail!("{name} holds an empty array: there is no job to send");
            }
            let mut jobs = Vec::with_capacity(items.len());
            for (index, item) in items.into_iter().enumerate() {
                let file_job: FileJob = serde_json::from_value(item)
                    .map_err(|error| anyhow!("{name}: job #{index} (counting from 0): {error}"))?;
                jobs.push(
                    to_job(args, file_job).map_err(|message| anyhow!("{name}: job #{index}: {message}"))?,
                );
            }
            Ok(Request::Many(jobs))
        }
        Value::Object(_) => {
            let file_job: FileJob =
                serde_json::from_value(document).map_err(|error| anyhow!("{name}: {error}"))?;
            Ok(Request::One(Box::new(
                to_job(args, file_job).map_err(|message| anyhow!("{name}: {message}"))?,
            )))
        }
        _ => bail!("{name} must hold a job object or an array of job objects"),
    }
}

fn read_file(path: &PathBuf) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading jobs from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// A serde_json error with its position spelled out.
fn describe_json_error(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let message = text.split(" at line ").next().unwrap_or(&text);
    format!("{message} (line {}, column {})", error.line(), error.column())
}

/// A job from a file entry, with the command-line options filling what the entry leaves out.
fn to_job(args: &SendArgs, file_job: FileJob) -> Result<JobSpec, String> {
    let job_type = file_job
        .job_type
        .or_else(|| args.job_type.clone())
        .ok_or_else(|| "no job type: set \"job_type\" in the file or pass --job-type".to_owned())?;
    if job_type.is_empty() {
        return Err("the job type is empty".to_owned());
    }
    let mut attributes: Vec<(String, AttributeValue)> = args
        .attributes
        .iter()
        .map(|(name, value)| (name.clone(), AttributeValue::string(value.clone())))
        .collect();
    for (name, value) in file_job.attributes {
        let value = match value {
            Value::String(text) => AttributeValue::string(text),
            Value::Number(number) => AttributeValue::number(number),
            other => {
                return Err(format!(
                    "attribute {name} must be a string or a number, not {other}"
                ));
            }
        };
        attributes.retain(|(existing, _)| *existing != name);
        attributes.push((name, value));
    }
    let delay_secs = file_job.delay_secs.or(args.delay_secs);
    if let Some(secs) = delay_secs.filter(|secs| *secs > MAX_DELAY_SECS) {
        return Err(format!(
            "\"delay_secs\" is {secs}: at most {MAX_DELAY_SECS} seconds (14 days, SQS's longest retention)"
        ));
    }
    Ok(JobSpec {
        job_type,
        payload: file_job.payload,
        version: file_job.version.or(args.schema_version),
        key: file_job.key.or_else(|| args.key.clone()),
        delay: delay_secs.map(Duration::from_secs),
        tenant: file_job.tenant.or_else(|| args.tenant.clone()),
        group_id: file_job.group_id.or_else(|| args.group_id.clone()),
        dedup_id: file_job.dedup_id.or_else(|| args.dedup_id.clone()),
        attributes,
    })
}

/// Parses `--attribute name=value`.
fn parse_attribute(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {text:?}"))?;
    if name.is_empty() {
        return Err(format!("the attribute name is empty in {text:?}"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// Checks every job against the queue before anything is sent; names each wrong job.
fn check_jobs(queue: &QueueInfo, jobs: &[JobSpec]) -> anyhow::Result<()> {
    let problems: Vec<String> = jobs
        .iter()
        .enumerate()
        .filter_map(|(index, job)| check_job(queue, job).err().map(|problem| (index, problem)))
        .map(|(index, problem)| {
            if jobs.len() == 1 {
                problem
            } else {
                format!("job #{index} ({}): {problem}", job_label(&jobs[index]))
            }
        })
        .collect();
    match problems.len() {
        0 => Ok(()),
        1 if jobs.len() == 1 => bail!("{}", problems[0]),
        count => bail!(
            "{count} of {} jobs cannot be sent to {}, so nothing was sent:\n  {}",
            jobs.len(),
            queue.name(),
            problems.join("\n  ")
        ),
    }
}

/// The FIFO rules for the queue's kind, then SQS's limits as the producer checks them.
fn check_job(queue: &QueueInfo, job: &JobSpec) -> Result<(), String> {
    let name = queue.name();
    let has_delay = job.delay.is_some_and(|delay| !delay.is_zero());
    if queue.fifo {
        if has_delay {
            return Err(format!(
                "queue {name} is a FIFO queue, which takes no per-message delay (--delay-secs / \"delay_secs\"): \
                 set DelaySeconds on the queue instead, or send to a standard queue"
            ));
        }
        if job.group_id.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "queue {name} is a FIFO queue: every message needs a message group id (--group-id / \
                 \"group_id\"); messages of one group are processed in order"
            ));
        }
        if !queue.content_based_deduplication && job.dedup_id.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "queue {name} is a FIFO queue without content-based deduplication: every message needs a \
                 deduplication id (--dedup-id / \"dedup_id\"); SQS drops a second message with the same id \
                 within 5 minutes"
            ));
        }
    } else {
        if job.group_id.is_some() {
            return Err(format!(
                "queue {name} is a standard queue: --group-id / \"group_id\" is only for FIFO queues (names \
                 ending in .fifo); to send the job's tenant as its MessageGroupId (SQS fair queues), use \
                 --tenant / \"tenant\""
            ));
        }
        if job.dedup_id.is_some() {
            return Err(format!(
                "queue {name} is a standard queue: --dedup-id / \"dedup_id\" is only for FIFO queues (names \
                 ending in .fifo)"
            ));
        }
    }
    match job.to_job().to_message(name) {
        // Too large for SQS but not for the payload bucket: the producer offloads it.
        Err(conveyor_sqs::ProduceError::TooLarge { .. })
            if conveyor_s3::payload_bucket_from_env().is_some() =>
        {
            Ok(())
        }
        other => other.map(|_| ()).map_err(|error| error.to_string()),
    }
}

fn job_label(job: &JobSpec) -> String {
    match &job.key {
        Some(key) => format!("{}, key {key}", job.job_type),
        None => job.job_type.clone(),
    }
}

fn print_results(
    queue: &QueueInfo,
    jobs: &[JobSpec],
    results: &[Result<String, String>],
    timers: bool,
    format: Format,
) -> anyhow::Result<()> {
    // With --timers, a job due later than 15 minutes was kept in the timer table: its id is a timer's.
    let kept = |job: &JobSpec| {
        timers
            && job
                .delay
                .is_some_and(|delay| delay > conveyor_core::limits::MAX_DELAY)
    };
    let sent = results.iter().filter(|result| result.is_ok()).count();
    if format == Format::Json {
        let entries: Vec<Value> = jobs
            .iter()
            .zip(results)
            .enumerate()
            .map(|(index, (job, result))| {
                let mut entry = json!({ "index": index, "job_type": job.job_type, "key": job.key });
                if let Some(tenant) = &job.tenant {
                    entry["tenant"] = json!(tenant);
                }
                match result {
                    Ok(id) if kept(job) => entry["timer_id"] = json!(id),
                    Ok(id) => entry["message_id"] = json!(id),
                    Err(error) => entry["error"] = json!(error),
                }
                entry
            })
            .collect();
        return print_json(&json!({
            "queue_url": queue.url,
            "queue": queue.name(),
            "sent": sent,
            "failed": results.len() - sent,
            "results": entries,
        }));
    }
    if let ([job], [Ok(id)]) = (jobs, results) {
        if format == Format::Text {
            // The one row: the message (or timer) id, for `id=$(conveyor send --output text ...)`.
            crate::outln!("{id}");
        }
        if kept(job) {
            crate::sayln!(
                format,
                "kept {} job for {} in the timer table: timer id {id} (see `conveyor delays list`)",
                job.job_type,
                queue.name()
            );
        } else {
            let tenant = job
                .tenant
                .as_ref()
                .map(|tenant| format!(" for tenant {tenant}"))
                .unwrap_or_default();
            crate::sayln!(
                format,
                "sent {} job{tenant} to {}: message id {id}",
                job.job_type,
                queue.name()
            );
        }
        return Ok(());
    }
    let mut table = Table::new(&["#", "JOB TYPE", "KEY", "RESULT"]);
    for (index, (job, result)) in jobs.iter().zip(results).enumerate() {
        let outcome = match result {
            Ok(id) if kept(job) => format!("kept, timer id {id}"),
            Ok(id) => format!("sent, message id {id}"),
            Err(error) => format!("NOT SENT: {error}"),
        };
        table.row(vec![
            index.to_string(),
            job.job_type.clone(),
            job.key.clone().unwrap_or_else(|| "-".to_owned()),
            outcome,
        ]);
    }
    table.print(format);
    crate::sayln!(
        format,
        "sent {sent} of {} jobs to {}",
        results.len(),
        queue.name()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use conveyor_core::port::QueueDepth;
    use conveyor_sqs::QueueArn;

    use super::*;

    fn queue(name: &str, content_based: bool) -> QueueInfo {
        QueueInfo {
            url: format!("http://localhost/{name}"),
            arn: QueueArn::parse(&format!("arn:aws:sqs:us-east-1:000000000000:{name}")).unwrap(),
            fifo: name.ends_with(".fifo"),
            content_based_deduplication: content_based,
            redrive: None,
            visibility_timeout: None,
            depth: QueueDepth::default(),
        }
    }

    fn spec(payload: Value) -> JobSpec {
        JobSpec {
            job_type: "t".to_owned(),
            payload,
            version: None,
            key: None,
            delay: None,
            tenant: None,
            group_id: None,
            dedup_id: None,
            attributes: Vec::new(),
        }
    }

    #[test]
    fn fifo_rules_follow_the_queue_kind() {
        let standard = queue("jobs", false);
        let fifo = queue("jobs.fifo", false);
        let plain = spec(json!({}));
        assert_eq!(check_job(&standard, &plain), Ok(()));
        let grouped = JobSpec {
            group_id: Some("g".to_owned()),
            ..plain.clone()
        };
        assert!(
            check_job(&standard, &grouped)
                .unwrap_err()
                .contains("only for FIFO")
        );
        assert!(check_job(&fifo, &plain).unwrap_err().contains("message group id"));
        assert!(
            check_job(&fifo, &grouped)
                .unwrap_err()
                .contains("deduplication id")
        );
        assert_eq!(check_job(&queue("jobs.fifo", true), &grouped), Ok(()));
        let delayed = JobSpec {
            dedup_id: Some("d".to_owned()),
            delay: Some(Duration::from_secs(5)),
            ..grouped.clone()
        };
        assert!(
            check_job(&fifo, &delayed)
                .unwrap_err()
                .contains("no per-message delay")
        );
    }

    #[test]
    fn limits_are_checked_before_sending() {
        let big = spec(json!("x".repeat(1024 * 1024)));
        let error = check_job(&queue("jobs", false), &big).unwrap_err();
        assert!(error.contains("over SQS's limit of 1048576 bytes"), "{error}");
        let late = JobSpec {
            delay: Some(Duration::from_secs(14 * 24 * 3600 + 1)),
            ..spec(json!({}))
        };
        assert!(
            check_job(&queue("jobs", false), &late)
                .unwrap_err()
                .contains("1209600s")
        );
    }

    #[test]
    fn a_tenant_is_checked_as_new_job_tenant_checks_it() {
        let standard = queue("jobs", false);
        let tenanted = |tenant: &str| JobSpec {
            tenant: Some(tenant.to_owned()),
            ..spec(json!({}))
        };
        assert_eq!(check_job(&standard, &tenanted("acme-42")), Ok(()));
        let refused = check_job(&standard, &tenanted("acme corp")).unwrap_err();
        let expected = NewJob::new("t", json!({}))
            .tenant("acme corp")
            .to_message("jobs")
            .unwrap_err()
            .to_string();
        assert_eq!(refused, expected);
        assert!(
            refused.contains("tenant \"acme corp\" cannot be sent") && refused.contains("' ' at position 4"),
            "{refused}"
        );
        // On a FIFO queue the tenant rides beside the group.
        let fifo = queue("jobs.fifo", true);
        let grouped = JobSpec {
            group_id: Some("g".to_owned()),
            ..tenanted("acme-42")
        };
        assert_eq!(check_job(&fifo, &grouped), Ok(()));
    }

    #[test]
    fn json_errors_give_line_and_column() {
        let error = serde_json::from_str::<Value>("{\n  \"a\": 1,\n  \"b\" 2\n}").unwrap_err();
        assert_eq!(describe_json_error(&error), "expected `:` (line 3, column 7)");
    }

    #[test]
    fn attributes_parse_as_name_equals_value() {
        assert_eq!(
            parse_attribute("tenant=acme=1"),
            Ok(("tenant".to_owned(), "acme=1".to_owned()))
        );
        assert!(parse_attribute("tenant").is_err());
        assert!(parse_attribute("=x").is_err());
    }
}

/// Property tests over every numeric flag of `send`, `delays`, `dlq` and `console`, and a file job's
/// `delay_secs`: whatever the value, parsing and what follows from it (the producer's own encoding,
/// which adds a delay to its clock; a reschedule's due time) refuse it or use it, never panic.
#[cfg(test)]
mod numeric_properties {
    use std::time::SystemTime;

    use clap::Parser as _;
    use proptest::prelude::*;

    use super::*;
    use crate::cli::{Cli, Command};

    /// Inputs per property.
    const CASES: u32 = 10_000;

    /// Each command line with its numeric flag's value last.
    const COMMANDS: &[&[&str]] = &[
        &[
            "send",
            "--queue-url",
            "q",
            "--job-type",
            "t",
            "--payload",
            "{}",
            "--delay-secs",
        ],
        &[
            "send",
            "--queue-url",
            "q",
            "--job-type",
            "t",
            "--payload",
            "{}",
            "--version",
        ],
        &["delays", "--queue-url", "q", "reschedule", "id", "--in-secs"],
        &["delays", "--queue-url", "q", "list", "--limit"],
        &["dlq", "peek", "--queue-url", "q", "--limit"],
        &["dlq", "peek", "--queue-url", "q", "--hold-secs"],
        &["dlq", "peek", "--queue-url", "q", "--max-payload-bytes"],
        &["dlq", "redrive", "--queue-url", "q", "--rate"],
        &["dlq", "redrive", "--queue-url", "q", "--hold-secs"],
        &["console", "--queue-url", "q", "--refresh-secs"],
        &["console", "--queue-url", "q", "--history-secs"],
        &["console", "--queue-url", "q", "--max-payload-bytes"],
    ];

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            "[+-]?[0-9]{1,30}",
            (0..=u64::MAX).prop_map(|n| n.to_string()),
            Just(u64::MAX.to_string()),
            Just("18446744073709551616".to_owned()),
            any::<String>(),
        ]
    }

    /// What the command does with its parsed numbers before any AWS call.
    fn follow(cli: &Cli) {
        match &cli.command {
            Command::Send(args) => {
                if let Ok(request) = read_request(args) {
                    for job in request.jobs() {
                        let _ = job.to_job().to_message("q");
                    }
                }
            }
            Command::Delays(args) => {
                if let crate::commands::delays::DelaysCommand::Reschedule { in_secs, .. } = &args.command {
                    let _ = crate::commands::delays::due_in(SystemTime::now(), *in_secs);
                }
            }
            _ => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn no_numeric_flag_panics(command in prop::sample::select(COMMANDS), value in number()) {
            let mut argv = vec!["conveyor"];
            argv.extend_from_slice(command);
            argv.push(&value);
            if let Ok(cli) = Cli::try_parse_from(&argv) {
                follow(&cli);
            }
        }

        #[test]
        fn no_file_delay_panics(delay in prop_oneof![0..=u64::MAX, Just(u64::MAX), 0..=2_000_000u64]) {
            let cli = Cli::try_parse_from(["conveyor", "send", "--queue-url", "q", "--job-type", "t", "--file", "-"])
                .expect("parses");
            let Command::Send(args) = &cli.command else { unreachable!("send") };
            let file_job: FileJob = serde_json::from_value(json!({"payload": {}, "delay_secs": delay}))
                .expect("a job");
            match to_job(args, file_job) {
                Ok(job) => {
                    prop_assert!(delay <= MAX_DELAY_SECS);
                    let _ = job.to_job().to_message("q");
                }
                Err(message) => prop_assert!(message.contains("delay_secs"), "{message}"),
            }
        }
    }

    #[test]
    fn the_probe_is_a_usage_error_naming_the_flag() {
        let error = Cli::try_parse_from([
            "conveyor",
            "send",
            "--queue-url",
            "q",
            "--job-type",
            "t",
            "--payload",
            "{}",
            "--delay-secs",
            "18446744073709551615",
        ])
        .map(|_| ())
        .expect_err("refused");
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("--delay-secs"), "{error}");
    }
}
