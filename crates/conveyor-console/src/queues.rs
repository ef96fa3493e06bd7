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

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::html::{Nav, card, csrf_field, esc, hidden, page, problem, query_value};
use crate::state::AppState;
use crate::workers::WorkerView;

/// One refresh's numbers.
struct Snapshot {
    queues: Vec<Result<Stats, String>>,
    workers: Vec<WorkerView>,
    listing_error: Option<String>,
    requests: u64,
    millis: u128,
}

async fn snapshot(state: &AppState) -> Snapshot {
    let started = Instant::now();
    let before = state.requests.total();
    let (urls, listing_error) = match state.queue_urls().await {
        Ok(urls) => (urls, None),
        Err(error) => (state.fixed_urls.clone(), Some(display_chain(&error))),
    };
    let (queues, workers) = tokio::join!(stats_of(&state.sqs, &urls), state.workers.scrape());
    let queues = queues
        .into_iter()
        .map(|read| read.map_err(|(url, error)| format!("{url}: {}", display_chain(&error))))
        .collect();
    Snapshot {
        queues,
        workers,
        listing_error,
        requests: state.requests.total() - before,
        millis: started.elapsed().as_millis(),
    }
}

pub(crate) async fn overview(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = snapshot(&state).await;
    let every = state.config.refresh.as_millis();
    let body = format!(
        "<div id=\"live\" data-live=\"/live\" data-every=\"{every}\">{}</div>\
         <noscript><p class=\"muted\">Reload the page for fresh numbers.</p></noscript>",
        render(&state, &snapshot)
    );
    page("Queues", Nav::Queues, &body).into_response()
}

/// The live part of the queues page (fetched by the page's script every refresh).
pub(crate) async fn live(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = snapshot(&state).await;
    Html(render(&state, &snapshot)).into_response()
}

fn render(state: &AppState, snapshot: &Snapshot) -> String {
    let good: Vec<&Stats> = snapshot
        .queues
        .iter()
        .filter_map(|read| read.as_ref().ok())
        .collect();
    let sum = |pick: fn(&Stats) -> u64| good.iter().map(|stats| pick(stats)).sum::<u64>();
    let visible = sum(|stats| stats.queue.queue.depth.visible);
    let in_flight = sum(|stats| stats.queue.queue.depth.in_flight);
    let delayed = sum(|stats| stats.queue.queue.depth.delayed);
    let dead = sum(|stats| {
        stats
            .dead_letter
            .as_ref()
            .map_or(0, |dlq| dlq.queue.depth.visible)
    });
    let mut cards = vec![
        card("Visible", &visible.to_string(), false, "total-visible"),
        card("In flight", &in_flight.to_string(), false, "total-in-flight"),
        card("Delayed", &delayed.to_string(), false, "total-delayed"),
        card("Dead letters", &dead.to_string(), dead > 0, "total-dead"),
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
            &rate(|worker| worker.per_second),
            false,
            "rate-ok",
        ));
        cards.push(card(
            "Errors",
            &rate(|worker| worker.errors_per_second),
            errors > 0.0,
            "rate-errors",
        ));
    }
    let mut html = format!("<div class=\"cards\">{}</div>", cards.concat());
    if let Some(error) = &snapshot.listing_error {
        html.push_str(&format!(
            "<p class=\"bad\">Listing queues failed: {}</p>",
            esc(error)
        ));
    }
    html.push_str(
        "<div class=\"scroll\"><table id=\"queues\"><thead><tr><th>Queue</th><th class=\"n\">Visible</th>\
         <th class=\"n\">In flight</th><th class=\"n wide\">Delayed</th><th class=\"wide\">DLQ</th><th class=\"n\">DLQ depth</th>\
         <th class=\"n wide\">Max receives</th><th class=\"n wide\">Visibility</th><th></th></tr></thead><tbody>",
    );
    for read in &snapshot.queues {
        match read {
            Ok(stats) => html.push_str(&queue_row(state, stats)),
            Err(error) => html.push_str(&format!(
                "<tr><td colspan=\"9\" class=\"bad\">{}</td></tr>",
                esc(error)
            )),
        }
    }
    html.push_str("</tbody></table></div>");
    if !snapshot.workers.is_empty() {
        html.push_str(&workers_table(&snapshot.workers));
    }
    html.push_str(&format!(
        "<p class=\"muted\" id=\"refresh-cost\">This refresh: <span id=\"refresh-requests\">{}</span> AWS \
         requests for {} queues, {} ms.</p>",
        snapshot.requests,
        snapshot.queues.len(),
        snapshot.millis
    ));
    html
}

