//! [`DynamoOutboxStore`]: the [`OutboxStore`] on the outbox table (layout in [`crate::table`]).
//!
//! Reads of an aggregate are consistent `Query`s on its partition; removals are conditional `DeleteItem`s,
//! 16 at a time (a job already removed by another relay fails its condition: this relay lost the race);
//! the pending aggregates come from the [`table::PENDING_INDEX`] index, one `Query` per bucket.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_core::message::{AttributeValue as MessageAttribute, Attributes};
use conveyor_core::port::OutgoingMessage;

use crate::item::pending_bucket;
use crate::store::{Backlog, JobRef, LeaseRecord, OutboxStore, StoreError, StoredJob};
use crate::table::{self, OutboxTable};

/// Conditional deletes in flight at once.
const REMOVE_CONCURRENCY: usize = 16;

/// The outbox store on DynamoDB.
#[derive(Debug, Clone)]
pub struct DynamoOutboxStore {
    client: Client,
    table: OutboxTable,
    requests: Arc<AtomicU64>,
}

type Item = HashMap<String, AttributeValue>;

impl DynamoOutboxStore {
    /// The store on `table`.
    pub fn new(client: Client, table: OutboxTable) -> Self {
        Self {
            client,
            table,
            requests: Arc::default(),
        }
    }

