//! `conveyor jobs`: tracked jobs' records (status, attempts, last error, progress, output).

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use conveyor_core::port::idempotency_key;
use conveyor_core::port::{ChildEnd, FlowState};
use conveyor_core::{
    port::{FlowStore, IdempotencyStore},
    {JobQuery, JobRecord, JobStatus},
};
use conveyor_dynamodb::DynamoStore;

use crate::aws::Aws;
use crate::output::{
    Format, Table, format_age, format_epoch_millis, format_time, print_json, print_json_line,
};

/// How often `jobs watch` reads the record.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Arguments of `conveyor jobs`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor jobs show report:r-1 --job-type report       # the job sent with key report:r-1
  conveyor jobs show 'conveyor:report#report:r-1'   # the same, by its record key
  conveyor jobs list --job-type report --status running
  conveyor jobs watch report:r-1 --job-type report      # follows progress until the job ends
  conveyor jobs watch report:r-1 --job-type report --output json | jq .status   # one JSON object per line
  conveyor jobs sweep-flows                         # ends the flows past their deadline now

Only job types whose handler sets HandlerSettings::tracked keep a record.")]
pub(crate) struct JobsArgs {
    /// The idempotency table that holds the records.
    #[arg(long, global = true, env = "CONVEYOR_IDEMPOTENCY_TABLE", default_value = crate::commands::local::DEFAULT_TABLE)]
    pub table: String,
    /// What to do.
    #[command(subcommand)]
    pub command: JobsCommand,
}

/// The `jobs` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Print one job's record.
    Show(KeyArgs),
    /// List tracked jobs of a type, newest change first.
    List(ListArgs),
    /// Follow one job's status and progress until it succeeds or is dead-lettered.
    Watch(KeyArgs),
    /// Sweep the flows past their deadline once, as every worker does each minute: their unfinished
    /// children (dead-lettered by SQS's redrive, never sent) are counted and the policy ends the flow.
    SweepFlows,
}

/// Which job.
#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The producer's key (with --job-type), or the record key `conveyor:<type>#<key>`.
    pub key: String,
    /// The job type, when KEY is the producer's key.
    #[arg(long, alias = "type", value_name = "TYPE")]
    pub job_type: Option<String>,
}

impl KeyArgs {
    fn record_key(&self) -> String {
        match &self.job_type {
            Some(job_type) => idempotency_key(job_type, Some(&self.key), ""),
            None => self.key.clone(),
        }
    }
}

/// Which jobs.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The job type.
    #[arg(long, alias = "type", value_name = "TYPE")]
    pub job_type: String,
    /// Only this status: sent, running, retrying, succeeded, dead_lettered, cancelled.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<JobStatus>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

fn parse_status(text: &str) -> Result<JobStatus, String> {
    JobStatus::parse(text).ok_or_else(|| {
        format!("{text:?} is not a job status; use one of sent, running, retrying, succeeded, dead_lettered, cancelled")
    })
}

/// Runs `conveyor jobs`.
pub(crate) async fn run(args: &JobsArgs, aws: &Aws, format: Format) -> anyhow::Result<()> {
    let store = DynamoStore::new(aws.dynamodb_client(), &args.table);
    match &args.command {
        JobsCommand::Show(key) => {
            let flow = match conveyor_core::port::flow_of_parent_record(&key.record_key()) {
                Some(flow_id) => match store.flow(flow_id).await.context("reading the job's flow")? {
                    Some(flow) => Some((flow, flow_tree(&store, flow_id, 3).await?)),
                    None => None,
                },
                None => None,
            };
            // A flow's parent has no record until it is sent: its flow's status is the answer then.
            let job = match (find(&store, key, &args.table).await, &flow) {
                (Ok(job), _) => Some(job),
                (Err(_), Some(_)) => None,
                (Err(error), None) => return Err(error),
            };
            match format {
                Format::Json => {
                    let (flow, children) = flow.unzip();
                    print_json(&serde_json::json!({ "job": job, "flow": flow, "children": children }))
                }
                Format::Table | Format::Text => {
                    if let Some(job) = &job {
                        crate::out!("{}", describe(job, SystemTime::now()));
                    }
                    if let Some((flow, children)) = &flow {
                        crate::out!("{}", describe_flow(flow, children));
                    }
                    Ok(())
                }
            }
        }
        JobsCommand::List(list) => {
            let query = JobQuery {
                job_type: list.job_type.clone(),
                status: list.status,
                limit: list.limit,
            };
            let jobs = store.jobs(&query).await?;
            if format == Format::Json {
                return print_json(&serde_json::to_value(&jobs)?);
            }
            list_table(&jobs, SystemTime::now()).print(format);
            if jobs.is_empty() {
                crate::sayln!(
                    format,
                    "no tracked {} jobs{}",
                    list.job_type,
                    status_words(list.status)
                );
            }
            Ok(())
        }
        JobsCommand::Watch(key) => watch(&store, key, &args.table, format).await,
        JobsCommand::SweepFlows => sweep_flows(store, aws, &args.table, format).await,
    }
}

