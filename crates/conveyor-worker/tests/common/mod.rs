//! Shared test kit: a recording handler with scripted failures, configs, and helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_core::message::{IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use conveyor_core::{
    message::AttributeValue,
    port::{OutgoingMessage, Queue},
    {Backoff, Context, Handler, HandlerError, HandlerSettings, Pipeline, Router},
};
use conveyor_worker::config::{PriorityMode, QueueConfig, WorkerConfig};
use conveyor_worker::{Worker, WorkerError, WorkerReport, WorkerStatus};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a test job does.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct TestJob {
    pub id: u64,
    /// How long the job works (watching its cancellation token unless `stubborn`).
    #[serde(default)]
    pub ms: u64,
    #[serde(default)]
    pub fail: Fail,
    /// For `Fail::Retry` / `Fail::RetryAfter`: fail on deliveries up to this receive count.
    #[serde(default)]
    pub fail_until: u32,
    /// Ignore cancellation while working.
    #[serde(default)]
    pub stubborn: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) enum Fail {
    #[default]
    Never,
    Retry,
    RetryAfter(u64),
    Permanent,
    Panic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Started,
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub id: u64,
    pub job_type: &'static str,
    pub kind: Kind,
    pub receive_count: u32,
    pub at: Instant,
}

/// Everything the handlers did, in order.
#[derive(Debug, Default)]
pub(crate) struct Log {
    events: Mutex<Vec<Event>>,
}

impl Log {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn push(&self, id: u64, job_type: &'static str, kind: Kind, receive_count: u32) {
        self.events.lock().unwrap().push(Event {
            id,
            job_type,
            kind,
            receive_count,
            at: Instant::now(),
        });
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    pub(crate) fn count(&self, kind: Kind) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.kind == kind)
            .count()
    }

    pub(crate) fn count_of(&self, job_type: &str, kind: Kind) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.kind == kind && event.job_type == job_type)
            .count()
    }

    /// Ids in the order their `kind` event happened.
    pub(crate) fn ids(&self, kind: Kind) -> Vec<u64> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.kind == kind)
            .map(|event| event.id)
            .collect()
    }

    /// How many runs were going on at once, at most.
    pub(crate) fn max_concurrent(&self, job_type: &str) -> usize {
        let mut running = 0usize;
        let mut max = 0usize;
        for event in self
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.job_type == job_type)
        {
            match event.kind {
                Kind::Started => {
                    running += 1;
                    max = max.max(running);
                }
                _ => running = running.saturating_sub(1),
            }
        }
        max
    }
}

/// A job type, as a type.
pub(crate) trait JobKind: Send + Sync + 'static {
    const NAME: &'static str;
}

pub(crate) struct Plain;
impl JobKind for Plain {
    const NAME: &'static str = "plain";
}
pub(crate) struct Slow;
impl JobKind for Slow {
    const NAME: &'static str = "slow";
}
pub(crate) struct Email;
impl JobKind for Email {
    const NAME: &'static str = "email";
}
pub(crate) struct Urgent;
impl JobKind for Urgent {
    const NAME: &'static str = "urgent";
}
pub(crate) struct Backlog;
impl JobKind for Backlog {
    const NAME: &'static str = "backlog";
}

/// A handler that records what it does and follows the job's script.
pub(crate) struct Recorder<K> {
    log: Arc<Log>,
    downstream_down: Arc<AtomicBool>,
    _kind: PhantomData<K>,
}

impl<K> Recorder<K> {
    pub(crate) fn new(log: &Arc<Log>) -> Self {
        Self::with_downstream(log, &Arc::new(AtomicBool::new(false)))
    }

    /// While `down` is true every run fails with a retryable error (after its work).
    pub(crate) fn with_downstream(log: &Arc<Log>, down: &Arc<AtomicBool>) -> Self {
        Self {
            log: Arc::clone(log),
            downstream_down: Arc::clone(down),
            _kind: PhantomData,
        }
    }
}

impl<K: JobKind> Handler for Recorder<K> {
    type Job = TestJob;
    type Output = u64;
    const JOB_TYPE: &'static str = K::NAME;

