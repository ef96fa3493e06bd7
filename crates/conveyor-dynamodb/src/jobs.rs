//! Tracked jobs' records on the idempotency item: the `job_*` attributes, the clauses the claim,
//! complete and release updates carry for them, and reading them back (one item, or the
//! `conveyor-jobs` index).
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `job_type` | S | the job type |
//! | `job_status` | S | `sent`, `running`, `retrying`, `succeeded`, `dead_lettered` |
//! | `job_attempts` | N | runs started (each tracked claim adds one in its own write) |
//! | `job_error` | S | the last run's error |
//! | `job_progress`, `job_progress_message`, `job_progress_at` | N, S, N | the last progress written (epoch ms) |
//! | `job_changed` | N | when the status last changed (epoch ms); the index's sort key |
//! | `job_index` | S | `<job type>#<status>`: the index's partition key |
//! | `job_sent_at`, `job_running_at`, `job_retrying_at`, `job_succeeded_at`, `job_dead_lettered_at` | N | the last time the job entered each status (epoch ms) |
//!
//! Powertools reads none of these and writes none of them, so a shared table stays readable by it.
//! The index partitions by type *and* status, so no one partition takes every write of a busy table
//! (a `succeeded`-only partition would), and `jobs list --type T --status S` is one `Query`, newest
//! change first; listing every status of a type is five.

use crate::defaults::JOBS_INDEX;
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::port::{StatusTime, from_epoch_millis, to_epoch_millis};
use conveyor_core::{
    port::{Claim, JobChange, StoreError},
    {JobQuery, JobRecord, JobStatus, Progress},
};

use crate::classify::{Failure, classify};
use crate::item::{Item, epoch_secs, number, string};
use crate::store::{DynamoStore, with_clauses};

/// The job type.
pub const JOB_TYPE: &str = "job_type";
/// The status.
pub(crate) const JOB_STATUS: &str = "job_status";
/// Runs started.
pub(crate) const JOB_ATTEMPTS: &str = "job_attempts";
/// The last error.
pub(crate) const JOB_ERROR: &str = "job_error";
/// The last progress percentage.
pub(crate) const JOB_PROGRESS: &str = "job_progress";
/// The last progress message.
pub(crate) const JOB_PROGRESS_MESSAGE: &str = "job_progress_message";
/// When the last progress was reported (epoch ms).
pub(crate) const JOB_PROGRESS_AT: &str = "job_progress_at";
/// When the status last changed (epoch ms): the index's sort key.
pub const JOB_CHANGED: &str = "job_changed";
/// `<job type>#<status>`: the index's partition key.
pub const JOB_INDEX: &str = "job_index";

/// The attribute holding the last time a job entered `status`.
pub(crate) fn status_time_attribute(status: JobStatus) -> String {
    format!("job_{}_at", status.as_str())
}

/// The index partition of a job type and status.
pub(crate) fn index_value(job_type: &str, status: JobStatus) -> String {
    format!("{job_type}#{}", status.as_str())
}

/// Clauses of an `UpdateItem` expression, with their names and values (`#job_*`, `:job_*`, never
/// clashing with the store's own).
#[derive(Debug, Default)]
pub(crate) struct Clauses {
    pub set: Vec<String>,
    pub remove: Vec<String>,
    pub names: Vec<(String, String)>,
    pub values: Vec<(String, AttributeValue)>,
}

impl Clauses {
    fn set(&mut self, attribute: &str, value: AttributeValue) {
        let name = format!("#{attribute}");
        let placeholder = format!(":{attribute}");
        self.set.push(format!("{name} = {placeholder}"));
        self.names.push((name, attribute.to_owned()));
        self.values.push((placeholder, value));
    }

    fn remove(&mut self, attribute: &str) {
        let name = format!("#{attribute}");
        self.remove.push(name.clone());
        self.names.push((name, attribute.to_owned()));
    }

    /// `SET a, b REMOVE c` (either part may be empty), after the store's own `set` and `remove` lists.
    pub(crate) fn expression(&self, mut set: Vec<String>, mut remove: Vec<String>) -> String {
        set.extend(self.set.iter().cloned());
        remove.extend(self.remove.iter().cloned());
        let mut expression = String::new();
        if !set.is_empty() {
            expression.push_str("SET ");
            expression.push_str(&set.join(", "));
        }
        if !remove.is_empty() {
            expression.push_str(" REMOVE ");
            expression.push_str(&remove.join(", "));
        }
        expression
    }
}

