//! The console in a real browser (headless Chromium through chromedriver) against LocalStack and a real
//! worker: the queues page follows a queue's depth; the dead letters of poison jobs are filtered by
//! reason, a selection is redriven and the worker processes it; requests without the token or the CSRF
//! value are refused; the send form refuses a body that is not JSON and sends one that is, and a tenant
//! SQS would refuse, and sends a job's tenant as its `MessageGroupId`. Screenshots go to
//! `target/console-screenshots/`. Prints the page load time and the
//! AWS requests one refresh costs (README figures).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;

use anyhow::Context as _;
use common::query;
use conveyor_console::{Console, ConsoleConfig};
use conveyor_core::{Context, Handler, HandlerError, Pipeline, Router};
use conveyor_sqs::admin::QueueRef;
use conveyor_sqs::{NewJob, Producer, SqsQueue};
use conveyor_testing::browser::{Chromedriver, chromium_capabilities, screenshot_dir};
use conveyor_testing::localstack::{self, QueueSpec};
use conveyor_testing::wait::wait_for;
use conveyor_worker::Worker;
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "browser-test-token-0123456789";

/// A webhook sender: malformed jobs fail for good; while the provider is "down" every job fails for good
/// with a 410 (a poison job as far as the worker knows); afterwards they succeed.
struct Webhook {
    provider_down: Arc<AtomicBool>,
    delivered: Arc<AtomicUsize>,
    /// The tenant of each delivered job.
    tenants: Arc<std::sync::Mutex<Vec<Option<String>>>>,
}

impl Handler for Webhook {
    type Job = Value;
    type Output = ();
    const JOB_TYPE: &'static str = "webhook";

