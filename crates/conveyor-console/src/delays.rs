//! Delayed jobs: the long delays a producer kept in the timer table (`Producer::with_timers`), per queue,
//! soonest first, each with "run now", "reschedule" and "cancel" (`conveyor delays` does the same).
//!
//! Jobs delayed by SQS hops travel inside the queue and are not listed: the page says so.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use conveyor_core::Timers;
use conveyor_core::port::TimerStore;
use conveyor_core::runtime::{format_age, format_time};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::html::{Nav, csrf_field, hidden, page, problem, query_value};
use crate::state::AppState;

/// Delayed jobs listed per page at most.
const LISTED: usize = 200;

pub(crate) async fn show(State(state): State<Arc<AppState>>, Query(fields): Query<Fields>) -> Response {
    let Some(store) = &state.timers else {
        let body = html! {
            p class="note" { "Delayed jobs are read from the idempotency table: start the console with --table NAME." }
        };
        return page("Delayed jobs", Nav::Delays, body).into_response();
    };
    let urls = match state.queue_urls().await {
        Ok(urls) => urls,
        Err(error) => return problem(StatusCode::BAD_GATEWAY, "Delayed jobs", &error.to_string()),
    };
    let queue = fields
        .get("queue")
        .map(str::to_owned)
        .or_else(|| urls.first().cloned());
    let form = html! {
        form class="filters" method="get" action="/delays" id="delays-queue" {
            label { "Queue"
                select name="queue" {
                    @for url in &urls {
                        option value=(url) selected[Some(url) == queue.as_ref()] { (url) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
    };
    let listing = match &queue {
        Some(queue) => listing(&state, timers(&state, Arc::clone(store), queue), queue).await,
        None => html! { p class="muted" { "No queue to show: start the console with --queue or --prefix." } },
    };
    let body = html! {
        (form)
        (listing)
        p class="muted" {
            "Jobs sent with a delay over 15 minutes without the timer table hop through the queue and are not \
             listed; cancel those by key (Producer::cancel)."
        }
    };
    page("Delayed jobs", Nav::Delays, body).into_response()
}

/// The queue's timers, sent through the console's SQS client.
fn timers(state: &AppState, store: Arc<dyn TimerStore>, queue: &str) -> Timers {
    Timers::new(
        store,
        Arc::new(conveyor_sqs::SqsSender::new(state.sqs.clone())),
        queue,
    )
}

async fn listing(state: &AppState, timers: Timers, queue: &str) -> Markup {
    let listed = match timers.list(LISTED).await {
        Ok(listed) => listed,
        Err(error) => return html! { p class="bad" { "Reading the delayed jobs failed: " (error) } },
    };
    if listed.is_empty() {
        return html! { p id="delays-empty" { "No delayed jobs wait for this queue." } };
    }
    let now = SystemTime::now();
    html! {
        table id="delays" {
            thead { tr { th { "Id" } th { "Job type" } th { "Due" } th { "In" } th { "State" } th { "Actions" } } }
            tbody {
                @for timer in &listed {
                    tr {
                        td { code { (timer.id) } }
                        td { (timer.job_type) }
                        td { (format_time(timer.due)) }
                        td { (timer.due.duration_since(now).map_or_else(|_| "due".to_owned(), format_age)) }
                        td { (timer.describe_state(now)) }
                        td { (actions(state, queue, &timer.id)) }
                    }
                }
            }
        }
    }
}

/// One small form per action, each carrying the CSRF value.
fn actions(state: &AppState, queue: &str, id: &str) -> Markup {
    let form = |action: &str, label: &str, extra: Markup| {
        html! {
            form class="inline" method="post" action="/delays/act" {
                (csrf_field(state))
                (hidden("queue", queue))
                (hidden("id", id))
                (hidden("action", action))
                (extra)
                button type="submit" { (label) }
            }
        }
    };
    html! {
        (form("run", "Run now", html! {}))
        (form("reschedule", "Reschedule", html! {
            input type="number" name="in_secs" min="0" placeholder="in seconds" required;
        }))
        (form("cancel", "Cancel", html! {}))
    }
}

pub(crate) async fn act(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let Some(store) = &state.timers else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Delayed jobs",
            "Start the console with --table NAME.",
        );
    };
    let (Some(queue), Some(id)) = (fields.get("queue"), fields.get("id")) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Delayed jobs",
            "Which queue and which delayed job?",
        );
    };
    let known = state
        .queue_urls()
        .await
        .map(|urls| urls.iter().any(|url| url == queue));
    if !known.unwrap_or(false) {
        return problem(
            StatusCode::BAD_REQUEST,
            "Delayed jobs",
            "That queue is not one this console shows.",
        );
    }
    let timers = timers(&state, Arc::clone(store), queue);
    let answer = match fields.get("action").unwrap_or_default() {
        "run" => match timers.run_now(id).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!(
                "{}, or a relay is sending it",
                conveyor_core::port::not_waiting(id)
            )),
            Err(error) => Err(error.to_string()),
        },
        "reschedule" => {
            let Some(secs) = fields
                .get("in_secs")
                .and_then(|secs| secs.trim().parse::<u64>().ok())
            else {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "Reschedule",
                    "Give the new due time in whole seconds from now.",
                );
            };
            let due = SystemTime::now() + Duration::from_secs(secs);
            changed(
                timers
                    .reschedule(id, due)
                    .await
                    .map_err(|error| error.to_string()),
                id,
                "rescheduled",
            )
        }
        "cancel" => changed(
            timers.cancel(id).await.map_err(|error| error.to_string()),
            id,
            "cancelled",
        ),
        _ => return problem(StatusCode::BAD_REQUEST, "Delayed jobs", "Unknown action."),
    };
    match answer {
        Ok(()) => {
            tracing::warn!(
                queue,
                timer = id,
                action = fields.get("action").unwrap_or_default(),
                "console: delayed job changed"
            );
            Redirect::to(&format!("/delays?queue={}", query_value(queue))).into_response()
        }
        Err(message) => problem(StatusCode::CONFLICT, "Delayed jobs", &message),
    }
}

fn changed(change: Result<conveyor_core::TimerChange, String>, id: &str, done: &str) -> Result<(), String> {
    change?.describe(id, done).map(|_| ())
}
