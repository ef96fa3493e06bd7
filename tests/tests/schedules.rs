//! The example application's schedules: the file the Lambda example's Terraform reads
//! (`infra/examples/lambda/schedules.json`, planned in tests/terraform.rs) is exactly what the code
//! exports, and an EventBridge-style enveloped tick (no attributes) runs through the real pipeline
//! with the tick's key; and three schedulers through a pause and a killed leader send every tick once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use conveyor_core::{
    Pipeline,
    message::Message,
    runtime::{AckReason, Budget, Lease, Outcome},
};

#[test]
fn the_committed_schedules_file_is_what_the_code_exports() -> Result<()> {
    let path = conveyor_e2e::terraform::infra_dir().join("examples/lambda/schedules.json");
    let committed = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let exported = conveyor_schedule::export(&conveyor_examples::schedules::schedules()?)? + "\n";
    ensure!(
        committed == exported,
        "{} is out of date: run `target/debug/worker --export-schedules {}`",
        path.display(),
        path.display()
    );
    Ok(())
}

#[tokio::test]
async fn an_enveloped_tick_without_attributes_runs_with_the_ticks_key() -> Result<()> {
    let file: serde_json::Value = serde_json::from_str(&conveyor_schedule::export(
        &conveyor_examples::schedules::schedules()?,
    )?)?;
    let nightly = file["schedules"]
        .as_array()
        .and_then(|schedules| {
            schedules
                .iter()
                .find(|schedule| schedule["name"] == "nightly-sales-report")
        })
        .context("no nightly-sales-report schedule")?;
    let input = nightly["input"].as_str().context("no input")?;
    // What EventBridge Scheduler sends: the input with the scheduled time filled in, no attributes.
    let body = input.replace("<aws.scheduler.scheduled-time>", "2026-11-30T01:00:00Z");
    let outbox = std::env::temp_dir().join(format!("conveyor-schedules-{}.jsonl", std::process::id()));
    let settings = conveyor_examples::AppSettings {
        outbox: outbox.clone(),
        webhook_secret: b"test".to_vec(),
        webhook_timeout: Duration::from_secs(1),
    };
    let store = Arc::new(conveyor_testing::MemoryIdempotencyStore::new());
    let pipeline = Pipeline::new(conveyor_examples::router(&settings)?).with_store(store.clone());
    let run = async |id: &str| {
        let lease = Lease::new(tokio::time::Instant::now() + Duration::from_secs(30));
        let message = Arc::new(Message::new(id, body.clone()));
        pipeline
            .process(message, Arc::from("jobs"), &lease, Budget::default())
            .await
    };
    let first = run("m-1").await;
    ensure!(
        first.outcome == Outcome::Ack(AckReason::Completed),
        "{:?}",
        first.outcome
    );
    ensure!(first.job_type == Some("report"));
    // The same tick delivered again (EventBridge retries at least once): a duplicate, by the key.
    let again = run("m-2").await;
    ensure!(
        again.outcome == Outcome::Ack(AckReason::Duplicate),
        "{:?}",
        again.outcome
    );
    let key = conveyor_core::port::idempotency_key(
        "report",
        Some("schedule:nightly-sales-report@2026-11-30T01:00:00Z"),
        "",
    );
    ensure!(
        conveyor_core::port::IdempotencyStore::get(store.as_ref(), &key)
            .await?
            .is_some()
    );
    let _ = std::fs::remove_file(outbox);
    Ok(())
}

