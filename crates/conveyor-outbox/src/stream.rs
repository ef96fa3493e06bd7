//! [`StreamRelay`]: reads the outbox table's DynamoDB stream with the Streams API (for ECS and other
//! long-running deployments) and hands its records to the [`Relay`].
//!
//! Design note (order): shards are read parents first (a child shard is read only once its parent is
//! closed and read to its end, or gone from the stream), each shard's records in order; a shard's
//! checkpoint moves only past records that are done (sent, or not the relay's), so a restart or a
//! takeover resumes at the first record not relayed. After a failure the shard is read again from its
//! checkpoint after a pause: records after the failure that were sent are sent again (duplicates that the
//! consumer settles once), and the failed aggregate keeps its order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use conveyor_core::runtime::epoch_millis;
use tokio_util::sync::CancellationToken;

use crate::image::{StreamRecord, from_streams};
use crate::relay::Relay;
use crate::state::{Checkpoint, RelayState, StateError};
use crate::table::OutboxTable;

/// Why the stream relay stopped.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum StreamRelayError {
    /// The outbox table has no stream.
    #[error(
        "outbox table {table} has no stream: enable one with StreamViewType NEW_IMAGE (or NEW_AND_OLD_IMAGES); \
         infra/modules/outbox-relay does"
    )]
    NoStream {
        /// The table.
        table: String,
    },
    /// The outbox table could not be described.
    #[error("cannot describe outbox table {table}: {message}")]
    DescribeTable {
        /// The table.
        table: String,
        /// The SDK's error.
        message: String,
    },
    /// No table for the lease and checkpoints was configured.
    #[error(
        "the outbox relay for table {table} needs a table for its lease and checkpoints: set \
         CONVEYOR_OUTBOX_STATE_TABLE, or CONVEYOR_IDEMPOTENCY_TABLE (the consumers' idempotency table serves)"
    )]
    NoStateTable {
        /// The outbox table.
        table: String,
    },
    /// `CONVEYOR_OUTBOX_LEASE_SECONDS` does not hold a whole number of at least 3.
    #[error(
        "CONVEYOR_OUTBOX_LEASE_SECONDS={value:?} is invalid: give whole seconds, at least 3 (default 30)"
    )]
    InvalidLease {
        /// The variable's value.
        value: String,
    },
    /// The state table failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Settings of a [`StreamRelay`].
#[derive(Debug, Clone)]
pub struct StreamRelayOptions {
    /// The table holding the lease and the checkpoints (partition key `id`, a string), e.g. the
    /// consumers' idempotency table.
    pub state_table: String,
    /// How long the lease lasts without renewal (renewed every third of it). Default 30 s: a standby
    /// relay takes over within that after the holder dies.
    pub lease: Duration,
    /// The pause after a pass that read nothing (DynamoDB Streams allows 5 reads per second per shard).
    /// Default 1 s.
    pub idle_poll: Duration,
    /// The pause before a shard is read again after a job could not be sent. Default 2 s.
    pub failure_pause: Duration,
    /// Records per `GetRecords` (at most 1000, the default).
    pub records_per_read: i32,
    /// How often a progress line is logged. Default 10 s.
    pub progress_interval: Duration,
    /// Stop after a pass over every readable shard that read nothing (for backfills, tests and
    /// benchmarks). Default false: run until stopped.
    pub exit_when_idle: bool,
}

impl StreamRelayOptions {
    /// The defaults, with the lease and checkpoints in `state_table`.
    pub fn new(state_table: impl Into<String>) -> Self {
        Self {
            state_table: state_table.into(),
            lease: Duration::from_secs(30),
            idle_poll: Duration::from_secs(1),
            failure_pause: Duration::from_secs(2),
            records_per_read: 1000,
            progress_interval: Duration::from_secs(10),
            exit_when_idle: false,
        }
    }
}

