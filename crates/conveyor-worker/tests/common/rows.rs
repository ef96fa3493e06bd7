//! Rows written by jobs into a DynamoDB table of the test's own: a batch handler with one
//! `BatchWriteItem` per call (25 items, DynamoDB's limit) and a per-job handler with one `PutItem`
//! each, both counting their DynamoDB requests and each row's writes. Shared by the LocalStack test
//! (`tests/aws/batch_rows.rs`) and the figures (`examples/batch_bench.rs`).
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use conveyor_core::{Batch, BatchHandler, BatchResult, BatchSettings, Context, Handler, HandlerError};
use serde::{Deserialize, Serialize};

/// One row to write. An empty `id` is poison: refused permanently.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RowJob {
    pub(crate) id: String,
    pub(crate) value: u64,
}

/// The table, with what the handlers did to it.
#[derive(Debug)]
pub(crate) struct RowTable {
    client: aws_sdk_dynamodb::Client,
    table: String,
    requests: AtomicU64,
    writes: Mutex<HashMap<String, u32>>,
}

impl RowTable {
    /// A fresh table (partition key `id`).
    pub(crate) async fn create(client: aws_sdk_dynamodb::Client, prefix: &str) -> anyhow::Result<Arc<Self>> {
        let table = conveyor_testing::localstack::create_table(&client, prefix).await?;
        Ok(Arc::new(Self {
            client,
            table,
            requests: AtomicU64::new(0),
            writes: Mutex::new(HashMap::new()),
        }))
    }

    /// DynamoDB requests the handlers made.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// How many times each row was written.
    pub(crate) fn writes(&self) -> HashMap<String, u32> {
        self.writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The rows in the table, by a scan.
    pub(crate) async fn rows(&self) -> anyhow::Result<HashSet<String>> {
        let mut ids = HashSet::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .set_exclusive_start_key(start)
                .send()
                .await?;
            for item in page.items() {
                if let Some(AttributeValue::S(id)) = item.get("id") {
                    ids.insert(id.clone());
                }
            }
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(ids);
            }
        }
    }

    fn item(job: &RowJob, ctx: &Context) -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("id".to_owned(), AttributeValue::S(job.id.clone())),
            ("value".to_owned(), AttributeValue::N(job.value.to_string())),
            (
                "message_id".to_owned(),
                AttributeValue::S(ctx.message_id().to_owned()),
            ),
        ])
    }

    fn wrote(&self, id: &str) {
        *self
            .writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default() += 1;
    }
}

fn refused(job: &RowJob) -> Option<HandlerError> {
    job.id
        .is_empty()
        .then(|| HandlerError::permanent(format!("row with value {} has no id", job.value)))
}

/// One `BatchWriteItem` per call; a job whose item comes back in `UnprocessedItems` is retried alone.
pub(crate) struct WriteRows(pub(crate) Arc<RowTable>);

impl BatchHandler for WriteRows {
    type Job = RowJob;
    type Output = ();
    const JOB_TYPE: &'static str = "row";

    async fn handle_batch(&self, batch: Batch<RowJob>) -> BatchResult<()> {
        let table = &self.0;
        let mut results: Vec<Option<Result<(), HandlerError>>> = Vec::with_capacity(batch.len());
        let mut requests = Vec::new();
        for job in batch.jobs() {
            if let Some(error) = refused(&job.job) {
                results.push(Some(Err(error)));
                continue;
            }
            if job.ctx.is_cancelled() {
                results.push(Some(Err(HandlerError::retryable("cancelled before the write"))));
                continue;
            }
            let put = PutRequest::builder()
                .set_item(Some(RowTable::item(&job.job, &job.ctx)))
                .build()
                .map_err(|error| HandlerError::permanent(error.to_string()))?;
            requests.push(WriteRequest::builder().put_request(put).build());
            results.push(None);
        }
        let mut unprocessed = HashSet::new();
        if !requests.is_empty() {
            table.requests.fetch_add(1, Ordering::Relaxed);
            let output = table
                .client
                .batch_write_item()
                .request_items(&table.table, requests)
                .send()
                .await
                .map_err(|error| {
                    HandlerError::retryable(aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string())
                })?;
            for request in output
                .unprocessed_items()
                .and_then(|items| items.get(&table.table))
                .into_iter()
                .flatten()
            {
                if let Some(AttributeValue::S(id)) =
                    request.put_request().and_then(|put| put.item().get("id"))
                {
                    unprocessed.insert(id.clone());
                }
            }
        }
        Ok(batch
            .jobs()
            .iter()
            .zip(results)
            .map(|(job, result)| {
                result.unwrap_or_else(|| {
                    if unprocessed.contains(&job.job.id) {
                        return Err(HandlerError::retryable(
                            "unprocessed by BatchWriteItem (throttled)",
                        ));
                    }
                    table.wrote(&job.job.id);
                    Ok(())
                })
            })
            .collect())
    }

    fn batch_settings(&self) -> BatchSettings {
        BatchSettings::default().with_max_jobs(25)
    }
}

/// One `PutItem` per job.
pub(crate) struct PutRow(pub(crate) Arc<RowTable>);

impl Handler for PutRow {
    type Job = RowJob;
    type Output = ();
    const JOB_TYPE: &'static str = "row";

    async fn handle(&self, job: RowJob, ctx: Context) -> Result<(), HandlerError> {
        if let Some(error) = refused(&job) {
            return Err(error);
        }
        let table = &self.0;
        table.requests.fetch_add(1, Ordering::Relaxed);
        table
            .client
            .put_item()
            .table_name(&table.table)
            .set_item(Some(RowTable::item(&job, &ctx)))
            .send()
            .await
            .map_err(|error| {
                HandlerError::retryable(aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string())
            })?;
        table.wrote(&job.id);
        Ok(())
    }
}