    /// The table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn error<E, R>(&self, error: &SdkError<E, R>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let message = DisplayErrorContext(error).to_string();
        let code = error.as_service_error().and_then(ProvideErrorMetadata::code);
        let misconfigured = matches!(
            code,
            Some(
                "ResourceNotFoundException"
                    | "AccessDeniedException"
                    | "ValidationException"
                    | "UnrecognizedClientException"
            )
        );
        if misconfigured {
            return StoreError::Misconfigured {
                store: self.table.name.clone(),
                message: format!(
                    "{message} (the table needs the key attributes {} and {} and the index {} over {} and {}: \
                     infra/modules/outbox-relay and create_outbox_table make them; the relay's role needs \
                     dynamodb:Query, GetItem, UpdateItem, PutItem and DeleteItem on the table and its index)",
                    self.table.partition_key,
                    self.table.sort_key,
                    table::PENDING_INDEX,
                    table::PENDING,
                    table::CREATED_AT
                ),
            };
        }
        StoreError::Unavailable {
            store: self.table.name.clone(),
            message,
        }
    }

    fn key(&self, partition: String, sort: String) -> Item {
        HashMap::from([
            (self.table.partition_key.clone(), AttributeValue::S(partition)),
            (self.table.sort_key.clone(), AttributeValue::S(sort)),
        ])
    }

    fn job_key(&self, job: &JobRef) -> Item {
        self.key(
            OutboxTable::aggregate_key(&job.aggregate),
            OutboxTable::job_key(job.sequence),
        )
    }

    fn lease_key(&self, name: &str) -> Item {
        self.key(
            format!("{}{}{name}", table::KEY_PREFIX, table::LEASE_PREFIX),
            "outbox#lease".to_owned(),
        )
    }

    /// Up to `limit` index entries under `partition` (a bucket, or the parked jobs) committed before
    /// `committed_before_millis`, oldest first: their table keys and creation times.
    async fn index_items(
        &self,
        partition: &str,
        limit: usize,
        committed_before_millis: u64,
    ) -> Result<Vec<Item>, StoreError> {
        self.count();
        let output = self
            .client
            .query()
            .table_name(&self.table.name)
            .index_name(table::PENDING_INDEX)
            .key_condition_expression("#pending = :pending AND #created < :before")
            .expression_attribute_names("#pending", table::PENDING)
            .expression_attribute_names("#created", table::CREATED_AT)
            .expression_attribute_values(":pending", AttributeValue::S(partition.to_owned()))
            .expression_attribute_values(":before", AttributeValue::N(committed_before_millis.to_string()))
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|error| self.error(&error))?;
        Ok(output.items.unwrap_or_default())
    }

    /// One bucket of the pending index, oldest first: creation times and aggregates.
    async fn index_page(
        &self,
        partition: &str,
        limit: usize,
        committed_before_millis: u64,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        let items = self
            .index_items(partition, limit, committed_before_millis)
            .await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let created = number(item, table::CREATED_AT)?;
                let key = item.get(&self.table.partition_key)?.as_s().ok()?;
                Some((created, OutboxTable::aggregate_of(key)?.to_owned()))
            })
            .collect())
    }

    /// Removes one job on the condition that it is still there: true when this call removed it.
    async fn remove_one(&self, job: &JobRef) -> Result<bool, StoreError> {
        self.count();
        let answer = self
            .client
            .delete_item()
            .table_name(&self.table.name)
            .set_key(Some(self.job_key(job)))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#pk", &self.table.partition_key)
            .send()
            .await;
        match answer {
            Ok(_) => Ok(true),
            Err(error)
                if error.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::delete_item::DeleteItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(self.error(&error)),
        }
    }

    fn sort_key_of<'a>(&self, item: &'a Item) -> Option<&'a str> {
        item.get(&self.table.sort_key)?.as_s().ok().map(String::as_str)
    }

    fn head_key(&self, aggregate: &str) -> Item {
        self.key(OutboxTable::aggregate_key(aggregate), table::HEAD_KEY.to_owned())
    }

    async fn head_exists(&self, aggregate: &str) -> Result<bool, StoreError> {
        self.count();
        let output = self
            .client
            .get_item()
            .table_name(&self.table.name)
            .set_key(Some(self.head_key(aggregate)))
            .projection_expression("#sequence")
            .expression_attribute_names("#sequence", table::SEQUENCE)
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(&error))?;
        Ok(output.item.is_some())
    }

    /// Sets the head's index entry: `partition` (a bucket, or parked) and, when given, its commit time.
    async fn set_head_index(
        &self,
        aggregate: &str,
        partition: &str,
        created_at_millis: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut expression = "SET #pending = :pending".to_owned();
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table.name)
            .set_key(Some(self.head_key(aggregate)))
            .condition_expression("attribute_exists(#sequence)")
            .expression_attribute_names("#sequence", table::SEQUENCE)
            .expression_attribute_names("#pending", table::PENDING)
            .expression_attribute_values(":pending", AttributeValue::S(partition.to_owned()));
        if let Some(created) = created_at_millis {
            expression.push_str(", #created = :created");
            request = request
                .expression_attribute_names("#created", table::CREATED_AT)
                .expression_attribute_values(":created", AttributeValue::N(created.to_string()));
        }
        self.count();
        match request.update_expression(expression).send().await {
            Ok(_) => Ok(()),
            Err(error) if is_condition_failure(&error) => Ok(()),
            Err(error) => Err(self.error(&error)),
        }
    }

    /// Keeps the head's index entry true after a read: gone when the aggregate has no unsent job (on
    /// the condition that no job was committed since the read), its commit time moved on to the first
    /// unsent job's, bucket or parked as the first job is.
    async fn follow_head(
        &self,
        aggregate: &str,
        head: &Item,
        first: Option<&StoredJob>,
    ) -> Result<(), StoreError> {
        let pending = string(head, table::PENDING);
        let Some(first) = first else {
            let (Some(_), Some(sequence)) = (pending, number(head, table::SEQUENCE)) else {
                return Ok(());
            };
            return self.clear_head(aggregate, sequence).await;
        };
        let want = if first.parked_at_millis.is_some() {
            table::PARKED.to_owned()
        } else {
            pending_bucket(aggregate)
        };
        let created = number(head, table::CREATED_AT);
        if pending.as_deref() == Some(want.as_str()) && created == Some(first.created_at_millis) {
            return Ok(());
        }
        self.set_head_index(aggregate, &want, Some(first.created_at_millis))
            .await
    }

    /// Drops the head's index entry on the condition that its last sequence is still `sequence` (no
    /// job committed since).
    async fn clear_head(&self, aggregate: &str, sequence: u64) -> Result<(), StoreError> {
        self.count();
        let answer = self
            .client
            .update_item()
            .table_name(&self.table.name)
            .set_key(Some(self.head_key(aggregate)))
            .update_expression("REMOVE #pending, #created")
            .condition_expression("#sequence = :sequence AND #pending <> :parked")
            .expression_attribute_names("#pending", table::PENDING)
            .expression_attribute_names("#created", table::CREATED_AT)
            .expression_attribute_names("#sequence", table::SEQUENCE)
            .expression_attribute_values(":sequence", AttributeValue::N(sequence.to_string()))
            .expression_attribute_values(":parked", AttributeValue::S(table::PARKED.to_owned()))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(()),
            // A job was committed since (or the aggregate is parked): the entry stays.
            Err(error) if is_condition_failure(&error) => Ok(()),
            Err(error) => Err(self.error(&error)),
        }
    }

    /// One job by its key (parked jobs for the backlog).
    async fn get_job(&self, job: &JobRef) -> Result<Option<StoredJob>, StoreError> {
        self.count();
        let output = self
            .client
            .get_item()
            .table_name(&self.table.name)
            .set_key(Some(self.job_key(job)))
            .send()
            .await
            .map_err(|error| self.error(&error))?;
        output.item.map(|item| self.parse(&item)).transpose()
    }

    fn parse(&self, item: &Item) -> Result<StoredJob, StoreError> {
        let aggregate = string(item, table::AGGREGATE).unwrap_or_default();
        let sequence = number(item, table::SEQUENCE).unwrap_or_default();
        let unreadable = |message: String| StoreError::Unreadable {
            store: self.table.name.clone(),
            aggregate: aggregate.clone(),
            sequence,
            message,
        };
        let version = number(item, table::VERSION);
        if version != Some(u64::from(table::FORMAT_VERSION)) {
            return Err(unreadable(format!(
                "its format version is {version:?} and this relay reads {}: deploy the relay with the \
                 writers' Conveyor version",
                table::FORMAT_VERSION
            )));
        }
        let required = |name: &'static str| {
            string(item, name)
                .ok_or_else(|| unreadable(format!("attribute {name} is missing or not a string")))
        };
        let delay = number(item, table::DELAY_MS).map(Duration::from_millis);
        let message = OutgoingMessage {
            body: required(table::BODY)?,
            attributes: attributes(item.get(table::ATTRIBUTES)),
            delay,
            group_id: string(item, table::GROUP_ID),
            deduplication_id: string(item, table::DEDUPLICATION_ID),
            trace_header: string(item, table::TRACE_HEADER),
        };
        Ok(StoredJob {
            aggregate: aggregate.clone(),
            sequence,
            id: required(table::ID)?,
            queue_url: required(table::QUEUE_URL)?,
            job_type: required(table::JOB_TYPE)?,
            message,
            created_at_millis: number(item, table::CREATED_AT).unwrap_or_default(),
            attempts: number(item, table::ATTEMPTS)
                .and_then(|attempts| u32::try_from(attempts).ok())
                .unwrap_or(0),
            last_error: string(item, table::LAST_ERROR),
            parked_at_millis: number(item, table::PARKED_AT),
        })
    }
}