/// One pass of the flows' deadline sweep; prints what it did.
async fn sweep_flows(store: DynamoStore, aws: &Aws, table: &str, format: Format) -> anyhow::Result<()> {
    let store = std::sync::Arc::new(store);
    let flows = conveyor_core::Flows {
        store: store.clone(),
        sender: std::sync::Arc::new(conveyor_sqs::SqsSender::new(aws.sqs_client())),
    };
    let report = conveyor_core::sweep_overdue_flows(&flows, store.as_ref(), SystemTime::now())
        .await
        .with_context(|| format!("sweeping the flows of table {table}"))?;
    if format == Format::Json {
        return print_json(&serde_json::json!({
            "overdue": report.overdue,
            "recovered": report.recovered,
            "counted_out": report.counted_out,
            "running": report.running,
            "failed": report.failed,
        }));
    }
    crate::sayln!(
        format,
        "{} flow(s) past their deadline ended; {} child(ren) counted as succeeded from their records, {} as failed",
        report.overdue,
        report.recovered,
        report.counted_out
    );
    if report.running > 0 {
        crate::sayln!(
            format,
            "{} flow(s) past their deadline stay open: a child still runs (claimed, its lease not over); it is counted when it ends",
            report.running
        );
    }
    if report.failed > 0 {
        crate::sayln!(
            format,
            "{} flow(s) could not be swept (each logged with its flow id and error); the next sweep tries them again",
            report.failed
        );
    }
    Ok(())
}

fn status_words(status: Option<JobStatus>) -> String {
    status.map_or_else(String::new, |status| format!(" with status {status}"))
}

async fn find(store: &DynamoStore, key: &KeyArgs, table: &str) -> anyhow::Result<JobRecord> {
    let record_key = key.record_key();
    store
        .job(&record_key)
        .await
        .with_context(|| format!("reading job {record_key:?} from table {table}"))?
        .with_context(|| {
            format!(
                "no tracked job {record_key:?} in table {table}: check the key (with --job-type, KEY is the producer's \
                 key; without, the record key `conveyor:<type>#<key>`), that the handler sets \
                 HandlerSettings::tracked, and that the record has not expired"
            )
        })
}