/// Counters of a running [`StreamRelay`], readable while it runs.
#[derive(Debug, Default)]
pub struct RelayProgress {
    relayed: AtomicU64,
    ignored: AtomicU64,
    unreadable: AtomicU64,
    delete_failures: AtomicU64,
    failures: AtomicU64,
    lag_millis: AtomicU64,
    requests: AtomicU64,
    leader: AtomicBool,
}

/// A copy of [`RelayProgress`]'s counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Jobs sent to SQS.
    pub relayed: u64,
    /// Records that were not outbox inserts, or inserts already removed.
    pub ignored: u64,
    /// Outbox items that cannot be sent (logged, left in the table).
    pub unreadable: u64,
    /// Sent items whose delete failed (left to their TTL).
    pub delete_failures: u64,
    /// Jobs that could not be sent (retried).
    pub failures: u64,
    /// The age of the last record read, in milliseconds (0 when caught up): how far behind the relay is.
    pub lag_millis: u64,
    /// AWS requests made: stream reads, sends, deletes, lease and checkpoints.
    pub requests: u64,
    /// Whether this process holds the lease (reads the stream) or stands by.
    pub leader: bool,
}

impl RelayProgress {
    /// The counters now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            relayed: self.relayed.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            unreadable: self.unreadable.load(Ordering::Relaxed),
            delete_failures: self.delete_failures.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            lag_millis: self.lag_millis.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            leader: self.leader.load(Ordering::Relaxed),
        }
    }

    fn count(&self, counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

/// One shard as the reader knows it.
#[derive(Debug, Default)]
struct Shard {
    parent: Option<String>,
    checkpoint: Checkpoint,
    iterator: Option<String>,
    /// The checkpoint's record is gone from the stream (older than 24 hours): read from the oldest.
    trimmed: bool,
    /// Not read again before this instant (after a failure).
    paused_until: Option<Instant>,
}

/// Reads the outbox table's stream and relays its outbox items, holding a lease so that one process
/// reads the stream at a time; others stand by and take over when the lease lapses.
pub struct StreamRelay {
    relay: Relay,
    streams: aws_sdk_dynamodbstreams::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    options: StreamRelayOptions,
    owner: String,
    progress: Arc<RelayProgress>,
}

impl std::fmt::Debug for StreamRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRelay")
            .field("table", &self.relay.table().name)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// A stream read that failed; the shard is read again later.
#[derive(Debug)]
enum ReadError {
    Expired,
    Trimmed,
    Other(String),
}

impl StreamRelay {
    /// A stream relay for `relay`'s outbox table. `dynamodb` reads the table's description and writes the
    /// state; `streams` reads the stream ([`streams_client_from_env`]).
    pub fn new(
        relay: Relay,
        streams: aws_sdk_dynamodbstreams::Client,
        dynamodb: aws_sdk_dynamodb::Client,
        options: StreamRelayOptions,
    ) -> Self {
        Self {
            relay,
            streams,
            dynamodb,
            options,
            owner: format!("relay-{}", uuid::Uuid::new_v4()),
            progress: Arc::default(),
        }
    }

    /// The counters, shared with the running relay.
    pub fn progress(&self) -> Arc<RelayProgress> {
        Arc::clone(&self.progress)
    }

    /// The ARN of the outbox table's stream.
    pub async fn stream_arn(&self) -> Result<String, StreamRelayError> {
        let table = &self.relay.table().name;
        let output = self
            .dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|error| StreamRelayError::DescribeTable {
                table: table.clone(),
                message: aws_sdk_dynamodb::error::DisplayErrorContext(&error).to_string(),
            })?;
        let description = output.table;
        let enabled = description
            .as_ref()
            .and_then(|table| table.stream_specification())
            .is_some_and(|stream| stream.stream_enabled());
        description
            .and_then(|table| table.latest_stream_arn)
            .filter(|_| enabled)
            .ok_or_else(|| StreamRelayError::NoStream { table: table.clone() })
    }

    /// Runs until `stop` is cancelled (or, with `exit_when_idle`, until a pass reads nothing), then gives
    /// the lease up. Errors of single reads, sends and state writes are logged and retried; only a table
    /// without a stream ends the run with an error.
    pub async fn run(self, stop: CancellationToken) -> Result<(), StreamRelayError> {
        let stream_arn = self.stream_arn().await?;
        let state = RelayState::new(
            self.dynamodb.clone(),
            &self.options.state_table,
            &stream_arn,
            &self.owner,
        );
        tracing::info!(table = %self.relay.table().name, stream = %stream_arn, owner = %self.owner, "outbox relay started");
        let mut shards: BTreeMap<String, Shard> = BTreeMap::new();
        let mut leader = false;
        let mut renewed = Instant::now();
        let mut described: Option<Instant> = None;
        let mut logged = Instant::now();
        let mut logged_relayed = 0;
        while !stop.is_cancelled() {
            if !leader || renewed.elapsed() >= self.options.lease / 3 {
                let held = self.count_request(state.acquire(self.options.lease).await);
                match held {
                    Ok(true) if !leader => {
                        tracing::info!(stream = %stream_arn, owner = %self.owner, "outbox relay lease taken; reading the stream");
                        shards.clear();
                        described = None;
                    }
                    Ok(false) if leader => {
                        tracing::warn!(stream = %stream_arn, "outbox relay lease lost to another relay; standing by");
                    }
                    Err(ref error) => tracing::warn!(%error, "outbox relay lease could not be renewed"),
                    _ => {}
                }
                leader = matches!(held, Ok(true));
                renewed = Instant::now();
                self.progress.leader.store(leader, Ordering::Relaxed);
            }
            if !leader {
                pause(&stop, self.options.lease / 3).await;
                continue;
            }
            if described.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                match self.describe(&state, &stream_arn, &mut shards).await {
                    Ok(()) => described = Some(Instant::now()),
                    Err(error) => tracing::warn!(%error, "describing the outbox stream failed"),
                }
            }
            let read = self.pass(&state, &mut shards, &stop).await;
            let snapshot = self.progress.snapshot();
            if logged.elapsed() >= self.options.progress_interval {
                let rate = (snapshot.relayed - logged_relayed) as f64 / logged.elapsed().as_secs_f64();
                tracing::info!(
                    relayed = snapshot.relayed,
                    per_second = format!("{rate:.0}"),
                    lag_ms = snapshot.lag_millis,
                    failures = snapshot.failures,
                    requests = snapshot.requests,
                    "outbox relay progress"
                );
                logged = Instant::now();
                logged_relayed = snapshot.relayed;
            }
            if read == 0 {
                self.progress.lag_millis.store(0, Ordering::Relaxed);
                if self.options.exit_when_idle
                    && described.is_some()
                    && shards.values().all(|shard| shard.paused_until.is_none())
                {
                    break;
                }
                pause(&stop, self.options.idle_poll).await;
            }
        }
        if leader {
            self.count_request(state.release().await).unwrap_or_else(
                |error| tracing::warn!(%error, "outbox relay lease could not be released; it lapses"),
            );
        }
        tracing::info!(stream = %stream_arn, relayed = self.progress.snapshot().relayed, "outbox relay stopped");
        Ok(())
    }

    fn count_request<T>(&self, result: T) -> T {
        self.progress.count(&self.progress.requests, 1);
        result
    }

    /// Adds the stream's shards not known yet, with their checkpoints, and forgets finished shards that left
    /// the stream.
    async fn describe(
        &self,
        state: &RelayState,
        stream_arn: &str,
        shards: &mut BTreeMap<String, Shard>,
    ) -> Result<(), String> {
        let mut start: Option<String> = None;
        let mut seen = Vec::new();
        loop {
            let output = self
                .count_request(
                    self.streams
                        .describe_stream()
                        .stream_arn(stream_arn)
                        .set_exclusive_start_shard_id(start.take())
                        .send()
                        .await,
                )
                .map_err(|error| aws_sdk_dynamodbstreams::error::DisplayErrorContext(&error).to_string())?;
            let Some(description) = output.stream_description else {
                return Ok(());
            };
            for shard in description.shards() {
                let Some(id) = shard.shard_id() else { continue };
                seen.push(id.to_owned());
                if shards.contains_key(id) {
                    continue;
                }
                let checkpoint = self
                    .count_request(state.checkpoint(id).await)
                    .map_err(|error| error.to_string())?;
                shards.insert(
                    id.to_owned(),
                    Shard {
                        parent: shard.parent_shard_id().map(str::to_owned),
                        checkpoint,
                        ..Shard::default()
                    },
                );
            }
            start = description.last_evaluated_shard_id().map(str::to_owned);
            if start.is_none() {
                break;
            }
        }
        shards.retain(|id, shard| seen.contains(id) || !shard.checkpoint.finished);
        Ok(())
    }

    /// Reads each readable shard once (parents before children); returns how many records were read.
    async fn pass(
        &self,
        state: &RelayState,
        shards: &mut BTreeMap<String, Shard>,
        stop: &CancellationToken,
    ) -> usize {
        let ready: Vec<String> = shards
            .iter()
            .filter(|(_, shard)| !shard.checkpoint.finished)
            .filter(|(_, shard)| shard.paused_until.is_none_or(|until| Instant::now() >= until))
            .filter(|(_, shard)| {
                shard
                    .parent
                    .as_ref()
                    .and_then(|parent| shards.get(parent))
                    .is_none_or(|parent| parent.checkpoint.finished)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut read = 0;
        for id in ready {
            if stop.is_cancelled() {
                break;
            }
            let Some(shard) = shards.get_mut(&id) else {
                continue;
            };
            shard.paused_until = None;
            match self.read_shard(state, &id, shard).await {
                Ok(count) => read += count,
                Err(ReadError::Expired) => shard.iterator = None,
                Err(ReadError::Trimmed) => {
                    tracing::error!(
                        shard = %id,
                        checkpoint = ?shard.checkpoint.sequence_number,
                        "the outbox stream no longer holds the checkpoint's record (the relay was down for more \
                         than the stream's 24 hours): reading from the oldest record; outbox items written in \
                         the gap are still in the table until their TTL"
                    );
                    shard.trimmed = true;
                    shard.iterator = None;
                }
                Err(ReadError::Other(error)) => {
                    tracing::warn!(shard = %id, %error, "reading the outbox stream failed; retrying");
                    shard.iterator = None;
                    shard.paused_until = Some(Instant::now() + self.options.failure_pause);
                }
            }
        }
        read
    }

    async fn iterator(&self, state: &RelayState, shard_id: &str, shard: &Shard) -> Result<String, ReadError> {
        let mut request = self
            .streams
            .get_shard_iterator()
            .stream_arn(state.stream_arn())
            .shard_id(shard_id);
        request = match (&shard.checkpoint.sequence_number, shard.trimmed) {
            (Some(sequence_number), false) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(sequence_number),
            _ => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let output = self.count_request(request.send().await).map_err(|error| {
            if error
                .as_service_error()
                .is_some_and(aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorError::is_trimmed_data_access_exception)
            {
                ReadError::Trimmed
            } else {
                ReadError::Other(aws_sdk_dynamodbstreams::error::DisplayErrorContext(&error).to_string())
            }
        })?;
        output
            .shard_iterator
            .ok_or_else(|| ReadError::Other("GetShardIterator answered without an iterator".to_owned()))
    }

    /// Reads one page of a shard, relays it and moves the checkpoint; returns how many records were read.
    async fn read_shard(
        &self,
        state: &RelayState,
        shard_id: &str,
        shard: &mut Shard,
    ) -> Result<usize, ReadError> {
        let iterator = match shard.iterator.take() {
            Some(iterator) => iterator,
            None => self.iterator(state, shard_id, shard).await?,
        };
        let output = self
            .count_request(
                self.streams
                    .get_records()
                    .shard_iterator(iterator)
                    .limit(self.options.records_per_read)
                    .send()
                    .await,
            )
            .map_err(|error| {
                use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError;
                match error.as_service_error() {
                    Some(GetRecordsError::ExpiredIteratorException(_)) => ReadError::Expired,
                    Some(GetRecordsError::TrimmedDataAccessException(_)) => ReadError::Trimmed,
                    _ => ReadError::Other(
                        aws_sdk_dynamodbstreams::error::DisplayErrorContext(&error).to_string(),
                    ),
                }
            })?;
        let records: Vec<StreamRecord> = output.records().iter().filter_map(stream_record).collect();
        let next = output.next_shard_iterator().map(str::to_owned);
        let before = self.relay.requests();
        let report = self.relay.relay(&records).await;
        self.progress.count(
            &self.progress.requests,
            self.relay.requests().saturating_sub(before),
        );
        self.progress.count(&self.progress.relayed, report.sent as u64);
        self.progress.count(
            &self.progress.ignored,
            (report.ignored + report.already_removed) as u64,
        );
        self.progress
            .count(&self.progress.unreadable, report.unreadable as u64);
        self.progress
            .count(&self.progress.delete_failures, report.delete_failures as u64);
        if let Some(created) = records.last().and_then(|record| record.created_at_millis) {
            let lag = epoch_millis(SystemTime::now()).saturating_sub(created);
            self.progress.lag_millis.store(lag, Ordering::Relaxed);
        }
        let done = report.first_failure.unwrap_or(records.len());
        let mut checkpoint = shard.checkpoint.clone();
        if let Some(record) = done.checked_sub(1).and_then(|last| records.get(last)) {
            checkpoint.sequence_number = Some(record.sequence_number.clone());
            shard.trimmed = false;
        }
        if let Some(failed) = report.first_failure {
            self.progress
                .count(&self.progress.failures, (records.len() - failed) as u64);
            shard.paused_until = Some(Instant::now() + self.options.failure_pause);
        } else if next.is_none() {
            checkpoint.finished = true;
            tracing::info!(shard = %shard_id, "outbox stream shard read to its end");
        } else {
            shard.iterator = next;
        }
        if checkpoint != shard.checkpoint {
            match self.count_request(state.save(shard_id, &checkpoint).await) {
                Ok(()) => shard.checkpoint = checkpoint,
                Err(error) => {
                    // The records were relayed; without the checkpoint a restart sends them again
                    // (duplicates the consumer settles once). Keep reading from memory.
                    tracing::warn!(shard = %shard_id, %error, "outbox relay checkpoint not saved");
                    shard.checkpoint = checkpoint;
                }
            }
        }
        Ok(records.len())
    }
}

/// A Streams API record in the relay's shape.
fn stream_record(record: &aws_sdk_dynamodbstreams::types::Record) -> Option<StreamRecord> {
    let change = record.dynamodb()?;
    let event = record
        .event_name()
        .map(|name| name.as_str().to_owned())
        .unwrap_or_default();
    let mut converted = StreamRecord::new(
        change.sequence_number()?,
        &event,
        change.keys().map(from_streams),
        change.new_image().map(from_streams),
    );
    converted.created_at_millis = change
        .approximate_creation_date_time()
        .and_then(|time| u64::try_from(time.to_millis().ok()?).ok());
    Some(converted)
}

async fn pause(stop: &CancellationToken, length: Duration) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(length) => {}
    }
}

