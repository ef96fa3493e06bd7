//! The batch function on AWS's documented events, against `MemoryQueue` (no runtime, no AWS).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style); helpers here are test code too

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use conveyor_core::message::{FAILURE_ATTRIBUTE, IDEMPOTENCY_KEY_ATTRIBUTE};
use conveyor_core::port::IdempotencyStore;
use conveyor_core::{
    message::{AttributeValue, Message},
    port::{OutgoingMessage, Queue, RecordStatus},
    {Context, Handler, HandlerError, Pipeline, Router},
};
use conveyor_lambda::LambdaConfig;
use conveyor_lambda::{BatchProcessor, BatchReport, FixedQueue, SqsEvent, parse_event, to_message};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, MessageState};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Batch handlers on the Lambda adapter.
#[path = "batch/handlers.rs"]
mod handlers;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A job that says what the handler should do.
#[derive(Debug, Deserialize)]
struct Step {
    name: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    sleep_ms: u64,
}

/// Runs steps and logs each run's name, in order.
struct Scripted {
    log: Arc<Mutex<Vec<String>>>,
    /// Handlers running now, and the most at once.
    running: Arc<(AtomicUsize, AtomicUsize)>,
    store: Option<Arc<MemoryIdempotencyStore>>,
    leases: Arc<Mutex<Vec<SystemTime>>>,
}

impl Handler for Scripted {
    type Job = Step;
    type Output = ();
    const JOB_TYPE: &'static str = "scripted";

    async fn handle(&self, step: Step, ctx: Context) -> Result<(), HandlerError> {
        self.log.lock().unwrap().push(step.name.clone());
        if step.action == "until_cancelled" {
            ctx.cancelled().await;
            self.log
                .lock()
                .unwrap()
                .push(format!("{}: told to stop", step.name));
            return Err(HandlerError::retryable("stopped"));
        }
        if let Some(store) = &self.store {
            let leases = store
                .records()
                .into_iter()
                .filter_map(|record| record.lease_until);
            self.leases.lock().unwrap().extend(leases);
        }
        if step.sleep_ms > 0 {
            let now = self.running.0.fetch_add(1, Ordering::SeqCst) + 1;
            self.running.1.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(step.sleep_ms)).await;
            self.running.0.fetch_sub(1, Ordering::SeqCst);
        }
        let runs = self
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|name| **name == step.name)
            .count();
        match step.action.as_str() {
            "retry" => Err(HandlerError::retry_after(
                "provider busy",
                Duration::from_secs(30),
            )),
            "retry_once" if runs < 2 => Err(HandlerError::retry_after(
                "provider busy for a moment",
                Duration::from_secs(2),
            )),
            "permanent" => Err(HandlerError::permanent("no such user")),
            "panic" => panic!("handler bug"),
            _ => Ok(()),
        }
    }
}

struct Harness {
    queue: Arc<MemoryQueue>,
    log: Arc<Mutex<Vec<String>>>,
    running: Arc<(AtomicUsize, AtomicUsize)>,
    leases: Arc<Mutex<Vec<SystemTime>>>,
    processor: BatchProcessor,
}

impl Harness {
    fn new(queue: MemoryQueue, config: LambdaConfig) -> Self {
        Self::build(queue, config, None)
    }

    fn build(queue: MemoryQueue, config: LambdaConfig, store: Option<Arc<MemoryIdempotencyStore>>) -> Self {
        let store_dyn = store.clone().map(|store| store as Arc<dyn IdempotencyStore>);
        Self::build_with(queue, config, store, store_dyn)
    }

    /// A harness whose pipeline uses `pipeline_store` (any store); `recorded` is the memory store the
    /// handler reads leases from, if any.
    fn build_with(
        queue: MemoryQueue,
        config: LambdaConfig,
        recorded: Option<Arc<MemoryIdempotencyStore>>,
        pipeline_store: Option<Arc<dyn IdempotencyStore>>,
    ) -> Self {
        let store = recorded;
        let queue = Arc::new(queue);
        let log = Arc::new(Mutex::new(Vec::new()));
        let leases = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let handler = Scripted {
            log: Arc::clone(&log),
            running: Arc::clone(&running),
            store: store.clone(),
            leases: Arc::clone(&leases),
        };
        let mut pipeline = Pipeline::new(Router::single(handler)).with_clock(paused_clock());
        if let Some(store) = pipeline_store {
            pipeline = pipeline.with_store(store);
        }
        let resolver = FixedQueue(Arc::clone(&queue) as Arc<dyn Queue>);
        let processor = BatchProcessor::new(pipeline, config, Arc::new(resolver)).without_metrics();
        Self {
            queue,
            log,
            running,
            leases,
            processor,
        }
    }

    fn push(&self, name: &str, action: &str) -> String {
        self.push_step(json!({"name": name, "action": action}), None)
    }

    fn push_step(&self, step: Value, group: Option<&str>) -> String {
        let group_id = group
            .map(str::to_owned)
            .or_else(|| self.queue.is_fifo().then(|| "g".to_owned()));
        let deduplication_id = self
            .queue
            .is_fifo()
            .then(|| step["name"].as_str().unwrap().to_owned());
        self.queue
            .push_message(OutgoingMessage {
                body: step.to_string(),
                group_id,
                deduplication_id,
                ..OutgoingMessage::default()
            })
            .unwrap()
    }

    /// Receives everything visible, as the event source mapping would.
    async fn receive(&self) -> Vec<Message> {
        self.queue.receive(10, Duration::ZERO).await.unwrap()
    }

    /// The event the mapping would send for `messages`.
    fn event(&self, messages: &[Message]) -> SqsEvent {
        event_of(&self.queue, messages)
    }

    async fn run(&self, messages: &[Message], deadline: Instant) -> BatchReport {
        self.processor
            .process_batch_report(self.event(messages), deadline)
            .await
    }

    fn ran(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn state_of(&self, id: &str) -> Option<MessageState> {
        self.queue
            .snapshot()
            .into_iter()
            .find(|message| message.id == id)
            .map(|message| message.state)
    }
}

/// The event the mapping would send for `messages`: AWS's documented record, filled in.
fn event_of(queue: &MemoryQueue, messages: &[Message]) -> SqsEvent {
    let template = fixture("sqs-standard-event.json")["Records"][0].clone();
    let arn = format!("arn:aws:sqs:us-east-2:123456789012:{}", queue.name());
    let records: Vec<Value> = messages
        .iter()
        .map(|message| {
            let mut record = template.clone();
            record["messageId"] = json!(message.id);
            record["receiptHandle"] = json!(message.receipt_handle.as_str());
            record["body"] = json!(message.body);
            record["eventSourceARN"] = json!(arn);
            record["attributes"]["ApproximateReceiveCount"] = json!(message.receive_count.to_string());
            // SQS's first-receive time, as the queue recorded it (the template's is from 2019).
            let attributes = conveyor_lambda::to_record(message, &arn).attributes;
            record["attributes"]["ApproximateFirstReceiveTimestamp"] =
                json!(attributes.get("ApproximateFirstReceiveTimestamp"));
            if let Some(group) = &message.group_id {
                record["attributes"]["MessageGroupId"] = json!(group);
            }
            let attributes = conveyor_lambda::to_record(message, &arn).message_attributes;
            record["messageAttributes"] = serde_json::to_value(attributes).unwrap();
            record
        })
        .collect();
    parse_event(json!({ "Records": records })).unwrap()
}

/// The wall clock as tokio's (paused) clock moves it, so that times the pipeline judges by the wall
/// clock (a deferral's bound) move with `tokio::time::advance`.
fn paused_clock() -> Arc<dyn Fn() -> SystemTime + Send + Sync> {
    let (start, wall) = (Instant::now(), SystemTime::now());
    Arc::new(move || wall + start.elapsed())
}

fn listed(report: &BatchReport) -> Vec<String> {
    report
        .response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect()
}

fn in_ten_seconds() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn slow_queue(name: &str) -> MemoryQueue {
    MemoryQueue::standard(name).with_visibility_timeout(Duration::from_secs(300))
}

#[test]
fn documented_events_convert_field_for_field() {
    let standard: SqsEvent = parse_event(fixture("sqs-standard-event.json")).unwrap();
    let first = to_message(&standard.records[0]).unwrap();
    assert_eq!(first.id, "059f36b4-87a3-44ab-83d2-661975830a7d");
    assert_eq!(
        first.receipt_handle.as_str(),
        "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a..."
    );
    assert_eq!(first.body, "Test message.");
    assert_eq!(first.receive_count, 1);
    assert_eq!(
        first.sent_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_545_082_649_183))
    );
    assert_eq!(
        first.first_received_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_545_082_649_185))
    );
    assert_eq!(first.attributes["myAttribute"], AttributeValue::string("myValue"));
    assert_eq!(first.group_id, None);

    let fifo: SqsEvent = parse_event(fixture("sqs-fifo-event.json")).unwrap();
    let message = to_message(&fifo.records[0]).unwrap();
    assert_eq!(message.group_id.as_deref(), Some("1"));
    assert_eq!(message.deduplication_id.as_deref(), Some("1"));
}

/// AWS's documented event, as the mapping hands it over just after its receive: the fixture's
/// first-receive time (2019) is replaced by now. Its receipts were never handed out by the test's
/// queue, so a record that looked held past its visibility would be refused its renewal and not run
/// (`src/cover.rs`).
fn documented_event_received_now() -> SqsEvent {
    let mut event = parse_event(fixture("sqs-standard-event.json")).unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for record in &mut event.records {
        record
            .attributes
            .insert("ApproximateFirstReceiveTimestamp".to_owned(), now.to_string());
    }
    event
}

