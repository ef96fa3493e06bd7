//! [`PostgresTables`]: where the outbox lives (schema and table names), checked to be plain identifiers so
//! they can be written into SQL.

use super::error::PostgresOutboxError;

/// The default jobs table.
pub(crate) const DEFAULT_JOBS: &str = "conveyor_outbox";
/// The default heads table (the last sequence number per aggregate).
pub(crate) const DEFAULT_HEADS: &str = "conveyor_outbox_heads";
/// The default leases table.
pub(crate) const DEFAULT_LEASES: &str = "conveyor_outbox_leases";

/// The longest identifier Postgres keeps (longer ones are truncated), less room for index suffixes.
const MAX_IDENTIFIER: usize = 50;

/// The outbox's schema and table names: `conveyor_outbox`, `conveyor_outbox_heads` and
/// `conveyor_outbox_leases` in the connection's `search_path` by default. Names are lowercase letters,
/// digits and `_`, starting with a letter or `_`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresTables {
    schema: Option<String>,
    jobs: String,
    heads: String,
    leases: String,
}

impl Default for PostgresTables {
    fn default() -> Self {
        Self {
            schema: None,
            jobs: DEFAULT_JOBS.to_owned(),
            heads: DEFAULT_HEADS.to_owned(),
            leases: DEFAULT_LEASES.to_owned(),
        }
    }
}

fn check(name: &str) -> Result<String, PostgresOutboxError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|first| first.is_ascii_lowercase() || first == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && name.len() <= MAX_IDENTIFIER {
        Ok(name.to_owned())
    } else {
        Err(PostgresOutboxError::InvalidName {
            name: name.to_owned(),
        })
    }
}

impl PostgresTables {
    /// The default table names in `schema`.
    pub fn in_schema(schema: &str) -> Result<Self, PostgresOutboxError> {
        Ok(Self {
            schema: Some(check(schema)?),
            ..Self::default()
        })
    }

    /// Own table names (in the connection's `search_path`, or the schema set before).
    pub fn with_names(self, jobs: &str, heads: &str, leases: &str) -> Result<Self, PostgresOutboxError> {
        Ok(Self {
            schema: self.schema,
            jobs: check(jobs)?,
            heads: check(heads)?,
            leases: check(leases)?,
        })
    }

    /// The schema, when one is set.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    fn qualified(&self, table: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{table}"),
            None => table.to_owned(),
        }
    }

    /// The jobs table, schema-qualified when a schema is set.
    pub fn jobs(&self) -> String {
        self.qualified(&self.jobs)
    }

    /// The heads table, schema-qualified when a schema is set.
    pub fn heads(&self) -> String {
        self.qualified(&self.heads)
    }

    /// The leases table, schema-qualified when a schema is set.
    pub fn leases(&self) -> String {
        self.qualified(&self.leases)
    }

    /// The migration for these names (unqualified: run it with the schema in `search_path`, as
    /// [`super::migrate_tables`] does). With the default names it is [`super::MIGRATION`].
    pub fn migration(&self) -> String {
        // The heads and leases names contain the jobs name: set them aside first.
        super::MIGRATION
            .replace(DEFAULT_HEADS, "\u{1}heads\u{1}")
            .replace(DEFAULT_LEASES, "\u{1}leases\u{1}")
            .replace(DEFAULT_JOBS, &self.jobs)
            .replace("\u{1}heads\u{1}", &self.heads)
            .replace("\u{1}leases\u{1}", &self.leases)
    }

    /// Statements that create the schema and put it first in the `search_path` of the current
    /// transaction (empty without a schema).
    pub(crate) fn schema_preamble(&self) -> String {
        match &self.schema {
            Some(schema) => {
                format!("CREATE SCHEMA IF NOT EXISTS {schema};\nSET LOCAL search_path TO {schema};\n")
            }
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        assert!(PostgresTables::in_schema("app_1").is_ok());
        for bad in [
            "",
            "1abc",
            "Outbox",
            "a;drop table x",
            "a.b",
            "a\"b",
            &"x".repeat(51),
        ] {
            assert!(PostgresTables::in_schema(bad).is_err(), "{bad:?} refused");
        }
    }

    #[test]
    fn the_default_migration_is_the_file_and_own_names_replace_every_table() {
        let tables = PostgresTables::default();
        assert_eq!(tables.migration(), super::super::MIGRATION);
        assert_eq!(tables.jobs(), "conveyor_outbox");
        let own = PostgresTables::in_schema("app")
            .and_then(|tables| tables.with_names("jobs", "job_heads", "job_leases"))
            .unwrap();
        let migration = own.migration();
        assert!(!migration.contains("conveyor_outbox"), "{migration}");
        assert!(migration.contains("CREATE TABLE IF NOT EXISTS jobs ("));
        assert!(migration.contains("CREATE TABLE IF NOT EXISTS job_heads ("));
        assert!(migration.contains("CREATE TABLE IF NOT EXISTS job_leases ("));
        assert!(migration.contains("CREATE INDEX IF NOT EXISTS jobs_pending"));
        assert_eq!(own.heads(), "app.job_heads");
    }
}
