//! Tracked jobs' records on the idempotency item: the `job_*` attributes, the clauses the claim,
//! complete and release updates carry for them, and reading them back (one item, or the
//! `conveyor-jobs-sharded` index).
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `job_type` | S | the job type |
//! | `job_status` | S | `sent`, `running`, `retrying`, `succeeded`, `dead_lettered`, `cancelled` |
//! | `job_attempts` | N | runs started (each tracked claim adds one in its own write) |
//! | `job_error` | S | the last run's error |
//! | `job_progress`, `job_progress_message`, `job_progress_at` | N, S, N | the last progress written (epoch ms) |
//! | `job_changed` | N | when the status last changed (epoch ms) |
//! | `job_shard` | S | `<job type>#<shard>`: the index's partition key |
//! | `job_sort` | S | `<status>#<job_changed, 13 digits>`: the index's sort key |
//! | `job_sent_at`, `job_running_at`, ..., `job_cancelled_at` | N | the last time the job entered each status (epoch ms) |
//! | `job_keep_until` | N | the tracked claim's expiry (epoch s): a lease extension keeps it as the expiry |
//! | `last_attempt` | BOOL | set by a claim on the message's last allowed receive, removed by the release (see `conveyor_core::port::IdempotencyRecord::dead_lettered_by_redrive`) |
//!
//! Powertools reads none of these and writes none of them, so a shared table stays readable by it.
//!
//! # Design note: the index
//!
//! The shard is a stable hash of the record key modulo [`JOBS_INDEX_SHARDS`], so one busy type's
//! transitions spread over that many partitions (about 1,000 writes/s each before DynamoDB throttles
//! an index partition, and with it the base table's writes); a job stays on its shard for life. The
//! sort key starts with the status, so `jobs list --status S` is one `Query` per shard
//! (`begins_with(job_sort, "S#")`, newest first) and every status is one `Query` per shard, merged
//! newest first. The index projects only [`JOBS_INDEX_PROJECTION`](crate::defaults::JOBS_INDEX_PROJECTION): a progress report, a lease
//! extension or the output writes no index entry; a status change writes one.
//! Every tracked write also removes `job_index`, the old `conveyor-jobs` index's key, so that index (on
//! a table not yet migrated) drops the item rather than show a stale status.

use crate::defaults::{JOBS_INDEX, JOBS_INDEX_SHARDS};
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::port::{StatusTime, from_epoch_millis, to_epoch_millis};
use conveyor_core::{
    port::{Claim, JobChange, StoreError},
    {JobQuery, JobRecord, JobStatus, Progress},
};

use crate::classify::{Failure, classify};
use crate::item::{Item, epoch_secs, number, string, text, whole};
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
/// When the status last changed (epoch ms).
pub const JOB_CHANGED: &str = "job_changed";
/// `<job type>#<shard>`: the index's partition key.
pub const JOB_SHARD: &str = "job_shard";
/// `<status>#<changed, epoch ms in 13 digits>`: the index's sort key.
pub const JOB_SORT: &str = "job_sort";
/// The old index's partition key (`<type>#<status>`), removed by every tracked write.
const LEGACY_JOB_INDEX: &str = "job_index";
/// A tracked claim's expiry (epoch seconds), which lease extensions keep instead of shortening it.
pub const JOB_KEEP_UNTIL: &str = "job_keep_until";
/// Set on the record by a claim on the message's last allowed receive.
pub const LAST_ATTEMPT: &str = "last_attempt";

/// The attribute holding the last time a job entered `status`.
pub(crate) fn status_time_attribute(status: JobStatus) -> String {
    format!("job_{}_at", status.as_str())
}

/// The shard of a record key: FNV-1a (64 bits) of its bytes modulo [`JOBS_INDEX_SHARDS`]. Stable
/// across processes, versions and platforms (never `std`'s randomly seeded hasher).
pub fn shard_of(key: &str) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    u32::try_from(hash % u64::from(JOBS_INDEX_SHARDS)).unwrap_or(0)
}