/// Three schedulers against LocalStack (SQS) and DynamoDB Local on a clock 4× real time, a schedule
/// every second: paused for 30 s then resumed, then the leader killed (aborted mid-flight: no release,
/// as a SIGKILL leaves it). Every tick outside the pause is received once, no paused tick is replayed,
/// and the cursor's run count matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_schedulers_a_pause_and_a_killed_leader_send_every_tick_once() -> Result<()> {
    use conveyor_schedule::{Schedule, ScheduleStore, Scheduler, SchedulerClock, TickStore};
    use conveyor_testing::localstack::{self, QueueSpec};
    use conveyor_testing::wait_until;
    use std::collections::HashMap;
    use std::time::SystemTime;
    use tokio_util::sync::CancellationToken;

    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "sched-e2e").await?;
    let queue = localstack::create_queue(&sqs, &QueueSpec::standard("sched-e2e")).await?;
    let clock = SchedulerClock::fast(4);
    let schedule = Schedule::every("every-second", Duration::from_secs(1))?
        .job_of("ping", 1, &serde_json::json!({}))?
        .missed_ticks(conveyor_schedule::MissedTicks::All);
    let store = TickStore::new(dynamodb.clone(), &table);
    let shutdown = CancellationToken::new();
    let mut workers = HashMap::new();
    for _ in 0..3 {
        let scheduler = Scheduler::new(
            vec![schedule.clone()],
            TickStore::new(dynamodb.clone(), &table),
            Arc::new(conveyor_sqs::Producer::new(sqs.clone(), &queue.url)),
        )?
        .with_clock(clock.clone())
        .with_lease(Duration::from_secs(3));
        let owner = scheduler.owner().to_owned();
        workers.insert(owner, tokio::spawn(scheduler.run(shutdown.child_token())));
    }
    let advanced_past = async |time: SystemTime| {
        wait_until(Duration::from_secs(60), Duration::from_millis(100), async || {
            store
                .state("every-second")
                .await
                .is_ok_and(|state| state.last_tick.is_some_and(|tick| tick >= time))
        })
        .await
    };
    let first = clock.now() + Duration::from_secs(2);
    advanced_past(first + Duration::from_secs(10)).await?;

    // Pause 30 s (schedule time), then resume.
    let paused_at = clock.now();
    store.pause("every-second", paused_at).await?;
    let resume_at = paused_at + Duration::from_secs(30);
    wait_until(Duration::from_secs(30), Duration::from_millis(50), async || {
        clock.now() >= resume_at
    })
    .await?;
    let resumed_at = clock.now();
    store.resume("every-second", resumed_at).await?;
    advanced_past(resumed_at + Duration::from_secs(10)).await?;

    // SIGKILL the leader: its lease lapses (no release) and a follower takes over.
    let leader = store
        .read_lease(conveyor_schedule::DEFAULT_SET)
        .await?
        .context("no lease")?;
    let killed = workers
        .remove(&leader.owner)
        .context("the leader is one of ours")?;
    killed.abort();
    let killed_at = clock.now();
    advanced_past(killed_at + Duration::from_secs(30)).await?;
    let new_leader = store
        .read_lease(conveyor_schedule::DEFAULT_SET)
        .await?
        .context("no lease")?;
    ensure!(
        new_leader.owner != leader.owner && new_leader.epoch > leader.epoch,
        "{new_leader:?}"
    );
    let last = store
        .state("every-second")
        .await?
        .last_sent
        .context("nothing sent")?;
    shutdown.cancel();
    for (_, worker) in workers {
        worker.await?;
    }

    let keys = ticks_sent(&sqs, &queue.url).await?;
    check_ticks(&schedule, &keys, first, last, (paused_at, resumed_at))?;
    let state = store.state("every-second").await?;
    ensure!(
        state.runs == u64::try_from(keys.len())?,
        "runs {} for {} ticks",
        state.runs,
        keys.len()
    );
    ensure!(!state.history.is_empty() && state.history.len() <= conveyor_schedule::store::HISTORY_LENGTH);
    println!(
        "{} ticks sent once each; pause {}s (schedule time) skipped; leader {} killed, {} took over",
        keys.len(),
        resumed_at.duration_since(paused_at)?.as_secs(),
        leader.owner,
        new_leader.owner
    );
    Ok(())
}

