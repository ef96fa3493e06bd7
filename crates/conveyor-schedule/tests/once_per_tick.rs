//! Schedulers against LocalStack (SQS) and DynamoDB Local: every tick is sent exactly once across
//! three workers (on a clock 4× real time), `max_runs` is exact and a paused schedule sends nothing.
//! (Pause and resume with a leader killed: `tests/tests/schedules.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE;
use conveyor_schedule::{Schedule, ScheduleStore, Scheduler, SchedulerClock, TickStore, tick_key};
use conveyor_sqs::Producer;
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait_until;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

struct Env {
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    table: String,
    queue_url: String,
}

async fn env(prefix: &str) -> Env {
    localstack::ensure_local_aws().await.unwrap();
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, prefix).await.unwrap();
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard(prefix))
        .await
        .unwrap();
    Env {
        sqs,
        dynamodb,
        table,
        queue_url: queue.url,
    }
}

impl Env {
    fn scheduler(&self, sqs: &aws_sdk_sqs::Client, schedule: &Schedule, clock: &SchedulerClock) -> Scheduler {
        let producer = Arc::new(Producer::new(sqs.clone(), &self.queue_url));
        let store = TickStore::new(self.dynamodb.clone(), &self.table);
        Scheduler::new(vec![schedule.clone()], store, producer)
            .unwrap()
            .with_clock(clock.clone())
            .with_lease(Duration::from_secs(3))
    }

    /// Every message in the queue, by idempotency key (receives until the queue stays empty).
    async fn drain(&self) -> HashMap<String, usize> {
        let mut keys: HashMap<String, usize> = HashMap::new();
        let mut empty_receives = 0;
        while empty_receives < 2 {
            let output = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            let messages = output.messages.unwrap_or_default();
            if messages.is_empty() {
                empty_receives += 1;
                continue;
            }
            empty_receives = 0;
            for message in messages {
                let key = message
                    .message_attributes
                    .as_ref()
                    .and_then(|attributes| attributes.get(IDEMPOTENCY_KEY_ATTRIBUTE))
                    .and_then(|value| value.string_value.clone())
                    .unwrap_or_default();
                *keys.entry(key).or_default() += 1;
                self.sqs
                    .delete_message()
                    .queue_url(&self.queue_url)
                    .receipt_handle(message.receipt_handle.unwrap_or_default())
                    .send()
                    .await
                    .unwrap();
            }
        }
        keys
    }
}

/// The whole second `ahead` seconds from now on `clock` (a minute from it then holds 61 ticks).
fn whole_second(clock: &SchedulerClock, ahead: u64) -> SystemTime {
    let now = clock.now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs() + ahead)
}

/// Stops the schedulers and waits for each to return.
async fn stop(shutdown: &CancellationToken, workers: Vec<JoinHandle<()>>) {
    shutdown.cancel();
    for worker in workers {
        worker.await.unwrap();
    }
}

fn spawn(scheduler: Scheduler, shutdown: &CancellationToken) -> JoinHandle<()> {
    tokio::spawn(scheduler.run(shutdown.child_token()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_schedulers_send_each_tick_of_a_minute_exactly_once() {
    let env = env("sched-once").await;
    let clock = SchedulerClock::fast(4);
    let start = whole_second(&clock, 4);
    let end = start + Duration::from_secs(60);
    let schedule = Schedule::cron("every-second", "* * * * * *", "Europe/Berlin")
        .unwrap()
        .job_of("ping", 1, &serde_json::json!({"n": 1}))
        .unwrap()
        .starting(start)
        .ending(end);
    let expected: Vec<String> = schedule
        .ticks_between(start - Duration::from_secs(1), end, 1000)
        .into_iter()
        .map(|tick| tick_key("every-second", tick))
        .collect();
    assert_eq!(expected.len(), 61);

    let shutdown = CancellationToken::new();
    let workers: Vec<JoinHandle<()>> = (0..3)
        .map(|_| spawn(env.scheduler(&env.sqs, &schedule, &clock), &shutdown))
        .collect();
    let last = schedule.ticks_between(start, end, 1000).last().copied().unwrap();
    let store = TickStore::new(env.dynamodb.clone(), &env.table);
    wait_until(Duration::from_secs(60), Duration::from_millis(250), async || {
        store
            .state("every-second")
            .await
            .is_ok_and(|state| state.last_sent == Some(last))
    })
    .await
    .unwrap();
    stop(&shutdown, workers).await;

    let keys = env.drain().await;
    let twice: Vec<(&String, &usize)> = keys.iter().filter(|(_, count)| **count != 1).collect();
    assert!(twice.is_empty(), "ticks sent more than once: {twice:?}");
    let mut sent: Vec<String> = keys.into_keys().collect();
    sent.sort();
    assert_eq!(sent, expected, "every tick of the minute, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_runs_is_never_exceeded_across_schedulers_and_a_paused_schedule_sends_nothing() {
    let env = env("sched-max").await;
    let clock = SchedulerClock::fast(4);
    let start = whole_second(&clock, 2);
    let end = start + Duration::from_secs(10);
    let limited = Schedule::every("limited", Duration::from_secs(1))
        .unwrap()
        .job_of("ping", 1, &serde_json::json!({"n": 3}))
        .unwrap()
        .starting(start)
        .ending(end)
        .max_runs(3);
    let paused = Schedule::every("paused", Duration::from_secs(1))
        .unwrap()
        .job_of("ping", 1, &serde_json::json!({"n": 4}))
        .unwrap()
        .starting(start)
        .ending(end);
    let store = TickStore::new(env.dynamodb.clone(), &env.table);
    store.pause("paused", clock.now()).await.unwrap();

    let shutdown = CancellationToken::new();
    let workers: Vec<JoinHandle<()>> = (0..2)
        .map(|_| {
            let producer = Arc::new(Producer::new(env.sqs.clone(), &env.queue_url));
            let store = TickStore::new(env.dynamodb.clone(), &env.table);
            let scheduler = Scheduler::new(vec![limited.clone(), paused.clone()], store, producer)
                .unwrap()
                .with_clock(clock.clone())
                .with_lease(Duration::from_secs(3));
            spawn(scheduler, &shutdown)
        })
        .collect();
    let past_end = end + Duration::from_secs(4);
    wait_until(Duration::from_secs(30), Duration::from_millis(100), async || {
        clock.now() > past_end
    })
    .await
    .unwrap();
    stop(&shutdown, workers).await;
    let keys = env.drain().await;
    assert!(keys.values().all(|count| *count == 1), "{keys:?}");
    let limited_keys = keys
        .keys()
        .filter(|key| key.starts_with("schedule:limited@"))
        .count();
    assert_eq!(limited_keys, 3, "max runs 3: {keys:?}");
    assert!(
        !keys.keys().any(|key| key.starts_with("schedule:paused@")),
        "a paused schedule sent: {keys:?}"
    );
    let state = store.state("limited").await.unwrap();
    assert_eq!(state.runs, 3);
    let sent = state
        .history
        .iter()
        .filter(|entry| entry.outcome == "sent")
        .count();
    assert_eq!(sent, 3, "{:?}", state.history);
    assert!(
        state
            .last_outcome
            .is_some_and(|outcome| outcome.contains("max runs reached")),
        "the ticks after the third are skipped"
    );
}
