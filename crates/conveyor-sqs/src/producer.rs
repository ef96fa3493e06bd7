//! [`Producer`]: sends typed jobs, one at a time or in batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_core::limits::{MAX_BATCH_ENTRIES, MAX_MESSAGE_BYTES};
use conveyor_core::port::{
    IdempotencyStore, OutgoingMessage, PayloadStore, QueueError, StoreError, TimerStore,
};
use conveyor_core::runtime::DUE_ATTRIBUTE;
use conveyor_core::{Cancelled, KeyStyle, Timers};
use serde::Serialize;
use tracing::Instrument as _;

use crate::convert::queue_name;
use crate::errors::{classify, classify_entry};
use crate::fifo_order::{self, HeldGroups};
use crate::job::{NewJob, ProduceError};
use crate::large::{LargePayloads, offload};
use crate::send::{batch_entry, check_outgoing, send_message};

/// Attempts per batch entry (the first send and two retries) for failures SQS marks as not the sender's.
pub const BATCH_ATTEMPTS: u32 = 3;
/// The wait before the first retry of a batch; it doubles before the next.
pub const BATCH_RETRY_BASE: Duration = Duration::from_millis(100);

/// Sends jobs to one queue.
///
/// ```no_run
/// # async fn example() -> Result<(), conveyor_sqs::ProduceError> {
/// use conveyor_sqs::{NewJob, Producer, sqs_client_from_env};
///
/// #[derive(serde::Serialize)]
/// struct WelcomeEmail { user_id: u64 }
///
/// let producer = Producer::new(sqs_client_from_env().await, "https://sqs.us-east-1.amazonaws.com/123456789012/jobs");
/// let id = producer.send(&NewJob::new("welcome_email", WelcomeEmail { user_id: 42 }).key("welcome_email:user:42")).await?;
/// println!("sent {id}");
/// # Ok(()) }
/// ```
pub struct Producer {
    client: Client,
    url: String,
    name: String,
    requests: AtomicU64,
    /// The queue's `MessageRetentionPeriod`, read once, for delays past 15 minutes (`None`: unreadable).
    retention: tokio::sync::OnceCell<Option<Duration>>,
    /// The consumers' idempotency store, for [`Producer::cancel`].
    store: Option<Arc<dyn IdempotencyStore>>,
    /// Where bodies over the threshold go ([`Producer::with_large_payloads`]).
    large: Option<LargePayloads>,
    /// The queue's `MaximumMessageSize`, read once when large payloads are on (1 MiB when unreadable).
    max_size: tokio::sync::OnceCell<usize>,
    /// Where jobs due later than 15 minutes are kept ([`Producer::with_timers`]).
    timers: Option<Timers>,
    /// The look for a relay of those timers (a warning when none runs).
    relay_watch: crate::relay_watch::RelayWatch,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("url", &self.url)
            .field("store", &self.store.is_some())
            .field("large_payloads", &self.large.as_ref().map(|large| &large.bucket))
            .finish_non_exhaustive()
    }
}

/// Why [`Producer::cancel`] could not cancel.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// The producer has no store to write the cancellation to.
    #[error(
        "cancelling a job needs the consumers' idempotency table: build the producer with \
         Producer::with_store (the same table as CONVEYOR_IDEMPOTENCY_TABLE)"
    )]
    NoStore,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The cancel itself failed (the store, or a key style that cannot be cancelled by key).
    #[error(transparent)]
    Cancel(#[from] conveyor_core::CancelError),
}

/// What happened to each job of a [`Producer::send_batch`], in input order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchReport {
    /// Per job, in input order: the message id, or why it was not sent.
    pub results: Vec<Result<String, ProduceError>>,
}

impl BatchReport {
    /// How many jobs were sent.
    pub fn sent(&self) -> usize {
        self.results.iter().filter(|result| result.is_ok()).count()
    }

    /// The jobs that were not sent, by input index.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &ProduceError)> {
        self.results
            .iter()
            .enumerate()
            .filter_map(|(index, result)| result.as_ref().err().map(|error| (index, error)))
    }

    /// True when every job was sent.
    pub fn all_sent(&self) -> bool {
        self.results.iter().all(Result::is_ok)
    }
}