/// True when a request failed on its condition.
fn is_condition_failure<E, R>(error: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|code| code == "ConditionalCheckFailedException")
}

fn string(item: &Item, name: &str) -> Option<String> {
    item.get(name)?.as_s().ok().cloned()
}

fn number(item: &Item, name: &str) -> Option<u64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

/// The stored message attributes back as the message's.
fn attributes(value: Option<&AttributeValue>) -> Attributes {
    let Some(AttributeValue::M(map)) = value else {
        return Attributes::new();
    };
    map.iter()
        .filter_map(|(name, entry)| {
            let AttributeValue::M(entry) = entry else {
                return None;
            };
            let data_type = entry.get("type")?.as_s().ok()?.clone();
            let attribute = MessageAttribute {
                data_type,
                string_value: entry.get("string").and_then(|value| value.as_s().ok()).cloned(),
                binary_value: entry
                    .get("binary")
                    .and_then(|value| value.as_b().ok())
                    .map(|blob| blob.as_ref().to_vec()),
            };
            Some((name.clone(), attribute))
        })
        .collect()
}

#[async_trait]
impl OutboxStore for DynamoOutboxStore {
    fn name(&self) -> &str {
        &self.table.name
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    async fn jobs(&self, aggregate: &str, limit: usize) -> Result<Vec<StoredJob>, StoreError> {
        self.count();
        // The head ("outbox#head") sorts before the jobs ("outbox#job#..."): one query reads both.
        let output = self
            .client
            .query()
            .table_name(&self.table.name)
            .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
            .expression_attribute_names("#pk", &self.table.partition_key)
            .expression_attribute_names("#sk", &self.table.sort_key)
            .expression_attribute_values(":pk", AttributeValue::S(OutboxTable::aggregate_key(aggregate)))
            .expression_attribute_values(":prefix", AttributeValue::S(table::KEY_PREFIX.to_owned()))
            .consistent_read(true)
            .limit(i32::try_from(limit.saturating_add(1)).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|error| self.error(&error))?;
        let items = output.items.unwrap_or_default();
        let head = items
            .iter()
            .find(|item| self.sort_key_of(item) == Some(table::HEAD_KEY));
        let jobs = items
            .iter()
            .filter(|item| {
                self.sort_key_of(item)
                    .is_some_and(|key| key.starts_with(table::JOB_PREFIX))
            })
            .take(limit)
            .map(|item| self.parse(item))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(head) = head {
            self.follow_head(aggregate, head, jobs.first()).await?;
        }
        Ok(jobs)
    }

    async fn pending(&self, limit: usize, committed_before_millis: u64) -> Result<Vec<String>, StoreError> {
        let mut oldest: Vec<(u64, String)> = Vec::new();
        for bucket in 0..table::PENDING_BUCKETS {
            oldest.extend(
                self.index_page(&format!("pending#{bucket}"), limit, committed_before_millis)
                    .await?,
            );
        }
        oldest.sort();
        let mut seen = std::collections::HashSet::new();
        Ok(oldest
            .into_iter()
            .filter(|(_, aggregate)| seen.insert(aggregate.clone()))
            .take(limit)
            .map(|(_, aggregate)| aggregate)
            .collect())
    }

    async fn remove_sent(&self, jobs: &[JobRef]) -> Result<Vec<bool>, StoreError> {
        // Conditional deletes, several at once: one write unit per job (a transaction would cost two,
        // and a batch write cannot say whether the job was still there). A job listed twice is deleted
        // once, for its first mention: two deletes of it at once would race for which one says so.
        let mut seen = std::collections::HashSet::with_capacity(jobs.len());
        let first_mentions: Vec<bool> = jobs.iter().map(|job| seen.insert(job)).collect();
        let unique: Vec<&JobRef> = jobs
            .iter()
            .zip(&first_mentions)
            .filter_map(|(job, first)| first.then_some(job))
            .collect();
        let mut removed_unique = Vec::with_capacity(unique.len());
        for chunk in unique.chunks(REMOVE_CONCURRENCY) {
            let removals: Vec<_> = chunk.iter().map(|job| self.remove_one(job)).collect();
            for result in futures_util::future::join_all(removals).await {
                removed_unique.push(result?);
            }
        }
        let mut answers = removed_unique.into_iter();
        Ok(first_mentions
            .into_iter()
            .map(|first| first && answers.next().unwrap_or(false))
            .collect())
    }

    async fn drained(&self, aggregate: &str, last_sequence: u64) -> Result<(), StoreError> {
        self.clear_head(aggregate, last_sequence).await
    }

    async fn record_failure(
        &self,
        job: &JobRef,
        reason: &str,
        parked_at_millis: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut expression =
            "SET #attempts = if_not_exists(#attempts, :zero) + :one, #error = :error".to_owned();
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table.name)
            .set_key(Some(self.job_key(job)))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#pk", &self.table.partition_key)
            .expression_attribute_names("#attempts", table::ATTEMPTS)
            .expression_attribute_names("#error", table::LAST_ERROR)
            .expression_attribute_values(":zero", AttributeValue::N("0".to_owned()))
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .expression_attribute_values(":error", AttributeValue::S(reason.to_owned()));
        if let Some(parked_at) = parked_at_millis {
            expression.push_str(", #parked = :parked, #pending = :parked_bucket");
            request = request
                .expression_attribute_names("#parked", table::PARKED_AT)
                .expression_attribute_names("#pending", table::PENDING)
                .expression_attribute_values(":parked", AttributeValue::N(parked_at.to_string()))
                .expression_attribute_values(":parked_bucket", AttributeValue::S(table::PARKED.to_owned()));
        }
        self.count();
        let answer = request.update_expression(expression).send().await;
        if answer.is_ok()
            && parked_at_millis.is_some()
            && (job.sequence > 1 || self.head_exists(&job.aggregate).await?)
        {
            // The aggregate's index entry moves to the parked ones: sweeps pass it by.
            self.set_head_index(&job.aggregate, table::PARKED, None).await?;
        }
        match answer {
            Ok(_) => Ok(()),
            // Removed meanwhile (another relay sent it): nothing to record.
            Err(error)
                if error.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(self.error(&error)),
        }
    }