    async fn handle(&self, job: TestJob, ctx: Context) -> Result<u64, HandlerError> {
        let receive_count = ctx.receive_count();
        let log = &self.log;
        log.push(job.id, K::NAME, Kind::Started, receive_count);
        if job.ms > 0 {
            let work = tokio::time::sleep(Duration::from_millis(job.ms));
            if job.stubborn {
                work.await;
            } else {
                tokio::select! {
                    () = work => {}
                    () = ctx.cancelled() => {
                        log.push(job.id, K::NAME, Kind::Cancelled, receive_count);
                        return Err(HandlerError::retryable("cancelled"));
                    }
                }
            }
        }
        if self.downstream_down.load(Ordering::SeqCst) {
            log.push(job.id, K::NAME, Kind::Failed, receive_count);
            return Err(HandlerError::retryable("downstream is down"));
        }
        let failing = receive_count <= job.fail_until;
        let result = match job.fail {
            Fail::Never => Ok(job.id),
            Fail::Retry if failing => Err(HandlerError::retryable("try again")),
            Fail::RetryAfter(secs) if failing => Err(HandlerError::retry_after(
                "try again later",
                Duration::from_secs(secs),
            )),
            Fail::Retry | Fail::RetryAfter(_) => Ok(job.id),
            Fail::Permanent => Err(HandlerError::permanent("poison: this job can never succeed")),
            Fail::Panic => {
                log.push(job.id, K::NAME, Kind::Failed, receive_count);
                panic!("handler panicked on purpose");
            }
        };
        let kind = if result.is_ok() {
            Kind::Succeeded
        } else {
            Kind::Failed
        };
        log.push(job.id, K::NAME, kind, receive_count);
        result
    }

    fn settings(&self) -> HandlerSettings {
        {
            // Short retries for tests: waits of at most 0.4, 0.8, 1.6 and 3.2 s.
            HandlerSettings::default().with_backoff(Backoff::with_budget(Duration::from_secs(3)))
        }
    }
}

/// A message for job type `job_type`.
pub(crate) fn message(job_type: &str, job: &TestJob) -> OutgoingMessage {
    let mut message = OutgoingMessage {
        body: serde_json::to_string(job).unwrap(),
        ..OutgoingMessage::default()
    };
    message
        .attributes
        .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string(job_type));
    message
}

/// The same with a producer idempotency key.
pub(crate) fn keyed_message(job_type: &str, job: &TestJob, key: &str) -> OutgoingMessage {
    let mut message = message(job_type, job);
    message
        .attributes
        .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
    message
}

/// A FIFO message of `group`.
pub(crate) fn fifo_message(job_type: &str, job: &TestJob, group: &str) -> OutgoingMessage {
    OutgoingMessage {
        group_id: Some(group.to_owned()),
        deduplication_id: Some(format!("{group}-{}", job.id)),
        ..message(job_type, job)
    }
}

pub(crate) fn job(id: u64) -> TestJob {
    TestJob {
        id,
        ..TestJob::default()
    }
}

pub(crate) fn slow_job(id: u64, ms: u64) -> TestJob {
    TestJob {
        id,
        ms,
        ..TestJob::default()
    }
}

/// A config for in-memory queues named `names` (weights as given), no operations endpoint.
pub(crate) fn config(queues: &[(&str, u32)]) -> WorkerConfig {
    WorkerConfig::default()
        .with_queues(
            queues
                .iter()
                .map(|(name, weight)| {
                    QueueConfig::new(format!("http://memory.invalid/000000000000/{name}"))
                        .with_weight(*weight)
                })
                .collect(),
        )
        .with_max_in_flight(10)
        .with_drain_deadline(Some(Duration::from_secs(10)))
        .with_priority(PriorityMode::Weighted)
        .with_listen_addr(None)
}

/// A worker running in its own task.
pub(crate) struct Running {
    pub shutdown: CancellationToken,
    pub handle: JoinHandle<Result<WorkerReport, WorkerError>>,
    pub status: WorkerStatus,
}

/// Runs `worker` until its `shutdown` token is cancelled.
pub(crate) fn start(worker: Worker) -> Running {
    let shutdown = CancellationToken::new();
    let status = worker.status();
    let handle = tokio::spawn(worker.run(shutdown.clone()));
    Running {
        shutdown,
        handle,
        status,
    }
}

impl Running {
    /// Shuts the worker down gracefully and returns its report.
    pub(crate) async fn stop(self) -> WorkerReport {
        self.shutdown.cancel();
        self.handle.await.unwrap().unwrap()
    }
}

/// A worker for one queue whose only route is `Recorder<Plain>`, without idempotency.
pub(crate) fn plain_worker<Q: Queue + 'static>(
    config: WorkerConfig,
    log: &Arc<Log>,
    queue: &Arc<Q>,
) -> Worker {
    let pipeline = Pipeline::new(Router::new().route(Recorder::<Plain>::new(log)));
    Worker::new(config, pipeline, vec![Arc::clone(queue) as Arc<dyn Queue>]).unwrap()
}

/// Waits for `condition` for up to `secs` (tokio's clock: instant under a paused clock).
pub(crate) async fn eventually(secs: u64, what: &str, condition: impl Fn() -> bool) {
    let waited =
        conveyor_testing::wait_until(Duration::from_secs(secs), Duration::from_millis(10), async || {
            condition()
        })
        .await;
    if let Err(error) = waited {
        panic!("waiting for {what}: {error}");
    }
}

/// `GET path` on the operations endpoint at `addr`: (status code, body).
pub(crate) async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (code, body)
}

pub(crate) mod aws;