/// The due time and the rest of the wait of a message due later than SQS's 15-minute delay.
fn long_delay(message: &OutgoingMessage) -> Option<(SystemTime, Duration)> {
    let due = message
        .attributes
        .get(DUE_ATTRIBUTE)
        .and_then(|value| value.string_value.as_deref())
        .and_then(|ms| ms.parse::<u64>().ok())?;
    let delay =
        Duration::from_millis(due.saturating_sub(conveyor_core::runtime::epoch_millis(SystemTime::now())));
    (delay > conveyor_core::limits::MAX_DELAY).then(|| (conveyor_core::port::from_epoch_millis(due), delay))
}

/// Marks a batch send's span failed when any of its jobs was not sent, with the first failure's class.
fn record_batch_errors(span: &tracing::Span, report: &BatchReport) {
    let mut failures = report.failures();
    if let Some((_, first)) = failures.next() {
        let failed = 1 + failures.count();
        let message = format!(
            "{failed} of {} jobs not sent; the first: {first}",
            report.results.len()
        );
        conveyor_core::trace::record_send_error(span, first.error_type(), &message);
    }
}

/// One encoded job waiting to be sent.
pub(crate) struct Pending {
    /// Its place in the caller's results.
    pub(crate) index: usize,
    pub(crate) message: OutgoingMessage,
    /// Body plus attributes, as SQS counts them against the 1 MiB of a call.
    pub(crate) size: usize,
}

/// A job checked and ready: its message, or the id of the timer that keeps it for later.
pub(crate) enum Prepared {
    /// Kept in the timer table; nothing to send now.
    Kept(String),
    /// To be sent.
    Ready(OutgoingMessage),
}