#[tokio::test]
async fn a_documented_event_that_succeeds_lists_nothing() {
    let harness = Harness::new(MemoryQueue::standard("my-queue"), LambdaConfig::default());
    let mut event = documented_event_received_now();
    for record in &mut event.records {
        record.body = Some(json!({"name": record.message_id}).to_string());
    }
    let report = harness
        .processor
        .process_batch_report(event, in_ten_seconds())
        .await;
    assert!(listed(&report).is_empty(), "{report:?}");
    assert_eq!(harness.ran().len(), 2);
    let metrics = &report.metrics[0];
    assert_eq!(metrics.queue, "my-queue");
    assert_eq!((metrics.received, metrics.succeeded, metrics.retried), (2, 2, 0));
    assert_eq!(metrics.handler_durations.len(), 2);
    // The documented body ("Test message.") is not a job: permanent, so dead-lettered; this queue has
    // no DLQ, so it is listed and retried after the fallback delay rather than lost.
    let raw = documented_event_received_now();
    let report = harness
        .processor
        .process_batch_report(raw, in_ten_seconds())
        .await;
    assert_eq!(
        listed(&report),
        vec![
            "059f36b4-87a3-44ab-83d2-661975830a7d",
            "2e1424d4-f796-459a-8184-9c92662be6da"
        ]
    );
}

/// A Lambda function has no heartbeat: a record handed to it long after the receive that took it (the
/// mapping's batching window, a slow cold start, a receive answered late) has its visibility renewed
/// before it runs, or SQS hands it to another consumer mid-run (simulator seed 2450). A prompt first
/// receive costs no call.
#[tokio::test(start_paused = true)]
async fn a_record_received_long_before_its_invocation_stays_invisible_while_it_runs() {
    let queue = MemoryQueue::standard("jobs").with_visibility_timeout(Duration::from_secs(60));
    let harness = Harness::new(queue, LambdaConfig::default());
    let prompt = harness.push("prompt", "ok");
    let received = harness.receive().await;
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(30))
        .await;
    assert!(listed(&report).is_empty());
    assert_eq!(
        harness.queue.requests().change_visibility,
        0,
        "a prompt first receive: no call"
    );
    harness
        .queue
        .delete_batch(&[received[0].receipt_handle.clone()])
        .await
        .unwrap();
    assert_eq!(harness.state_of(&prompt), None);

    let slow = harness.push_step(json!({"name": "slow", "sleep_ms": 20_000}), None);
    // Its first receive's run died; the second receive was held 50 s before the invocation: 10 s of
    // its visibility are left, for a 20 s run.
    harness.receive().await;
    tokio::time::advance(Duration::from_secs(61)).await;
    let received = harness.receive().await;
    assert_eq!(received[0].receive_count, 2);
    tokio::time::advance(Duration::from_secs(50)).await;
    let another_consumer = async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        harness.queue.receive(10, Duration::ZERO).await.unwrap()
    };
    let (report, taken) = tokio::join!(
        harness.run(&received, Instant::now() + Duration::from_secs(30)),
        another_consumer
    );
    assert!(listed(&report).is_empty(), "{report:?}");
    assert!(taken.is_empty(), "handed out again while it ran: {taken:?}");
    assert_eq!(harness.ran(), vec!["prompt", "slow"]);
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "one batch call renewed it"
    );
    assert_eq!(harness.state_of(&slow), Some(MessageState::InFlight));
}

/// A record whose visibility ended before its invocation is no longer the invocation's: SQS refuses its
/// renewal, and it must not run. On a FIFO queue the rest of its group may have been received and run
/// elsewhere meanwhile; running the record then reorders the group (simulator seed 2601: the head was
/// moved to the DLQ at its next receive, a worker ran the message behind it, then the invocation ran
/// the head). It is listed, never run and never touched (no DLQ copy of its own), and the rest of its
/// group in the batch does not run either.
#[tokio::test(start_paused = true)]
async fn a_record_whose_visibility_ended_before_the_invocation_does_not_run() {
    let dlq = Arc::new(MemoryQueue::fifo("orders-dlq"));
    let queue = MemoryQueue::fifo("orders")
        .with_visibility_timeout(Duration::from_secs(10))
        .with_dead_letter_queue(Arc::clone(&dlq), 2);
    let harness = Harness::new(queue, LambdaConfig::default());
    let head = harness.push_step(json!({"name": "head"}), Some("g"));
    // The head's first receive, whose invocation died.
    assert_eq!(harness.queue.receive(1, Duration::ZERO).await.unwrap().len(), 1);
    tokio::time::advance(Duration::from_secs(11)).await;
    let next = harness.push_step(json!({"name": "next"}), Some("g"));
    // The batch this invocation gets (the head's last allowed receive), held past its visibility
    // timeout before the invocation.
    let held = harness.receive().await;
    assert_eq!(held.len(), 2);
    assert_eq!(held[0].receive_count, 2);
    tokio::time::advance(Duration::from_secs(11)).await;
    // Meanwhile another consumer receives the group: the head, past maxReceiveCount, is moved to the
    // DLQ by the redrive policy; the message behind it is handed out, run and deleted.
    let elsewhere = harness.receive().await;
    assert_eq!(elsewhere.len(), 1, "{elsewhere:?}");
    assert_eq!(elsewhere[0].id, next);
    harness
        .queue
        .delete_batch(&[elsewhere[0].receipt_handle.clone()])
        .await
        .unwrap();
    assert_eq!(dlq.snapshot().len(), 1, "the redrive moved the head");

    let report = harness.run(&held, in_ten_seconds()).await;
    assert!(
        harness.ran().is_empty(),
        "ran a record no longer ours, after the message behind it: {:?}",
        harness.ran()
    );
    assert_eq!(listed(&report), vec![head.clone(), next.clone()]);
    assert_eq!(
        dlq.snapshot().len(),
        1,
        "no DLQ copy of a record that is not ours"
    );
}

/// Log lines at warn level and above, captured for one test (tokio's test runtime runs on one thread,
/// so a thread-local subscriber sees the adapter's tasks).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Warnings {
    type Writer = Warnings;

    fn make_writer(&'a self) -> Warnings {
        self.clone()
    }
}

impl Warnings {
    /// Captures warnings on this thread until the guard drops.
    ///
    /// `tracing` caches each callsite's interest for the whole process, computed the first time
    /// any thread reaches it: a test on another thread without a subscriber caches "never" and the
    /// warning is never built, here either (this test failed so in CI). A global registry, which
    /// wants every callsite, keeps those interests open; the events still reach only this thread's
    /// capture.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        conveyor_testing::spans::keep_callsites_open();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        guard
    }

    /// How many captured lines contain `text`.
    fn count(&self, text: &str) -> usize {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(text))
            .count()
    }
}

/// A record's span says what settlement did, not what the pipeline asked for: a permanent failure
/// is `dead_lettered` when its copy reached the DLQ, and `retried` on a queue with no DLQ, where it
/// went back to the queue (it said `dead_lettered` there too).
#[tokio::test]
async fn a_records_span_says_what_settlement_did() {
    for with_dlq in [true, false] {
        let mut queue = MemoryQueue::standard("jobs");
        if with_dlq {
            queue = queue.with_dead_letter_queue(Arc::new(MemoryQueue::standard("jobs-dlq")), 5);
        }
        let harness = Harness::new(queue, LambdaConfig::default());
        harness.push("doomed", "permanent");
        harness.push("fine", "ok");
        let outcomes = conveyor_testing::SpanOutcomes::default();
        let guard = outcomes.capture();
        let messages = harness.receive().await;
        harness
            .run(&messages, Instant::now() + Duration::from_secs(60))
            .await;
        drop(guard);
        let expected = if with_dlq {
            ["acked", "dead_lettered"]
        } else {
            ["acked", "retried"]
        };
        let mut seen = outcomes.values();
        seen.sort();
        assert_eq!(seen, expected, "with a DLQ: {with_dlq}");
    }
}

/// The warning an invocation gives once when SQS says it never issued its records' receipt handles.
const NOT_ISSUED_WARNING: &str = "SQS says it never issued the receipt handles";

/// `tests/fixtures/sqs-hand-written-event.json` (the shape of `aws_lambda_events`' fixture: receipt
/// handles SQS never issued, a first receive years ago), its records made steps of the scripted
/// handler: the first succeeds, the second fails and is retried. On a FIFO queue, both records in one group.
fn hand_written_event(fifo: bool) -> SqsEvent {
    let mut event = parse_event(fixture("sqs-hand-written-event.json")).unwrap();
    for (record, action) in event.records.iter_mut().zip(["ok", "retry"]) {
        record.body = Some(json!({"name": record.message_id, "action": action}).to_string());
        if let Some(job_type) = record.message_attributes.get_mut("conveyor.type") {
            job_type.string_value = Some("scripted".to_owned());
        }
        if fifo {
            record.event_source_arn = Some("arn:aws:sqs:us-west-2:123456789012:SQSQueue.fifo".to_owned());
            record
                .attributes
                .insert("MessageGroupId".to_owned(), "g".to_owned());
        }
    }
    event
}

