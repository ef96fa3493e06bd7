//! The queues page: every queue with its DLQ, live; the workers' rates; purge with a confirmation.
//!
//! One refresh reads the queues with [`stats_of`] (the numbers `conveyor stats` prints): one
//! `GetQueueAttributes` per queue, plus `GetQueueUrl` and `GetQueueAttributes` for a DLQ that is not
//! itself listed, plus one `ListQueues` per prefix. The page prints what the refresh cost.

use std::sync::Arc;
use std::time::Instant;

use axum::Form;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use conveyor_sqs::admin::{Stats, display_chain, purge as purge_queue, stats_of};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::history::{Sample, Series, chart};
use crate::html::{Nav, card, csrf_field, hidden, page, problem, query_value};
use crate::state::AppState;
use crate::workers::WorkerView;

/// One refresh's numbers.
pub(crate) struct Snapshot {
    queues: Vec<Result<Stats, String>>,
    workers: Vec<WorkerView>,
    listing_error: Option<String>,
    /// The fair-queue metrics, when the console reads CloudWatch and shows a standard queue.
    fair_queues: Option<crate::fair_queues::FairQueueRead>,
    requests: u64,
    millis: u128,
}

/// Reads the queues and workers, and with `fair_queues` the fair-queue metrics (the page shows them; the
/// chart sampler does not ask: CloudWatch bills each metric read, and the sampler runs with no one
/// watching).
pub(crate) async fn snapshot(state: &AppState, fair_queues: bool) -> Snapshot {
    let started = Instant::now();
    let before = state.requests.total();
    let (urls, listing_error) = match state.queue_urls().await {
        Ok(urls) => (urls, None),
        Err(error) => (state.fixed_urls.clone(), Some(display_chain(&error))),
    };
    // CloudWatch is read beside SQS, under its own deadlines (`fair_queues::deadlines`): a CloudWatch
    // that does not answer delays a refresh by that much at most, once per `RETRY_AFTER`.
    let fair_queues = async {
        match state.cloudwatch.get() {
            Some(cloudwatch) if fair_queues => state.fair_queues.read(cloudwatch, &urls).await,
            _ => None,
        }
    };
    let (queues, workers, fair_queues) =
        tokio::join!(stats_of(&state.sqs, &urls), state.workers.scrape(), fair_queues);
    let queues = queues
        .into_iter()
        .map(|read| read.map_err(|(url, error)| format!("{url}: {}", display_chain(&error))))
        .collect();
    Snapshot {
        queues,
        workers,
        fair_queues,
        listing_error,
        requests: state.requests.total() - before,
        millis: started.elapsed().as_millis(),
    }
}

pub(crate) async fn overview(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = snapshot(&state, true).await;
    let every = state.config.refresh.as_millis();
    let body = html! {
        div id="live" data-live="/live" data-every=(every) { (render(&state, &snapshot)) }
        noscript { p class="muted" { "Reload the page for fresh numbers." } }
    };
    page("Queues", Nav::Queues, body).into_response()
}

/// The live part of the queues page (fetched by the page's script every refresh).
pub(crate) async fn live(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = snapshot(&state, true).await;
    Html(render(&state, &snapshot).into_string()).into_response()
}

/// The totals of `snapshot` across its queues and workers: the cards, and a chart sample.
pub(crate) fn totals(state: &AppState, snapshot: &Snapshot) -> Sample {
    let good: Vec<&Stats> = snapshot
        .queues
        .iter()
        .filter_map(|read| read.as_ref().ok())
        .collect();
    let sum = |pick: fn(&Stats) -> u64| good.iter().map(|stats| pick(stats)).sum::<u64>();
    let rate = |pick: fn(&WorkerView) -> Option<f64>| {
        let rates: Vec<f64> = snapshot.workers.iter().filter_map(pick).collect();
        (!state.workers.is_empty() && !rates.is_empty()).then(|| rates.iter().sum::<f64>())
    };
    Sample {
        visible: sum(|stats| stats.queue.queue.depth.visible),
        in_flight: sum(|stats| stats.queue.queue.depth.in_flight),
        // In flight too: a peek holds dead letters for a moment, and they are still there.
        dead: sum(|stats| {
            stats
                .dead_letter
                .as_ref()
                .map_or(0, |dlq| dlq.queue.depth.visible + dlq.queue.depth.in_flight)
        }),
        succeeded_per_second: rate(|worker| worker.per_second),
        errors_per_second: rate(|worker| worker.errors_per_second),
    }
}