impl Producer {
    /// A producer for the queue at `queue_url` (FIFO when its name ends in `.fifo`). No request is made
    /// until the first send; a missing queue shows up there as [`QueueError::QueueMissing`].
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        let url = queue_url.into();
        let name = queue_name(&url).to_owned();
        Self {
            client,
            url,
            name,
            requests: AtomicU64::new(0),
            retention: tokio::sync::OnceCell::new(),
            store: None,
            large: None,
            max_size: tokio::sync::OnceCell::new(),
            timers: None,
            relay_watch: crate::relay_watch::RelayWatch::default(),
        }
    }

    /// Keeps every job due later than SQS's 15 minutes in `store` (the consumers' idempotency table:
    /// `conveyor_dynamodb::DynamoStore`) instead of hopping it through the queue: [`Producer::send`]
    /// then returns the timer's id, and [`Producer::timers`] lists, runs now, reschedules and cancels
    /// such jobs. A relay sends each when it is due: `conveyor_core::TimerRelay` beside a worker of the
    /// queue (`Pipeline::with_timers`), or `conveyor delays relay` (see `docs/delays.md`). When it keeps
    /// a job, the producer looks for the relays' mark (at most every ten minutes) and warns once when
    /// no relay was seen for the queue recently.
    pub fn with_timers(mut self, store: Arc<dyn TimerStore>) -> Self {
        let sender = Arc::new(crate::flow::SqsSender::new(self.client.clone()));
        self.timers = Some(Timers::new(store, sender, self.url.clone()));
        self
    }

    /// The queue's timers, when [`Producer::with_timers`] is on.
    pub fn timers(&self) -> Option<&Timers> {
        self.timers.as_ref()
    }

    /// Sends jobs too large for the queue through `store` (S3: `conveyor_s3::S3PayloadStore`) in
    /// `bucket`: a job whose body plus attributes exceed the threshold (by default the queue's
    /// `MaximumMessageSize`, read once; see [`Producer::with_payload_threshold`]) is stored under a
    /// random UUID key and sent as a pointer in the SQS Extended Client Library's format, with the
    /// `ExtendedPayloadSize` attribute, so consumers built on that library read it too. Such a job may
    /// carry at most 8 attributes (Conveyor's own included): the marker takes the ninth slot.
    pub fn with_large_payloads(mut self, store: Arc<dyn PayloadStore>, bucket: impl Into<String>) -> Self {
        self.large = Some(LargePayloads::new(store, bucket.into()));
        self
    }

    /// Marks pointers with the legacy `SQSLargePayloadSize` attribute instead of `ExtendedPayloadSize`:
    /// what the Java Extended Client writes by default, and the only name older readers know. Needs
    /// [`Producer::with_large_payloads`] first; ignored without it.
    pub fn with_legacy_payload_size_attribute(mut self) -> Self {
        if let Some(large) = &mut self.large {
            large.legacy_attribute = true;
        }
        self
    }

    /// Stores objects under `prefix` (the libraries' `s3KeyPrefix`): keys are `<prefix><uuid>`. Needs
    /// [`Producer::with_large_payloads`] first; ignored without it.
    pub fn with_payload_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        if let Some(large) = &mut self.large {
            large.key_prefix = prefix.into();
        }
        self
    }

    /// Offloads jobs over `bytes` (body plus attributes) instead of the queue's limit; `0` sends every
    /// job through the payload store (the libraries' `always_through_s3`). The libraries default to
    /// 262,144. Needs [`Producer::with_large_payloads`] first; ignored without it.
    pub fn with_payload_threshold(mut self, bytes: usize) -> Self {
        if let Some(large) = &mut self.large {
            large.threshold = Some(bytes);
        }
        self
    }

    /// Lets [`Producer::cancel`] write to the consumers' idempotency store (their
    /// `CONVEYOR_IDEMPOTENCY_TABLE`).
    pub fn with_store(mut self, store: Arc<dyn IdempotencyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Cancels the delayed jobs of `job_type` sent with idempotency key `key` before now: the consumer
    /// drops them at their next hop or when due, without running, with a log line and a metric. A job
    /// sent with the same key after the cancel runs. Needs [`Producer::with_store`]; the handler's key
    /// style is Conveyor's (see [`Producer::cancel_with_style`]). A run in progress is not stopped, and
    /// the answer says so (see `conveyor-core/src/delay.rs`).
    pub async fn cancel(&self, job_type: &str, key: &str) -> Result<Cancelled, CancelError> {
        self.cancel_with_style(&KeyStyle::Conveyor, job_type, key).await
    }

    /// [`Producer::cancel`] for a handler whose records use `style` (a Powertools-compatible key).
    pub async fn cancel_with_style(
        &self,
        style: &KeyStyle,
        job_type: &str,
        key: &str,
    ) -> Result<Cancelled, CancelError> {
        let store = self.store.as_deref().ok_or(CancelError::NoStore)?;
        Ok(conveyor_core::runtime::cancel(store, style, job_type, key).await?)
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many AWS requests this producer has made (one per API call).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Sends one job with `SendMessage`; returns its message id. Limits are checked first, so a job
    /// that breaks one makes no request.
    ///
    /// With [`Producer::with_timers`], a job due later than 15 minutes is kept in the timer table and
    /// the timer's id is returned instead.
    pub async fn send<J: Serialize>(&self, job: &NewJob<J>) -> Result<String, ProduceError> {
        // The job is encoded inside the send's span, so it carries the span's context (feature `otel`).
        let span = conveyor_core::trace::send_span(&self.name, 1);
        let sent = self.send_one(job).instrument(span.clone()).await;
        if let Err(error) = &sent {
            conveyor_core::trace::record_send_error(&span, error.error_type(), &error.to_string());
        }
        sent
    }

    async fn send_one<J: Serialize>(&self, job: &NewJob<J>) -> Result<String, ProduceError> {
        let message = match self.prepare(job).await? {
            Prepared::Kept(id) => return Ok(id),
            Prepared::Ready(message) => message,
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let id = send_message(&self.client, &self.url, &message).await?;
        tracing::debug!(queue = %self.name, job_type = %job.job_type(), message_id = %id, "job sent");
        Ok(id)
    }

    /// Sends jobs with `SendMessageBatch`, in calls of at most 10 entries and 1 MiB.
    ///
    /// Jobs that break a limit are reported without being sent. Entries SQS fails with `SenderFault`
    /// false, and calls that fail as a whole with a retryable error (throttling, 5xx, timeouts), are
    /// retried up to [`BATCH_ATTEMPTS`] times in all, waiting [`BATCH_RETRY_BASE`], then twice that;
    /// only the entries that failed are sent again. A whole call that timed out may have been applied,
    /// so a retry can duplicate a job on a standard queue (FIFO queues deduplicate); consumers are
    /// idempotent for this reason. A missing queue or denied access fails every remaining job without
    /// further requests.
    pub async fn send_batch<J: Serialize>(&self, jobs: &[NewJob<J>]) -> BatchReport {
        let span = conveyor_core::trace::send_span(&self.name, jobs.len());
        let report = self.send_jobs(jobs).instrument(span.clone()).await;
        record_batch_errors(&span, &report);
        report
    }

    async fn send_jobs<J: Serialize>(&self, jobs: &[NewJob<J>]) -> BatchReport {
        let mut results: Vec<Option<Result<String, ProduceError>>> = vec![None; jobs.len()];
        let mut pending = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            match self.prepare(job).await {
                Ok(Prepared::Kept(id)) => results[index] = Some(Ok(id)),
                Ok(Prepared::Ready(message)) => {
                    let size = message.size();
                    pending.push(Pending { index, message, size });
                }
                Err(error) => results[index] = Some(Err(error)),
            }
        }
        self.send_pending(pending, results).await
    }

    /// Sends messages already encoded by [`NewJob::to_message`] (for this queue) with `SendMessageBatch`,
    /// exactly as [`Producer::send_batch`] sends jobs: calls of at most 10 entries and 1 MiB, the same
    /// retries. The transactional outbox (`conveyor-outbox`) encodes a job when the application commits
    /// it and sends it later through this method. Each message is checked against SQS's limits again
    /// (delay, size, FIFO), so a message built for another queue is refused without a request.
    pub async fn send_messages(&self, messages: Vec<OutgoingMessage>) -> BatchReport {
        // Encoded earlier (the outbox's, at commit): they carry their own producer's context, which the
        // send's span links to.
        let span = conveyor_core::trace::send_span(&self.name, messages.len());
        conveyor_core::trace::link_to_messages(&span, messages.iter().map(|message| &message.attributes));
        let report = self.send_encoded(messages).instrument(span.clone()).await;
        record_batch_errors(&span, &report);
        report
    }

    async fn send_encoded(&self, messages: Vec<OutgoingMessage>) -> BatchReport {
        let fifo = self.name.ends_with(".fifo");
        let mut results: Vec<Option<Result<String, ProduceError>>> = vec![None; messages.len()];
        let mut pending = Vec::new();
        for (index, message) in messages.into_iter().enumerate() {
            if let Err(error) = check_outgoing(&message, fifo) {
                results[index] = Some(Err(ProduceError::from(error)));
                continue;
            }
            let size = message.size();
            pending.push(Pending { index, message, size });
        }
        self.send_pending(pending, results).await
    }

    /// Sends encoded messages in packed chunks; `results` already holds the refusals.
    async fn send_pending(
        &self,
        pending: Vec<Pending>,
        mut results: Vec<Option<Result<String, ProduceError>>>,
    ) -> BatchReport {
        let mut fatal: Option<QueueError> = None;
        // FIFO: the groups with a job not sent; their later jobs are held back (see `fifo_order`).
        let mut held = HeldGroups::default();
        let fifo = self.is_fifo();
        for chunk in pack(pending) {
            if let Some(error) = &fatal {
                for entry in chunk {
                    results[entry.index] = Some(Err(ProduceError::from(error.clone())));
                }
                continue;
            }
            if !fifo {
                if let Err(error) = self.send_chunk(chunk, &mut results).await {
                    fatal = Some(error);
                }
                continue;
            }
            let chunk = held.hold_back(chunk, &mut results);
            let groups = fifo_order::groups_of(&chunk);
            if let Err(error) = self.send_chunk(chunk, &mut results).await {
                fatal = Some(error);
            }
            held.note_failures(&groups, &results);
        }
        let results = results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Err(no_result())))
            .collect();
        BatchReport { results }
    }

    /// A job as it goes to SQS, checked against every limit first: encoded, kept in the timer table
    /// when due later than 15 minutes (with timers on), checked against the queue's retention, and its
    /// large body offloaded. No `SendMessage` is made here.
    pub(crate) async fn prepare<J: Serialize>(&self, job: &NewJob<J>) -> Result<Prepared, ProduceError> {
        let message = job.encode(&self.name)?;
        if let Some(id) = self.keep_for_later(job.job_type(), &message).await? {
            return Ok(Prepared::Kept(id));
        }
        self.check_retention(job.job_type(), &message).await?;
        Ok(Prepared::Ready(self.fit(job.job_type(), message).await?))
    }

    /// True for a FIFO queue (its name ends in `.fifo`).
    pub(crate) fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// The message as it goes to SQS: a large body offloaded when large payloads are on, else the size
    /// checked against SQS's 1 MiB.
    pub(crate) async fn fit(
        &self,
        job_type: &str,
        message: OutgoingMessage,
    ) -> Result<OutgoingMessage, ProduceError> {
        let Some(large) = &self.large else {
            return offload(None, job_type, message, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES).await;
        };
        let limit = self.queue_limit().await;
        let threshold = large.threshold.unwrap_or(limit);
        offload(Some(large), job_type, message, threshold, limit).await
    }

    /// One attribute of the queue (one `GetQueueAttributes`), `None` when it cannot be read (a producer
    /// role without `sqs:GetQueueAttributes`).
    async fn queue_attribute(&self, name: QueueAttributeName) -> Option<String> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(name.clone())
            .send()
            .await
            .ok()?;
        output.attributes?.remove(&name)
    }

    /// The queue's `MaximumMessageSize` (read once; SQS's 1 MiB when it cannot be read).
    async fn queue_limit(&self) -> usize {
        *self
            .max_size
            .get_or_init(|| async {
                let limit = self
                    .queue_attribute(QueueAttributeName::MaximumMessageSize)
                    .await
                    .and_then(|value| value.parse::<usize>().ok());
                match limit {
                    None => tracing::debug!(queue = %self.name, "cannot read the queue's MaximumMessageSize; offloading over 1 MiB"),
                    Some(limit) if limit < MAX_MESSAGE_BYTES => tracing::warn!(
                        queue = %self.name,
                        maximum_message_size = limit,
                        "the queue takes messages up to {limit} bytes, where SQS allows 1 MiB since August 2025: \
                         jobs over it go through S3; raise its MaximumMessageSize to 1048576 to send them inline"
                    ),
                    Some(_) => {}
                }
                limit.unwrap_or(MAX_MESSAGE_BYTES).min(MAX_MESSAGE_BYTES)
            })
            .await
    }

    /// Refuses a job due later than the queue keeps a message (its `MessageRetentionPeriod`, read once
    /// per producer with `GetQueueAttributes` when the first job due past 15 minutes is sent). When the
    /// attribute cannot be read (a producer role without `sqs:GetQueueAttributes`), SQS's 14-day maximum
    /// was already checked by [`NewJob::to_message`].
    /// Keeps `message` in the timer table when timers are on and it is due later than 15 minutes; the
    /// timer's id then.
    async fn keep_for_later(
        &self,
        job_type: &str,
        message: &OutgoingMessage,
    ) -> Result<Option<String>, ProduceError> {
        let Some(timers) = &self.timers else {
            return Ok(None);
        };
        let Some((due, _)) = long_delay(message) else {
            return Ok(None);
        };
        let message = self.fit(job_type, message.clone()).await?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let id = timers
            .put(job_type, due, message)
            .await
            .map_err(|error| ProduceError::Timer {
                job_type: job_type.to_owned(),
                error,
            })?;
        self.relay_watch.look(timers, &self.name).await;
        Ok(Some(id))
    }

    async fn check_retention(&self, job_type: &str, message: &OutgoingMessage) -> Result<(), ProduceError> {
        let Some((_, delay)) = long_delay(message) else {
            // No delay, or SQS's own `DelaySeconds`: no hop, nothing to check against the retention.
            return Ok(());
        };
        let retention = *self
            .retention
            .get_or_init(|| async {
                let seconds = self
                    .queue_attribute(QueueAttributeName::MessageRetentionPeriod)
                    .await
                    .and_then(|value| value.parse::<u64>().ok());
                if seconds.is_none() {
                    tracing::debug!(queue = %self.name, "cannot read the queue's retention; checking delays against 14 days");
                }
                seconds.map(Duration::from_secs)
            })
            .await;
        match retention {
            Some(limit) if delay > limit => Err(ProduceError::DelayTooLong {
                job_type: job_type.to_owned(),
                delay,
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// Sends one chunk, retrying what may be retried; fills `results` for every entry of the chunk.
    /// Returns `Err` when the queue is missing or access is denied (later chunks would fail the same way).
    pub(crate) async fn send_chunk(
        &self,
        mut chunk: Vec<Pending>,
        results: &mut [Option<Result<String, ProduceError>>],
    ) -> Result<(), QueueError> {
        let fifo = self.is_fifo();
        for attempt in 1..=BATCH_ATTEMPTS {
            let last = attempt == BATCH_ATTEMPTS;
            let mut entries = Vec::with_capacity(chunk.len());
            for pending in &chunk {
                entries.push(batch_entry(pending.index.to_string(), &pending.message)?);
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let response = self
                .client
                .send_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|error| classify(&error, &self.url));
            let output = match response {
                Ok(output) => output,
                Err(error) if error.is_retryable() && !last => {
                    tracing::debug!(queue = %self.name, %error, attempt, "batch send failed; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(error) => {
                    for pending in &chunk {
                        results[pending.index] = Some(Err(ProduceError::from(error.clone())));
                    }
                    let fatal = matches!(
                        error,
                        QueueError::QueueMissing { .. } | QueueError::AccessDenied { .. }
                    );
                    return if fatal { Err(error) } else { Ok(()) };
                }
            };
            for entry in output.successful {
                if let Some(slot) = entry
                    .id
                    .parse::<usize>()
                    .ok()
                    .and_then(|index| results.get_mut(index))
                {
                    *slot = Some(Ok(entry.message_id));
                }
            }
            let mut retry = Vec::new();
            for entry in output.failed {
                let Some(index) = entry
                    .id
                    .parse::<usize>()
                    .ok()
                    .filter(|index| *index < results.len())
                else {
                    continue;
                };
                if !entry.sender_fault && !last {
                    // FIFO: a later job of its group went through in this call; a resend would put
                    // this one after it, so the caller is told instead.
                    let overtaken = fifo
                        .then(|| fifo_order::sent_after(&chunk, index, results))
                        .flatten();
                    if let Some(group) = overtaken {
                        results[index] = Some(Err(fifo_order::overtaken(
                            &entry.code,
                            entry.message.as_deref(),
                            group,
                        )));
                        continue;
                    }
                    retry.push(index);
                    continue;
                }
                results[index] = Some(Err(rejected(
                    &entry.code,
                    entry.message.as_deref(),
                    entry.sender_fault,
                )));
            }
            // Entries SQS answered neither way are retried too, never taken as sent.
            chunk.retain(|pending| retry.contains(&pending.index) || results[pending.index].is_none());
            if chunk.is_empty() {
                return Ok(());
            }
            if last {
                break;
            }
            tracing::debug!(queue = %self.name, count = chunk.len(), attempt, "retrying failed batch entries");
            tokio::time::sleep(backoff(attempt)).await;
        }
        Ok(())
    }
}

/// The error of an entry no call answered for (never expected: every path fills its result).
pub(crate) fn no_result() -> ProduceError {
    ProduceError::Rejected {
        code: "NoResult".to_owned(),
        message: "the job was never answered for".to_owned(),
        sender_fault: false,
    }
}

fn rejected(code: &str, message: Option<&str>, sender_fault: bool) -> ProduceError {
    match classify_entry(code, message, sender_fault) {
        conveyor_core::port::EntryError::Failed {
            code,
            message,
            sender_fault,
        } => ProduceError::Rejected {
            code,
            message,
            sender_fault,
        },
        conveyor_core::port::EntryError::LeaseLost(message)
        | conveyor_core::port::EntryError::NotIssued(message) => ProduceError::Rejected {
            code: code.to_owned(),
            message,
            sender_fault,
        },
    }
}

fn backoff(attempt: u32) -> Duration {
    BATCH_RETRY_BASE * 2u32.saturating_pow(attempt.saturating_sub(1))
}

/// Packs jobs into calls of at most 10 entries and at most 1 MiB of messages, in input order.
fn pack(pending: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut chunks = Vec::new();
    let mut current: Vec<Pending> = Vec::new();
    let mut current_size = 0;
    for entry in pending {
        let full = current.len() == MAX_BATCH_ENTRIES || current_size + entry.size > MAX_MESSAGE_BYTES;
        if full && !current.is_empty() {
            chunks.push(std::mem::take(&mut current));
            current_size = 0;
        }
        current_size += entry.size;
        current.push(entry);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(index: usize, size: usize) -> Pending {
        Pending {
            index,
            message: OutgoingMessage::default(),
            size,
        }
    }

    #[test]
    fn packs_by_count_and_by_size() {
        let sizes: Vec<Vec<usize>> = pack((0..23).map(|i| pending(i, 10)).collect())
            .iter()
            .map(|chunk| chunk.iter().map(|p| p.index).collect::<Vec<_>>().len())
            .map(|len| vec![len])
            .collect();
        assert_eq!(sizes, vec![vec![10], vec![10], vec![3]]);

        let big = MAX_MESSAGE_BYTES / 3 + 1;
        let chunks = pack((0..5).map(|i| pending(i, big)).collect());
        let indices: Vec<Vec<usize>> = chunks
            .iter()
            .map(|c| c.iter().map(|p| p.index).collect())
            .collect();
        assert_eq!(indices, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    #[test]
    fn backoff_doubles() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
    }
}