    async fn unpark(&self, aggregate: &str) -> Result<usize, StoreError> {
        let mut count = 0;
        for job in self.jobs(aggregate, 1000).await? {
            if job.parked_at_millis.is_none() {
                continue;
            }
            // A job of an aggregate with a head leaves the index (the head is its entry); a job without
            // one (`put_unordered`) is its own entry.
            let has_head = job.sequence > 1 || self.head_exists(aggregate).await?;
            let expression = if has_head {
                "SET #attempts = :zero REMOVE #parked, #pending"
            } else {
                "SET #pending = :bucket, #attempts = :zero REMOVE #parked"
            };
            let mut request = self
                .client
                .update_item()
                .table_name(&self.table.name)
                .set_key(Some(self.job_key(&job.reference())))
                .update_expression(expression)
                .condition_expression("attribute_exists(#pk)")
                .expression_attribute_names("#pk", &self.table.partition_key)
                .expression_attribute_names("#pending", table::PENDING)
                .expression_attribute_names("#attempts", table::ATTEMPTS)
                .expression_attribute_names("#parked", table::PARKED_AT)
                .expression_attribute_values(":zero", AttributeValue::N("0".to_owned()));
            if !has_head {
                request = request
                    .expression_attribute_values(":bucket", AttributeValue::S(pending_bucket(aggregate)));
            }
            self.count();
            request.send().await.map_err(|error| self.error(&error))?;
            if has_head {
                self.set_head_index(aggregate, &pending_bucket(aggregate), Some(job.created_at_millis))
                    .await?;
            }
            count += 1;
        }
        Ok(count)
    }

