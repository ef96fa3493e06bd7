//! The console's pages that read the idempotency table, against DynamoDB Local: a flow's parent (the
//! flow's counts, its parent's state, its failed and pending children with links to their records,
//! before the parent has a record), and the schedules page (a set's run-time schedules, a paused
//! schedule's state).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use conveyor_console::{Console, ConsoleConfig};
use conveyor_core::ChildFailurePolicy;
use conveyor_core::port::{ChildEnd, FlowStore as _};
use conveyor_dynamodb::DynamoStore;
use conveyor_testing::localstack;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123";

/// `GET path` with the token; the whole answer.
async fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await?;
    Ok(answer)
}

/// A console on `table`, serving on a loopback port until `stop` is cancelled.
async fn console(table: &str, stop: &CancellationToken) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = ConsoleConfig::default()
        .with_listen(addr)
        .with_token(Some(TOKEN.to_owned()))
        .with_prefixes(vec!["console-pages".to_owned()])
        .with_table(Some(table.to_owned()));
    let console = Console::new(
        config,
        localstack::sqs_client().await,
        localstack::dynamodb_client().await,
    )
    .await?;
    tokio::spawn(console.serve(listener, stop.child_token()));
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_set_and_a_paused_schedule_are_shown() -> anyhow::Result<()> {
    use conveyor_schedule::{DEFAULT_SET, Schedule, ScheduleStore as _, TickStore, to_definition_json};
    localstack::ensure_local_aws().await?;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "console-schedules").await?;
    let store = TickStore::new(dynamodb, &table);
    let cleanup = Schedule::every("cleanup", std::time::Duration::from_secs(300))?.job_of(
        "cleanup",
        1,
        &serde_json::json!({}),
    )?;
    store
        .put_definition(DEFAULT_SET, "cleanup", &to_definition_json(&cleanup))
        .await?;
    store
        .pause("nightly-report", std::time::SystemTime::now())
        .await?;
    let stop = CancellationToken::new();
    let addr = console(&table, &stop).await?;

    let page = get(addr, "/schedules?name=nightly-report").await?;
    let set_page = get(addr, "/schedules").await?;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("paused since"), "the pause: {page}");
    assert!(page.contains("id=\"schedule-no-history\""), "no runs yet: {page}");

    // Resumed and paused again from the page, as the CLI does.
    let csrf = common::csrf_of(&page);
    let toggle = async |action: &str| -> anyhow::Result<reqwest::StatusCode> {
        let form = [
            ("csrf", csrf.as_str()),
            ("name", "nightly-report"),
            ("action", action),
        ];
        let answer = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?
            .post(format!("http://{addr}/schedules/act"))
            .bearer_auth(TOKEN)
            .form(&form)
            .send()
            .await?;
        Ok(answer.status())
    };
    assert_eq!(toggle("resume").await?, reqwest::StatusCode::SEE_OTHER);
    let resumed = store.state("nightly-report").await?;
    assert!(!resumed.paused && resumed.resumed_at.is_some(), "{resumed:?}");
    assert!(
        get(addr, "/schedules?name=nightly-report")
            .await?
            .contains("Pause (its ticks")
    );
    assert_eq!(toggle("pause").await?, reqwest::StatusCode::SEE_OTHER);
    assert!(store.state("nightly-report").await?.paused);
    assert_eq!(toggle("explode").await?, reqwest::StatusCode::BAD_REQUEST);
    stop.cancel();
    assert!(
        set_page.contains("href=\"/schedules?name=cleanup&amp;set=default\""),
        "the run-time schedule, linked: {set_page}"
    );
    assert!(
        set_page.contains("none: no scheduler of this set runs"),
        "no leader: {set_page}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flows_parent_shows_its_flow_with_failed_and_pending_children() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "console-flow").await?;
    let store = DynamoStore::new(dynamodb.clone(), &table);
    let flow = conveyor_testing::flow_conformance::new_flow("console", 3, ChildFailurePolicy::Ignore);
    store.create_flow(&flow).await?;
    store
        .child_finished(&flow.id, "00000", &ChildEnd::Succeeded { output: None })
        .await?;
    store
        .child_finished(
            &flow.id,
            "00001",
            &ChildEnd::Failed("the <warehouse> said no".into()),
        )
        .await?;

    let stop = CancellationToken::new();
    let addr = console(&table, &stop).await?;

    let record = conveyor_console_query(&flow.parent_record);
    let page = get(addr, &format!("/jobs?record_id={record}")).await?;
    stop.cancel();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("3 children: 1 succeeded, 1 failed, 1 pending"),
        "the counts: {page}"
    );
    assert!(page.contains("waiting for its children"), "the parent: {page}");
    assert!(
        page.contains("the &lt;warehouse&gt; said no"),
        "the failed child's reason, escaped: {page}"
    );
    assert!(
        page.contains("id=\"flow-pending\"") && page.contains(">00002</a>"),
        "the pending child, linked: {page}"
    );
    assert!(
        !page.contains("id=\"job-missing\""),
        "a parent not sent yet is not 'no record': {page}"
    );
    Ok(())
}

