//! [`PostgresOutboxStore`]: the [`OutboxStore`] on the outbox tables, for the relay.
//!
//! Every call is one statement on the pool (autocommit, `READ COMMITTED`): an aggregate's jobs by its
//! primary key; the pending aggregates from the partial index over unparked jobs' commit times; the
//! removal of sent jobs one `DELETE ... RETURNING` for the whole batch, so each job is reported removed
//! by the one call that removed it (a concurrent `DELETE` of the same row waits for the first, then
//! finds it gone); the lease a conditional `UPDATE` or `INSERT ... ON CONFLICT DO NOTHING`, judged by
//! its row count.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{PgPool, Row};

use super::error::store_error;
use super::row::{COLUMNS, parse_job};
use super::tables::PostgresTables;
use crate::store::{Backlog, JobRef, LeaseRecord, OutboxStore, StoreError, StoredJob};

/// The outbox store on Postgres. Clones share the pool.
///
/// Its calls wait as long as the pool lets them: set the pool's `acquire_timeout` and a
/// `statement_timeout` (connection options) so an unreachable or stuck database fails a relay pass
/// ([`StoreError::Unavailable`]) instead of holding it.
#[derive(Debug, Clone)]
pub struct PostgresOutboxStore {
    pool: PgPool,
    tables: PostgresTables,
    name: String,
    /// SQL statements sent so far (the figures' requests per job).
    statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A count or limit as a bigint parameter.
fn bigint(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// An epoch-milliseconds bound as a bigint parameter (`u64::MAX`, "any time", stays the largest).
fn millis(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PostgresOutboxStore {
    /// The store on the default tables, through `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self::with_tables(pool, PostgresTables::default())
    }

    /// The store on `tables`, through `pool`.
    pub fn with_tables(pool: PgPool, tables: PostgresTables) -> Self {
        let name = format!("postgres:{}", tables.jobs());
        Self {
            pool,
            tables,
            name,
            statements: std::sync::Arc::default(),
        }
    }

    /// The tables.
    pub fn tables(&self) -> &PostgresTables {
        &self.tables
    }

    fn count(&self) {
        self.statements.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn error(&self, operation: &'static str, error: &sqlx::Error) -> StoreError {
        let mapped = store_error(&self.name, error);
        // The relay logs the failure with its context; this says which statement.
        tracing::debug!(store = %self.name, operation, error = %mapped, "outbox store call failed");
        mapped
    }

    fn parse(&self, rows: &[sqlx::postgres::PgRow]) -> Result<Vec<StoredJob>, StoreError> {
        rows.iter().map(|row| parse_job(&self.name, row)).collect()
    }
}

#[async_trait]
impl OutboxStore for PostgresOutboxStore {
    fn requests(&self) -> u64 {
        self.statements.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn jobs(&self, aggregate: &str, limit: usize) -> Result<Vec<StoredJob>, StoreError> {
        let statement = format!(
            "SELECT {COLUMNS} FROM {} WHERE aggregate = $1 ORDER BY sequence LIMIT $2",
            self.tables.jobs()
        );
        self.count();
        let rows = sqlx::query(&statement)
            .bind(aggregate)
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|error| self.error("jobs", &error))?;
        self.parse(&rows)
    }

    async fn pending(&self, limit: usize, committed_before_millis: u64) -> Result<Vec<String>, StoreError> {
        // An aggregate's oldest unparked job is older than the bound exactly when one of its unparked
        // jobs is: filtering the rows first lets the partial index bound the scan. Jobs behind a parked
        // one are not sendable, so they never list their aggregate: an aggregate whose head is parked
        // would take another's turn in a pass (150 parked heads stopped a relay of 100 per pass).
        let jobs = self.tables.jobs();
        let statement = format!(
            "SELECT aggregate, min(created_at_millis) AS oldest FROM {jobs} AS waiting \
             WHERE parked_at_millis IS NULL AND created_at_millis < $1 \
             AND NOT EXISTS (SELECT 1 FROM {jobs} AS parked WHERE parked.aggregate = waiting.aggregate \
             AND parked.sequence < waiting.sequence AND parked.parked_at_millis IS NOT NULL) \
             GROUP BY aggregate ORDER BY oldest, aggregate LIMIT $2"
        );
        self.count();
        let rows = sqlx::query(&statement)
            .bind(millis(committed_before_millis))
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|error| self.error("pending", &error))?;
        rows.iter()
            .map(|row| {
                row.try_get("aggregate")
                    .map_err(|error| self.error("pending", &error))
            })
            .collect()
    }

    async fn remove_sent(&self, jobs: &[JobRef]) -> Result<Vec<bool>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        // A sequence past bigint cannot be stored: such a job is not there.
        let (aggregates, sequences): (Vec<&str>, Vec<i64>) = jobs
            .iter()
            .filter_map(|job| Some((job.aggregate.as_str(), i64::try_from(job.sequence).ok()?)))
            .unzip();
        let statement = format!(
            "DELETE FROM {} WHERE (aggregate, sequence) IN \
             (SELECT * FROM unnest($1::text[], $2::bigint[])) RETURNING aggregate, sequence",
            self.tables.jobs()
        );
        self.count();
        let rows = sqlx::query(&statement)
            .bind(&aggregates)
            .bind(&sequences)
            .fetch_all(&self.pool)
            .await
            .map_err(|error| self.error("remove_sent", &error))?;
        let mut removed: HashSet<(String, u64)> = HashSet::with_capacity(rows.len());
        for row in &rows {
            let aggregate: String = row
                .try_get("aggregate")
                .map_err(|error| self.error("remove_sent", &error))?;
            let sequence: i64 = row
                .try_get("sequence")
                .map_err(|error| self.error("remove_sent", &error))?;
            removed.insert((aggregate, u64::try_from(sequence).unwrap_or_default()));
        }
        // A job listed twice was removed once: the first mention takes it.
        Ok(jobs
            .iter()
            .map(|job| removed.remove(&(job.aggregate.clone(), job.sequence)))
            .collect())
    }

    async fn record_failure(
        &self,
        job: &JobRef,
        reason: &str,
        parked_at_millis: Option<u64>,
    ) -> Result<(), StoreError> {
        let Ok(sequence) = i64::try_from(job.sequence) else {
            return Ok(());
        };
        // No row (another relay sent it meanwhile): nothing to record.
        let statement = format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = $3, \
             parked_at_millis = COALESCE($4, parked_at_millis) \
             WHERE aggregate = $1 AND sequence = $2",
            self.tables.jobs()
        );
        self.count();
        sqlx::query(&statement)
            .bind(&job.aggregate)
            .bind(sequence)
            .bind(reason)
            .bind(parked_at_millis.map(millis))
            .execute(&self.pool)
            .await
            .map_err(|error| self.error("record_failure", &error))?;
        Ok(())
    }