/// `cargo lambda invoke` with a hand-written event: SQS never issued its receipt handles, so the
/// invocation is not Lambda's own, and it answers as Lambda would, every time: the record that
/// succeeds is not listed, the one that fails is, and both ran. The visibility cover's call is the
/// only visibility call (no backoff for the retry: SQS would refuse it), and one warning per
/// invocation says why. (Before, the cover took `ReceiptHandleIsInvalid` for "no longer ours":
/// nothing ran and every record was listed, on every invocation.)
#[tokio::test(start_paused = true)]
async fn a_hand_written_event_runs_its_records_on_every_invocation() {
    let harness = Harness::new(slow_queue("SQSQueue"), LambdaConfig::default());
    let warnings = Warnings::default();
    let _capture = warnings.capture();
    for invocation in 1..=2 {
        let report = harness
            .processor
            .process_batch_report(hand_written_event(false), in_ten_seconds())
            .await;
        assert_eq!(
            listed(&report),
            vec!["MessageID_2"],
            "invocation {invocation}: {report:?}"
        );
        assert_eq!(
            warnings.count(NOT_ISSUED_WARNING),
            invocation,
            "one warning per invocation"
        );
        assert_eq!(
            harness.queue.requests().change_visibility,
            invocation as u64,
            "the cover's call, and no backoff for the retry"
        );
    }
    let mut ran = harness.ran();
    ran.sort();
    assert_eq!(ran, ["MessageID_1", "MessageID_1", "MessageID_2", "MessageID_2"]);
    assert_eq!(warnings.count("no longer ours"), 0);
}

/// The same on a FIFO queue: the record that succeeded is not deleted before the rest of its group
/// (SQS would refuse the delete, and the group would go back unrun), so the one behind it runs too.
#[tokio::test(start_paused = true)]
async fn a_hand_written_fifo_event_runs_its_group() {
    let harness = Harness::new(
        MemoryQueue::fifo("SQSQueue.fifo").with_visibility_timeout(Duration::from_secs(300)),
        LambdaConfig::default(),
    );
    let report = harness
        .processor
        .process_batch_report(hand_written_event(true), in_ten_seconds())
        .await;
    assert_eq!(listed(&report), vec!["MessageID_2"], "{report:?}");
    assert_eq!(harness.ran(), ["MessageID_1", "MessageID_2"]);
    let requests = harness.queue.requests();
    assert_eq!(
        (requests.change_visibility, requests.delete),
        (1, 0),
        "{requests:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn partial_failures_are_listed_and_come_back_after_their_backoff() {
    let harness = Harness::new(slow_queue("jobs"), LambdaConfig::default());
    let ok1 = harness.push("ok1", "ok");
    let retry1 = harness.push("retry1", "retry");
    let ok2 = harness.push("ok2", "ok");
    let retry2 = harness.push("retry2", "retry");
    let received = harness.receive().await;
    assert_eq!(received.len(), 4);

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), vec![retry1.clone(), retry2.clone()]);
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "one batch call for all retries"
    );
    let metrics = &report.metrics[0];
    assert_eq!(
        (
            metrics.received,
            metrics.succeeded,
            metrics.retried,
            metrics.dead_lettered
        ),
        (4, 2, 2, 0)
    );

    // The handler asked for 30 s; the queue's visibility timeout is 300 s.
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(harness.state_of(&retry1), Some(MessageState::InFlight));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(harness.state_of(&retry1), Some(MessageState::Visible));
    assert_eq!(harness.state_of(&retry2), Some(MessageState::Visible));
    // Successes are left for the event source mapping to delete.
    assert_eq!(harness.state_of(&ok1), Some(MessageState::InFlight));
    assert_eq!(harness.state_of(&ok2), Some(MessageState::InFlight));
}

#[tokio::test]
async fn permanent_failures_go_to_the_dlq_at_once_and_are_not_listed() {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5);
    let harness = Harness::new(queue, LambdaConfig::default());
    harness.push("fine", "ok");
    harness.push("doomed", "permanent");
    let received = harness.receive().await;

    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(listed(&report).is_empty(), "{report:?}");
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].body.contains("doomed"));
    let failure = dead[0].attributes[FAILURE_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    assert!(failure.contains("no such user"), "{failure}");
    assert_eq!(report.metrics[0].dead_lettered, 1);
    assert_eq!(harness.queue.requests().change_visibility, 0);
}

#[tokio::test]
async fn a_failed_dlq_send_is_listed_for_retry() {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5);
    let harness = Harness::new(queue, LambdaConfig::default());
    let doomed = harness.push("doomed", "permanent");
    let received = harness.receive().await;
    dlq.set_unavailable(true);

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), vec![doomed]);
    assert!(dlq.snapshot().is_empty());
    assert_eq!(report.metrics[0].dead_lettered, 0);
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "it comes back after the fallback delay"
    );
}

#[tokio::test(start_paused = true)]
async fn fifo_stops_a_group_after_a_failure_and_lets_other_groups_go_on() {
    let queue = MemoryQueue::fifo("orders").with_visibility_timeout(Duration::from_secs(300));
    let harness = Harness::new(queue, LambdaConfig::default());
    let a1 = harness.push_step(json!({"name": "a1"}), Some("a"));
    let a2 = harness.push_step(json!({"name": "a2", "action": "retry"}), Some("a"));
    let a3 = harness.push_step(json!({"name": "a3"}), Some("a"));
    let b1 = harness.push_step(json!({"name": "b1", "sleep_ms": 5}), Some("b"));
    let b2 = harness.push_step(json!({"name": "b2"}), Some("b"));
    let received = harness.receive().await;
    assert_eq!(received.len(), 5, "both groups in one batch");

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), vec![a2.clone(), a3.clone()]);
    let ran = harness.ran();
    let group_a: Vec<&str> = ran
        .iter()
        .map(String::as_str)
        .filter(|name| name.starts_with('a'))
        .collect();
    let group_b: Vec<&str> = ran
        .iter()
        .map(String::as_str)
        .filter(|name| name.starts_with('b'))
        .collect();
    assert_eq!(group_a, vec!["a1", "a2"], "a3 never started");
    assert_eq!(group_b, vec!["b1", "b2"], "in order, after b1's sleep");

    // a2 comes back after its 30 s, and a3 with it (the group moves together, in order) instead of
    // waiting for the 300 s visibility timeout.
    tokio::time::advance(Duration::from_secs(31)).await;
    let states: Vec<(String, MessageState)> = harness
        .queue
        .snapshot()
        .into_iter()
        .map(|message| (message.id, message.state))
        .collect();
    assert!(states.contains(&(a2, MessageState::Visible)), "{states:?}");
    assert!(states.contains(&(a3, MessageState::Visible)), "{states:?}");
    // A settled message with successors in the batch was deleted by the adapter before they ran (a
    // failed mapping delete cannot bring it back behind them); the last of a group is the mapping's.
    let present = |id: &String| states.iter().any(|(state_id, _)| state_id == id);
    assert!(!present(&a1), "a1 deleted before a2 ran: {states:?}");
    assert!(!present(&b1), "b1 deleted before b2 ran: {states:?}");
    assert!(states.contains(&(b2, MessageState::InFlight)), "{states:?}");
}

/// The deferred copies in the queue (`conveyor.deferral`), by the original message id they carry.
fn deferred_copies(harness: &Harness) -> Vec<(String, u32, MessageState)> {
    let mut copies: Vec<(String, u32, MessageState)> = harness
        .queue
        .snapshot()
        .into_iter()
        .filter_map(|copy| {
            let record = copy
                .attributes
                .get(conveyor_core::message::DEFERRAL_ATTRIBUTE)?
                .string_value
                .clone()?;
            let original: Value = serde_json::from_str(&record).ok()?;
            let original = original.get("original_id")?.as_str()?.to_owned();
            Some((original, copy.receive_count, copy.state))
        })
        .collect();
    copies.sort_by(|a, b| a.0.cmp(&b.0));
    copies
}

#[tokio::test(start_paused = true)]
async fn messages_that_cannot_start_before_the_deadline_are_deferred_with_a_copy() {
    let config = LambdaConfig::default()
        .with_batch_concurrency(1)
        .with_deadline_margin(Duration::from_millis(1500));
    let harness = Harness::new(slow_queue("jobs"), config);
    let slow = harness.push_step(json!({"name": "slow", "sleep_ms": 600}), None);
    let late1 = harness.push("late1", "ok");
    let late2 = harness.push("late2", "ok");
    let received = harness.receive().await;

    // The cut-off is 2 s - 1.5 s = 500 ms away: the slow one starts and runs into it; the others
    // cannot start. Listing them would spend a receive each without a run: they are deferred with a
    // copy at receive count 0 instead, and left out of the response (the mapping deletes them).
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(2))
        .await;
    assert_eq!(listed(&report), vec![slow.clone()]);
    assert_eq!(harness.ran(), vec!["slow"]);
    assert_eq!(report.metrics[0].deferred, 2);
    assert_eq!(report.metrics[0].retried, 1);
    let mut expected = vec![
        (late1.clone(), 0, MessageState::Visible),
        (late2.clone(), 0, MessageState::Visible),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(deferred_copies(&harness), expected);
    // The timed-out one is a retry with backoff (at most the first ceiling of the default budget).
    tokio::time::advance(conveyor_core::Backoff::default().ceiling(1, None)).await;
    assert_eq!(harness.state_of(&slow), Some(MessageState::Visible));

    // A batch that arrives past the cut-off runs nothing; its records are deferred the same way.
    harness.log.lock().unwrap().clear();
    let received = harness.receive().await;
    assert_eq!(received.len(), 3, "the retried one and the two copies");
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(1))
        .await;
    assert!(listed(&report).is_empty(), "{:?}", listed(&report));
    assert_eq!(report.metrics[0].deferred, 3);
    assert!(harness.ran().is_empty());
}