/// A record key as a query value (`:` and `#` escaped).
fn conveyor_console_query(text: &str) -> String {
    text.replace(':', "%3A").replace('#', "%23").replace('/', "%2F")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_are_listed_run_rescheduled_and_cancelled_from_the_page() -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use conveyor_core::port::OutgoingMessage;

    localstack::ensure_local_aws().await?;
    let dynamodb = localstack::dynamodb_client().await;
    let table = localstack::create_table(&dynamodb, "console-delays").await?;
    let sqs = localstack::sqs_client().await;
    let queue =
        localstack::create_queue(&sqs, &localstack::QueueSpec::standard("console-pages-delays")).await?;
    let store = Arc::new(DynamoStore::new(dynamodb, &table));
    let timers = conveyor_core::Timers::new(
        store,
        Arc::new(conveyor_sqs::SqsSender::new(sqs.clone())),
        queue.url.as_str(),
    );
    let later = SystemTime::now() + Duration::from_secs(7200);
    let mut ids = Vec::new();
    for index in 0..3u64 {
        let message = OutgoingMessage {
            body: format!("{{\"report\":{index}}}"),
            ..OutgoingMessage::default()
        };
        ids.push(
            timers
                .put("report", later + Duration::from_secs(index), message)
                .await?,
        );
    }
    let (run, cancel, moved) = (&ids[0], &ids[1], &ids[2]);
    let stop = CancellationToken::new();
    let addr = console(&table, &stop).await?;
    let http = reqwest::Client::new();
    let page = http
        .get(format!(
            "http://{addr}/delays?queue={}",
            common::query(&queue.url)
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .text()
        .await?;
    for id in &ids {
        assert!(page.contains(id.as_str()), "{id} is listed: {page}");
    }
    assert!(page.contains("Run now") && page.contains("1h 59m"), "{page}");
    assert!(
        !page.contains("OVERDUE") && page.contains("Relay: never seen"),
        "nothing overdue yet; no relay has run for the queue: {page}"
    );
    // A job due ten minutes ago that no relay sent (no consumer has timers on) is flagged, with the fix.
    let stuck = timers
        .put(
            "report",
            SystemTime::now() - Duration::from_secs(600),
            OutgoingMessage {
                body: "{}".to_owned(),
                ..OutgoingMessage::default()
            },
        )
        .await?;
    let flagged = http
        .get(format!(
            "http://{addr}/delays?queue={}",
            common::query(&queue.url)
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .text()
        .await?;
    assert!(
        flagged.contains(stuck.as_str())
            && flagged.contains("1 delayed job(s) OVERDUE")
            && flagged.contains("conveyor::Pipeline::with_timers")
            && flagged.contains(r#"class="bad overdue""#),
        "{flagged}"
    );
    // Once a relay has passed, the page says when it was seen (and the overdue job was sent).
    timers.relay(Duration::from_secs(60)).await?;
    let relayed = http
        .get(format!(
            "http://{addr}/delays?queue={}",
            common::query(&queue.url)
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .text()
        .await?;
    assert!(
        relayed.contains("Relay: seen at") && !relayed.contains("OVERDUE"),
        "{relayed}"
    );
    let csrf = common::csrf_of(&page);
    let act = |action: &'static str, id: &str, extra: Option<(&'static str, &'static str)>| {
        let mut form = vec![
            ("csrf", csrf.clone()),
            ("queue", queue.url.clone()),
            ("id", id.to_owned()),
            ("action", action.to_owned()),
        ];
        if let Some((name, value)) = extra {
            form.push((name, value.to_owned()));
        }
        http.post(format!("http://{addr}/delays/act"))
            .bearer_auth(TOKEN)
            .form(&form)
            .send()
    };

    assert!(act("cancel", cancel, None).await?.status().is_success());
    assert!(timers.get(cancel).await?.is_none(), "cancelled");
    assert!(act("run", run, None).await?.status().is_success());
    assert!(timers.get(run).await?.is_none(), "sent now");
    assert!(
        act("reschedule", moved, Some(("in_secs", "60")))
            .await?
            .status()
            .is_success()
    );
    let due = timers.get(moved).await?.map(|timer| timer.due);
    let expected = SystemTime::now() + Duration::from_secs(60);
    assert!(
        due.is_some_and(|due| due <= expected && due + Duration::from_secs(30) >= expected),
        "moved to a minute from now: {due:?}"
    );
    let again = act("cancel", cancel, None).await?;
    assert_eq!(again.status(), 409);
    assert!(again.text().await?.contains("sent or cancelled already"));
    let forged = http
        .post(format!("http://{addr}/delays/act"))
        .bearer_auth(TOKEN)
        .form(&[
            ("queue", queue.url.as_str()),
            ("id", moved.as_str()),
            ("action", "cancel"),
        ])
        .send()
        .await?;
    assert_eq!(forged.status(), 403, "no CSRF value, no change");
    assert!(timers.get(moved).await?.is_some());
    stop.cancel();
    Ok(())
}