/// The index partition of a record: `<job type>#<shard>`.
pub fn shard_value(job_type: &str, key: &str) -> String {
    format!("{job_type}#{}", shard_of(key))
}

/// The index sort key of a status entered at `at`: `<status>#<epoch ms, 13 digits>`.
pub fn sort_value(status: JobStatus, at: std::time::SystemTime) -> String {
    format!("{}#{:013}", status.as_str(), to_epoch_millis(at))
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

/// The clauses that write `change` on record `key`, as [`JobRecord::apply`] defines it.
pub(crate) fn change_clauses(key: &str, change: &JobChange) -> Clauses {
    let mut clauses = Clauses::default();
    let at = number(to_epoch_millis(change.at));
    clauses.set(JOB_TYPE, string(&change.job_type));
    clauses.set(JOB_STATUS, string(change.status.as_str()));
    clauses.set(JOB_SHARD, string(shard_value(&change.job_type, key)));
    clauses.set(JOB_SORT, string(sort_value(change.status, change.at)));
    clauses.remove(LEGACY_JOB_INDEX);
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
        let clauses = change_clauses(key, change);
        let expires = change
            .keep_until
            .unwrap_or(change.at + conveyor_core::runtime::IDEMPOTENCY_RECORD_TTL);
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

    /// A job record from an item, with the idempotency record's output and token when it has one,
    /// as the record says it is now (a run SQS's redrive took is dead-lettered).
    fn job_from(&self, key: &str, item: &Item) -> Option<JobRecord> {
        let record = self.parse(key, item).ok();
        let (output, token) = record
            .as_ref()
            .map_or((None, None), |record| (record.output.clone(), record.token));
        let job = parse_job(key, item, output, token)?;
        Some(match &record {
            Some(record) => job.seen_with(record, std::time::SystemTime::now()),
            None => job,
        })
    }

    /// Tracked jobs of one type (and status), newest change first, through the jobs index: one
    /// `Query` per shard (each newest first, at most `limit`), merged.
    pub(crate) async fn query_jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        let mut found = Vec::new();
        for shard in 0..JOBS_INDEX_SHARDS {
            let partition = format!("{}#{shard}", query.job_type);
            let prefix = query.status.map(|status| format!("{}#", status.as_str()));
            found.extend(
                self.query_shard(&partition, prefix.as_deref(), false, query.limit)
                    .await?,
            );
            if query.status == Some(JobStatus::DeadLettered) {
                // Runs SQS's redrive took still say `running` in the index (nothing ran to say more).
                let running = format!("{}#", JobStatus::Running.as_str());
                found.extend(
                    self.query_shard(&partition, Some(&running), true, query.limit)
                        .await?,
                );
            }
        }
        found.retain(|job| query.status.is_none_or(|status| job.status == status));
        conveyor_core::port::newest_first(&mut found, query.limit);
        Ok(found)
    }

    /// One shard's jobs (of one status, or all), newest change first. An entry the index cannot judge
    /// alone (a run on its last attempt: did SQS's redrive take it?) is read whole.
    async fn query_shard(
        &self,
        partition: &str,
        prefix: Option<&str>,
        last_attempts_only: bool,
        limit: usize,
    ) -> Result<Vec<JobRecord>, StoreError> {
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
            let mut request = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(JOBS_INDEX)
                .expression_attribute_names("#job_shard", JOB_SHARD)
                .expression_attribute_values(":job_shard", string(partition))
                .scan_index_forward(false)
                .limit(i32::try_from(limit - found.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take());
            request = match prefix {
                Some(prefix) => request
                    .key_condition_expression(
                        "#job_shard = :job_shard AND begins_with(#job_sort, :job_status)",
                    )
                    .expression_attribute_names("#job_sort", JOB_SORT)
                    .expression_attribute_values(":job_status", string(prefix)),
                None => request.key_condition_expression("#job_shard = :job_shard"),
            };
            if last_attempts_only {
                request = request
                    .filter_expression("attribute_exists(#last_attempt)")
                    .expression_attribute_names("#last_attempt", LAST_ATTEMPT);
            }
            let page = request.send().await.map_err(|error| {
                match classify(&error, self.target("Query", partition)) {
                    Failure::Store(StoreError::Misconfigured { message }) if message.contains("index") => {
                        StoreError::Misconfigured {
                            message: format!(
                                "table {} has no usable index {JOBS_INDEX} for listing jobs: add it (the \
                                 infra/modules/idempotency-table module and `conveyor local init` create \
                                 it: partition key `{JOB_SHARD}` (S), sort key `{JOB_SORT}` (S)) ({message})",
                                self.table
                            ),
                        }
                    }
                    other => store_error(other),
                }
            })?;
            for item in page.items() {
                let key = text(item, id_attribute).unwrap_or_default().to_owned();
                if item.contains_key(LAST_ATTEMPT) {
                    found.extend(self.read_job(&key).await?);
                } else {
                    found.extend(parse_job(&key, item, None, None));
                }
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    /// 10,000 transitions of one busy type, keyed as the consumers key them (message ids): each
    /// index partition key takes its share, none a hot spot (DynamoDB throttles one partition key
    /// above about 1,000 writes/s).
    #[test]
    fn a_busy_types_transitions_spread_over_the_shards() {
        let mut per_partition = std::collections::HashMap::<String, u32>::new();
        for index in 0..10_000u32 {
            // SQS message ids look like UUIDs: hex spread by a multiplicative hash.
            let id = u128::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            let key = format!("conveyor:email#{id:032x}");
            *per_partition.entry(shard_value("email", &key)).or_default() += 1;
        }
        let busiest = per_partition.values().copied().max().unwrap_or_default();
        let mean = 10_000 / JOBS_INDEX_SHARDS;
        println!(
            "10,000 transitions of one type: {} partitions, busiest {busiest} (mean {mean})",
            per_partition.len()
        );
        assert!(per_partition.len() >= 14, "{per_partition:?}");
        assert!(busiest * 2 <= mean * 3, "busiest {busiest}, mean {mean}");
        // Producer keys (business keys) spread as well.
        let mut business = std::collections::HashMap::<u32, u32>::new();
        for user in 0..10_000u32 {
            *business
                .entry(shard_of(&format!("conveyor:email#welcome:user:{user}")))
                .or_default() += 1;
        }
        let busiest = business.values().copied().max().unwrap_or_default();
        assert!(business.len() >= 14 && busiest * 2 <= mean * 3, "{business:?}");
    }

    #[test]
    fn the_sort_key_orders_by_status_then_time() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(sort_value(JobStatus::Running, at), "running#1700000000123");
        assert_eq!(
            sort_value(JobStatus::Sent, UNIX_EPOCH + Duration::from_millis(5)),
            "sent#0000000000005"
        );
        // Stable across processes and releases: a job stays on its shard for life.
        assert_eq!(shard_of("conveyor:email#m-1"), shard_of("conveyor:email#m-1"));
        assert_eq!(
            shard_value("email", "conveyor:email#m-1"),
            format!("email#{}", shard_of("conveyor:email#m-1"))
        );
    }

    #[test]
    fn progress_touches_no_projected_attribute() {
        let mut clauses = Clauses::default();
        progress_clauses(
            &mut clauses,
            &Progress {
                percent: 5,
                message: "m".into(),
                at: UNIX_EPOCH,
            },
        );
        for (_, attribute) in &clauses.names {
            assert!(
                !crate::defaults::JOBS_INDEX_PROJECTION.contains(&attribute.as_str())
                    && attribute != JOB_SHARD
                    && attribute != JOB_SORT,
                "a progress write would write the index: {attribute}"
            );
        }
    }
}