#[tokio::test(start_paused = true)]
async fn on_a_fifo_queue_messages_that_cannot_start_are_listed_untouched() {
    let config = LambdaConfig::default()
        .with_batch_concurrency(1)
        .with_deadline_margin(Duration::from_millis(1500));
    let queue = MemoryQueue::fifo("orders.fifo").with_visibility_timeout(Duration::from_secs(300));
    let harness = Harness::new(queue, config);
    harness.push_step(json!({"name": "slow", "sleep_ms": 600}), Some("a"));
    let late = harness.push_step(json!({"name": "late", "action": "ok"}), Some("b"));
    let received = harness.receive().await;

    // A copy would go behind the rest of its group: the late one is listed and left in flight.
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(2))
        .await;
    assert!(listed(&report).contains(&late), "{:?}", listed(&report));
    assert_eq!(report.metrics[0].deferred, 0);
    assert!(deferred_copies(&harness).is_empty());
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(harness.state_of(&late), Some(MessageState::InFlight));
}

#[tokio::test]
async fn a_panic_fails_only_its_message() {
    let harness = Harness::new(slow_queue("jobs"), LambdaConfig::default());
    harness.push("before", "ok");
    let bug = harness.push("bug", "panic");
    harness.push("after", "ok");
    let received = harness.receive().await;

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), vec![bug]);
    let mut ran = harness.ran();
    ran.sort();
    assert_eq!(ran, vec!["after", "before", "bug"]);
    assert_eq!(report.metrics[0].succeeded, 2);
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "the panic is a retry with backoff"
    );
}

#[test]
fn an_event_that_is_not_from_sqs_is_a_clear_error() {
    let error = parse_event(fixture("eventbridge-scheduled-event.json")).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("EventBridge event"), "{text}");
    assert!(text.contains("\"Scheduled Event\""), "{text}");
    assert!(text.contains("SQS events") && text.contains("Records"), "{text}");
    let diagnostic = lambda_runtime_diagnostic(error);
    assert_eq!(diagnostic.0, "Conveyor.NotAnSqsEvent");
}

fn lambda_runtime_diagnostic(error: conveyor_lambda::EventError) -> (String, String) {
    let diagnostic: lambda_runtime::Diagnostic = error.into();
    (diagnostic.error_type, diagnostic.error_message)
}

#[tokio::test]
async fn records_without_an_id_are_skipped_and_without_a_handle_are_listed() {
    let harness = Harness::new(MemoryQueue::standard("my-queue"), LambdaConfig::default());
    let mut event = parse_event(fixture("sqs-standard-event.json")).unwrap();
    event.records[0].message_id = None;
    event.records[1].receipt_handle = None;
    let report = harness
        .processor
        .process_batch_report(event, in_ten_seconds())
        .await;
    assert_eq!(listed(&report), vec!["2e1424d4-f796-459a-8184-9c92662be6da"]);
    assert!(harness.ran().is_empty());
    assert_eq!(report.metrics[0].received, 2);
}

#[tokio::test]
async fn a_duplicate_is_acknowledged_without_running_and_the_claim_lease_is_the_deadline_plus_the_allowance()
{
    let store = Arc::new(MemoryIdempotencyStore::new());
    let harness = Harness::build(
        slow_queue("jobs"),
        LambdaConfig::default(),
        Some(Arc::clone(&store)),
    );
    for _ in 0..2 {
        let mut attributes = conveyor_core::message::Attributes::new();
        attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            AttributeValue::string("welcome:42"),
        );
        harness
            .queue
            .push_message(OutgoingMessage {
                body: json!({"name": "welcome"}).to_string(),
                attributes,
                ..OutgoingMessage::default()
            })
            .unwrap();
    }
    let received = harness.receive().await;
    assert_eq!(received.len(), 2);

    let deadline_wall = SystemTime::now() + Duration::from_secs(10);
    let first = harness
        .run(&received[..1], conveyor_lambda::instant_at(deadline_wall))
        .await;
    let second = harness.run(&received[1..], in_ten_seconds()).await;
    assert!(listed(&first).is_empty() && listed(&second).is_empty());
    assert_eq!(harness.ran(), vec!["welcome"], "the handler ran once");
    assert_eq!(second.metrics[0].duplicates, 1);
    assert_eq!(second.metrics[0].succeeded, 0);
    let records = store.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, RecordStatus::Completed);

    let leases = harness.leases.lock().unwrap().clone();
    assert_eq!(leases.len(), 1, "the handler saw its in-progress claim");
    // The lease ends the clock-skew allowance after the deadline (see `CLOCK_SKEW_ALLOWANCE`).
    let lease_end = deadline_wall + conveyor_core::runtime::CLOCK_SKEW_ALLOWANCE;
    let gap = match leases[0].duration_since(lease_end) {
        Ok(after) => after,
        Err(before) => before.duration(),
    };
    assert!(
        gap < Duration::from_millis(50),
        "lease {:?} vs deadline {deadline_wall:?} plus the allowance",
        leases[0]
    );
}

#[tokio::test(start_paused = true)]
async fn the_last_allowed_attempt_goes_to_the_dlq_with_its_last_error() {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 2);
    let harness = Harness::new(queue, LambdaConfig::default());
    let flaky = harness.push("flaky", "retry");

    let first = harness.receive().await;
    let report = harness.run(&first, in_ten_seconds()).await;
    assert_eq!(
        listed(&report),
        vec![flaky.clone()],
        "the first attempt is retried"
    );
    assert!(dlq.snapshot().is_empty());

    tokio::time::advance(Duration::from_secs(31)).await;
    let second = harness.receive().await;
    assert_eq!(second[0].receive_count, 2);
    let report = harness.run(&second, in_ten_seconds()).await;
    assert!(
        listed(&report).is_empty(),
        "the last attempt is not listed: {report:?}"
    );
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1);
    let record = dead[0].attributes[FAILURE_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    let failure: conveyor_core::runtime::Failure = serde_json::from_str(&record).unwrap();
    assert!(failure.error.contains("provider busy"), "{failure:?}");
    assert!(failure.retries_exhausted);
    assert_eq!(failure.receive_count, 2);
    assert_eq!(report.metrics[0].dead_lettered, 1);
}

/// The retry budget counts runs, not receives (issue 51, rule 3): a job whose first receive went by
/// unrun reaches its last allowed receive at its first run; its retry goes on a copy that carries the
/// one run, and only the second run's failure dead-letters it, as retries exhausted.
#[tokio::test(start_paused = true)]
async fn a_retry_at_the_last_receive_with_runs_left_goes_on_a_copy_that_carries_the_runs() {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 2);
    let harness = Harness::build(queue, LambdaConfig::default(), Some(Arc::clone(&store)));
    let flaky = harness.push("flaky", "retry");
    // A receive that did not run it (its invocation never came, say): visible again after 300 s.
    assert_eq!(harness.receive().await.len(), 1);
    tokio::time::advance(Duration::from_secs(301)).await;
    let last = harness.receive().await;
    assert_eq!(
        last[0].receive_count, 2,
        "the last receive the redrive policy allows"
    );

    let report = harness.run(&last, in_ten_seconds()).await;
    assert!(
        listed(&report).is_empty(),
        "on a copy, so the mapping deletes it: {report:?}"
    );
    assert!(
        dlq.snapshot().is_empty(),
        "one run of two: the job has a run left"
    );
    let copy = harness
        .queue
        .snapshot()
        .into_iter()
        .find(|message| message.id != flaky)
        .expect("the retry's copy was sent");
    let record = copy.attributes["conveyor.deferral"].string_value.clone().unwrap();
    assert!(
        record.contains(r#""attempts":1"#),
        "the copy carries one run: {record}"
    );

    // The mapping deletes the original; the copy comes after its 30 s and runs a second time.
    harness
        .queue
        .delete_batch(&[last[0].receipt_handle.clone()])
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(31)).await;
    let again = harness.receive().await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].receive_count, again[0].attempt()), (1, 2));
    let report = harness.run(&again, in_ten_seconds()).await;
    assert!(listed(&report).is_empty(), "{report:?}");
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1, "the second run spent the budget");
    let failure: conveyor_core::runtime::Failure = serde_json::from_str(
        dead[0].attributes[FAILURE_ATTRIBUTE]
            .string_value
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    assert!(
        failure.retries_exhausted && !failure.receives_exhausted,
        "{failure:?}"
    );
    assert_eq!(failure.receive_count, 2, "the record counts runs");
    assert_eq!(harness.ran(), vec!["flaky", "flaky"]);
}

/// Every deferral of a job that did not run is bounded per cause (issue 51, rule 4): an idempotency
/// table whose writes are denied after the start (a configuration mistake, not an outage) defers its
/// jobs, nothing lost, for an hour; then they go to the DLQ with the cause and what to fix, instead of
/// being deferred forever without an error.
#[tokio::test(start_paused = true)]
async fn a_store_that_refuses_writes_dead_letters_its_jobs_with_the_cause_after_an_hour() {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5);
    let harness = Harness::build(queue, LambdaConfig::default(), Some(Arc::clone(&store)));
    harness.push("email", "ok");
    store.set_misconfigured(true);
    let started = Instant::now();
    let mut invocations = 0;
    while dlq.snapshot().is_empty() {
        invocations += 1;
        assert!(
            invocations < 1_000,
            "still deferred after {:?}",
            started.elapsed()
        );
        let received = harness.receive().await;
        assert_eq!(received.len(), 1, "the job is never lost");
        let report = harness.run(&received, in_ten_seconds()).await;
        assert!(
            listed(&report).is_empty(),
            "deferred on a copy or dead-lettered: {report:?}"
        );
        // The mapping deletes what was not listed; the copy comes after its delay.
        harness
            .queue
            .delete_batch(&[received[0].receipt_handle.clone()])
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(31)).await;
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3600) && waited < Duration::from_secs(3700),
        "dead-lettered after {waited:?}"
    );
    let dead = dlq.snapshot();
    let failure: conveyor_core::runtime::Failure = serde_json::from_str(
        dead[0].attributes[FAILURE_ATTRIBUTE]
            .string_value
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        failure.not_run,
        Some(conveyor_core::runtime::NotRun::StoreMisconfigured)
    );
    assert!(
        failure.error.contains("permissions"),
        "names the fix: {}",
        failure.error
    );
    assert!(harness.ran().is_empty(), "never run unclaimed");
    assert!(harness.queue.snapshot().is_empty(), "one copy, in the DLQ");
}