    async fn backlog(&self, limit: usize) -> Result<Backlog, StoreError> {
        let mut oldest = None;
        for bucket in 0..table::PENDING_BUCKETS {
            let first = self.index_page(&format!("pending#{bucket}"), 1, u64::MAX).await?;
            if let Some((created, _)) = first.first() {
                oldest = Some(oldest.map_or(*created, |oldest: u64| oldest.min(*created)));
            }
        }
        let pending_aggregates = self.pending(limit, u64::MAX).await?;
        // Parked jobs: the index gives their keys, the table the rest.
        let mut parked = Vec::new();
        for item in &self.index_items(table::PARKED, limit, u64::MAX).await? {
            let Some(sort) = self.sort_key_of(item) else {
                continue;
            };
            let Some(partition) = item
                .get(&self.table.partition_key)
                .and_then(|value| value.as_s().ok())
            else {
                continue;
            };
            let (Some(aggregate), Some(sequence)) = (
                OutboxTable::aggregate_of(partition),
                sort.strip_prefix(table::JOB_PREFIX)
                    .and_then(|digits| digits.parse().ok()),
            ) else {
                continue;
            };
            let reference = JobRef {
                aggregate: aggregate.to_owned(),
                sequence,
            };
            if let Some(job) = self.get_job(&reference).await? {
                parked.push(job);
            }
        }
        Ok(Backlog {
            oldest_pending_millis: oldest,
            pending_aggregates,
            parked,
        })
    }

    async fn read_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.count();
        let output = self
            .client
            .get_item()
            .table_name(&self.table.name)
            .set_key(Some(self.lease_key(name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(&error))?;
        Ok(output.item.map(|item| LeaseRecord {
            owner: string(&item, table::LEASE_OWNER).unwrap_or_default(),
            epoch: number(&item, table::LEASE_EPOCH).unwrap_or_default(),
            version: number(&item, table::LEASE_VERSION).unwrap_or_default(),
        }))
    }

    async fn write_lease(
        &self,
        name: &str,
        expected: Option<&LeaseRecord>,
        lease: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        let mut item = self.lease_key(name);
        item.insert(
            table::LEASE_OWNER.to_owned(),
            AttributeValue::S(lease.owner.clone()),
        );
        item.insert(
            table::LEASE_EPOCH.to_owned(),
            AttributeValue::N(lease.epoch.to_string()),
        );
        item.insert(
            table::LEASE_VERSION.to_owned(),
            AttributeValue::N(lease.version.to_string()),
        );
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table.name)
            .set_item(Some(item))
            .expression_attribute_names("#pk", &self.table.partition_key);
        request = match expected {
            None => request.condition_expression("attribute_not_exists(#pk)"),
            Some(expected) => request
                .condition_expression("#owner = :owner AND #epoch = :epoch AND #version = :version")
                .expression_attribute_names("#owner", table::LEASE_OWNER)
                .expression_attribute_names("#epoch", table::LEASE_EPOCH)
                .expression_attribute_names("#version", table::LEASE_VERSION)
                .expression_attribute_values(":owner", AttributeValue::S(expected.owner.clone()))
                .expression_attribute_values(":epoch", AttributeValue::N(expected.epoch.to_string()))
                .expression_attribute_values(":version", AttributeValue::N(expected.version.to_string())),
        };
        if expected.is_some() {
            // `#pk` is named only for the first condition; DynamoDB refuses unused names.
            request = request.set_expression_attribute_names(Some(HashMap::from([
                ("#owner".to_owned(), table::LEASE_OWNER.to_owned()),
                ("#epoch".to_owned(), table::LEASE_EPOCH.to_owned()),
                ("#version".to_owned(), table::LEASE_VERSION.to_owned()),
            ])));
        }
        self.count();
        match request.send().await {
            Ok(_) => Ok(true),
            Err(error)
                if error.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::put_item::PutItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(self.error(&error)),
        }
    }
}
