#![doc = include_str!("../README.md")]

mod batch;
mod concurrency;
mod cover;
mod error;
mod event;
mod flow_sweep;
mod log_format;
mod metrics;
#[cfg(feature = "outbox")]
pub mod outbox;
mod queues;
mod record;
mod runtime;
mod settings;
mod store_env;
mod tenants;
mod timer_relay;

pub use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
pub use batch::{BatchFailed, BatchProcessor, BatchReport, visibility_advice};
pub use concurrency::MAX_CONCURRENCY_ENV;
pub use error::{EventError, InvocationError, LambdaError};
pub use event::{SQS_EVENT_SOURCE, parse_event};
pub use flow_sweep::{FLOW_SWEEP_EVENT, is_flow_sweep};
pub use metrics::{BatchMetrics, NAMESPACE, TenantBatchMetrics};
pub use queues::{FixedQueue, QueueResolver, ResolveError, SqsQueues, queue_name};
pub use record::{RecordError, to_message, to_record};
pub use runtime::{
    BATCH_CONCURRENCY_ENV, DEADLINE_MARGIN_ENV, FAIL_WHEN_ALL_FAIL_ENV, FIFO_FAILURE_ENV,
    PROCESS_CONCURRENCY_ENV, REJECT_MODE_ENV, TENANT_MAX_CONCURRENT_ENV, TENANT_METRICS_TOP_ENV,
    TENANT_PER_SECOND_ENV, config_from_env, init_tracing, instant_at, run, run_with_config,
};
pub use settings::{FifoFailure, LambdaConfig};
pub use timer_relay::{TIMER_RELAY_EVENT, is_timer_relay};