/// On a FIFO queue a copy would go behind the group: a retry at the last receive with runs left is
/// dead-lettered with a reason that says so, never put back for SQS's redrive to move without one.
#[tokio::test(start_paused = true)]
async fn a_fifo_retry_at_the_last_receive_with_runs_left_is_dead_lettered_with_its_reason() {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let dlq = Arc::new(MemoryQueue::fifo("jobs-dlq.fifo"));
    let queue = MemoryQueue::fifo("jobs.fifo")
        .with_visibility_timeout(Duration::from_secs(300))
        .with_dead_letter_queue(Arc::clone(&dlq), 2);
    let harness = Harness::build(queue, LambdaConfig::default(), Some(Arc::clone(&store)));
    harness.push("flaky", "retry");
    assert_eq!(harness.receive().await.len(), 1);
    tokio::time::advance(Duration::from_secs(301)).await;
    let last = harness.receive().await;
    assert_eq!(last[0].receive_count, 2);

    let report = harness.run(&last, in_ten_seconds()).await;
    assert!(listed(&report).is_empty(), "{report:?}");
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1);
    let failure: conveyor_core::runtime::Failure = serde_json::from_str(
        dead[0].attributes[FAILURE_ATTRIBUTE]
            .string_value
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    assert!(
        failure.receives_exhausted && !failure.retries_exhausted,
        "{failure:?}"
    );
    assert!(
        failure.error.contains("provider busy") && failure.error.contains("run 1 of the 2"),
        "{}",
        failure.error
    );
    assert_eq!(harness.ran(), vec!["flaky"]);
}

#[tokio::test]
async fn a_duplicate_in_progress_elsewhere_is_deferred_with_a_copy_not_a_receive() {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 2);
    let harness = Harness::build(queue, LambdaConfig::default(), Some(Arc::clone(&store)));
    let mut key = conveyor_core::message::Attributes::new();
    key.insert(
        IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
        conveyor_core::message::AttributeValue::string("report:9"),
    );
    harness
        .queue
        .push_message(OutgoingMessage {
            body: json!({"name": "dupe"}).to_string(),
            attributes: key,
            ..OutgoingMessage::default()
        })
        .unwrap();
    // Another consumer holds the key for ten minutes.
    let held = conveyor_core::port::ClaimRequest {
        key: conveyor_core::port::idempotency_key("scripted", Some("report:9"), "unused"),
        lease_until: SystemTime::now() + Duration::from_secs(600),
        expires_at: SystemTime::now() + Duration::from_secs(3600),
        validation: None,
        restart_runs: false,
        last_attempt: false,
    };
    conveyor_core::port::IdempotencyStore::claim(store.as_ref(), &held)
        .await
        .unwrap();
    let received = harness.receive().await;

    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(listed(&report).is_empty(), "not a failure: {report:?}");
    assert!(harness.ran().is_empty());
    assert_eq!(report.metrics[0].deferred, 1);
    let copies: Vec<_> = harness
        .queue
        .snapshot()
        .into_iter()
        .filter(|message| message.id != received[0].id)
        .collect();
    assert_eq!(copies.len(), 1, "a delayed copy was sent");
    assert_eq!(copies[0].state, MessageState::Delayed);
    assert_eq!(copies[0].receive_count, 0, "the copy starts afresh");
    assert!(dlq.snapshot().is_empty());
}

/// A store whose claims never answer (DynamoDB hung), over a memory store.
struct HungClaims(MemoryIdempotencyStore);