    async fn handle(&self, job: Value, ctx: Context) -> Result<(), HandlerError> {
        if job.get("url").is_none() {
            return Err(HandlerError::permanent("invalid payload: no url"));
        }
        if self.provider_down.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent("provider answered 410 Gone"));
        }
        self.tenants.lock().unwrap().push(ctx.tenant().map(str::to_owned));
        self.delivered.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn text(browser: &Client, css: &str) -> Option<String> {
    browser.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// Waits until the element `css` shows `expected` (the page refreshes itself, or `reload` reloads it).
async fn wait_text(browser: &Client, css: &str, expected: &str, reload: bool) -> anyhow::Result<()> {
    let waited = wait_for(Duration::from_secs(30), Duration::from_millis(200), async || {
        if reload {
            browser.refresh().await.ok()?;
        }
        (text(browser, css).await.as_deref() == Some(expected)).then_some(())
    })
    .await;
    let shown = text(browser, css).await;
    waited.with_context(|| format!("{css} never showed {expected:?}; it shows {shown:?}"))
}

/// Waits until the element `css` contains `part` (10 s at most); returns its text.
async fn wait_contains(browser: &Client, css: &str, part: &str) -> anyhow::Result<String> {
    wait_for(Duration::from_secs(10), Duration::from_millis(100), async || {
        text(browser, css).await.filter(|text| text.contains(part))
    })
    .await
    .with_context(|| format!("{css} never contained {part:?}"))
}

/// Each message's receive count in the queue at `url`, read with the peek the CLI uses (which adds one).
async fn receive_counts(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
) -> anyhow::Result<std::collections::HashMap<String, u32>> {
    let options = conveyor_sqs::admin::PeekOptions::default().with_max(10);
    let peeked = conveyor_sqs::admin::peek(sqs, url, options).await?;
    Ok(peeked
        .messages
        .into_iter()
        .map(|received| (received.message.id, received.message.receive_count))
        .collect())
}

/// Clicks the element `css` once it is on the page (10 s at most): a click that submitted a form or
/// followed a link returns before the next page has loaded.
async fn click(browser: &Client, css: &str) -> anyhow::Result<()> {
    let element = wait_for(Duration::from_secs(10), Duration::from_millis(100), async || {
        browser.find(Locator::Css(css)).await.ok()
    })
    .await
    .with_context(|| format!("{css} never appeared"))?;
    element.click().await?;
    Ok(())
}

/// Sets the send form's `field` to `value`, submits it, and waits (10 s at most) for the element
/// `answer` (`#send-error` or `#sent-id`) of the page that answers; returns its text. Each answer is a
/// new page: alternate the two, so the wait cannot read the page being replaced.
async fn send_form(browser: &Client, field: &str, value: &str, answer: &str) -> anyhow::Result<String> {
    let form = browser.form(Locator::Css("#send")).await?;
    form.set_by_name(field, value).await?;
    form.submit().await?;
    wait_for(Duration::from_secs(10), Duration::from_millis(100), async || {
        text(browser, answer).await.filter(|text| !text.is_empty())
    })
    .await
    .with_context(|| format!("no {answer} after sending with {field} = {value:?}"))
}

async fn screenshot(browser: &Client, name: &str) -> anyhow::Result<()> {
    let png = browser.screenshot().await?;
    std::fs::write(screenshot_dir()?.join(name), png)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_watch_queues_and_redrive_dead_letters_in_a_browser() -> anyhow::Result<()> {
    localstack::ensure_local_aws().await?;
    let driver = Chromedriver::start().await?;
    let sqs = localstack::sqs_client().await;
    let queue =
        localstack::create_queue(&sqs, &QueueSpec::standard("console-browser").max_receive_count(3)).await?;

    // The console, with a token although it listens on loopback, and the worker's metrics.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    // The worker's operations endpoint, started later: a port no outgoing connection can take meanwhile.
    let ops = std::net::SocketAddr::from(([127, 0, 0, 1], conveyor_testing::free_port()?));
    let config = ConsoleConfig::default()
        .with_listen(listener.local_addr()?)
        .with_token(Some(TOKEN.to_owned()))
        .with_queues(vec![
            QueueRef::parse(&queue.name)?,
            QueueRef::parse(queue.dlq_name.as_deref().context("the test queue has a DLQ")?)?,
        ])
        .with_workers(vec![format!("http://{ops}")])
        .with_job_types(vec!["webhook".to_owned()])
        .with_refresh(Duration::from_secs(1))
        .with_history_every(Duration::from_secs(1));
    let console = Console::new(config, sqs.clone(), localstack::dynamodb_client().await).await?;
    let stop = CancellationToken::new();
    tokio::spawn(console.clone().serve(listener, stop.clone()));

    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.enforce_http(true);
    let browser = ClientBuilder::new(connector)
        .capabilities(chromium_capabilities(1280, 900))
        .connect(driver.url())
        .await
        .context("starting headless Chromium through chromedriver")?;
    let result = scenario(&browser, &base, &sqs, &queue, ops, &console).await;
    let _ = screenshot(&browser, "last.png").await;
    browser.close().await?;
    stop.cancel();
    result
}

async fn scenario(
    browser: &Client,
    base: &str,
    sqs: &aws_sdk_sqs::Client,
    queue: &localstack::TestQueue,
    ops: std::net::SocketAddr,
    console: &Console,
) -> anyhow::Result<()> {
    let row = format!("tr[data-queue=\"{}\"]", queue.name);

    // Without the token: refused. Opening it once with ?token= sets the cookie and drops it from the URL.
    browser.goto(&format!("{base}/")).await?;
    assert!(
        text(browser, "#problem")
            .await
            .unwrap_or_default()
            .contains("needs its token")
    );
    browser.goto(&format!("{base}/?token={TOKEN}")).await?;
    assert_eq!(browser.current_url().await?.as_str(), format!("{base}/"));
    wait_text(browser, &format!("{row} td.visible"), "0", false).await?;

    // The queues page follows the depth: four jobs (two malformed) wait for a worker.
    let producer = Producer::new(sqs.clone(), &queue.url);
    for id in 0..4 {
        let payload = if id % 2 == 0 {
            json!({"url": format!("https://hooks.example/{id}")})
        } else {
            json!({"id": id})
        };
        producer.send(&NewJob::new("webhook", payload)).await?;
    }
    wait_text(browser, &format!("{row} td.visible"), "4", false).await?;
    // The charts draw the samples taken since the start: the depth reaches 4 at its top.
    wait_contains(browser, "#chart-depth .chart-scale", "top 4").await?;
    let points = browser
        .find(Locator::Css("#chart-depth polyline.s1"))
        .await?
        .attr("points")
        .await?
        .unwrap_or_default();
    assert!(points.split(' ').count() >= 2, "{points}");
    assert!(
        points.ends_with(",0.0"),
        "the newest sample (4) is at the top: {points}"
    );
    screenshot(browser, "queues.png").await?;

    // Figures: a page load, and what one refresh costs.
    let mut loads = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        browser.goto(&format!("{base}/")).await?;
        loads.push(started.elapsed());
    }
    loads.sort();
    let requests = text(browser, "#refresh-requests").await.unwrap_or_default();
    println!(
        "figure: queues page load (1 queue + DLQ, 1 worker), median of 5: {} ms; AWS requests per refresh: {requests}",
        loads[2].as_millis()
    );
    let before = console.aws_requests();
    let live = browser
        .execute(
            "return fetch('/live').then(r => r.text()).then(t => t.length)",
            vec![],
        )
        .await?;
    assert!(live.as_u64().unwrap_or(0) > 0);
    println!(
        "figure: AWS requests of one live refresh: {}",
        console.aws_requests() - before
    );

    // A hidden tab stops polling (no AWS requests) and polls again once shown: its next tick parks
    // on `visibilitychange` instead of fetching.
    browser
        .execute(
            "window.__fetches = 0; window.__parked = 0; \
             const fetch0 = window.fetch; \
             window.fetch = function () { window.__fetches++; return fetch0.apply(this, arguments); }; \
             const add0 = document.addEventListener.bind(document); \
             document.addEventListener = function (type, listener, options) { \
               if (type === 'visibilitychange') window.__parked++; return add0(type, listener, options); }; \
             Object.defineProperty(document, 'hidden', { configurable: true, get: function () { return true; } });",
            vec![],
        )
        .await?;
    let counter = async |name: &str| -> u64 {
        let value = browser.execute(&format!("return window.{name}"), vec![]).await;
        value.ok().and_then(|value| value.as_u64()).unwrap_or(0)
    };
    wait_for(Duration::from_secs(10), Duration::from_millis(100), async || {
        (counter("__parked").await >= 1).then_some(())
    })
    .await
    .context("a hidden tab's live region parks instead of polling")?;
    let fetched_while_hidden = counter("__fetches").await;
    browser
        .execute(
            "Object.defineProperty(document, 'hidden', { configurable: true, get: function () { return false; } }); \
             document.dispatchEvent(new Event('visibilitychange'));",
            vec![],
        )
        .await?;
    wait_for(Duration::from_secs(10), Duration::from_millis(100), async || {
        (counter("__fetches").await > fetched_while_hidden).then_some(())
    })
    .await
    .context("the live region polls again once the tab is shown")?;

    // A worker runs the jobs while the provider is down: all four are dead-lettered.
    let provider_down = Arc::new(AtomicBool::new(true));
    let delivered = Arc::new(AtomicUsize::new(0));
    let tenants = Arc::default();
    let pipeline = Pipeline::new(Router::new().route(Webhook {
        provider_down: Arc::clone(&provider_down),
        delivered: Arc::clone(&delivered),
        tenants: Arc::clone(&tenants),
    }));
    let config = WorkerConfig::default()
        .with_queues(vec![QueueConfig::new(queue.url.clone()).with_weight(1)])
        .with_receive_wait(Duration::from_secs(1))
        .with_listen_addr(Some(ops.to_string()));
    let worker_queue: Arc<dyn conveyor_core::port::Queue> =
        Arc::new(SqsQueue::connect(sqs.clone(), &queue.url).await?);
    let worker = Worker::new(config, pipeline, vec![worker_queue])?;
    let shutdown = CancellationToken::new();
    let mut running = tokio::spawn(worker.run(shutdown.clone()));
    // A worker that stops (it could not listen, say) says why, instead of the DLQ staying empty.
    let dlq_depth = format!("{row} td.dlq-depth");
    tokio::select! {
        waited = wait_text(browser, &dlq_depth, "4", false) => waited?,
        ended = &mut running => anyhow::bail!("the worker stopped before dead-lettering the jobs: {ended:?}"),
    }
    provider_down.store(false, Ordering::SeqCst);

    // Dead letters: nothing is received until the operator peeks; then filter by reason, see only the
    // provider's failures, select them all, redrive.
    let dlq_url = queue.dlq_url.clone().context("the test queue has a DLQ")?;
    let counts_before = receive_counts(sqs, &dlq_url).await?;
    click(browser, &format!("{row} a[href^=\"/dlq\"]")).await?;
    wait_contains(browser, "#no-peek", "No peek yet")
        .await
        .context("the dead-letter page offers a peek before it takes one")?;
    click(browser, "#peek").await?;
    wait_text(browser, "#dlq-peeked", "4", false).await?;
    let filter = browser.form(Locator::Css("#filter")).await?;
    filter.set_by_name("reason", "410").await?;
    filter.submit().await?;
    wait_text(browser, "#dlq-matching", "2", false).await?;
    // Reloads and a body shown work from the kept peek: the one peek is the only receive since.
    browser.refresh().await?;
    click(browser, "a.show-body").await?;
    wait_contains(browser, "pre.body", "hooks.example")
        .await
        .context("the body of a dead letter is shown from the kept peek")?;
    let details = wait_contains(browser, "dl.details", "Attributes").await?;
    assert!(
        details.contains("conveyor.failure"),
        "the failure attribute is listed: {details}"
    );
    browser.refresh().await?;
    wait_text(browser, "#dlq-matching", "2", false).await?;
    let counts_after = receive_counts(sqs, &dlq_url).await?;
    for (id, before) in &counts_before {
        // +1 for the console's one peek, +1 for this test's own second look.
        assert_eq!(counts_after.get(id), Some(&(before + 2)), "receive count of {id}");
    }
    assert_eq!(counts_before.len(), 4);
    let reasons = browser.find_all(Locator::Css("tr.dead-letter td.reason")).await?;
    assert_eq!(reasons.len(), 2);
    for reason in reasons {
        assert_eq!(reason.text().await?, "provider answered 410 Gone");
    }
    screenshot(browser, "dead-letters.png").await?;
    click(browser, "input[data-select-all]").await?;
    click(browser, "#redrive-selected").await?;
    wait_text(browser, "#task-status[data-finished=\"true\"] .ok", "done", false).await?;
    assert_eq!(text(browser, "#task-moved").await.as_deref(), Some("2"));
    screenshot(browser, "redrive.png").await?;

    // The worker processes the redriven jobs; the malformed ones stay in the DLQ.
    wait_for(Duration::from_secs(30), Duration::from_millis(200), async || {
        (delivered.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await
    .context("the worker never delivered the two redriven webhooks")?;
    browser.goto(&format!("{base}/")).await?;
    wait_text(browser, &format!("{row} td.dlq-depth"), "2", false).await?;
    // The worker's /metrics, scraped by the console, count the two deliveries.
    wait_text(browser, "#workers td.succeeded-total", "2", false).await?;
    screenshot(browser, "queues-after.png").await?;
    // The same page as a phone shows it.
    browser.set_window_size(390, 844).await?;
    browser.refresh().await?;
    wait_text(browser, &format!("{row} td.dlq-depth"), "2", false).await?;
    screenshot(browser, "queues-phone.png").await?;
    // Nothing is cut off at 390 px: no table is wider than its box.
    let overflowing = browser
        .execute(
            "return [...document.querySelectorAll('.scroll')] \
               .filter(box => box.scrollWidth > box.clientWidth + 1) \
               .map(box => box.querySelector('table')?.id || 'a table')",
            vec![],
        )
        .await?;
    assert_eq!(overflowing, json!([]), "tables wider than a 390 px phone");
    browser.set_window_size(1280, 900).await?;

    // A state-changing request without the CSRF value is refused, in the browser...
    browser
        .goto(&format!("{base}/dlq?queue={}", query(&queue.url)))
        .await?;
    click(browser, "#peek").await?;
    wait_text(browser, "#dlq-peeked", "2", false).await?;
    browser
        .execute(
            "document.querySelector('#dead-letters input[name=csrf]').remove()",
            vec![],
        )
        .await?;
    click(browser, "input[name=id]").await?;
    click(browser, "#delete-selected").await?;
    wait_contains(browser, "#problem", "CSRF").await?;
    // ...and one without the token, from another client, even with the right CSRF value.
    browser.goto(&format!("{base}/")).await?;
    let csrf = browser
        .find(Locator::Css("input[name=csrf]"))
        .await?
        .attr("value")
        .await?
        .unwrap_or_default();
    let http = reqwest::Client::new();
    let form = [
        ("csrf", csrf.as_str()),
        ("queue", queue.url.as_str()),
        ("action", "redrive_filter"),
    ];
    let anonymous = http.post(format!("{base}/dlq/act")).form(&form).send().await?;
    assert_eq!(anonymous.status(), 401);
    let no_csrf = http
        .post(format!("{base}/dlq/act"))
        .bearer_auth(TOKEN)
        .form(&[("queue", queue.url.as_str()), ("action", "redrive_filter")])
        .send()
        .await?;
    assert_eq!(no_csrf.status(), 403);
    // ...and a redrive, with the token and the CSRF value, to a queue the console does not show (the
    // operator's credentials could write there): refused, since the bodies would leave with it.
    let elsewhere = localstack::create_queue(sqs, &QueueSpec::standard("console-not-shown")).await?;
    let mut outside = form.to_vec();
    outside.push(("to_other", elsewhere.url.as_str()));
    let refused = http
        .post(format!("{base}/dlq/act"))
        .bearer_auth(TOKEN)
        .form(&outside)
        .send()
        .await?;
    assert_eq!(refused.status(), 400);
    let refused = refused.text().await?;
    assert!(
        refused.contains("redrives only to the queues it shows"),
        "{refused}"
    );
    // Nothing moved: the two malformed jobs are still dead letters.
    browser.refresh().await?;
    wait_text(browser, &format!("{row} td.dlq-depth"), "2", false).await?;

    // The send form offers the queue but not its DLQ (nothing runs jobs sent there), and refuses the
    // DLQ when a hand-made form names it.
    browser.goto(&format!("{base}/send")).await?;
    let offered = browser
        .execute(
            "return [...document.querySelectorAll('#send select[name=queue] option')].map(o => o.text)",
            vec![],
        )
        .await?;
    assert_eq!(offered, json!([queue.name]), "{offered}");
    browser
        .execute(
            "const s = document.querySelector('#send select[name=queue]'); \
             s.add(new Option('dlq', arguments[0], true, true));",
            vec![json!(dlq_url)],
        )
        .await?;
    browser.form(Locator::Css("#send")).await?.submit().await?;
    let refused = wait_contains(browser, "#send-error", "dead-letter queue of").await?;
    assert!(refused.contains("nothing was sent"), "{refused}");
    browser.goto(&format!("{base}/send")).await?;

    // The send form checks the JSON before sending anything, then sends.
    let refused = send_form(browser, "payload", "{\"url\": ", "#send-error").await?;
    assert!(
        refused.contains("not valid JSON") && refused.contains("nothing was sent"),
        "{refused}"
    );
    let sent = r#"{"url": "https://hooks.example/sent"}"#;
    send_form(browser, "payload", sent, "#sent-id").await?;
    wait_for(Duration::from_secs(30), Duration::from_millis(200), async || {
        (delivered.load(Ordering::SeqCst) == 3).then_some(())
    })
    .await
    .context("the worker never delivered the job sent from the console")?;

    // A tenant: one SQS would refuse gets NewJob::tenant's words with nothing sent; a good one reaches
    // the handler (its MessageGroupId on this standard queue).
    let refused = send_form(browser, "tenant", "acme corp", "#send-error").await?;
    assert!(
        refused.contains(r#"tenant "acme corp" cannot be sent"#)
            && refused.contains("' ' at position 4")
            && refused.contains("nothing was sent"),
        "{refused}"
    );
    send_form(browser, "tenant", "acme-42", "#sent-id").await?;
    wait_for(Duration::from_secs(30), Duration::from_millis(200), async || {
        (delivered.load(Ordering::SeqCst) == 4).then_some(())
    })
    .await
    .context("the worker never delivered the job sent with a tenant")?;
    assert_eq!(
        *tenants.lock().unwrap(),
        [None, None, None, Some("acme-42".to_owned())],
        "only the last job had a tenant"
    );
    browser
        .form(Locator::Css("#send"))
        .await?
        .set_by_name("tenant", "")
        .await?;

    // A delay: a bad one is refused with nothing sent, a good one leaves the job delayed in the queue.
    let refused = send_form(browser, "delay_secs", "soon", "#send-error").await?;
    assert!(
        refused.contains("\"delay_secs\"") && refused.contains("whole number of seconds"),
        "{refused}"
    );
    send_form(browser, "delay_secs", "600", "#sent-id").await?;
    let delayed = wait_for(Duration::from_secs(10), Duration::from_millis(200), async || {
        let depth = conveyor_sqs::admin::describe(sqs, &queue.url).await.ok()?.depth;
        (depth.delayed == 1).then_some(depth.delayed)
    })
    .await
    .context("the job sent with a 600 s delay is not delayed in the queue")?;
    assert_eq!(delayed, 1);
    assert_eq!(delivered.load(Ordering::SeqCst), 4, "the delayed job did not run");

    // Long moves can be stopped. Thirty more dead letters, redriven "all matching" at 1 per second:
    // the confirmation counts them from the peek, and the task stops after its first batch of ten.
    for n in 0..30 {
        sqs.send_message()
            .queue_url(&dlq_url)
            .message_body(json!({ "id": n }).to_string())
            .send()
            .await?;
    }
    browser
        .goto(&format!("{base}/dlq?queue={}", query(&queue.url)))
        .await?;
    click(browser, "#peek").await?;
    wait_text(browser, "#dlq-peeked", "32", false).await?;
    browser
        .form(Locator::Css("#dead-letters"))
        .await?
        .set_by_name("rate", "1")
        .await?;
    click(browser, "#redrive-filter").await?;
    wait_text(browser, "#confirm-count", "32", false).await?;
    click(browser, "#confirm").await?;
    click(browser, "#stop-task").await?;
    let stopped = wait_contains(browser, "#task-status[data-finished=\"true\"]", "stopped").await?;
    let moved: u64 = text(browser, "#task-moved").await.unwrap_or_default().parse()?;
    assert!(moved < 32, "a stopped redrive moved {moved} of 32: {stopped}");
    browser.goto(&format!("{base}/tasks")).await?;
    let listed = wait_contains(browser, "#tasks", "stopped").await?;
    assert!(
        listed.contains("done"),
        "the earlier redrive is listed too: {listed}"
    );

    // SQS's own move tasks are listed on the dead-letter page, and a running one is cancelled there.
    let dlq_arn = queue.dlq_arn.clone().context("the test queue has a DLQ")?;
    let (_, left, _) = (
        0,
        conveyor_sqs::admin::describe(sqs, &dlq_url).await?.depth.visible,
        0,
    );
    conveyor_sqs::admin::start_move_task(sqs, &dlq_arn, Some(&elsewhere.arn), Some(1)).await?;
    browser
        .goto(&format!("{base}/dlq?queue={}", query(&queue.url)))
        .await?;
    wait_for(Duration::from_secs(30), Duration::from_millis(300), async || {
        browser.refresh().await.ok()?;
        browser.find(Locator::Css(".cancel-task")).await.ok()
    })
    .await
    .context("the running SQS move task has a Cancel button")?
    .click()
    .await?;
    wait_for(Duration::from_secs(30), Duration::from_millis(300), async || {
        browser.refresh().await.ok()?;
        text(browser, ".move-task-status")
            .await
            .filter(|status| status.starts_with("CANCEL"))
    })
    .await
    .context("the cancelled SQS move task is listed as cancelled")?;
    let moved_away = conveyor_sqs::admin::describe(sqs, &elsewhere.url)
        .await?
        .depth
        .visible;
    assert!(
        moved_away < left,
        "the cancelled task moved {moved_away} of {left}"
    );

    // Delete by filter: three dead letters of a job type nobody wants, deleted after a confirmation
    // that counts them from the peek; the others stay. Without a filter it is refused.
    for n in 0..3 {
        sqs.send_message()
            .queue_url(&dlq_url)
            .message_body(json!({ "n": n }).to_string())
            .message_attributes(
                conveyor_core::message::JOB_TYPE_ATTRIBUTE,
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("obsolete")
                    .build()?,
            )
            .send()
            .await?;
    }
    let obsolete = format!("{base}/dlq?queue={}&job_type=obsolete", query(&queue.url));
    browser.goto(&obsolete).await?;
    click(browser, "#peek").await?;
    wait_text(browser, "#dlq-matching", "3", false).await?;
    click(browser, "#delete-filter").await?;
    wait_text(browser, "#confirm-count", "3", false).await?;
    click(browser, "#confirm").await?;
    wait_text(browser, "#task-status[data-finished=\"true\"] .ok", "done", false).await?;
    assert_eq!(text(browser, "#task-moved").await.as_deref(), Some("3"));
    browser.goto(&obsolete).await?;
    click(browser, "#peek").await?;
    wait_text(browser, "#dlq-matching", "0", false).await?;
    let unfiltered = http
        .post(format!("{base}/dlq/act"))
        .bearer_auth(TOKEN)
        .form(&[
            ("csrf", csrf.as_str()),
            ("queue", queue.url.as_str()),
            ("action", "delete_filter"),
        ])
        .send()
        .await?;
    assert_eq!(unfiltered.status(), 400);
    assert!(unfiltered.text().await?.contains("needs a filter"));

    shutdown.cancel();
    running.await??;
    Ok(())
}
