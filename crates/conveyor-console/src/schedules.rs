//! Schedules: who leads a schedule set, its run-time schedules, and one schedule's state and run
//! history (`conveyor schedules history` prints the same), read from the idempotency table.
//!
//! The code's schedules live in the application, not in the table: look one up by name. A schedule is
//! paused or resumed from its page (`POST /schedules/act`, the store's `pause` / `resume`, as `conveyor
//! schedules pause|resume`): a paused schedule's ticks are skipped, never replayed. Adding and
//! triggering need the schedule's definition and stay the CLI's (`conveyor schedules add|trigger`).

use std::sync::Arc;
use std::time::SystemTime;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use conveyor_core::runtime::format_time;
use conveyor_schedule::{DEFAULT_SET, ScheduleState, ScheduleStore as _, TickStore};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::html::{Nav, csrf_field, hidden, page, problem, query_value};
use crate::state::AppState;

pub(crate) async fn show(State(state): State<Arc<AppState>>, Query(fields): Query<Fields>) -> Response {
    let body = match &state.schedules {
        Some(store) => lookup(&state, store, &fields).await,
        None => html! {
            p class="note" { "Schedules are read from the idempotency table: start the console with --table NAME." }
        },
    };
    page("Schedules", Nav::Schedules, body).into_response()
}

/// `POST /schedules/act`: pauses or resumes the named schedule, then shows it.
pub(crate) async fn act(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let Some(store) = &state.schedules else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Schedules",
            "Start the console with --table NAME.",
        );
    };
    let Some(name) = fields.get("name") else {
        return problem(StatusCode::BAD_REQUEST, "Schedules", "Which schedule?");
    };
    let now = SystemTime::now();
    let result = match fields.get("action").unwrap_or_default() {
        "pause" => store.pause(name, now).await,
        "resume" => store.resume(name, now).await,
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Schedules",
                "Unknown action: pause or resume.",
            );
        }
    };
    if let Err(error) = result {
        return problem(
            StatusCode::BAD_GATEWAY,
            "Schedules",
            &format!("Nothing changed: {error}"),
        );
    }
    let action = fields.get("action").unwrap_or_default();
    tracing::warn!(schedule = %name, action, "console: schedule {action}d");
    let set = fields.get("set").unwrap_or(DEFAULT_SET);
    Redirect::to(&format!(
        "/schedules?name={}&set={}",
        query_value(name),
        query_value(set)
    ))
    .into_response()
}

async fn lookup(state: &AppState, store: &TickStore, fields: &Fields) -> Markup {
    let set = fields.get("set").unwrap_or(DEFAULT_SET);
    let name = fields.get("name");
    let form = html! {
        form class="filters" method="get" action="/schedules" id="schedule-lookup" {
            label { "Schedule" input name="name" value=(name.unwrap_or_default()); }
            label { "Set" input name="set" value=(set); }
            button type="submit" { "Show" }
        }
    };
    let set_section = set_section(store, set).await;
    let schedule = match name {
        Some(name) => match store.state(name).await {
            Ok(schedule) => {
                html! { (render_state(name, &schedule)) (pause_form(state, name, set, &schedule)) }
            }
            Err(error) => html! { p class="bad" { "Reading schedule " code { (name) } " failed: " (error) } },
        },
        None => html! {},
    };
    html! { (form) (schedule) (set_section) }
}

/// The set's leader and its run-time schedules, each a link to its state.
async fn set_section(store: &TickStore, set: &str) -> Markup {
    let leader = match store.read_lease(set).await {
        Ok(Some(lease)) if !lease.owner.is_empty() => html! {
            code id="schedule-leader" { (lease.owner) } " (takeovers so far: " (lease.epoch) ")"
        },
        Ok(_) => {
            html! { span class="muted" { "none: no scheduler of this set runs, or none has started yet" } }
        }
        Err(error) => html! { span class="bad" { "reading the lease failed: " (error) } },
    };
    let definitions = match store.definitions(set).await {
        Ok(definitions) => {
            let mut names: Vec<String> = definitions.into_keys().collect();
            names.sort();
            names
        }
        Err(error) => return html! { p class="bad" { "Reading the run-time schedules failed: " (error) } },
    };
    let link = |name: &str| format!("/schedules?name={}&set={}", query_value(name), query_value(set));
    html! {
        h2 { "Set " code { (set) } }
        p { "Leader: " (leader) }
        @if definitions.is_empty() {
            p class="muted" { "No run-time schedules in this set (conveyor schedules add)." }
        } @else {
            ul id="runtime-schedules" {
                @for name in &definitions { li { a href=(link(name)) { (name) } } }
            }
        }
    }
}