/// The environment variable naming the relay's state table (lease and checkpoints); default the
/// consumers' idempotency table, `CONVEYOR_IDEMPOTENCY_TABLE`.
pub const STATE_TABLE_ENV: &str = "CONVEYOR_OUTBOX_STATE_TABLE";

/// The environment variable setting the relay's lease in whole seconds (default 30, at least 3): how
/// long a standby relay waits before it takes over from one that died.
pub const LEASE_SECONDS_ENV: &str = "CONVEYOR_OUTBOX_LEASE_SECONDS";

/// A stream relay from the environment, or `None` when `CONVEYOR_OUTBOX_TABLE` is unset: the outbox
/// table from `OutboxTable::from_env`, the state table from [`STATE_TABLE_ENV`] or
/// `CONVEYOR_IDEMPOTENCY_TABLE`, clients the standard way with Conveyor's deadlines.
pub async fn stream_relay_from_env() -> Result<Option<StreamRelay>, StreamRelayError> {
    let Some(table) = OutboxTable::from_env() else {
        return Ok(None);
    };
    let state_table = [STATE_TABLE_ENV, "CONVEYOR_IDEMPOTENCY_TABLE"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
        .ok_or_else(|| StreamRelayError::NoStateTable {
            table: table.name.clone(),
        })?;
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(timeouts())
        .load()
        .await;
    let dynamodb = aws_sdk_dynamodb::Client::new(&config);
    let relay = Relay::new(conveyor_sqs::sqs_client_from_env().await, dynamodb.clone(), table);
    let mut options = StreamRelayOptions::new(state_table);
    if let Ok(text) = std::env::var(LEASE_SECONDS_ENV) {
        let seconds = text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|seconds| *seconds >= 3)
            .ok_or(StreamRelayError::InvalidLease { value: text })?;
        options.lease = Duration::from_secs(seconds);
    }
    Ok(Some(StreamRelay::new(
        relay,
        streams_client(&config),
        dynamodb,
        options,
    )))
}

