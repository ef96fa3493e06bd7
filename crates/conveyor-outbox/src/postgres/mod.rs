//! The outbox on Postgres (feature `postgres`): [`PostgresOutbox`] puts jobs in the application's own
//! sqlx transaction, [`PostgresOutboxStore`] is the relay's [`crate::OutboxStore`] on the same tables.
//!
//! The tables come from [`MIGRATION`] (`migrations/postgres/0001_outbox.sql` in this crate): run it with
//! the application's own migrations, or call [`migrate`] (tests, quick starts).
//!
//! # Design note: the sequence is the commit order
//!
//! [`PostgresOutbox::put`] allocates the aggregate's next sequence number and inserts the job in one
//! statement:
//!
//! ```sql
//! INSERT INTO conveyor_outbox_heads (aggregate, sequence) VALUES ($1, 1)
//! ON CONFLICT (aggregate) DO UPDATE SET sequence = conveyor_outbox_heads.sequence + 1
//! RETURNING sequence
//! ```
//!
//! The upsert takes the aggregate's head row lock (or, for a new aggregate, the unique index entry) and
//! Postgres holds it until the application's transaction commits or rolls back. A second transaction
//! putting a job of the same aggregate waits on that row; it reads the head only once the first has
//! ended: `n + 1` after a commit of `n`, `n` again after a rollback (no gap). So job `n + 1` of an
//! aggregate commits only after job `n` committed: sequence order is commit order, per aggregate, which
//! is the store contract the relay's order rests on (`store.rs`, `relay.rs`). Jobs of different
//! aggregates never wait on each other.
//!
//! What the application sees: writers of one aggregate are serialised from their put to their commit
//! (keep those transactions short); under `REPEATABLE READ` or `SERIALIZABLE` the waiting writer fails
//! with a serialization failure instead of waiting, and two transactions that put jobs of two aggregates
//! in opposite orders can deadlock: both are retryable ([`PostgresOutboxError::is_retryable`]), as any
//! conflicting write in Postgres is.

mod error;
mod row;
mod store;
mod tables;
mod writer;

pub use error::PostgresOutboxError;
pub use store::PostgresOutboxStore;
pub use tables::PostgresTables;
pub use writer::{PostgresOutbox, PostgresWrite};

/// The migration's file, for messages.
pub const MIGRATION_FILE: &str = "crates/conveyor-outbox/migrations/postgres/0001_outbox.sql";

/// The migration that creates the outbox tables with their default names (idempotent: `IF NOT EXISTS`).
pub const MIGRATION: &str = include_str!("../../migrations/postgres/0001_outbox.sql");

/// Runs [`MIGRATION`] on `pool` (the default names, in the connection's `search_path`).
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), PostgresOutboxError> {
    migrate_tables(pool, &PostgresTables::default()).await
}

/// Runs the migration for `tables` (creating its schema when one is set), in one transaction, under an
/// advisory lock so concurrent runs do not race.
pub async fn migrate_tables(pool: &sqlx::PgPool, tables: &PostgresTables) -> Result<(), PostgresOutboxError> {
    let failed = |source| PostgresOutboxError::Database {
        operation: "running the outbox migration",
        source,
    };
    let script = format!(
        "SELECT pg_advisory_xact_lock(hashtext('conveyor_outbox migration'));\n{}{}",
        tables.schema_preamble(),
        tables.migration()
    );
    let mut tx = pool.begin().await.map_err(failed)?;
    sqlx::raw_sql(&script).execute(&mut *tx).await.map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    tracing::info!(jobs = %tables.jobs(), heads = %tables.heads(), leases = %tables.leases(), "outbox tables migrated");
    Ok(())
}