/// The charts of the kept history: depth, dead letters and, with workers, throughput.
fn charts(state: &AppState) -> Markup {
    let samples = state.history.samples();
    if samples.len() < 2 {
        return html! {
            p class="muted" id="charts-pending" {
                "Charts appear after the second sample (one every " (state.config.history_every.as_secs()) " s)."
            }
        };
    }
    let values = |pick: fn(&Sample) -> Option<f64>| samples.iter().map(pick).collect::<Vec<_>>();
    let depth = [
        Series {
            name: "visible",
            class: "s1",
            values: values(|sample| Some(sample.visible as f64)),
        },
        Series {
            name: "in flight",
            class: "s2",
            values: values(|sample| Some(sample.in_flight as f64)),
        },
    ];
    let dead = [Series {
        name: "dead letters",
        class: "s3",
        values: values(|sample| Some(sample.dead as f64)),
    }];
    let throughput = [
        Series {
            name: "succeeded",
            class: "s1",
            values: values(|sample| sample.succeeded_per_second),
        },
        Series {
            name: "errors",
            class: "s3",
            values: values(|sample| sample.errors_per_second),
        },
    ];
    html! {
        div class="charts" {
            (chart("Queue depth", "chart-depth", "", &depth))
            (chart("Dead letters", "chart-dead", "", &dead))
            @if !state.workers.is_empty() {
                (chart("Throughput", "chart-throughput", "/s", &throughput))
            }
        }
    }
}

fn render(state: &AppState, snapshot: &Snapshot) -> Markup {
    let Sample {
        visible,
        in_flight,
        dead,
        ..
    } = totals(state, snapshot);
    let delayed = snapshot
        .queues
        .iter()
        .filter_map(|read| read.as_ref().ok())
        .map(|stats| stats.queue.queue.depth.delayed)
        .sum::<u64>();
    let mut cards = vec![
        card("Visible", visible, false, "total-visible"),
        card("In flight", in_flight, false, "total-in-flight"),
        card("Delayed", delayed, false, "total-delayed"),
        card("Dead letters", dead, dead > 0, "total-dead"),
    ];
    if !state.workers.is_empty() {
        let rate = |pick: fn(&WorkerView) -> Option<f64>| {
            let rates: Vec<f64> = snapshot.workers.iter().filter_map(pick).collect();
            if rates.is_empty() {
                "…".to_owned()
            } else {
                format!("{:.1}/s", rates.iter().sum::<f64>())
            }
        };
        let errors = snapshot
            .workers
            .iter()
            .filter_map(|worker| worker.errors_per_second)
            .sum::<f64>();
        cards.push(card(
            "Succeeded",
            rate(|worker| worker.per_second),
            false,
            "rate-ok",
        ));
        cards.push(card(
            "Errors",
            rate(|worker| worker.errors_per_second),
            errors > 0.0,
            "rate-errors",
        ));
    }
    html! {
        div class="cards" { @for card in &cards { (card) } }
        (charts(state))
        @if let Some(error) = &snapshot.listing_error {
            p class="bad" { "Listing queues failed: " (error) }
        }
        div class="scroll" {
            table id="queues" {
                thead {
                    tr {
                        th { "Queue" }
                        th class="n" { "Visible" }
                        th class="n" { "In flight" }
                        th class="n wide" { "Delayed" }
                        th class="wide" { "DLQ" }
                        th class="n" { "DLQ depth" }
                        th class="n wide" { "Max receives" }
                        th class="n wide" { "Visibility" }
                        th {}
                    }
                }
                tbody {
                    @for read in &snapshot.queues {
                        @match read {
                            Ok(stats) => (queue_row(state, stats)),
                            Err(error) => tr { td colspan="9" class="bad" { (error) } },
                        }
                    }
                }
            }
        }
        @if let Some(read) = &snapshot.fair_queues {
            (crate::fair_queues::render(read))
        }
        @if !snapshot.workers.is_empty() {
            (workers_table(&snapshot.workers))
        }
        p class="muted" id="refresh-cost" {
            "This refresh: " span id="refresh-requests" { (snapshot.requests) } " AWS requests for "
            (snapshot.queues.len()) " queues, " (snapshot.millis) " ms. "
            a href="/tasks" id="tasks-link" { "Redrives and deletes started here" }
        }
    }
}