/// Deadlines for the relay's DynamoDB and Streams calls (those of `conveyor_dynamodb`'s clients).
fn timeouts() -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(2))
        .operation_attempt_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(15))
        .build()
}

/// A DynamoDB Streams client configured the standard way, with the same deadlines as the other clients.
/// `AWS_ENDPOINT_URL_DYNAMODB_STREAMS` points it elsewhere; when only `AWS_ENDPOINT_URL_DYNAMODB` is set
/// (DynamoDB Local, which serves streams on its own port), that endpoint is used.
///
/// The configuration is loaded once per process and shared with the other clients
/// (`conveyor_aws::shared_config`).
pub async fn streams_client_from_env() -> aws_sdk_dynamodbstreams::Client {
    streams_client(conveyor_aws::shared_config().await)
}

/// A DynamoDB Streams client from a loaded configuration, with the endpoint rule of
/// [`streams_client_from_env`].
pub fn streams_client(config: &aws_config::SdkConfig) -> aws_sdk_dynamodbstreams::Client {
    let mut builder = aws_sdk_dynamodbstreams::config::Builder::from(config).timeout_config(timeouts());
    let own = std::env::var("AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        .ok()
        .filter(|url| !url.is_empty());
    let dynamodb = std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
        .ok()
        .filter(|url| !url.is_empty());
    if let (None, Some(endpoint)) = (own, dynamodb) {
        builder = builder.endpoint_url(endpoint);
    }
    aws_sdk_dynamodbstreams::Client::from_conf(builder.build())
}

impl conveyor_core::BackgroundTask for StreamRelay {
    fn name(&self) -> &'static str {
        "outbox relay"
    }

    /// When the drain begins, the last page read is relayed and checkpointed, then the lease is
    /// released, so another worker takes over at once.
    fn run(self: Box<Self>, drain: CancellationToken) -> conveyor_core::BoxFuture<()> {
        Box::pin(async move {
            if let Err(error) = StreamRelay::run(*self, drain).await {
                tracing::error!(%error, "outbox relay stopped");
            }
        })
    }
}