/// The button that pauses a running schedule or resumes a paused one.
fn pause_form(state: &AppState, name: &str, set: &str, schedule: &ScheduleState) -> Markup {
    let (action, label) = if schedule.paused {
        (
            "resume",
            "Resume (ticks from now on fire; the paused ones are not replayed)",
        )
    } else {
        ("pause", "Pause (its ticks are skipped until resumed)")
    };
    html! {
        form method="post" action="/schedules/act" class="inline" {
            (csrf_field(state))
            (hidden("name", name))
            (hidden("set", set))
            (hidden("action", action))
            button type="submit" id="schedule-toggle" { (label) }
        }
    }
}

/// One schedule's state and its recent runs, newest first.
fn render_state(name: &str, state: &ScheduleState) -> Markup {
    let time = |at: Option<SystemTime>| at.map_or("–".to_owned(), format_time);
    let paused = match (state.paused, state.paused_at) {
        (true, at) => format!("paused since {}", time(at)),
        (false, Some(_)) => format!(
            "running (last pause {} to {})",
            time(state.paused_at),
            time(state.resumed_at)
        ),
        (false, None) => "running".to_owned(),
    };
    html! {
        h2 { "Schedule " code { (name) } }
        div class="scroll" {
            table id="schedule" {
                tbody {
                    tr { th { "State" } td id="schedule-paused" { (paused) } }
                    tr { th { "Runs" } td id="schedule-runs" { (state.runs) } }
                    tr { th { "Last tick (the cursor)" } td { (time(state.last_tick)) } }
                    tr { th { "Last sent" } td { (time(state.last_sent)) } }
                    tr { th { "Last outcome" } td { (state.last_outcome.as_deref().unwrap_or("–")) } }
                }
            }
        }
        @if state.history.is_empty() {
            p class="muted" id="schedule-no-history" {
                "No runs recorded: the name is not a schedule of a running scheduler, or it has not ticked yet."
            }
        } @else {
            div class="scroll" {
                table id="schedule-history" {
                    thead { tr { th { "Tick" } th { "Recorded" } th { "Outcome" } th { "Message id / reason" } } }
                    tbody {
                        @for entry in state.history.iter().rev() {
                            tr {
                                td { (format_time(entry.tick)) }
                                td { (format_time(entry.at)) }
                                td { (entry.outcome) }
                                td { (entry.detail) }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use conveyor_schedule::HistoryEntry;

    use super::*;

    #[test]
    fn a_schedules_state_and_history_are_shown_newest_first_and_escaped() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_963_051);
        let entry = |seconds: u64, outcome: &str, detail: &str| HistoryEntry {
            tick: at + Duration::from_secs(seconds),
            at: at + Duration::from_secs(seconds),
            outcome: outcome.to_owned(),
            detail: detail.to_owned(),
        };
        let state = ScheduleState {
            paused: true,
            paused_at: Some(at + Duration::from_secs(120)),
            runs: 2,
            last_tick: Some(at + Duration::from_secs(60)),
            history: vec![entry(0, "sent", "m-1"), entry(60, "failed", "<SQS> down")],
            ..ScheduleState::default()
        };
        let html = render_state("nightly<report>", &state).into_string();
        assert!(html.contains("nightly&lt;report&gt;"), "{html}");
        assert!(html.contains("paused since 2026-11-29T14:39:31"), "{html}");
        assert!(html.contains("&lt;SQS&gt; down"), "{html}");
        let newest = html.find("&lt;SQS&gt; down").unwrap_or(usize::MAX);
        let oldest = html.find("m-1").unwrap_or(0);
        assert!(newest < oldest, "newest first: {html}");
    }
}
