//! Delayed jobs: the long delays a producer kept in the timer table (`Producer::with_timers`), per queue,
//! soonest first, each with "run now", "reschedule" and "cancel" (`conveyor delays` does the same).
//!
//! Jobs delayed by SQS hops travel inside the queue and are not listed: the page says so.
//!
//! Nothing waits silently: a job due more than two minutes ago that no relay claimed is marked overdue,
//! with what that means and the fix, and the page says when a relay was last seen for the queue (the
//! relays' mark, see `conveyor_core`'s timer note).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use conveyor_core::Timers;
use conveyor_core::port::{OVERDUE_HINT, RelayMark, TimerStore};
use conveyor_core::runtime::{format_age, format_time};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::{FieldError, Fields};
use crate::html::{Nav, csrf_field, hidden, page, problem, query_value};
use crate::state::AppState;

/// Delayed jobs listed per page at most.
const LISTED: usize = 200;
/// The furthest a reschedule may move a delayed job: SQS's longest retention (14 days), as a producer's
/// delay.
const MAX_IN_SECS: u64 = conveyor_core::runtime::MAX_TOTAL_DELAY.as_secs();

/// What `POST /delays/act` is asked to do, parsed before anything is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DelayAction {
    /// Send the job now.
    Run,
    /// Move its due time to this one.
    Reschedule(SystemTime),
    /// Drop it.
    Cancel,
}

impl DelayAction {
    /// The action `fields` ask for at `now` (`in_secs` checked: a due time the clock cannot hold, or
    /// one past [`MAX_IN_SECS`], is refused naming the field).
    pub(crate) fn parse(fields: &Fields, now: SystemTime) -> Result<Self, FieldError> {
        const ACTIONS: [&str; 3] = ["run", "reschedule", "cancel"];
        match fields.choice("action", &ACTIONS)? {
            Some("run") => Ok(Self::Run),
            Some("cancel") => Ok(Self::Cancel),
            Some(_) => {
                let expected = || format!("a whole number of seconds from 0 to {MAX_IN_SECS}");
                let secs = fields
                    .whole("in_secs", 0, MAX_IN_SECS, "seconds")?
                    .ok_or_else(|| FieldError::new("in_secs", "", expected()))?;
                now.checked_add(Duration::from_secs(secs))
                    .map(Self::Reschedule)
                    .ok_or_else(|| FieldError::new("in_secs", &secs.to_string(), expected()))
            }
            None => Err(FieldError::new(
                "action",
                "",
                format!("one of {}", ACTIONS.join(", ")),
            )),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Reschedule(_) => "reschedule",
            Self::Cancel => "cancel",
        }
    }
}

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
    // Confined before any AWS call for it: the same answer whether or not such a queue exists.
    if fields
        .get("queue")
        .is_some_and(|queue| !urls.iter().any(|url| url == queue))
    {
        tracing::warn!("console: a queue it does not show was asked for and refused");
        return crate::dlq::not_shown("Delayed jobs");
    }
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
    let overdue = listed.iter().filter(|timer| timer.is_overdue(now)).count();
    html! {
        @if overdue > 0 {
            p class="bad" id="delays-overdue" {
                (overdue) " delayed job(s) OVERDUE: " (OVERDUE_HINT)
            }
        }
        (relay_note(&timers, now).await)
        table id="delays" {
            thead { tr { th { "Id" } th { "Job type" } th { "Due" } th { "In" } th { "State" } th { "Actions" } } }
            tbody {
                @for timer in &listed {
                    tr {
                        td { code { (timer.id) } }
                        td { (timer.job_type) }
                        td { (format_time(timer.due)) }
                        td { (timer.due.duration_since(now).map_or_else(|_| "due".to_owned(), format_age)) }
                        td {
                            @if timer.is_overdue(now) {
                                strong class="bad overdue" { "OVERDUE" } " "
                            }
                            (timer.describe_state(now))
                        }
                        td { (actions(state, queue, &timer.id)) }
                    }
                }
            }
        }
    }
}

/// When a relay was last seen for the queue (nothing when the store keeps no marks).
async fn relay_note(timers: &Timers, now: SystemTime) -> Markup {
    if !timers.keeps_relay_marks() {
        return html! {};
    }
    let mark: Option<RelayMark> = match timers.relay_mark().await {
        Ok(mark) => mark,
        Err(error) => {
            return html! { p class="bad" id="delays-relay" { "The relay's mark cannot be read: " (error) } };
        }
    };
    match mark {
        Some(mark) if mark.is_fresh(now) => html! {
            p class="muted" id="delays-relay" { "Relay: seen at " (format_time(mark.seen)) "." }
        },
        Some(mark) => html! {
            p class="bad" id="delays-relay" {
                "Relay: not seen since " (format_time(mark.seen)) ": no relay runs for this queue."
            }
        },
        None => html! {
            p class="bad" id="delays-relay" { "Relay: never seen for this queue: no relay has run for it." }
        },
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
    let action = match DelayAction::parse(&fields, SystemTime::now()) {
        Ok(action) => action,
        Err(error) => return error.refusal("Delayed jobs"),
    };
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
        return crate::dlq::not_shown("Delayed jobs");
    }
    let timers = timers(&state, Arc::clone(store), queue);
    let answer = match action {
        DelayAction::Run => match timers.run_now(id).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!(
                "{}, or a relay is sending it",
                conveyor_core::port::not_waiting(id)
            )),
            Err(error) => Err(error.to_string()),
        },
        DelayAction::Reschedule(due) => changed(
            timers
                .reschedule(id, due)
                .await
                .map_err(|error| error.to_string()),
            id,
            "rescheduled",
        ),
        DelayAction::Cancel => changed(
            timers.cancel(id).await.map_err(|error| error.to_string()),
            id,
            "cancelled",
        ),
    };
    match answer {
        Ok(()) => {
            tracing::warn!(
                queue,
                timer = id,
                action = action.name(),
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