/// The clauses that write `change`, as [`JobRecord::apply`] defines it.
pub(crate) fn change_clauses(change: &JobChange) -> Clauses {
    let mut clauses = Clauses::default();
    let at = number(to_epoch_millis(change.at));
    clauses.set(JOB_TYPE, string(&change.job_type));
    clauses.set(JOB_STATUS, string(change.status.as_str()));
    clauses.set(JOB_INDEX, string(index_value(&change.job_type, change.status)));
    clauses.set(JOB_CHANGED, at.clone());
    clauses.set(&status_time_attribute(change.status), at);
    if change.status == JobStatus::Running {
        clauses.set.push(format!(
            "#{JOB_ATTEMPTS} = if_not_exists(#{JOB_ATTEMPTS}, :job_zero) + :job_one"
        ));
        clauses
            .names
            .push((format!("#{JOB_ATTEMPTS}"), JOB_ATTEMPTS.to_owned()));
        clauses.values.push((":job_zero".to_owned(), number(0)));
        clauses.values.push((":job_one".to_owned(), number(1)));
    }
    if let Some(error) = &change.error {
        clauses.set(JOB_ERROR, string(error));
    }
    match &change.progress {
        Some(progress) => progress_clauses(&mut clauses, progress),
        None if change.status == JobStatus::Running => {
            clauses.remove(JOB_PROGRESS);
            clauses.remove(JOB_PROGRESS_MESSAGE);
            clauses.remove(JOB_PROGRESS_AT);
        }
        None => {}
    }
    clauses
}

/// The clauses that write a progress report.
pub(crate) fn progress_clauses(clauses: &mut Clauses, progress: &Progress) {
    clauses.set(JOB_PROGRESS, number(u64::from(progress.percent)));
    clauses.set(JOB_PROGRESS_MESSAGE, string(&progress.message));
    clauses.set(JOB_PROGRESS_AT, number(to_epoch_millis(progress.at)));
}

fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Some(text),
        _ => None,
    }
}

fn whole(item: &Item, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().ok(),
        _ => None,
    }
}

/// The job record an item holds, `None` when it is not a tracked job's (no `job_status`). `output`
/// and `token` come from the idempotency attributes the caller read.
pub(crate) fn parse_job(
    key: &str,
    item: &Item,
    output: Option<String>,
    token: Option<u64>,
) -> Option<JobRecord> {
    let status = JobStatus::parse(text(item, JOB_STATUS)?)?;
    let at = |name: &str| whole(item, name).map(from_epoch_millis);
    let progress = whole(item, JOB_PROGRESS).map(|percent| Progress {
        percent: u8::try_from(percent.min(100)).unwrap_or(100),
        message: text(item, JOB_PROGRESS_MESSAGE).unwrap_or_default().to_owned(),
        at: at(JOB_PROGRESS_AT).unwrap_or(std::time::UNIX_EPOCH),
    });
    let history = JobStatus::ALL
        .into_iter()
        .filter_map(|status| Some((status, StatusTime(at(&status_time_attribute(status))?))))
        .collect();
    Some(JobRecord {
        key: key.to_owned(),
        job_type: text(item, JOB_TYPE).unwrap_or_default().to_owned(),
        status,
        attempts: whole(item, JOB_ATTEMPTS).map_or(0, |attempts| u32::try_from(attempts).unwrap_or(u32::MAX)),
        last_error: text(item, JOB_ERROR).map(str::to_owned),
        progress,
        output: output.filter(|_| status == JobStatus::Succeeded),
        updated_at: at(JOB_CHANGED).unwrap_or(std::time::UNIX_EPOCH),
        history,
        token,
    })
}

impl DynamoStore {
    /// One `UpdateItem`: the progress, if the record still carries the claim's token and is in progress.
    pub(crate) async fn write_progress(&self, claim: &Claim, progress: &Progress) -> Result<(), StoreError> {
        let mut clauses = Clauses::default();
        progress_clauses(&mut clauses, progress);
        let update = with_clauses(self.client.update_item(), &clauses)
            .update_expression(clauses.expression(Vec::new(), Vec::new()));
        self.fenced_update(claim, update).await
    }

