//! `CONVEYOR_IDEMPOTENCY_TABLE` in the worker: the DynamoDB store built from it when the pipeline has
//! none (feature `dynamodb`), or the start refused with what to do (see
//! `conveyor_core::runtime::store_from_env` for the cases).

use conveyor_core::Pipeline;
use conveyor_core::runtime::{ENV_IDEMPOTENCY_TABLE, StoreChoice, store_from_env};

use crate::error::WorkerError;

/// `pipeline` with the store the environment names, when it names one the pipeline lacks.
pub(crate) async fn with_store_from_env(pipeline: Pipeline) -> Result<Pipeline, WorkerError> {
    let variable = std::env::var(ENV_IDEMPOTENCY_TABLE).ok();
    match store_from_env(variable.as_deref(), &pipeline, cfg!(feature = "dynamodb"))? {
        StoreChoice::Pipeline => Ok(pipeline),
        StoreChoice::Build { table } => Ok(build(pipeline, table).await),
    }
}

#[cfg(feature = "dynamodb")]
async fn build(pipeline: Pipeline, table: String) -> Pipeline {
    let client = conveyor_dynamodb::dynamodb_client_from_env().await;
    tracing::debug!(%table, "idempotency store built from {ENV_IDEMPOTENCY_TABLE}");
    let store = conveyor_dynamodb::DynamoStore::new(client, table);
    pipeline.with_store(std::sync::Arc::new(store))
}

/// Never called: without the feature `store_from_env` refuses instead of choosing to build.
#[cfg(not(feature = "dynamodb"))]
async fn build(pipeline: Pipeline, _table: String) -> Pipeline {
    pipeline
}
