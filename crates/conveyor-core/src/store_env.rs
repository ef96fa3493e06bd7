//! `CONVEYOR_IDEMPOTENCY_TABLE`: what both runtimes do when the environment names an idempotency table.
//!
//! The decision is one pure function, so the worker and the Lambda adapter decide alike; each runtime
//! builds the DynamoDB store itself (with its `dynamodb` feature), since the core has no AWS SDK.
//!
//! | variable | the pipeline's store | `dynamodb` compiled in | result |
//! |---|---|---|---|
//! | unset (or blank) | any | any | the pipeline's store stands (or none) |
//! | set | none | yes | the runtime builds the DynamoDB store on the table |
//! | set | none | no | refused: duplicates would run twice |
//! | set | on the same table | any | the pipeline's store stands |
//! | set | on another table, or not a table | any | refused: which one is meant? |

use crate::Pipeline;

/// `CONVEYOR_IDEMPOTENCY_TABLE`: the DynamoDB table of the idempotency records (both runtimes).
pub const ENV_IDEMPOTENCY_TABLE: &str = "CONVEYOR_IDEMPOTENCY_TABLE";

/// What a runtime does about the idempotency store, by [`store_from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The pipeline's own store stands (none when the pipeline has none and the variable is unset).
    Pipeline,
    /// Build the DynamoDB store on this table and give it to the pipeline.
    Build {
        /// The table's name.
        table: String,
    },
}

/// `CONVEYOR_IDEMPOTENCY_TABLE` is set but cannot be used: the runtime refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreEnvError {
    /// The binary cannot build a DynamoDB store.
    #[error(
        "{ENV_IDEMPOTENCY_TABLE}={table} is set, but this binary was built without Conveyor's `dynamodb` \
         feature and its pipeline has no store, so jobs would run without idempotency (a duplicate would run \
         twice): add the feature (conveyor = {{ ..., features = [\"dynamodb\"] }}), or give the pipeline a \
         store (Pipeline::with_store), or unset {ENV_IDEMPOTENCY_TABLE} to run without idempotency"
    )]
    NotCompiledIn {
        /// The variable's value.
        table: String,
    },
    /// The pipeline has a store on another table.
    #[error(
        "{ENV_IDEMPOTENCY_TABLE}={table} is set, but the pipeline's store (Pipeline::with_store) is on table \
         {store_table}: set {ENV_IDEMPOTENCY_TABLE}={store_table}, or build the store on {table}, or unset \
         {ENV_IDEMPOTENCY_TABLE} and keep the pipeline's"
    )]
    OtherTable {
        /// The variable's value.
        table: String,
        /// The table of the pipeline's store.
        store_table: String,
    },
    /// The pipeline has a store that is not on a table (an in-memory store, an application's own).
    #[error(
        "{ENV_IDEMPOTENCY_TABLE}={table} is set, but the pipeline already has an idempotency store that is \
         not a DynamoDB table (Pipeline::with_store): remove the store to use the table, or unset \
         {ENV_IDEMPOTENCY_TABLE} to keep the store"
    )]
    OtherStore {
        /// The variable's value.
        table: String,
    },
}

/// Decides what a runtime does with `variable` (the value of [`ENV_IDEMPOTENCY_TABLE`], blank counts as
/// unset) for `pipeline`, when it `can_build` a DynamoDB store (its `dynamodb` feature is on). See the
/// module docs for the table of cases.
pub fn store_from_env(
    variable: Option<&str>,
    pipeline: &Pipeline,
    can_build: bool,
) -> Result<StoreChoice, StoreEnvError> {
    let Some(table) = variable.map(str::trim).filter(|table| !table.is_empty()) else {
        return Ok(StoreChoice::Pipeline);
    };
    let table = table.to_owned();
    let Some(store) = pipeline.store() else {
        if can_build {
            return Ok(StoreChoice::Build { table });
        }
        return Err(StoreEnvError::NotCompiledIn { table });
    };
    match store.table() {
        Some(store_table) if store_table == table => Ok(StoreChoice::Pipeline),
        Some(store_table) => Err(StoreEnvError::OtherTable {
            table,
            store_table: store_table.to_owned(),
        }),
        None => Err(StoreEnvError::OtherStore { table }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Router;

    /// A store that says which table it is on.
    pub(crate) struct OnTable(pub(crate) Option<&'static str>);

    #[async_trait::async_trait]
    impl crate::port::IdempotencyStore for OnTable {
        async fn claim(
            &self,
            _: &crate::port::ClaimRequest,
        ) -> Result<crate::port::ClaimOutcome, crate::port::StoreError> {
            unreachable!("not called")
        }
        async fn complete(
            &self,
            _: &crate::port::Claim,
            _: Option<&str>,
            _: std::time::SystemTime,
        ) -> Result<(), crate::port::StoreError> {
            unreachable!("not called")
        }
        async fn release(&self, _: &crate::port::Claim) -> Result<(), crate::port::StoreError> {
            unreachable!("not called")
        }
        async fn extend_lease(
            &self,
            _: &crate::port::Claim,
            _: std::time::SystemTime,
        ) -> Result<(), crate::port::StoreError> {
            unreachable!("not called")
        }
        async fn get(
            &self,
            _: &str,
        ) -> Result<Option<crate::port::IdempotencyRecord>, crate::port::StoreError> {
            unreachable!("not called")
        }
        fn table(&self) -> Option<&str> {
            self.0
        }
    }

    fn with(store: OnTable) -> Pipeline {
        Pipeline::new(Router::new()).with_store(Arc::new(store))
    }

    #[test]
    fn each_case_of_the_table() {
        let bare = Pipeline::new(Router::new());
        assert_eq!(store_from_env(None, &bare, false), Ok(StoreChoice::Pipeline));
        assert_eq!(
            store_from_env(Some("  "), &bare, false),
            Ok(StoreChoice::Pipeline)
        );
        assert_eq!(
            store_from_env(Some("jobs"), &bare, true),
            Ok(StoreChoice::Build {
                table: "jobs".to_owned()
            })
        );
        let error = store_from_env(Some("jobs"), &bare, false)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("CONVEYOR_IDEMPOTENCY_TABLE=jobs") && error.contains("features = [\"dynamodb\"]"),
            "{error}"
        );
        let same = with(OnTable(Some("jobs")));
        assert_eq!(
            store_from_env(Some("jobs"), &same, false),
            Ok(StoreChoice::Pipeline)
        );
        let error = store_from_env(Some("other"), &same, true)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("other") && error.contains("is on table jobs"),
            "{error}"
        );
        let memory = with(OnTable(None));
        assert!(matches!(
            store_from_env(Some("jobs"), &memory, true),
            Err(StoreEnvError::OtherStore { .. })
        ));
        assert_eq!(store_from_env(None, &memory, true), Ok(StoreChoice::Pipeline));
    }
}