    /// One `UpdateItem` that writes the `sent` marker only where no item exists yet. The marker has no
    /// Powertools `status`, so the claim condition treats it as free; its `expiration` lets TTL remove a
    /// job that never ran.
    pub(crate) async fn write_sent(&self, key: &str, change: &JobChange) -> Result<(), StoreError> {
        let names = &self.options.attributes;
        let clauses = change_clauses(change);
        let expires = change.at + conveyor_core::runtime::IDEMPOTENCY_RECORD_TTL;
        self.count_request();
        let update = with_clauses(self.client.update_item(), &clauses);
        let result = update
            .table_name(&self.table)
            .set_key(Some(self.primary_key(key)))
            .update_expression(clauses.expression(vec!["#expiry = :expiry".to_owned()], Vec::new()))
            .condition_expression("attribute_not_exists(#id)")
            .expression_attribute_names("#id", &names.id)
            .expression_attribute_names("#expiry", &names.expiration)
            .expression_attribute_values(":expiry", number(epoch_secs(expires)))
            .send()
            .await;
        match result.map_err(|error| classify(&error, self.target("UpdateItem", key))) {
            Ok(_) | Err(Failure::ConditionFailed) => Ok(()),
            Err(Failure::ItemTooLarge) => Err(StoreError::Misconfigured {
                message: format!("the sent record of {key:?} is over DynamoDB's item size"),
            }),
            Err(Failure::Store(error)) => Err(error),
        }
    }

    /// The job record of `key` (one consistent `GetItem`).
    pub(crate) async fn read_job(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        Ok(self
            .get_item(key)
            .await?
            .and_then(|item| self.job_from(key, &item)))
    }

    /// A job record from an item, with the idempotency record's output and token when it has one.
    fn job_from(&self, key: &str, item: &Item) -> Option<JobRecord> {
        let (output, token) = match self.parse(key, item) {
            Ok(record) => (record.output, record.token),
            Err(_) => (None, None),
        };
        parse_job(key, item, output, token)
    }

    /// Tracked jobs of one type (and status), newest change first, through the `conveyor-jobs` index.
    pub(crate) async fn query_jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        let statuses = match query.status {
            Some(status) => vec![status],
            None => JobStatus::ALL.to_vec(),
        };
        let mut found = Vec::new();
        for status in statuses {
            found.extend(
                self.query_partition(&index_value(&query.job_type, status), query.limit)
                    .await?,
            );
        }
        conveyor_core::port::newest_first(&mut found, query.limit);
        Ok(found)
    }

    async fn query_partition(&self, partition: &str, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        let id_attribute = self
            .options
            .sort_key
            .as_ref()
            .map_or(self.options.attributes.id.as_str(), |sort_key| {
                sort_key.attribute.as_str()
            });
        let mut found = Vec::new();
        let mut start = None;
        while found.len() < limit {
            self.count_request();
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(JOBS_INDEX)
                .key_condition_expression("#job_index = :job_index")
                .expression_attribute_names("#job_index", JOB_INDEX)
                .expression_attribute_values(":job_index", string(partition))
                .scan_index_forward(false)
                .limit(i32::try_from(limit - found.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|error| match classify(&error, self.target("Query", partition)) {
                    Failure::Store(StoreError::Misconfigured { message }) if message.contains("index") => {
                        StoreError::Misconfigured {
                            message: format!(
                                "table {} has no usable index {JOBS_INDEX} for listing jobs: add it (the \
                                 infra/modules/idempotency-table module and `conveyor local init` create \
                                 it: partition key `{JOB_INDEX}` (S), sort key `{JOB_CHANGED}` (N)) ({message})",
                                self.table
                            ),
                        }
                    }
                    other => store_error(other),
                })?;
            for item in page.items() {
                let key = text(item, id_attribute).unwrap_or_default().to_owned();
                found.extend(self.job_from(&key, item));
            }
            match page.last_evaluated_key {
                Some(last) if !last.is_empty() => start = Some(last),
                _ => break,
            }
        }
        Ok(found)
    }
}

/// A read's failure as a store error (reads have no condition to fail).
fn store_error(failure: Failure) -> StoreError {
    match failure {
        Failure::Store(error) => error,
        other => StoreError::Unavailable {
            message: format!("unexpected answer to a read: {other:?}"),
        },
    }
}