/// The same promise with the real `worker` processes (`CONVEYOR_SCHEDULES=on`) and the `conveyor` CLI, in
/// real time: a run-time schedule every second added with `conveyor schedules add`, paused 30 s with
/// `schedules pause`, resumed with `schedules resume`, then the leading process SIGKILLed (its lease,
/// 30 s by default, lapses and a follower takes over). Every tick outside the pause is sent once, no
/// paused tick is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_a_cli_pause_and_a_sigkilled_leader_send_every_tick_once() -> Result<()> {
    use conveyor_e2e::{app_env, binaries, outbox_path};
    use conveyor_schedule::{Schedule, ScheduleStore, TickStore};
    use conveyor_testing::localstack::{self, QueueSpec};
    use conveyor_testing::wait_until;
    use std::time::SystemTime;

    localstack::ensure_local_aws().await?;
    let sqs = localstack::sqs_client().await;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "sched-procs").await?;
    // The workers consume `jobs` (empty); the ticks go to `ticks`, which only this test reads.
    let jobs = localstack::create_queue(&sqs, &QueueSpec::standard("sched-procs-jobs")).await?;
    let ticks = localstack::create_queue(&sqs, &QueueSpec::standard("sched-procs-ticks")).await?;
    let store = TickStore::new(dynamodb.clone(), &table);
    let outbox = outbox_path("sched-procs");
    let mut env = app_env(&table, &outbox);
    env.push((
        conveyor_examples::schedules::SCHEDULES_ENV.to_owned(),
        "on".to_owned(),
    ));
    env.push((
        conveyor_examples::schedules::SCHEDULE_QUEUE_ENV.to_owned(),
        ticks.url.clone(),
    ));
    let conveyor = async |args: &[&str]| -> Result<()> {
        let output = tokio::process::Command::new(binaries().path("conveyor")?)
            .envs(localstack::aws_env())
            .args(args)
            .output()
            .await?;
        ensure!(output.status.success(), "conveyor {args:?}: {output:?}");
        Ok(())
    };
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(binaries().spawn_worker(&jobs.url, None, &env, None)?);
    }

    // Intervals count from the start: a whole second a little ahead.
    let now_secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs();
    let first = SystemTime::UNIX_EPOCH + Duration::from_secs(now_secs + 2);
    let start = conveyor_core::runtime::format_time(first);
    conveyor(&[
        "schedules",
        "add",
        "every-second",
        "--every",
        "1",
        "--start",
        &start,
        "--job-type",
        "ping",
        "--missed",
        "all",
        "--table",
        &table,
    ])
    .await?;
    let schedule = Schedule::every("every-second", Duration::from_secs(1))?.starting(first);
    let advanced_past = async |time: SystemTime, within: Duration| {
        wait_until(within, Duration::from_millis(200), async || {
            store
                .state("every-second")
                .await
                .is_ok_and(|state| state.last_tick.is_some_and(|tick| tick >= time))
        })
        .await
    };
    // A follower leads only after the first leader's lease: allow for one lapse.
    advanced_past(first + Duration::from_secs(10), Duration::from_secs(90)).await?;

    let paused_at = SystemTime::now();
    conveyor(&["schedules", "pause", "every-second", "--table", &table]).await?;
    wait_until(Duration::from_secs(40), Duration::from_millis(100), async || {
        SystemTime::now() >= paused_at + Duration::from_secs(30)
    })
    .await?;
    conveyor(&["schedules", "resume", "every-second", "--table", &table]).await?;
    let resumed_at = SystemTime::now();
    advanced_past(resumed_at + Duration::from_secs(5), Duration::from_secs(60)).await?;

    // SIGKILL the leading process: the lease's owner starts with its pid.
    let leader = store
        .read_lease(conveyor_schedule::DEFAULT_SET)
        .await?
        .context("no lease")?;
    let pid = leader
        .owner
        .strip_prefix("pid-")
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .with_context(|| format!("the owner {} names no pid", leader.owner))?;
    let index = workers
        .iter()
        .position(|worker| worker.id() == Some(pid))
        .context("the leader is one of the three workers")?;
    let mut killed = workers.remove(index);
    killed.start_kill()?;
    killed.wait().await?;
    let killed_at = SystemTime::now();
    advanced_past(killed_at + Duration::from_secs(10), Duration::from_secs(120)).await?;
    let new_leader = store
        .read_lease(conveyor_schedule::DEFAULT_SET)
        .await?
        .context("no lease")?;
    ensure!(
        new_leader.owner != leader.owner && new_leader.epoch > leader.epoch,
        "{new_leader:?}"
    );
    conveyor(&["schedules", "pause", "every-second", "--table", &table]).await?;
    let last = store
        .state("every-second")
        .await?
        .last_sent
        .context("nothing sent")?;
    for worker in &mut workers {
        conveyor_demo::terminate(worker).await?;
    }

    let keys = ticks_sent(&sqs, &ticks.url).await?;
    check_ticks(&schedule, &keys, first, last, (paused_at, resumed_at))?;
    println!(
        "{} ticks sent once each by 3 worker processes; a 30 s pause skipped; leader {} SIGKILLed, {} took over",
        keys.len(),
        leader.owner,
        new_leader.owner
    );
    Ok(())
}

/// Every message on the tick queue, counted by idempotency key (each read once and deleted).
async fn ticks_sent(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
) -> Result<std::collections::HashMap<String, usize>> {
    let mut keys = std::collections::HashMap::new();
    let mut empty = 0;
    while empty < 2 {
        let output = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await?;
        let messages = output.messages.unwrap_or_default();
        if messages.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        for message in messages {
            let key = message
                .message_attributes
                .as_ref()
                .and_then(|attributes| attributes.get(conveyor_core::message::IDEMPOTENCY_KEY_ATTRIBUTE))
                .and_then(|value| value.string_value.clone())
                .unwrap_or_default();
            *keys.entry(key).or_default() += 1;
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(message.receipt_handle.unwrap_or_default())
                .send()
                .await?;
        }
    }
    Ok(keys)
}

/// No tick sent twice, none of the pause (a tick within a second after the pause may have been sent
/// before the pause was written), and every other tick from `first` to `last` sent.
fn check_ticks(
    schedule: &conveyor_schedule::Schedule,
    keys: &std::collections::HashMap<String, usize>,
    first: std::time::SystemTime,
    last: std::time::SystemTime,
    (paused_at, resumed_at): (std::time::SystemTime, std::time::SystemTime),
) -> Result<()> {
    use conveyor_schedule::tick_key;
    let name = schedule.name.as_str();
    let twice: Vec<(&String, &usize)> = keys.iter().filter(|(_, count)| **count > 1).collect();
    ensure!(twice.is_empty(), "ticks sent twice: {twice:?}");
    let replayed: Vec<String> = schedule
        .ticks_between(paused_at + Duration::from_secs(1), resumed_at, 100)
        .into_iter()
        .map(|tick| tick_key(name, tick))
        .filter(|key| keys.contains_key(key))
        .collect();
    ensure!(replayed.is_empty(), "paused ticks sent: {replayed:?}");
    let in_pause = |tick: std::time::SystemTime| tick > paused_at && tick <= resumed_at;
    let missing: Vec<String> = schedule
        .ticks_between(first, last, 1000)
        .into_iter()
        .filter(|tick| !in_pause(*tick))
        .map(|tick| tick_key(name, tick))
        .filter(|key| !keys.contains_key(key))
        .collect();
    ensure!(missing.is_empty(), "ticks never sent: {missing:?}");
    Ok(())
}
