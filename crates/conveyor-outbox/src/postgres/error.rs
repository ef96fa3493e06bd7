//! The writer's error ([`PostgresOutboxError`]) and how a Postgres error becomes a
//! [`StoreError`]: set up wrongly (a missing table or column, denied permissions: an operator must act)
//! or unavailable (connections, timeouts, conflicts: trying again may work).

use crate::item::OutboxError;
use crate::store::StoreError;

use super::MIGRATION_FILE;

/// Why a job could not be put in the Postgres outbox, or the migration not run.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PostgresOutboxError {
    /// The job breaks one of the producer's checks, or its aggregate id is invalid.
    #[error(transparent)]
    Job(#[from] OutboxError),
    /// The outbox tables (or a column) are missing, or the role may not use them.
    #[error(
        "{operation}: the outbox tables are missing or not usable ({source}): run the migration \
         {MIGRATION_FILE} (conveyor_outbox::postgres::MIGRATION) on this database, and grant the \
         application's role INSERT and UPDATE on the heads table and INSERT on the jobs table"
    )]
    Misconfigured {
        /// What was being done.
        operation: &'static str,
        /// Postgres's error.
        source: sqlx::Error,
    },
    /// Postgres refused or failed the statement; the transaction is aborted (roll it back). See
    /// [`PostgresOutboxError::is_retryable`].
    #[error("{operation}: {source}")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// Postgres's error.
        source: sqlx::Error,
    },
    /// A schema or table name that is not a plain identifier.
    #[error(
        "outbox schema or table name {name:?} must be 1 to 50 lowercase letters, digits or `_`, not \
         starting with a digit"
    )]
    InvalidName {
        /// The name given.
        name: String,
    },
}

impl PostgresOutboxError {
    /// Wraps a Postgres error raised while doing `operation`.
    pub(crate) fn database(operation: &'static str, source: sqlx::Error) -> Self {
        if misconfiguration(&source) {
            Self::Misconfigured { operation, source }
        } else {
            Self::Database { operation, source }
        }
    }

    /// True when running the application's transaction again may succeed: a serialization failure
    /// or deadlock (two writers of one aggregate under `REPEATABLE READ`, or of two aggregates in
    /// opposite orders), a lost connection, a timeout.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database { source, .. } => !misconfiguration(source) && retryable(source),
            _ => false,
        }
    }
}

/// The SQLSTATE of a database error.
fn code(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(database) => database.code().map(|code| code.into_owned()),
        _ => None,
    }
}

/// True for errors an operator must fix: missing tables, columns, schemas, functions or databases,
/// denied permissions, failed authentication, a wrong connection setting, a column of another type.
pub(crate) fn misconfiguration(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Configuration(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::TypeNotFound { .. } => true,
        sqlx::Error::Database(_) => matches!(
            code(error).as_deref(),
            // undefined table, column, function, object; invalid schema; insufficient privilege;
            // invalid authorization; invalid password; no such database.
            Some("42P01" | "42703" | "42883" | "42704" | "3F000" | "42501" | "28000" | "28P01" | "3D000")
        ),
        _ => false,
    }
}

/// True for errors that may pass by themselves.
fn retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(_) => code(error).is_some_and(|code| {
            // serialization failure, deadlock, connection exceptions, insufficient resources, operator
            // intervention (shutdown, statement timeout), lock not available.
            code == "40001"
                || code == "40P01"
                || code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57")
                || code == "55P03"
        }),
        _ => false,
    }
}

/// `error`, raised by the store named `store`, as a [`StoreError`].
pub(crate) fn store_error(store: &str, error: &sqlx::Error) -> StoreError {
    if misconfiguration(error) {
        return StoreError::Misconfigured {
            store: store.to_owned(),
            message: format!(
                "{error} (run the migration {MIGRATION_FILE} (conveyor_outbox::postgres::MIGRATION) on this \
                 database; the relay's role needs SELECT, UPDATE and DELETE on the jobs table and SELECT, \
                 INSERT and UPDATE on the leases table)"
            ),
        };
    }
    StoreError::Unavailable {
        store: store.to_owned(),
        message: error.to_string(),
    }
}