#[async_trait::async_trait]
impl IdempotencyStore for HungClaims {
    async fn claim(
        &self,
        _request: &conveyor_core::port::ClaimRequest,
    ) -> Result<conveyor_core::port::ClaimOutcome, conveyor_core::port::StoreError> {
        std::future::pending().await
    }
    async fn complete(
        &self,
        claim: &conveyor_core::port::Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), conveyor_core::port::StoreError> {
        self.0.complete(claim, output, expires_at).await
    }
    async fn release(
        &self,
        claim: &conveyor_core::port::Claim,
    ) -> Result<(), conveyor_core::port::StoreError> {
        self.0.release(claim).await
    }
    async fn extend_lease(
        &self,
        claim: &conveyor_core::port::Claim,
        lease_until: SystemTime,
    ) -> Result<(), conveyor_core::port::StoreError> {
        self.0.extend_lease(claim, lease_until).await
    }
    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<conveyor_core::port::IdempotencyRecord>, conveyor_core::port::StoreError> {
        self.0.get(key).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_cannot_push_the_invocation_past_its_deadline() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(HungClaims(MemoryIdempotencyStore::new()));
    let harness = Harness::build_with(slow_queue("jobs"), LambdaConfig::default(), None, Some(store));
    harness.push("stuck", "ok");
    let received = harness.receive().await;
    let deadline = Instant::now() + Duration::from_secs(3);

    let report = harness.run(&received, deadline).await;
    assert!(Instant::now() < deadline, "answered after the deadline");
    assert!(harness.ran().is_empty(), "never run unclaimed");
    // Not run and not spent: a delayed copy carries it to a later invocation.
    assert_eq!(report.metrics[0].deferred, 1, "{report:?}");
    assert!(listed(&report).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_handler_is_told_to_stop_before_the_deadline_and_the_response_comes_in_time() {
    let config = LambdaConfig::default().with_deadline_margin(Duration::from_millis(1500));
    let harness = Harness::new(slow_queue("jobs"), config);
    let long = harness.push("long", "until_cancelled");
    let received = harness.receive().await;
    let deadline = Instant::now() + Duration::from_secs(3);

    let report = harness.run(&received, deadline).await;
    assert!(Instant::now() < deadline, "answered after the deadline");
    assert_eq!(
        harness.ran(),
        vec!["long".to_owned(), "long: told to stop".to_owned()]
    );
    assert_eq!(listed(&report), vec![long], "a retry, with its backoff");
    assert_eq!(harness.queue.requests().change_visibility, 1);
}

#[tokio::test(start_paused = true)]
async fn a_record_without_a_message_id_fails_the_invocation_instead_of_being_deleted() {
    let harness = Harness::new(slow_queue("jobs"), LambdaConfig::default());
    harness.push("fine", "ok");
    harness.push("orphan", "ok");
    let received = harness.receive().await;
    let mut event = harness.event(&received);
    event.records[1].message_id = None;

    let report = harness
        .processor
        .process_batch_report(event.clone(), in_ten_seconds())
        .await;
    let reason = report.invocation_error.clone().expect("the invocation must fail");
    assert!(reason.contains("no messageId"), "{reason}");
    let failed = harness.processor.process_batch(event, in_ten_seconds()).await;
    assert!(
        failed.is_err(),
        "answering would make the mapping delete the record"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_failed_entirely_can_fail_the_invocation_for_the_errors_metric() {
    let config = LambdaConfig::default().with_fail_invocation_when_all_fail(true);
    let harness = Harness::new(slow_queue("jobs"), config);
    harness.push("one", "retry");
    harness.push("two", "retry");
    let received = harness.receive().await;
    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(report.invocation_error.is_some(), "{report:?}");
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "both settled (backoff) first"
    );

    let lenient = Harness::new(slow_queue("jobs"), LambdaConfig::default());
    lenient.push("one", "retry");
    let received = lenient.receive().await;
    assert!(
        lenient
            .run(&received, in_ten_seconds())
            .await
            .invocation_error
            .is_none()
    );
}

/// Resolves to a fixed queue, or fails, and counts the calls.
struct CountingResolver {
    queue: Arc<dyn Queue>,
    fail: bool,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl conveyor_lambda::QueueResolver for CountingResolver {
    async fn resolve(&self, arn: &str) -> Result<Arc<dyn Queue>, conveyor_lambda::ResolveError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail {
            return Err(conveyor_lambda::ResolveError::Sqs {
                arn: arn.to_owned(),
                message: "AccessDenied: not authorized to perform sqs:GetQueueUrl".to_owned(),
            });
        }
        Ok(Arc::clone(&self.queue))
    }
}

#[tokio::test(start_paused = true)]
async fn the_success_path_needs_no_sqs_call_and_an_unresolvable_queue_fails_only_what_needs_it() {
    for fail in [false, true] {
        let harness = Harness::new(slow_queue("jobs"), LambdaConfig::default());
        let resolver = Arc::new(CountingResolver {
            queue: Arc::clone(&harness.queue) as Arc<dyn Queue>,
            fail,
            calls: std::sync::atomic::AtomicUsize::new(0),
        });
        let handler = Scripted {
            log: Arc::clone(&harness.log),
            running: Arc::clone(&harness.running),
            store: None,
            leases: Arc::clone(&harness.leases),
        };
        let processor = BatchProcessor::new(
            Pipeline::new(Router::single(handler)),
            LambdaConfig::default(),
            Arc::clone(&resolver) as Arc<dyn conveyor_lambda::QueueResolver>,
        )
        .without_metrics();
        harness.push("a", "ok");
        harness.push("b", "ok");
        let received = harness.receive().await;
        let report = processor
            .process_batch_report(harness.event(&received), in_ten_seconds())
            .await;
        assert!(listed(&report).is_empty(), "fail={fail}: {report:?}");
        assert_eq!(
            resolver.calls.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no SQS call when every record succeeds"
        );

        let flaky = harness.push("c", "retry");
        harness.push("d", "ok");
        let received = harness.receive().await;
        let report = processor
            .process_batch_report(harness.event(&received), in_ten_seconds())
            .await;
        assert_eq!(
            listed(&report),
            vec![flaky],
            "fail={fail}: only the retry is listed"
        );
        assert_eq!(
            resolver.calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "resolved once, when needed"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn powertools_mode_holds_back_the_whole_rest_of_a_fifo_batch() {
    let config = LambdaConfig::default().with_fifo_failure(conveyor_lambda::FifoFailure::Batch);
    let queue = MemoryQueue::fifo("orders.fifo").with_visibility_timeout(Duration::from_secs(300));
    let harness = Harness::new(queue, config);
    harness.push_step(json!({"name": "a1"}), Some("a"));
    let a2 = harness.push_step(json!({"name": "a2", "action": "retry"}), Some("a"));
    let b1 = harness.push_step(json!({"name": "b1"}), Some("b"));
    let received = harness.receive().await;
    assert_eq!(received.len(), 3);

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(
        harness.ran(),
        vec!["a1", "a2"],
        "b1 comes after the failure in the batch"
    );
    assert_eq!(listed(&report), vec![a2, b1]);
}

/// A job due in two hours (a long delay, `conveyor-core/src/delay.rs`) reaches the Lambda adapter: it hops
/// as a delayed copy of at most 15 minutes that keeps its key and due time, is not listed (no receive
/// spent) and does not run; once due it runs. The worker takes the same path: both call the pipeline.
#[tokio::test(start_paused = true)]
async fn a_job_not_due_yet_hops_as_a_delayed_copy_and_runs_once_due() {
    use conveyor_core::runtime::{DUE_ATTRIBUTE, due_value};

    let store = Arc::new(MemoryIdempotencyStore::new());
    let harness = Harness::build(
        slow_queue("jobs"),
        LambdaConfig::default(),
        Some(Arc::clone(&store)),
    );
    let push = |name: &str, due: SystemTime| {
        let mut attributes = conveyor_core::message::Attributes::new();
        attributes.insert(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            conveyor_core::message::AttributeValue::string(format!("report:{name}")),
        );
        attributes.insert(
            DUE_ATTRIBUTE.to_owned(),
            conveyor_core::message::AttributeValue::number(due_value(due)),
        );
        harness
            .queue
            .push_message(OutgoingMessage {
                body: json!({"name": name}).to_string(),
                attributes,
                ..OutgoingMessage::default()
            })
            .unwrap()
    };
    let later = push("later", SystemTime::now() + Duration::from_secs(2 * 3600));
    let received = harness.receive().await;
    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(listed(&report).is_empty(), "a hop is not a failure: {report:?}");
    assert!(harness.ran().is_empty(), "not due: nothing ran");
    assert_eq!(report.metrics[0].deferred, 1);
    let copies = deferred_copies(&harness);
    assert_eq!(copies, vec![(later, 0, MessageState::Delayed)]);
    let copy = harness
        .queue
        .snapshot()
        .into_iter()
        .find(|message| {
            message
                .attributes
                .contains_key(conveyor_core::message::DEFERRAL_ATTRIBUTE)
        })
        .unwrap();
    assert_eq!(
        copy.attributes[IDEMPOTENCY_KEY_ATTRIBUTE].string_value.as_deref(),
        Some("report:later")
    );
    assert!(
        copy.attributes.contains_key(DUE_ATTRIBUTE),
        "the due time travels on"
    );

    push("now", SystemTime::now() - Duration::from_secs(1));
    let received = harness.receive().await;
    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(listed(&report).is_empty());
    assert_eq!(harness.ran(), vec!["now"]);
    assert_eq!(report.metrics[0].succeeded, 1);
}

/// A failed FIFO run whose backoff fits in the invocation is retried there (the store counts its
/// runs), so the message behind it in its group runs in the same invocation instead of being listed,
/// unrun, with it: neither spends a receive.
#[tokio::test(start_paused = true)]
async fn a_failed_fifo_head_is_retried_in_the_invocation_and_its_group_goes_on() {
    let dlq = Arc::new(MemoryQueue::fifo("orders-dlq"));
    let queue = MemoryQueue::fifo("orders")
        .with_visibility_timeout(Duration::from_secs(300))
        .with_dead_letter_queue(dlq, 3);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let harness = Harness::build(queue, LambdaConfig::default(), Some(store));
    harness.push_step(json!({"name": "a1", "action": "retry_once"}), Some("a"));
    harness.push_step(json!({"name": "a2"}), Some("a"));
    let received = harness.receive().await;

    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), Vec::<String>::new(), "nothing listed");
    assert_eq!(
        harness.ran(),
        vec!["a1", "a1", "a2"],
        "a1 again after its 2 s, then a2"
    );
    assert_eq!(report.metrics[0].succeeded, 2);
}

/// A FIFO group whose store is down: its first receive comes back after the pipeline's short deferral,
/// but the receive before its last allowed one waits `fifo_last_receive_wait` (half to all of it), so
/// the last receive is spent after the outage rather than inside it (fails with `fifo_wait` removed:
/// the group comes back after 30 s and is dead-lettered unrun at its third receive).
#[tokio::test(start_paused = true)]
async fn a_fifo_group_saves_its_last_receive_for_after_a_store_outage() {
    let dlq = Arc::new(MemoryQueue::fifo("orders-dlq"));
    let queue = MemoryQueue::fifo("orders")
        .with_visibility_timeout(Duration::from_secs(300))
        .with_dead_letter_queue(Arc::clone(&dlq), 3);
    let store = Arc::new(MemoryIdempotencyStore::new());
    let config = LambdaConfig::default().with_fifo_last_receive_wait(Duration::from_secs(600));
    let harness = Harness::build(queue, config, Some(Arc::clone(&store)));
    let a1 = harness.push_step(json!({"name": "a1"}), Some("a"));
    let a2 = harness.push_step(json!({"name": "a2"}), Some("a"));
    store.set_unavailable(true);

    // Receive 1 of 3: the next is not the last, so the group is back after the short deferral.
    let received = harness.receive().await;
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(2))
        .await;
    assert_eq!(listed(&report), vec![a1.clone(), a2.clone()]);
    tokio::time::advance(Duration::from_secs(31)).await;
    assert_eq!(harness.state_of(&a1), Some(MessageState::Visible));

    // Receive 2 of 3: the next would be the last, so the group waits at least half of the 600 s.
    let received = harness.receive().await;
    assert_eq!(received.len(), 2, "the group again");
    assert!(received.iter().all(|message| message.receive_count == 2));
    let report = harness
        .run(&received, Instant::now() + Duration::from_secs(2))
        .await;
    assert_eq!(listed(&report), vec![a1.clone(), a2.clone()]);
    tokio::time::advance(Duration::from_secs(290)).await;
    assert_eq!(harness.state_of(&a1), Some(MessageState::InFlight), "still saved");
    assert_eq!(
        harness.state_of(&a2),
        Some(MessageState::InFlight),
        "follows its head"
    );

    // The store is back before the last receive: both run, in order, and nothing is dead-lettered.
    store.set_unavailable(false);
    tokio::time::advance(Duration::from_secs(311)).await;
    let received = harness.receive().await;
    assert!(received.iter().all(|message| message.receive_count == 3));
    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), Vec::<String>::new());
    assert_eq!(harness.ran(), vec!["a1", "a2"]);
    assert!(dlq.snapshot().is_empty(), "nothing dead-lettered");
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_limit_is_deferred_with_a_copy_that_keeps_the_tenant() {
    let mut config = LambdaConfig::default().with_batch_concurrency(10);
    config.tenants.max_concurrent = Some(2);
    let harness = Harness::new(slow_queue("tenants"), config);
    let noisy: Vec<String> = (0..6)
        .map(|n| {
            harness.push_step(
                json!({"name": format!("noisy-{n}"), "sleep_ms": 500}),
                Some("noisy"),
            )
        })
        .collect();
    let quiet = harness.push_step(json!({"name": "quiet", "sleep_ms": 500}), Some("quiet"));
    let received = harness.receive().await;
    assert_eq!(received.len(), 7);
    let report = harness.run(&received, in_ten_seconds()).await;
    assert!(
        listed(&report).is_empty(),
        "deferred, not listed: {:?}",
        listed(&report)
    );
    let mut ran = harness.ran();
    ran.sort();
    assert_eq!(
        ran,
        vec!["noisy-0", "noisy-1", "quiet"],
        "two of the noisy tenant, and the quiet one"
    );
    assert_eq!(report.metrics[0].deferred, 4);
    let copies = deferred_copies(&harness);
    assert_eq!(copies.len(), 4);
    assert!(
        copies
            .iter()
            .all(|(original, receives, _)| noisy.contains(original) && *receives == 0),
        "copies of the noisy tenant's jobs, no receive spent: {copies:?}"
    );
    assert!(!copies.iter().any(|(original, _, _)| *original == quiet));
    let groups: Vec<Option<String>> = harness
        .queue
        .snapshot()
        .into_iter()
        .filter(|message| {
            message
                .attributes
                .contains_key(conveyor_core::message::DEFERRAL_ATTRIBUTE)
        })
        .map(|message| message.group_id)
        .collect();
    assert!(
        groups.iter().all(|group| group.as_deref() == Some("noisy")),
        "each copy keeps its tenant as its MessageGroupId: {groups:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn per_tenant_emf_documents_name_only_the_busiest_tenants() {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let queue = slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5);
    let mut config = LambdaConfig::default();
    config.tenants.metrics_top = 1;
    let harness = Harness::new(queue, config);
    // 50 jobs earn "big" the one label of its own (`TenantMetrics`: at least 50 jobs).
    for batch in 0..5 {
        for n in 0..10 {
            harness.push_step(json!({"name": format!("big-{batch}-{n}")}), Some("big"));
        }
        let received = harness.receive().await;
        let report = harness.run(&received, in_ten_seconds()).await;
        assert!(listed(&report).is_empty(), "{report:?}");
    }
    harness.push_step(json!({"name": "big-ok"}), Some("big"));
    harness.push_step(json!({"name": "big-busy", "action": "retry"}), Some("big"));
    harness.push_step(json!({"name": "a-ok"}), Some("small-a"));
    harness.push_step(
        json!({"name": "a-doomed", "action": "permanent"}),
        Some("small-a"),
    );
    harness.push_step(json!({"name": "b-ok"}), Some("small-b"));
    harness.push_step(json!({"name": "no-tenant"}), None);
    let received = harness.receive().await;
    assert_eq!(received.len(), 6);
    let report = harness.run(&received, in_ten_seconds()).await;

    let metrics = &report.metrics[0];
    let figures = |label: &str| {
        let tenant = metrics
            .tenants
            .iter()
            .find(|tenant| tenant.tenant == label)
            .unwrap_or_else(|| panic!("no {label} figures in {:?}", metrics.tenants));
        (
            tenant.received,
            tenant.succeeded,
            tenant.retried,
            tenant.dead_lettered,
            tenant.deferred,
            tenant.handler_durations.len(),
        )
    };
    let mut labels: Vec<&str> = metrics
        .tenants
        .iter()
        .map(|tenant| tenant.tenant.as_str())
        .collect();
    labels.sort_unstable();
    assert_eq!(
        labels,
        ["big", "none", "other"],
        "small-a and small-b are `other`"
    );
    assert_eq!(figures("big"), (2, 1, 1, 0, 0, 2));
    assert_eq!(figures("other"), (3, 2, 0, 1, 0, 3));
    assert_eq!(figures("none"), (1, 1, 0, 0, 0, 1));

    // One document for the queue, then one per label with both dimensions (`src/metrics.rs` checks
    // that each declares exactly what it carries).
    let series: Vec<(Value, Value)> = metrics
        .to_emf_lines(SystemTime::now())
        .iter()
        .map(|line| {
            let document: Value = serde_json::from_str(line).unwrap();
            let dimensions = document["_aws"]["CloudWatchMetrics"][0]["Dimensions"].clone();
            (document["tenant"].clone(), dimensions)
        })
        .collect();
    let both = json!([["queue", "tenant"]]);
    assert_eq!(
        series,
        [
            (Value::Null, json!([["queue"]])),
            (json!(metrics.tenants[0].tenant), both.clone()),
            (json!(metrics.tenants[1].tenant), both.clone()),
            (json!(metrics.tenants[2].tenant), both),
        ]
    );
}

/// Two invocations of one process at once against one processor (Lambda Managed Instances), with
/// different deadlines: the short one's cutoff stops only its own handler (listed, back after its
/// backoff, its claim released), and the long one's job runs past the short one's deadline to completion.
#[tokio::test(start_paused = true)]
async fn two_invocations_at_once_each_keep_their_own_deadline() {
    let store = Arc::new(MemoryIdempotencyStore::new());
    let harness = Harness::build(
        slow_queue("jobs"),
        LambdaConfig::default(),
        Some(Arc::clone(&store)),
    );
    let short = harness.push("short", "until_cancelled");
    let short_batch = harness.receive().await;
    harness.push_step(json!({"name": "long", "sleep_ms": 3000}), None);
    harness.push("quick", "ok");
    let long_batch = harness.receive().await;
    let short_deadline = Instant::now() + Duration::from_secs(2);
    let long_deadline = Instant::now() + Duration::from_secs(10);

    let short_run = async {
        let report = harness.run(&short_batch, short_deadline).await;
        (report, Instant::now())
    };
    let ((short_report, short_answered), long_report) =
        tokio::join!(short_run, harness.run(&long_batch, long_deadline));

    assert!(
        short_answered < short_deadline,
        "the short invocation answered in its own time"
    );
    assert!(
        Instant::now() >= short_deadline && Instant::now() < long_deadline,
        "the long job ran past the short invocation's deadline, within its own"
    );
    assert_eq!(listed(&short_report), vec![short.clone()]);
    assert!(listed(&long_report).is_empty(), "{long_report:?}");
    assert_eq!(long_report.metrics[0].succeeded, 2, "{long_report:?}");
    let ran = harness.ran();
    for name in ["short", "short: told to stop", "long", "quick"] {
        assert_eq!(
            ran.iter().filter(|run| *run == name).count(),
            1,
            "{name} once: {ran:?}"
        );
    }
    // The long job's claim completed; the short one's was released, so its retry can run.
    let records = store.records();
    assert_eq!(
        records
            .iter()
            .filter(|record| record.status == RecordStatus::Completed)
            .count(),
        2,
        "{records:?}"
    );
    let released = |record: &&conveyor_core::port::IdempotencyRecord| {
        record.status == RecordStatus::Completed
            || record.lease_until.is_some_and(|until| until <= SystemTime::now())
    };
    assert!(
        records.iter().all(|record| released(&record)),
        "no claim left held: {records:?}"
    );
    tokio::time::advance(conveyor_core::Backoff::default().ceiling(1, None)).await;
    assert_eq!(
        harness.state_of(&short),
        Some(MessageState::Visible),
        "back after its backoff"
    );
}

/// The process's record slots bound the handlers of every invocation together: two invocations of
/// three records each, four at once per batch but two slots in the process, never run more than two
/// handlers at once; and a third invocation that finds the slots busy until its own cutoff starts
/// nothing and defers its record with a copy (no receive spent), answering before its deadline.
#[tokio::test(start_paused = true)]
async fn the_process_record_slots_bound_concurrent_invocations_together() {
    let config = LambdaConfig::default()
        .with_batch_concurrency(4)
        .with_process_concurrency(Some(2));
    let harness = Harness::new(slow_queue("jobs"), config);
    for name in ["a1", "a2", "a3"] {
        harness.push_step(json!({"name": name, "sleep_ms": 500}), None);
    }
    let first = harness.receive().await;
    for name in ["b1", "b2", "b3"] {
        harness.push_step(json!({"name": name, "sleep_ms": 500}), None);
    }
    let second = harness.receive().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (one, two) = tokio::join!(harness.run(&first, deadline), harness.run(&second, deadline));
    assert_eq!(
        one.metrics[0].succeeded + two.metrics[0].succeeded,
        6,
        "{one:?} {two:?}"
    );
    assert_eq!(
        harness.running.1.load(Ordering::SeqCst),
        2,
        "two handlers at once, never more"
    );

    harness.log.lock().unwrap().clear();
    harness.push("busy1", "until_cancelled");
    harness.push("busy2", "until_cancelled");
    let busy = harness.receive().await;
    let waiting = harness.push("waiting", "ok");
    let starved = harness.receive().await;
    let short_deadline = Instant::now() + Duration::from_secs(2);
    let short_run = async {
        let report = harness.run(&starved, short_deadline).await;
        (report, Instant::now())
    };
    let (busy_report, (starved_report, answered)) = tokio::join!(
        harness.run(&busy, Instant::now() + Duration::from_secs(6)),
        short_run
    );
    assert!(answered < short_deadline, "answered in its own time");
    assert!(
        !harness.ran().contains(&"waiting".to_owned()),
        "{:?}",
        harness.ran()
    );
    assert_eq!(starved_report.metrics[0].deferred, 1, "{starved_report:?}");
    assert!(listed(&starved_report).is_empty());
    assert_eq!(
        listed(&busy_report).len(),
        2,
        "the busy ones stop at their own cutoff"
    );
    let copies = deferred_copies(&harness);
    assert!(
        copies
            .iter()
            .any(|(id, receives, _)| *id == waiting && *receives == 0),
        "a copy of the waiting record, no receive spent: {copies:?}"
    );
}

/// A tracked job that takes the store down while it runs, then fails for good: its release (the
/// `dead_lettered` status and the spent runs) cannot land.
struct RejectedInAStoreOutage {
    store: Arc<MemoryIdempotencyStore>,
}

impl Handler for RejectedInAStoreOutage {
    type Job = Value;
    type Output = ();
    const JOB_TYPE: &'static str = "report";

    async fn handle(&self, _job: Value, _ctx: Context) -> Result<(), HandlerError> {
        self.store.set_unavailable(true);
        Err(HandlerError::permanent("report 404: no such account"))
    }

    fn settings(&self) -> conveyor_core::HandlerSettings {
        conveyor_core::HandlerSettings::default().with_tracked(true)
    }
}

/// Seed 9324: the release of a rejected run was tried again until the invocation's settle deadline,
/// which left the DLQ send after it no time: listed, the message came back with its claim lapsed
/// (the spent runs never written) and ran again. The release's tries end at the handlers' cutoff, so
/// the DLQ send has the settle reserve.
#[tokio::test(start_paused = true)]
async fn a_rejection_whose_release_cannot_land_still_reaches_the_dlq() {
    let dlq = Arc::new(MemoryQueue::standard("jobs-dlq"));
    let source = Arc::new(slow_queue("jobs").with_dead_letter_queue(Arc::clone(&dlq), 5));
    let queue = conveyor_testing::ScriptedQueue::new(Arc::clone(&source));
    queue.slow_dead_letters(Duration::from_millis(500));
    let store = Arc::new(MemoryIdempotencyStore::new());
    let handler = RejectedInAStoreOutage {
        store: Arc::clone(&store),
    };
    let pipeline =
        Pipeline::new(Router::single(handler)).with_store(Arc::clone(&store) as Arc<dyn IdempotencyStore>);
    let resolver = FixedQueue(Arc::clone(&queue) as Arc<dyn Queue>);
    let processor =
        BatchProcessor::new(pipeline, LambdaConfig::default(), Arc::new(resolver)).without_metrics();
    source
        .push_message(OutgoingMessage {
            body: json!({"account": 7}).to_string(),
            ..OutgoingMessage::default()
        })
        .unwrap();
    let received = source.receive(10, Duration::ZERO).await.unwrap();

    let deadline = in_ten_seconds();
    let report = processor
        .process_batch_report(event_of(&source, &received), deadline)
        .await;
    assert!(Instant::now() < deadline, "answered after the deadline");
    assert!(
        listed(&report).is_empty(),
        "the rejected message was listed: {report:?}"
    );
    let dead = dlq.snapshot();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let failure = dead[0].attributes[FAILURE_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    assert!(failure.contains("no such account"), "{failure}");
    assert_eq!(report.metrics[0].dead_lettered, 1);
}

/// A store whose completions take 400 ms (DynamoDB under load), over a memory store.
struct SlowCompletions(Arc<MemoryIdempotencyStore>);

#[async_trait::async_trait]
impl IdempotencyStore for SlowCompletions {
    async fn claim(
        &self,
        request: &conveyor_core::port::ClaimRequest,
    ) -> Result<conveyor_core::port::ClaimOutcome, conveyor_core::port::StoreError> {
        self.0.claim(request).await
    }
    async fn complete(
        &self,
        claim: &conveyor_core::port::Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), conveyor_core::port::StoreError> {
        tokio::time::sleep(Duration::from_millis(400)).await;
        self.0.complete(claim, output, expires_at).await
    }
    async fn release(
        &self,
        claim: &conveyor_core::port::Claim,
    ) -> Result<(), conveyor_core::port::StoreError> {
        self.0.release(claim).await
    }
    async fn extend_lease(
        &self,
        claim: &conveyor_core::port::Claim,
        lease_until: SystemTime,
    ) -> Result<(), conveyor_core::port::StoreError> {
        self.0.extend_lease(claim, lease_until).await
    }
    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<conveyor_core::port::IdempotencyRecord>, conveyor_core::port::StoreError> {
        self.0.get(key).await
    }
}

/// Issue 51, rule 1 on Lambda: a handler that ignores its context and returns `Ok` after the cutoff,
/// within its grace, has done its work: it is acknowledged, and only with its completion landed (a
/// record acknowledged with its claim never completed lets a duplicate run it again). One still
/// running when the grace ends is retried. With the grace taken out of the settle reserve (the old
/// phases), the later one returned into the reserve and was acknowledged uncompleted.
#[tokio::test(start_paused = true)]
async fn a_late_ok_is_acknowledged_only_with_its_completion_landed() {
    let memory = Arc::new(MemoryIdempotencyStore::new());
    let store: Arc<dyn IdempotencyStore> = Arc::new(SlowCompletions(Arc::clone(&memory)));
    let config = LambdaConfig::default().with_batch_concurrency(2);
    let harness = Harness::build_with(slow_queue("jobs"), config, None, Some(store));
    // A 10 s invocation: the settle reserve is 1 s and the response's 100 ms, the grace 1 s, so the
    // handlers are told to stop 7.9 s in. `in_grace` returns 0.8 s after that; `past_grace` 1.8 s
    // after, 0.2 s before the response's reserve.
    let in_grace = harness.push_step(json!({"name": "in_grace", "sleep_ms": 8_700}), None);
    let past_grace = harness.push_step(json!({"name": "past_grace", "sleep_ms": 9_700}), None);
    let received = harness.receive().await;
    let deadline = Instant::now() + Duration::from_secs(10);

    let report = harness.run(&received, deadline).await;
    assert!(Instant::now() < deadline, "answered after the deadline");
    let listed = listed(&report);
    assert!(!listed.contains(&in_grace), "its work is done: {report:?}");
    assert!(
        listed.contains(&past_grace),
        "dropped at the end of its grace: {report:?}"
    );
    let acknowledged: Vec<&Message> = received
        .iter()
        .filter(|message| !listed.contains(&message.id))
        .collect();
    let completed = memory
        .records()
        .into_iter()
        .filter(|record| record.status == RecordStatus::Completed)
        .count();
    assert_eq!(
        completed,
        acknowledged.len(),
        "every acknowledged record is completed first: {:?}",
        memory.records()
    );
}

/// A record first received 11 h 59 min 40 s ago (its message retried for most of SQS's 12 hours),
/// received again now, whose handler asks to retry after 30 s.
async fn near_the_twelve_hours(harness: &Harness) -> (String, Vec<Message>) {
    let id = harness.push("late-in-life", "retry");
    assert_eq!(harness.receive().await.len(), 1, "the first receive");
    tokio::time::advance(Duration::from_secs(12 * 3600 - 20)).await;
    let received = harness.receive().await;
    assert_eq!(received.len(), 1, "received again");
    assert_eq!(received[0].receive_count, 2);
    (id, received)
}

/// SQS's 12 hours of visibility count from a message's first receive, and SQS refuses a change past
/// them (issue 51 rule 5). On a standard queue a retry that would end past them goes on a fresh copy
/// with its delay, the record not listed (the mapping deletes it), as the worker does; no backoff is
/// asked for. (Before, the backoff was asked for as is, SQS refused it, and the message came
/// back at the queue's visibility timeout instead of its backoff.)
#[tokio::test(start_paused = true)]
async fn a_retry_past_twelve_hours_from_the_first_receive_goes_on_a_fresh_copy() {
    let harness = Harness::new(slow_queue("jobs"), LambdaConfig::default());
    let (id, received) = near_the_twelve_hours(&harness).await;
    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), Vec::<String>::new(), "{report:?}");
    assert_eq!(
        harness.queue.requests().change_visibility,
        1,
        "the cover's renewal only (within the 12 hours), no backoff"
    );
    let copies = deferred_copies(&harness);
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(copies[0].0, id);
    assert_eq!(
        copies[0].2,
        MessageState::Delayed,
        "the copy waits out the backoff"
    );
}

/// On a FIFO queue a copy would break the group's order: the cover's renewal and the backoff are cut
/// to what the 12 hours leave, and SQS takes them (the message comes back within seconds, not at the
/// visibility timeout after a refused change).
#[tokio::test(start_paused = true)]
async fn a_fifo_retry_near_twelve_hours_gets_the_backoff_sqs_still_allows() {
    let queue = MemoryQueue::fifo("jobs.fifo").with_visibility_timeout(Duration::from_secs(300));
    let harness = Harness::new(queue, LambdaConfig::default());
    let (id, received) = near_the_twelve_hours(&harness).await;
    let report = harness.run(&received, in_ten_seconds()).await;
    assert_eq!(listed(&report), vec![id.clone()]);
    assert_eq!(harness.state_of(&id), Some(MessageState::InFlight));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(
        harness.state_of(&id),
        Some(MessageState::Visible),
        "a refused change would hold it for the 300 s visibility timeout"
    );
}

/// Two invocations of one process at once (Lambda Managed Instances) that were handed the same FIFO
/// group (an emulator that unlocks a group early, a visibility that lapsed): the group's messages run
/// one at a time, in the order the invocations started, both to completion (issue 51 rule 5). Before,
/// each invocation ran its lane at once: two messages of one group ran together.
#[tokio::test(start_paused = true)]
async fn one_message_of_a_fifo_group_at_a_time_across_invocations() {
    let queue = MemoryQueue::fifo("jobs.fifo").with_visibility_timeout(Duration::from_secs(300));
    let harness = Harness::new(queue, LambdaConfig::default());
    harness.push_step(json!({"name": "first", "sleep_ms": 3000}), Some("g"));
    harness.push_step(json!({"name": "second", "sleep_ms": 1000}), Some("g"));
    let received = harness.receive().await;
    assert_eq!(received.len(), 2, "one receive brings the group");
    let deadline = Instant::now() + Duration::from_secs(10);

    let (first, second) = tokio::join!(
        harness.run(&received[..1], deadline),
        harness.run(&received[1..], deadline)
    );

    assert!(listed(&first).is_empty(), "{first:?}");
    assert!(listed(&second).is_empty(), "{second:?}");
    assert_eq!(harness.ran(), vec!["first", "second"]);
    assert_eq!(
        harness.running.1.load(Ordering::SeqCst),
        1,
        "never two handlers of the group at once"
    );
}