    async fn unpark(&self, aggregate: &str) -> Result<usize, StoreError> {
        let statement = format!(
            "UPDATE {} SET parked_at_millis = NULL, attempts = 0 \
             WHERE aggregate = $1 AND parked_at_millis IS NOT NULL",
            self.tables.jobs()
        );
        self.count();
        let done = sqlx::query(&statement)
            .bind(aggregate)
            .execute(&self.pool)
            .await
            .map_err(|error| self.error("unpark", &error))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn backlog(&self, limit: usize) -> Result<Backlog, StoreError> {
        let jobs = self.tables.jobs();
        self.count();
        let oldest: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT min(created_at_millis) FROM {jobs} WHERE parked_at_millis IS NULL"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|error| self.error("backlog", &error))?;
        let pending_aggregates = self.pending(limit, u64::MAX).await?;
        self.count();
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM {jobs} WHERE parked_at_millis IS NOT NULL \
             ORDER BY created_at_millis, aggregate, sequence LIMIT $1"
        ))
        .bind(bigint(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|error| self.error("backlog", &error))?;
        Ok(Backlog {
            oldest_pending_millis: oldest.and_then(|oldest| u64::try_from(oldest).ok()),
            pending_aggregates,
            parked: self.parse(&rows)?,
        })
    }

    async fn read_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let statement = format!(
            "SELECT owner, epoch, version FROM {} WHERE name = $1",
            self.tables.leases()
        );
        self.count();
        let row: Option<(String, i64, i64)> = sqlx::query_as(&statement)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(|error| self.error("read_lease", &error))?;
        Ok(row.map(|(owner, epoch, version)| LeaseRecord {
            owner,
            epoch: u64::try_from(epoch).unwrap_or_default(),
            version: u64::try_from(version).unwrap_or_default(),
        }))
    }

    async fn write_lease(
        &self,
        name: &str,
        expected: Option<&LeaseRecord>,
        lease: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        let leases = self.tables.leases();
        let epoch = millis(lease.epoch);
        let version = millis(lease.version);
        let done = match expected {
            None => {
                self.count();
                sqlx::query(&format!(
                    "INSERT INTO {leases} (name, owner, epoch, version) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (name) DO NOTHING"
                ))
                .bind(name)
                .bind(&lease.owner)
                .bind(epoch)
                .bind(version)
                .execute(&self.pool)
                .await
            }
            Some(expected) => {
                self.count();
                sqlx::query(&format!(
                    "UPDATE {leases} SET owner = $2, epoch = $3, version = $4 \
                     WHERE name = $1 AND owner = $5 AND epoch = $6 AND version = $7"
                ))
                .bind(name)
                .bind(&lease.owner)
                .bind(epoch)
                .bind(version)
                .bind(&expected.owner)
                .bind(millis(expected.epoch))
                .bind(millis(expected.version))
                .execute(&self.pool)
                .await
            }
        }
        .map_err(|error| self.error("write_lease", &error))?;
        Ok(done.rows_affected() == 1)
    }
}
