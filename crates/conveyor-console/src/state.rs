//! What every handler shares: the clients, the configuration, the CSRF secret, the running tasks.

use conveyor_dynamodb::DynamoStore;
use conveyor_schedule::TickStore;
use conveyor_sqs::admin::{AdminError, list_queues, resolve_queue_url};

use crate::config::{ConsoleConfig, ConsoleError};
use crate::history::History;
use crate::peeks::Peeks;
use crate::requests::RequestCounter;
use crate::tasks::Tasks;
use crate::workers::Workers;

pub(crate) struct AppState {
    pub(crate) config: ConsoleConfig,
    /// The token every request must carry: the configured one, or one generated at start.
    pub(crate) token: String,
    pub(crate) sqs: aws_sdk_sqs::Client,
    pub(crate) store: Option<DynamoStore>,
    /// Schedules' leases, states and run-time definitions (the same table).
    pub(crate) schedules: Option<TickStore>,
    /// Delayed jobs kept in the timer table (the same table).
    pub(crate) timers: Option<std::sync::Arc<dyn conveyor_core::port::TimerStore>>,
    pub(crate) requests: RequestCounter,
    /// The CSRF value every form carries: random per process, never derived from the token.
    pub(crate) csrf: String,
    /// Queues given by URL or name, resolved once at start.
    pub(crate) fixed_urls: Vec<String>,
    pub(crate) tasks: Tasks,
    pub(crate) workers: Workers,
    /// The dead-letter pages' last peeks.
    pub(crate) peeks: Peeks,
    /// The queues page's chart samples.
    pub(crate) history: History,
    /// Where large payloads are read from ("fetch the payload" on a dead letter), when given.
    pub(crate) payloads: std::sync::OnceLock<std::sync::Arc<dyn conveyor_core::port::PayloadStore>>,
    /// Where the fair-queue metrics are read from, when given.
    pub(crate) cloudwatch: std::sync::OnceLock<aws_sdk_cloudwatch::Client>,
    /// The last read of the fair-queue metrics, reused for a minute.
    pub(crate) fair_queues: crate::fair_queues::FairQueueCache,
}

impl AppState {
    pub(crate) async fn new(
        config: ConsoleConfig,
        sqs: aws_sdk_sqs::Client,
        dynamodb: aws_sdk_dynamodb::Client,
    ) -> Result<Self, ConsoleError> {
        let requests = RequestCounter::default();
        let sqs = requests.sqs(&sqs);
        let store = config
            .table
            .as_ref()
            .map(|table| DynamoStore::new(requests.dynamodb(&dynamodb), table.clone()));
        let schedules = config
            .table
            .as_ref()
            .map(|table| TickStore::new(requests.dynamodb(&dynamodb), table.clone()));
        let timers = config.table.as_ref().map(|table| {
            std::sync::Arc::new(DynamoStore::new(requests.dynamodb(&dynamodb), table.clone()))
                as std::sync::Arc<dyn conveyor_core::port::TimerStore>
        });
        let mut fixed_urls = Vec::new();
        for queue in &config.queues {
            let url = resolve_queue_url(&sqs, queue).await?;
            if !fixed_urls.contains(&url) {
                fixed_urls.push(url);
            }
        }
        let workers = Workers::new(config.workers.clone());
        let token = config.token.clone().unwrap_or_else(random_hex);
        Ok(Self {
            token,
            config,
            sqs,
            store,
            schedules,
            timers,
            requests,
            csrf: random_hex(),
            fixed_urls,
            tasks: Tasks::default(),
            workers,
            peeks: Peeks::default(),
            history: History::default(),
            payloads: std::sync::OnceLock::new(),
            cloudwatch: std::sync::OnceLock::new(),
            fair_queues: crate::fair_queues::FairQueueCache::default(),
        })
    }

    /// The queues to show: the fixed ones, then those the prefixes list now (one `ListQueues` each).
    pub(crate) async fn queue_urls(&self) -> Result<Vec<String>, AdminError> {
        let mut urls = self.fixed_urls.clone();
        for prefix in &self.config.prefixes {
            for url in list_queues(&self.sqs, prefix).await? {
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
        }
        Ok(urls)
    }
}

/// 64 hexadecimal digits from two random UUIDs (244 random bits).
fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
