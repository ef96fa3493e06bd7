//! [`PostgresOutbox`]: puts jobs in the outbox tables on the application's own connection, inside its
//! transaction, so a job commits (or rolls back) with the application's rows. The sequence allocation and
//! why it is the commit order: the module's design note (`postgres/mod.rs`).

use std::time::SystemTime;

use conveyor_core::runtime::epoch_millis;
use conveyor_sqs::NewJob;
use serde::Serialize;
use sqlx::PgConnection;

use super::error::PostgresOutboxError;
use super::row::{FORMAT_VERSION, attributes_json};
use super::tables::PostgresTables;
use crate::encode::{EncodedJob, encode};

/// Puts jobs for one queue in the Postgres outbox, on the application's connection.
///
/// ```no_run
/// use conveyor_outbox::postgres::PostgresOutbox;
/// use conveyor_sqs::NewJob;
///
/// #[derive(serde::Serialize)]
/// struct Invoice { order_id: i64 }
///
/// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
/// let outbox = PostgresOutbox::new("https://sqs.us-east-1.amazonaws.com/123456789012/invoices");
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)").bind(42_i64).bind(100_i64).execute(&mut *tx).await?;
/// outbox.put(&mut tx, NewJob::new("invoice", Invoice { order_id: 42 }), "order:42").await?;
/// tx.commit().await?; // the order and its job, or neither
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresOutbox {
    queue_url: String,
    tables: PostgresTables,
    jobs_insert: String,
    unordered_insert: String,
}

/// One job put by [`PostgresOutbox::put`]: it commits with the transaction it was put in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresWrite {
    /// The aggregate (for [`PostgresOutbox::put_unordered`], the item id).
    pub aggregate: String,
    /// The job's sequence number in its aggregate.
    pub sequence: u64,
    /// The item id (the FIFO deduplication id unless the job set one).
    pub id: String,
    /// The idempotency key the consumer settles the job under: the job's own, or `outbox:<id>`.
    pub idempotency_key: String,
}

/// The job columns an insert writes, in the order of its parameters `$2..`.
const JOB_COLUMNS: &str = "id, queue_url, job_type, idempotency_key, body, attributes, delay_ms, group_id, \
     deduplication_id, trace_header, created_at_millis, attempts, format_version";
/// Their parameters (`$1` is the aggregate).
const JOB_VALUES: &str = "$2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, 0, $13";

impl PostgresOutbox {
    /// An outbox for the queue at `queue_url` (FIFO when its name ends in `.fifo`), in the default tables.
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self::with_tables(queue_url, PostgresTables::default())
    }

    /// An outbox for the queue at `queue_url` in `tables`.
    pub fn with_tables(queue_url: impl Into<String>, tables: PostgresTables) -> Self {
        let jobs = tables.jobs();
        let heads = tables.heads();
        // One statement: the head's upsert takes the aggregate's row lock (held until the transaction
        // ends) and the job gets the sequence it returns. Atomic even outside a transaction.
        let jobs_insert = format!(
            "WITH head AS (\
                 INSERT INTO {heads} AS h (aggregate, sequence) VALUES ($1, 1) \
                 ON CONFLICT (aggregate) DO UPDATE SET sequence = h.sequence + 1 \
                 RETURNING sequence\
             ) \
             INSERT INTO {jobs} (aggregate, sequence, {JOB_COLUMNS}) \
             SELECT $1, head.sequence, {JOB_VALUES} FROM head \
             RETURNING sequence"
        );
        let unordered_insert = format!(
            "INSERT INTO {jobs} (aggregate, sequence, {JOB_COLUMNS}) VALUES ($1, 1, {JOB_VALUES}) \
             RETURNING sequence"
        );
        Self {
            queue_url: queue_url.into(),
            jobs_insert,
            unordered_insert,
            tables,
        }
    }

    /// The tables written.
    pub fn tables(&self) -> &PostgresTables {
        &self.tables
    }

    /// Puts `job` as `aggregate`'s next job, on `conn`: pass the application's transaction
    /// (`&mut tx`), so the job commits or rolls back with the application's rows. `aggregate` orders
    /// jobs: the relay sends them in the order their transactions committed; on a FIFO queue it is the
    /// message group id (replacing a group id set on the job).
    ///
    /// Until the transaction ends, other transactions putting jobs of the same aggregate wait (the
    /// head's row lock): keep them short.
    pub async fn put<J: Serialize>(
        &self,
        conn: &mut PgConnection,
        job: NewJob<J>,
        aggregate: &str,
    ) -> Result<PostgresWrite, PostgresOutboxError> {
        let id = uuid::Uuid::new_v4().to_string();
        let encoded = encode(job, &self.queue_url, aggregate, &id)?;
        self.insert(conn, &self.jobs_insert, encoded, aggregate, id).await
    }

    /// Puts `job`, which needs no order relative to other jobs: an aggregate of its own (its item id),
    /// sequence 1, no head row and no lock other writers wait on.
    pub async fn put_unordered<J: Serialize>(
        &self,
        conn: &mut PgConnection,
        job: NewJob<J>,
    ) -> Result<PostgresWrite, PostgresOutboxError> {
        let id = uuid::Uuid::new_v4().to_string();
        let encoded = encode(job, &self.queue_url, &id, &id)?;
        let aggregate = id.clone();
        self.insert(conn, &self.unordered_insert, encoded, &aggregate, id)
            .await
    }

    async fn insert(
        &self,
        conn: &mut PgConnection,
        statement: &str,
        encoded: EncodedJob,
        aggregate: &str,
        id: String,
    ) -> Result<PostgresWrite, PostgresOutboxError> {
        let message = &encoded.message;
        let delay_ms = message
            .delay
            .map(|delay| i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
        let created_at = i64::try_from(epoch_millis(SystemTime::now())).unwrap_or(i64::MAX);
        let sequence: i64 = sqlx::query_scalar(statement)
            .bind(aggregate)
            .bind(&id)
            .bind(&self.queue_url)
            .bind(&encoded.job_type)
            .bind(&encoded.idempotency_key)
            .bind(&message.body)
            .bind(attributes_json(&message.attributes))
            .bind(delay_ms)
            .bind(message.group_id.as_deref())
            .bind(message.deduplication_id.as_deref())
            .bind(message.trace_header.as_deref())
            .bind(created_at)
            .bind(FORMAT_VERSION)
            .fetch_one(&mut *conn)
            .await
            .map_err(|error| PostgresOutboxError::database("putting a job in the outbox", error))?;
        tracing::debug!(
            aggregate,
            sequence,
            job_type = %encoded.job_type,
            table = %self.tables.jobs(),
            "outbox job put"
        );
        Ok(PostgresWrite {
            aggregate: aggregate.to_owned(),
            sequence: u64::try_from(sequence).unwrap_or_default(),
            id,
            idempotency_key: encoded.idempotency_key,
        })
    }
}