fn queue_row(state: &AppState, stats: &Stats) -> String {
    let queue = &stats.queue.queue;
    let depth = &queue.depth;
    let (dlq_cell, dlq_depth, dlq_link) = match &stats.dead_letter {
        Some(dlq) => (
            esc(dlq.queue.name()),
            dlq.queue.depth.visible + dlq.queue.depth.in_flight + dlq.queue.depth.delayed,
            Some(format!("/dlq?queue={}", query_value(&queue.url))),
        ),
        None if !stats.dead_letter_of.is_empty() => (
            "<span class=\"muted\">is a DLQ</span>".to_owned(),
            0,
            Some(format!("/dlq?queue={}", query_value(&queue.url))),
        ),
        None => ("<span class=\"muted\">none</span>".to_owned(), 0, None),
    };
    let dead_letters = match &dlq_link {
        Some(link) => format!("<a href=\"{}\">Dead letters</a>", esc(link)),
        None => String::new(),
    };
    let max_receives = queue
        .redrive
        .as_ref()
        .and_then(|policy| policy.max_receive_count)
        .map_or("–".to_owned(), |count| count.to_string());
    let visibility = queue
        .visibility_timeout
        .map_or("–".to_owned(), |timeout| format!("{} s", timeout.as_secs()));
    let dlq_class = if dlq_depth > 0 { "n bad" } else { "n" };
    format!(
        "<tr data-queue=\"{name}\"><td>{name}{fifo}</td><td class=\"n visible\">{visible}</td>\
         <td class=\"n\">{in_flight}</td><td class=\"n wide\">{delayed}</td><td class=\"wide\">{dlq_cell}</td>\
         <td class=\"{dlq_class} dlq-depth\">{dlq_depth}</td><td class=\"n wide\">{max_receives}</td>\
         <td class=\"n wide\">{visibility}</td><td>{dead_letters} \
         <form class=\"inline\" method=\"post\" action=\"/queues/purge\">{csrf}{url}\
         <button class=\"danger\" type=\"submit\">Purge…</button></form></td></tr>",
        name = esc(queue.name()),
        fifo = if queue.fifo {
            " <span class=\"muted\">FIFO</span>"
        } else {
            ""
        },
        visible = depth.visible,
        in_flight = depth.in_flight,
        delayed = depth.delayed,
        csrf = csrf_field(state),
        url = hidden("queue", &queue.url),
    )
}

fn workers_table(workers: &[WorkerView]) -> String {
    let rate = |value: Option<f64>| value.map_or("…".to_owned(), |value| format!("{value:.1}/s"));
    let rows: String = workers
        .iter()
        .map(|worker| match &worker.error {
            Some(error) => format!(
                "<tr><td>{}</td><td colspan=\"6\" class=\"bad\">{}</td></tr>",
                esc(&worker.url),
                esc(error)
            ),
            None => format!(
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n wide\">{}</td>\
                 <td class=\"n wide\">{:.0}</td><td class=\"n wide succeeded-total\">{:.0}</td><td class=\"n{}\">{:.0}</td></tr>",
                esc(&worker.url),
                rate(worker.per_second),
                rate(worker.errors_per_second),
                worker.in_flight,
                worker.received,
                worker.succeeded,
                if worker.leases_lost > 0.0 { " bad" } else { "" },
                worker.leases_lost,
            ),
        })
        .collect();
    format!(
        "<h2>Workers</h2><div class=\"scroll\"><table id=\"workers\"><thead><tr><th>Worker</th>\
         <th class=\"n\">Succeeded</th><th class=\"n\">Errors</th><th class=\"n wide\">In flight</th>\
         <th class=\"n wide\">Received</th><th class=\"n wide\">Succeeded total</th><th class=\"n\">Leases lost</th>\
         </tr></thead><tbody>{rows}</tbody></table></div>"
    )
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
        let body = format!(
            "<p>Delete <strong>every message</strong> of <code>{}</code>? This cannot be undone; SQS takes up \
             to 60 seconds and allows one purge per queue per 60 seconds.</p>\
             <form method=\"post\" action=\"/queues/purge\">{}{}{}\
             <button class=\"danger\" type=\"submit\" id=\"confirm\">Yes, purge it</button> \
             <a href=\"/\">Cancel</a></form>",
            esc(url),
            csrf_field(&state),
            hidden("queue", url),
            hidden("confirm", "yes")
        );
        return page("Purge a queue?", Nav::Queues, &body).into_response();
    }
    tracing::info!(queue = %url, "console: purge");
    match purge_queue(&state.sqs, url).await {
        Ok(()) => page(
            "Purged",
            Nav::Queues,
            &format!(
                "<p class=\"ok\">Purge of <code>{}</code> started: SQS deletes every message within 60 seconds.</p>\
                 <p><a href=\"/\">Back to the queues</a></p>",
                esc(url)
            ),
        )
        .into_response(),
        Err(error) => problem(StatusCode::BAD_GATEWAY, "Purge failed", &display_chain(&error)),
    }
}