/// Prints a line each time the record changes, until the job succeeds or is dead-lettered; with
/// `--output json` each line is one JSON document (NDJSON).
async fn watch(store: &DynamoStore, key: &KeyArgs, table: &str, format: Format) -> anyhow::Result<()> {
    let mut last = None;
    loop {
        let job = find(store, key, table).await?;
        let line = watch_line(&job);
        if last.as_ref() != Some(&line) {
            match format {
                Format::Json => print_json_line(&serde_json::to_value(&job)?)?,
                Format::Table | Format::Text => crate::outln!("{} {line}", format_time(SystemTime::now())),
            }
            last = Some(line);
        }
        if job.status.is_final() {
            return Ok(());
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

fn watch_line(job: &JobRecord) -> String {
    let mut line = format!("{} (attempt {})", job.status, job.attempts);
    if let Some(progress) = &job.progress {
        line.push_str(&format!(" {}% {}", progress.percent, progress.message));
    }
    if job.status != JobStatus::Succeeded
        && let Some(error) = &job.last_error
    {
        line.push_str(&format!(" (last error: {error})"));
    }
    line
}

/// A job's record as a person reads it.
pub(crate) fn describe(job: &JobRecord, now: SystemTime) -> String {
    let ago = |time: SystemTime| format_age(now.duration_since(time).unwrap_or_default());
    let mut text = format!("job       {}\n", job.key);
    text.push_str(&format!("type      {}\n", job.job_type));
    text.push_str(&format!(
        "status    {} ({} ago)\n",
        job.status,
        ago(job.updated_at)
    ));
    text.push_str(&format!("attempts  {}\n", job.attempts));
    if let Some(progress) = &job.progress {
        text.push_str(&format!(
            "progress  {}% {} ({} ago)\n",
            progress.percent,
            progress.message,
            ago(progress.at)
        ));
    }
    if let Some(error) = &job.last_error {
        text.push_str(&format!("last error {error}\n"));
    }
    if let Some(output) = &job.output {
        text.push_str(&format!("output    {output}\n"));
    }
    if let Some(token) = job.token {
        text.push_str(&format!("fence     {token}\n"));
    }
    text.push_str("history\n");
    for (status, at) in &job.history {
        text.push_str(&format!("  {:<14}{}\n", status.as_str(), format_time(at.0)));
    }
    text
}

/// Children listed by name per state at most (the rest are counted).
const LISTED_CHILDREN: usize = 20;

/// A flow's status as a tree: its counts and parent, then its failed and pending children (the first
/// [`LISTED_CHILDREN`] of each), a nested flow's own tree under its child.
pub(crate) fn describe_flow(flow: &FlowState, children: &[FlowTree]) -> String {
    let mut text = format!(
        "flow      {} ({}; on failure: {}; deadline {})\n",
        flow.id,
        flow.summary(),
        flow.policy.as_str(),
        format_epoch_millis(flow.deadline)
    );
    let parent = flow.parent_state();
    text.push_str(&format!("parent    {} ({parent})\n", flow.parent_record));
    tree_lines(children, 1, &mut text);
    text
}

/// One child of a flow tree, and its own flow when it is a nested flow's parent.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct FlowTree {
    id: String,
    key: String,
    state: &'static str,
    reason: Option<String>,
    nested: Option<(FlowState, Vec<FlowTree>)>,
}

fn tree_lines(children: &[FlowTree], depth: usize, text: &mut String) {
    let indent = "  ".repeat(depth);
    for state in ["failed", "pending"] {
        let listed: Vec<&FlowTree> = children.iter().filter(|child| child.state == state).collect();
        for child in listed.iter().take(LISTED_CHILDREN) {
            let reason = child
                .reason
                .as_deref()
                .map(|reason| format!(": {reason}"))
                .unwrap_or_default();
            text.push_str(&format!(
                "{indent}└ child {} {state} ({}){reason}\n",
                child.id, child.key
            ));
        }
        if listed.len() > LISTED_CHILDREN {
            text.push_str(&format!(
                "{indent}  … and {} more {state}\n",
                listed.len() - LISTED_CHILDREN
            ));
        }
    }
    for child in children {
        if let Some((flow, nested)) = &child.nested {
            text.push_str(&format!(
                "{indent}└ child {} is flow {} ({})\n",
                child.id,
                flow.id,
                flow.summary()
            ));
            tree_lines(nested, depth + 1, text);
        }
    }
}

/// The children of `flow_id` as a tree, nested flows read to `depth` levels.
pub(crate) async fn flow_tree(
    store: &DynamoStore,
    flow_id: &str,
    depth: usize,
) -> anyhow::Result<Vec<FlowTree>> {
    let mut tree = Vec::new();
    for child in store
        .children(flow_id)
        .await
        .context("reading the flow's children")?
    {
        let (state, reason) = match &child.end {
            Some(ChildEnd::Succeeded { .. }) => ("succeeded", None),
            Some(ChildEnd::Failed(reason)) => ("failed", Some(reason.clone())),
            None => ("pending", None),
        };
        let nested = match conveyor_core::port::flow_of_parent_record(&child.key) {
            Some(nested_id) if depth > 0 => match store.flow(nested_id).await? {
                Some(flow) => Some((flow, Box::pin(flow_tree(store, nested_id, depth - 1)).await?)),
                None => None,
            },
            _ => None,
        };
        tree.push(FlowTree {
            id: child.id,
            key: child.key,
            state,
            reason,
            nested,
        });
    }
    Ok(tree)
}

fn list_table(jobs: &[JobRecord], now: SystemTime) -> Table {
    let mut table = Table::new(&["KEY", "STATUS", "ATTEMPTS", "PROGRESS", "CHANGED", "LAST ERROR"]);
    for job in jobs {
        table.row(vec![
            job.key.clone(),
            job.status.to_string(),
            job.attempts.to_string(),
            job.progress
                .as_ref()
                .map_or_else(|| "-".to_owned(), |progress| format!("{}%", progress.percent)),
            format!(
                "{} ago",
                format_age(now.duration_since(job.updated_at).unwrap_or_default())
            ),
            job.last_error.clone().unwrap_or_default(),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use conveyor_core::port::StatusTime;

    use super::*;

    #[test]
    fn a_record_reads_as_a_person_wants_it() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_963_051);
        let job = JobRecord {
            key: "conveyor:report#r-1".into(),
            job_type: "report".into(),
            status: JobStatus::Succeeded,
            attempts: 2,
            last_error: Some("503 from the warehouse".into()),
            progress: None,
            output: Some(r#"{"rows":12}"#.into()),
            updated_at: now - Duration::from_secs(65),
            history: vec![
                (JobStatus::Running, StatusTime(now - Duration::from_secs(90))),
                (JobStatus::Succeeded, StatusTime(now - Duration::from_secs(65))),
            ],
            token: Some(7),
        };
        let text = describe(&job, now);
        assert!(text.contains("status    succeeded (1m 5s ago)"), "{text}");
        assert!(text.contains("attempts  2"), "{text}");
        assert!(text.contains("last error 503 from the warehouse"), "{text}");
        assert!(text.contains(r#"output    {"rows":12}"#), "{text}");
        assert!(text.contains("  succeeded     2026-"), "{text}");
    }

    #[test]
    fn keys_with_a_type_are_namespaced_like_the_consumers() {
        let args = KeyArgs {
            key: "r-1".into(),
            job_type: Some("report".into()),
        };
        assert_eq!(args.record_key(), "conveyor:report#r-1");
    }
}