fn queue_row(state: &AppState, stats: &Stats) -> Markup {
    let queue = &stats.queue.queue;
    let depth = &queue.depth;
    let dlq_link = format!("/dlq?queue={}", query_value(&queue.url));
    let (dlq_cell, dlq_depth, dlq_link) = match &stats.dead_letter {
        Some(dlq) => (
            html! { (dlq.queue.name()) },
            dlq.queue.depth.visible + dlq.queue.depth.in_flight + dlq.queue.depth.delayed,
            Some(dlq_link),
        ),
        None if !stats.dead_letter_of.is_empty() => {
            (html! { span class="muted" { "is a DLQ" } }, 0, Some(dlq_link))
        }
        None => (html! { span class="muted" { "none" } }, 0, None),
    };
    let max_receives = queue
        .redrive
        .as_ref()
        .and_then(|policy| policy.max_receive_count)
        .map_or("–".to_owned(), |count| count.to_string());
    let visibility = queue
        .visibility_timeout
        .map_or("–".to_owned(), |timeout| format!("{} s", timeout.as_secs()));
    let dlq_class = if dlq_depth > 0 {
        "n bad dlq-depth"
    } else {
        "n dlq-depth"
    };
    html! {
        tr data-queue=(queue.name()) {
            td { (queue.name()) @if queue.fifo { " " span class="muted" { "FIFO" } } }
            td class="n visible" { (depth.visible) }
            td class="n" { (depth.in_flight) }
            td class="n wide" { (depth.delayed) }
            td class="wide" { (dlq_cell) }
            td class=(dlq_class) { (dlq_depth) }
            td class="n wide" { (max_receives) }
            td class="n wide" { (visibility) }
            td {
                @if let Some(link) = &dlq_link { a href=(link) { "Dead letters" } }
                " "
                form class="inline" method="post" action="/queues/purge" {
                    (csrf_field(state))
                    (hidden("queue", &queue.url))
                    button class="danger" type="submit" { "Purge…" }
                }
            }
        }
    }
}

/// A worker's address without its scheme (`127.0.0.1:9100`): the column fits a phone.
fn address(url: &str) -> &str {
    url.split_once("://").map_or(url, |(_, rest)| rest)
}

fn workers_table(workers: &[WorkerView]) -> Markup {
    let rate = |value: Option<f64>| value.map_or("…".to_owned(), |value| format!("{value:.1}/s"));
    let whole = |value: f64| format!("{value:.0}");
    html! {
        h2 { "Workers" }
        div class="scroll" {
            table id="workers" {
                thead {
                    tr {
                        th { "Worker" }
                        th class="n" { "Succeeded" }
                        th class="n" { "Errors" }
                        th class="n wide" { "In flight" }
                        th class="n wide" { "Received" }
                        th class="n wide" { "Succeeded total" }
                        th class="n" { "Leases lost" }
                    }
                }
                tbody {
                    @for worker in workers {
                        @match &worker.error {
                            Some(error) => tr {
                                td { (address(&worker.url)) }
                                td colspan="6" class="bad" { (error) }
                            },
                            None => tr {
                                td { (address(&worker.url)) }
                                td class="n" { (rate(worker.per_second)) }
                                td class="n" { (rate(worker.errors_per_second)) }
                                td class="n wide" { (worker.in_flight) }
                                td class="n wide" { (whole(worker.received)) }
                                td class="n wide succeeded-total" { (whole(worker.succeeded)) }
                                td class=(if worker.leases_lost > 0.0 { "n bad" } else { "n" }) {
                                    (whole(worker.leases_lost))
                                }
                            },
                        }
                    }
                }
            }
        }
    }
}

/// `POST /queues/purge`: a confirmation page first, then `PurgeQueue` (the code behind `conveyor purge`).
pub(crate) async fn purge(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let Some(url) = fields.get("queue") else {
        return problem(StatusCode::BAD_REQUEST, "Purge", "No queue was given.");
    };
    let known = state.queue_urls().await.unwrap_or_default();
    if !known.iter().any(|known| known == url) {
        return problem(
            StatusCode::BAD_REQUEST,
            "Purge",
            "This console does not show that queue, so it does not purge it.",
        );
    }
    if fields.get("confirm") != Some("yes") {
        let body = html! {
            p {
                "Delete " strong { "every message" } " of " code { (url) } "? This cannot be undone; SQS \
                 takes up to 60 seconds and allows one purge per queue per 60 seconds."
            }
            form method="post" action="/queues/purge" {
                (csrf_field(&state))
                (hidden("queue", url))
                (hidden("confirm", "yes"))
                button class="danger" type="submit" id="confirm" { "Yes, purge it" }
                " "
                a href="/" { "Cancel" }
            }
        };
        return page("Purge a queue?", Nav::Queues, body).into_response();
    }
    tracing::warn!(queue = %url, "console: purge");
    match purge_queue(&state.sqs, url).await {
        Ok(()) => page(
            "Purged",
            Nav::Queues,
            html! {
                p class="ok" {
                    "Purge of " code { (url) } " started: SQS deletes every message within 60 seconds."
                }
                p { a href="/" { "Back to the queues" } }
            },
        )
        .into_response(),
        Err(error) => problem(StatusCode::BAD_GATEWAY, "Purge failed", &display_chain(&error)),
    }
}
