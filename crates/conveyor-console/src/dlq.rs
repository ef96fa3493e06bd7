//! The dead letters of a queue: peek without consuming, filter, redrive or delete all that match or a
//! selection.
//!
//! The page shows the DLQ's last [`peek`](conveyor_sqs::admin::peek) (the code behind `conveyor dlq
//! peek`: messages are held for a moment and made visible again, each peek adds one to their receive
//! count), taken only when the operator asks (`POST /dlq/peek`) and kept (`peeks.rs`): reloads,
//! filters and "show body" cost no receive. The filter is
//! a [`MoveFilter`], the same value the redrive and the delete then run with, so "redrive what matches"
//! moves what the page showed as matching (and any matching message the peek did not reach). Bodies are
//! shown only for the one message asked for (`show=<id>`) and never logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use conveyor_core::message::Message;
use conveyor_core::port::{PayloadPointer, declared_size};
use conveyor_core::runtime::format_time;
use conveyor_sqs::admin::{
    AdminError, DeadLetterPair, Destinations, MAX_MOVE_RATE, MoveFilter, MoveOptions, MoveTaskStatus,
    PeekOptions, Received, cancel_move_task, delete_messages, describe, display_chain, list_move_tasks,
    move_messages, peek, resolve_dead_letter,
};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::{FieldError, Fields};
use crate::html::{Nav, card, csrf_field, hidden, page, problem, query_value};
use crate::peeks::Peek;
use crate::state::AppState;

/// Messages a page peeks at unless `max` says otherwise.
const DEFAULT_PEEK: usize = 50;
/// The most messages a page peeks at.
const MAX_PEEK: usize = 200;
/// The filter fields, carried from the page to its actions.
const FILTER_FIELDS: [&str; 4] = ["job_type", "reason", "newer", "older"];

/// The longest look-back a time filter takes, in minutes (ten years).
const MAX_FILTER_MINUTES: u64 = 10 * 365 * 24 * 60;

/// The filter fields, parsed: job type, reason text, failed within the last `newer` minutes, failed
/// more than `older` minutes ago. A field that does not parse is an error, never "no filter".
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FilterSpec {
    job_type: Option<String>,
    reason: Option<String>,
    newer: Option<u64>,
    older: Option<u64>,
}

impl FilterSpec {
    /// The filter `fields` describe; `Err` names the first field that is not what it must be.
    pub(crate) fn parse(fields: &Fields) -> Result<Self, FieldError> {
        let minutes = |name| fields.whole(name, 0, MAX_FILTER_MINUTES, "minutes");
        Ok(Self {
            job_type: fields.get("job_type").map(str::to_owned),
            reason: fields.get("reason").map(str::to_owned),
            newer: minutes("newer")?,
            older: minutes("older")?,
        })
    }

    /// True when it selects every message.
    pub(crate) fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The [`MoveFilter`] it means at `now` (checked arithmetic: a time the clock cannot hold is an
    /// error naming its field).
    pub(crate) fn at(&self, now: SystemTime) -> Result<MoveFilter, FieldError> {
        let minutes_ago = |name: &'static str, minutes: Option<u64>| {
            let Some(minutes) = minutes else {
                return Ok(None);
            };
            minutes
                .checked_mul(60)
                .and_then(|secs| now.checked_sub(Duration::from_secs(secs)))
                .map(Some)
                .ok_or_else(|| {
                    FieldError::new(
                        name,
                        &minutes.to_string(),
                        "a number of minutes this machine's clock can count back",
                    )
                })
        };
        Ok(MoveFilter::default()
            .with_job_type(self.job_type.clone())
            .with_reason_contains(self.reason.clone())
            .with_failed_after(minutes_ago("newer", self.newer)?)
            .with_failed_before(minutes_ago("older", self.older)?))
    }
}

/// What `GET /dlq` asks for besides the queue: the filter, the message whose body is shown, and
/// whether its large payload is fetched.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShowQuery {
    filter: MoveFilter,
    show: Option<String>,
    fetch: bool,
}

impl ShowQuery {
    /// The query of `GET /dlq` at `now`; `Err` names the field that is wrong.
    pub(crate) fn parse(fields: &Fields, now: SystemTime) -> Result<Self, FieldError> {
        let filter = FilterSpec::parse(fields)?.at(now)?;
        let fetch = fields.choice("fetch", &["1"])?.is_some();
        Ok(Self {
            filter,
            show: fields.get("show").map(str::to_owned),
            fetch,
        })
    }
}

/// What `POST /dlq/act` is asked to do, parsed before anything is done.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ActForm {
    action: &'static str,
    selected: Vec<String>,
    spec: FilterSpec,
    filter: MoveFilter,
    rate: Option<u32>,
    confirmed: bool,
    destination: Option<String>,
}

/// The actions of `POST /dlq/act`.
const ACTIONS: [&str; 4] = [
    "redrive_selected",
    "redrive_filter",
    "delete_selected",
    "delete_filter",
];

impl ActForm {
    /// The form of `POST /dlq/act` at `now`; `Err` names the field that is wrong.
    pub(crate) fn parse(fields: &Fields, now: SystemTime) -> Result<Self, FieldError> {
        let action = fields
            .choice("action", &ACTIONS)?
            .ok_or_else(|| FieldError::new("action", "", format!("one of {}", ACTIONS.join(", "))))?;
        let spec = FilterSpec::parse(fields)?;
        let filter = spec.at(now)?;
        let rate = fields
            .whole("rate", 1, u64::from(MAX_MOVE_RATE), "messages per second")?
            .map(|rate| u32::try_from(rate).unwrap_or(MAX_MOVE_RATE));
        Ok(Self {
            action,
            selected: fields.all("id").into_iter().map(str::to_owned).collect(),
            spec,
            filter,
            rate,
            confirmed: fields.choice("confirm", &["yes"])?.is_some(),
            destination: fields
                .get("to_other")
                .or_else(|| fields.get("to"))
                .map(str::to_owned),
        })
    }
}

/// The shown queue `fields` name: refused, before any AWS call is made for it, when it is not one of
/// the queues this console shows, with the same answer whether or not such a queue exists.
async fn shown_queue<'a>(
    state: &AppState,
    fields: &'a Fields,
    title: &str,
) -> Result<&'a str, Box<Response>> {
    let Some(url) = fields.get("queue") else {
        return Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            title,
            "No queue was given.",
        )));
    };
    let known = state.queue_urls().await.map_err(|error| {
        Box::new(problem(
            StatusCode::BAD_GATEWAY,
            title,
            &format!(
                "The console's queues could not be listed: {}",
                display_chain(&error)
            ),
        ))
    })?;
    if !known.iter().any(|known| known == url) {
        tracing::warn!("console: a queue it does not show was asked for and refused");
        return Err(Box::new(not_shown(title)));
    }
    Ok(url)
}

/// The one answer for a queue this console does not show, whether or not it exists.
pub(crate) fn not_shown(title: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        title,
        "This console does not show that queue; start it with --queue-url or --queue-prefix for it.",
    )
}

/// The DLQ of `fields`' `queue`, when the console shows that queue: confined first ([`shown_queue`]).
async fn resolve(state: &AppState, fields: &Fields) -> Result<DeadLetterPair, Box<Response>> {
    let url = shown_queue(state, fields, "Dead letters").await?;
    resolve_dead_letter(&state.sqs, url).await.map_err(|error| {
        Box::new(problem(
            StatusCode::BAD_GATEWAY,
            "Dead letters",
            &display_chain(&error),
        ))
    })
}

/// How many messages a peek asks for: the form's `max` (1 to [`MAX_PEEK`]), else [`DEFAULT_PEEK`].
pub(crate) fn peek_size(fields: &Fields) -> Result<usize, FieldError> {
    let max = fields.whole("max", 1, MAX_PEEK as u64, "messages")?;
    Ok(max.map_or(DEFAULT_PEEK, |max| usize::try_from(max).unwrap_or(MAX_PEEK)))
}

/// This page's address for `queue` with the filter of `fields`, plus `extra`.
fn page_url(queue: &str, fields: &Fields, extra: &str) -> String {
    let mut url = format!("/dlq?queue={}", query_value(queue));
    for name in FILTER_FIELDS {
        if let Some(value) = fields.get(name) {
            url.push_str(&format!("&{name}={}", query_value(value)));
        }
    }
    format!("{url}{extra}")
}

/// [`resolve`] for a form posted from the console: refused first without its CSRF value.
async fn resolve_posted(state: &AppState, fields: &Fields) -> Result<DeadLetterPair, Box<Response>> {
    if let Some(refused) = refuse_without_csrf(state, fields) {
        return Err(Box::new(refused));
    }
    resolve(state, fields).await
}

/// `GET /dlq`: the DLQ's kept peek, filtered; without one, the button that takes it. Never receives.
pub(crate) async fn show(State(state): State<Arc<AppState>>, Query(fields): Query<Fields>) -> Response {
    let query = match ShowQuery::parse(&fields, SystemTime::now()) {
        Ok(query) => query,
        Err(error) => return error.refusal("Dead letters"),
    };
    let pair = match resolve(&state, &fields).await {
        Ok(pair) => pair,
        Err(response) => return *response,
    };
    let queue = fields.get("queue").unwrap_or_default();
    let title = format!("Dead letters of {}", source_names(&pair));
    let Some(peek) = state.peeks.get(&pair.dlq.url) else {
        let body = html! {
            (summary(&pair, None, 0))
            p id="no-peek" {
                "No peek yet. SQS shows a message only by receiving it: a peek holds the messages for a                  moment, makes them visible again and adds one to each one's receive count. This page then                  works from what the peek saw (filters, bodies, reloads) until the next peek."
            }
            (peek_form(&state, queue, &fields, DEFAULT_PEEK, "Peek"))
            (move_tasks(&state, &pair, queue).await)
        };
        return page(&title, Nav::Queues, body).into_response();
    };
    let matching: Vec<&Received> = peek
        .messages
        .iter()
        .filter(|received| query.filter.matches(received))
        .collect();
    if let Some(shown) = matching
        .iter()
        .find(|received| Some(received.message.id.as_str()) == query.show.as_deref())
    {
        tracing::warn!(dlq = %pair.dlq.url, message_id = %shown.message.id, "console: a dead letter's body was shown");
    }
    let fetched = fetch_shown(&state, &query, &matching).await;
    let body = html! {
        (summary(&pair, Some(&peek), matching.len()))
        (peek_form(&state, queue, &fields, peek.max, "Peek again"))
        (filter_form(queue, &fields))
        (messages_form(&state, &pair, queue, &fields, &matching, fetched.as_ref()))
        (move_tasks(&state, &pair, queue).await)
    };
    page(&title, Nav::Queues, body).into_response()
}

/// What the page shows of a shown pointer message's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fetched {
    /// The payload, read from its store.
    Body(String),
    /// Why it could not be read.
    Failed(String),
}

/// The shown message's large payload, read from its store when the operator asked (`fetch=1`): `None`
/// when not asked, not a pointer, no store was given, or the pointer names a bucket this console does
/// not read from (it stays a pointer: [`followed`]). The read stops at
/// [`ConsoleConfig::max_payload_bytes`](crate::ConsoleConfig::max_payload_bytes) when the store streams
/// (S3's does), and a larger object is refused either way.
async fn fetch_shown(state: &AppState, query: &ShowQuery, matching: &[&Received]) -> Option<Fetched> {
    if !query.fetch {
        return None;
    }
    let shown = query.show.as_deref()?;
    let message = &matching
        .iter()
        .find(|received| received.message.id == shown)?
        .message;
    let pointer = match PayloadPointer::of(message)? {
        Ok(pointer) => pointer,
        Err(error) => return Some(Fetched::Failed(error.to_string())),
    };
    if !followed(state, &pointer) {
        tracing::warn!(bucket = %pointer.bucket, key = %pointer.key, message_id = %message.id,
            "console: a payload pointer into a bucket it does not read from was not followed");
        return None;
    }
    let Some(store) = state.payloads.get() else {
        return Some(Fetched::Failed(
            "this console was started without a payload store".to_owned(),
        ));
    };
    let max = state.config.max_payload_bytes;
    let bytes = match store.get(&pointer.bucket, &pointer.key).await {
        Ok(bytes) => bytes,
        Err(error) => return Some(Fetched::Failed(error.to_string())),
    };
    tracing::warn!(bucket = %pointer.bucket, key = %pointer.key, message_id = %message.id,
        bytes = bytes.len(), "console: a dead letter's payload was read");
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Some(Fetched::Failed(format!(
            "{pointer} is larger than the {max} bytes this console reads (--max-payload-bytes); read it \
             with the AWS CLI"
        )));
    }
    Some(match String::from_utf8(bytes) {
        Ok(body) => Fetched::Body(body),
        Err(error) => Fetched::Failed(format!("{pointer} is not UTF-8 text: {}", error.utf8_error())),
    })
}

/// Whether the console follows `pointer`: only into the payload buckets it was started with.
fn followed(state: &AppState, pointer: &PayloadPointer) -> bool {
    state.config.payload_buckets.contains(&pointer.bucket)
}

/// SQS's own move tasks of the DLQ (its last ten, one `ListMessageMoveTasks`), a running one with a
/// button that cancels it.
async fn move_tasks(state: &AppState, pair: &DeadLetterPair, queue: &str) -> Markup {
    let tasks = match list_move_tasks(&state.sqs, &pair.dlq.arn.arn).await {
        Ok(tasks) => tasks,
        Err(AdminError::Unsupported { .. }) => {
            return html! { p class="muted" { "This endpoint has no SQS move tasks (ListMessageMoveTasks)." } };
        }
        Err(error) => {
            return html! { p class="bad" { "SQS's move tasks could not be listed: " (display_chain(&error)) } };
        }
    };
    html! {
        h2 { "SQS move tasks" }
        @if tasks.is_empty() {
            p class="muted" id="no-move-tasks" {
                "None: SQS keeps a DLQ's last ten (started with " code { "conveyor dlq redrive" } " or the AWS console)."
            }
        } @else {
            div class="scroll" {
                table id="move-tasks" {
                    thead {
                        tr {
                            th class="wide" { "Started" }
                            th { "Status" }
                            th class="n" { "Moved" }
                            th class="n wide" { "Of" }
                            th class="wide" { "To" }
                            th {}
                        }
                    }
                    tbody {
                        @for task in &tasks { (move_task_row(state, queue, task)) }
                    }
                }
            }
        }
    }
}

fn move_task_row(state: &AppState, queue: &str, task: &MoveTaskStatus) -> Markup {
    let percent = task
        .to_move
        .filter(|total| *total > 0)
        .map(|total| format!(" ({}%)", task.moved.saturating_mul(100) / total))
        .unwrap_or_default();
    let destination = task.destination_name().unwrap_or("each message's source");
    html! {
        tr class="move-task" {
            td class="wide" { (conveyor_core::runtime::format_epoch_millis(task.started_at_ms)) }
            td class="move-task-status" {
                (task.status)
                @if let Some(reason) = &task.failure_reason { ": " (reason) }
            }
            td class="n" { (task.moved) (percent) }
            td class="n wide" { (task.to_move.map_or_else(|| "?".to_owned(), |total| total.to_string())) }
            td class="wide" { (destination) }
            td {
                @if let (Some(handle), false) = (&task.handle, task.is_finished()) {
                    form method="post" action="/dlq/cancel-task" class="inline" {
                        (csrf_field(state))
                        (hidden("queue", queue))
                        (hidden("handle", handle))
                        button type="submit" class="danger cancel-task" { "Cancel" }
                    }
                }
            }
        }
    }
}

/// `POST /dlq/cancel-task`: cancels one of the DLQ's running SQS move tasks (only a handle its listing
/// shows); what it moved stays moved.
pub(crate) async fn cancel_task(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    let pair = match resolve_posted(&state, &fields).await {
        Ok(pair) => pair,
        Err(response) => return *response,
    };
    let Some(handle) = fields.get("handle") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Cancel a move task",
            "No task handle was given.",
        );
    };
    let listed = match list_move_tasks(&state.sqs, &pair.dlq.arn.arn).await {
        Ok(tasks) => tasks,
        Err(error) => {
            return problem(
                StatusCode::BAD_GATEWAY,
                "Cancel a move task",
                &display_chain(&error),
            );
        }
    };
    if !listed.iter().any(|task| task.handle.as_deref() == Some(handle)) {
        return problem(
            StatusCode::BAD_REQUEST,
            "Cancel a move task",
            "No running move task of this dead-letter queue has that handle (it may have finished); nothing was cancelled.",
        );
    }
    match cancel_move_task(&state.sqs, handle).await {
        Ok(moved) => {
            tracing::warn!(dlq = %pair.dlq.url, moved, "console: SQS move task cancelled");
            Redirect::to(&page_url(fields.get("queue").unwrap_or_default(), &fields, "")).into_response()
        }
        Err(error) => problem(
            StatusCode::BAD_GATEWAY,
            "Cancel a move task",
            &display_chain(&error),
        ),
    }
}

/// `POST /dlq/peek`: peeks at the DLQ (the one receive this page makes), keeps the result and shows it.
pub(crate) async fn take_peek(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    let pair = match resolve_posted(&state, &fields).await {
        Ok(pair) => pair,
        Err(response) => return *response,
    };
    let max = match peek_size(&fields) {
        Ok(max) => max,
        Err(error) => return error.refusal("Dead letters"),
    };
    let peeked = match peek(&state.sqs, &pair.dlq.url, PeekOptions::default().with_max(max)).await {
        Ok(peeked) => peeked,
        Err(error) => return problem(StatusCode::BAD_GATEWAY, "Dead letters", &display_chain(&error)),
    };
    tracing::warn!(dlq = %pair.dlq.url, messages = peeked.messages.len(), "console: peeked at dead letters (their bodies were read)");
    let peek = Peek {
        at: SystemTime::now(),
        max,
        messages: peeked.messages,
    };
    state.peeks.put(&pair.dlq.url, peek);
    Redirect::to(&page_url(fields.get("queue").unwrap_or_default(), &fields, "")).into_response()
}

fn source_names(pair: &DeadLetterPair) -> String {
    let names: Vec<&str> = pair.sources.iter().map(|source| source.name()).collect();
    names.join(", ")
}

fn summary(pair: &DeadLetterPair, peek: Option<&Peek>, matching: usize) -> Markup {
    let depth = &pair.dlq.depth;
    html! {
        div class="cards" {
            (card("In the DLQ", depth.visible + depth.in_flight, depth.visible > 0, "dlq-depth"))
            @if let Some(peek) = peek {
                (card("Peeked", peek.messages.len(), false, "dlq-peeked"))
                (card("Matching the filter", matching, false, "dlq-matching"))
            }
        }
        p class="muted" {
            "DLQ " code { (pair.dlq.name()) } "."
            @if let Some(peek) = peek {
                " Peeked at " span id="peeked-at" { (format_time(peek.at)) } ": the list below is that peek;                  peek again to see what arrived since (each peek adds one to every message's receive count)."
            }
        }
    }
}

/// The button that peeks (a POST: it receives), carrying the filter.
fn peek_form(state: &AppState, queue: &str, fields: &Fields, max: usize, label: &str) -> Markup {
    html! {
        form class="filters" method="post" action="/dlq/peek" id="peek-form" {
            (csrf_field(state))
            (hidden("queue", queue))
            @for name in FILTER_FIELDS {
                @if let Some(value) = fields.get(name) { (hidden(name, value)) }
            }
            label { "Peek at most" input type="number" name="max" min="1" max=(MAX_PEEK) value=(max); }
            button type="submit" id="peek" { (label) }
        }
    }
}

fn filter_form(queue: &str, fields: &Fields) -> Markup {
    let input = |name: &str, label: &str, kind: &str| {
        html! {
            label { (label) input type=(kind) name=(name) value=(fields.get(name).unwrap_or_default()); }
        }
    };
    html! {
        form class="filters" method="get" action="/dlq" id="filter" {
            (hidden("queue", queue))
            (input("job_type", "Job type", "text"))
            (input("reason", "Reason contains", "text"))
            (input("newer", "Failed in the last (min)", "number"))
            (input("older", "Failed over (min) ago", "number"))
            button type="submit" { "Filter" }
        }
    }
}

fn messages_form(
    state: &AppState,
    pair: &DeadLetterPair,
    queue: &str,
    fields: &Fields,
    matching: &[&Received],
    fetched: Option<&Fetched>,
) -> Markup {
    let show = fields.get("show");
    let follows = |pointer: &PayloadPointer| followed(state, pointer);
    let page_url = |extra: &str| page_url(queue, fields, extra);
    html! {
        form method="post" action="/dlq/act" id="dead-letters" {
            (csrf_field(state))
            (hidden("queue", queue))
            @for name in FILTER_FIELDS {
                @if let Some(value) = fields.get(name) { (hidden(name, value)) }
            }
            div class="actions" {
                (destination_select(pair))
                label {
                    "At most per second"
                    input type="number" name="rate" min="1" max=(MAX_MOVE_RATE) placeholder="no limit";
                }
                button type="submit" name="action" value="redrive_selected" id="redrive-selected" {
                    "Redrive selected"
                }
                button type="submit" name="action" value="redrive_filter" id="redrive-filter" {
                    "Redrive all matching"
                }
                button type="submit" name="action" value="delete_selected" class="danger" id="delete-selected" {
                    "Delete selected…"
                }
                button type="submit" name="action" value="delete_filter" class="danger" id="delete-filter" {
                    "Delete all matching…"
                }
            }
            div class="scroll" {
                table {
                    thead {
                        tr {
                            th { input type="checkbox" data-select-all aria-label="select all"; }
                            th { "Job type" }
                            th { "Reason" }
                            th class="n" { "Receives" }
                            th { "Source" }
                            th class="wide" { "Failed at" }
                            th class="wide" { "Message id" }
                            th {}
                        }
                    }
                    tbody {
                        @for received in matching {
                            (dead_letter_rows(received, show == Some(received.message.id.as_str()), &page_url, fetched, &follows))
                        }
                        @if matching.is_empty() {
                            tr { td colspan="8" class="muted" { "No dead letters match." } }
                        }
                    }
                }
            }
        }
    }
}

/// One dead letter's row, and its body's row when `shown`; `page_url` is this page's address plus a
/// suffix.
fn dead_letter_rows(
    received: &Received,
    shown: bool,
    page_url: &dyn Fn(&str) -> String,
    fetched: Option<&Fetched>,
    follows: &dyn Fn(&PayloadPointer) -> bool,
) -> Markup {
    let message = &received.message;
    let failure = received.failure();
    let job_type = message
        .job_type()
        .map(str::to_owned)
        .or_else(|| failure.as_ref().map(|failure| failure.handler.clone()))
        .unwrap_or_default();
    let receives = failure
        .as_ref()
        .map_or(message.receive_count, |failure| failure.receive_count);
    let source = failure
        .as_ref()
        .map(|failure| failure.source_queue.clone())
        .or_else(|| {
            received
                .dead_letter_source_arn
                .as_ref()
                .map(|arn| arn.rsplit(':').next().unwrap_or(arn).to_owned())
        })
        .unwrap_or_default();
    let failed = received.failed_at().map(format_time).unwrap_or_default();
    let id = &message.id;
    html! {
        tr id={ "m-" (id) } class="dead-letter" {
            td { input type="checkbox" name="id" value=(id) aria-label="select"; }
            td class="job-type" { (job_type) }
            td class="reason" { (received.reason()) }
            td class="n" { (receives) }
            td { (source) }
            td class="wide" { (failed) }
            td class="wide" { code { (id) } }
            td {
                @if shown {
                    a href=(page_url("")) { "Hide body" }
                } @else {
                    a href={ (page_url(&format!("&show={}", query_value(id)))) "#m-" (id) } class="show-body" {
                        "Show body"
                    }
                }
            }
        }
        @if shown {
            tr {
                td {}
                td colspan="7" {
                    (details(message))
                    pre class="body" { (message.body) }
                    @match (fetched, PayloadPointer::of(message)) {
                        (Some(Fetched::Body(payload)), _) => { p { "The payload, read from its store:" } pre class="payload" id="payload" { (payload) } },
                        (Some(Fetched::Failed(error)), _) => p class="bad" id="payload-error" { "The payload could not be read: " (error) },
                        (None, Some(Ok(pointer))) if !follows(&pointer) => {
                            p class="muted" id="payload-not-followed" {
                                "Not fetched: " code { (pointer) } " is outside the payload buckets this console reads \
                                 from (--payload-bucket, by default CONVEYOR_PAYLOAD_BUCKET), so it stays a pointer."
                            }
                        },
                        (None, Some(_)) => {
                            a href={ (page_url(&format!("&show={}&fetch=1", query_value(id)))) "#m-" (id) } id="fetch-payload" {
                                "Fetch the payload (reads the object, deletes nothing)"
                            }
                        },
                        (None, None) => {},
                    }
                }
            }
        }
    }
}

/// What SQS and Conveyor recorded about a shown message besides its body: its key, group, trace,
/// first send, attribute names, and the S3 object a large payload's pointer names.
fn details(message: &Message) -> Markup {
    let pointer = PayloadPointer::of(message).map(|pointer| match pointer {
        Ok(pointer) => {
            let size = declared_size(&message.attributes)
                .map_or_else(|| "size unknown".to_owned(), |bytes| format!("{bytes} bytes"));
            format!("{pointer} ({size}); conveyor dlq peek --show-body --fetch-payloads prints it")
        }
        Err(error) => format!("a pointer that cannot be read: {error}"),
    });
    let names: Vec<&str> = message.attributes.keys().map(String::as_str).collect();
    html! {
        dl class="details" {
            @if let Some(key) = message.idempotency_key() { dt { "Idempotency key" } dd { code { (key) } } }
            @if let Some(group) = &message.group_id { dt { "Message group" } dd { code { (group) } } }
            @if let Some(trace) = &message.trace_header { dt { "Trace" } dd { code { (trace) } } }
            @if let Some(sent) = message.sent_at { dt { "First sent" } dd { (format_time(sent)) } }
            dt { "Attributes" } dd { (names.join(", ")) }
            @if let Some(pointer) = pointer { dt { "Large payload" } dd { "in S3: " (pointer) } }
        }
    }
}

/// Whether `url` is a queue this console shows (or a source of `pair`): the only places a redrive may
/// send messages, bodies included.
async fn shown_here(state: &AppState, pair: &DeadLetterPair, url: &str) -> bool {
    pair.sources.iter().any(|source| source.url == url)
        || state
            .queue_urls()
            .await
            .is_ok_and(|known| known.iter().any(|known| known == url))
}

/// Where a redrive sends messages: back to their source (the default), or any queue the console shows.
fn destination_select(pair: &DeadLetterPair) -> Markup {
    html! {
        label {
            "Redrive to"
            select name="to" {
                option value="" { "its source queue" }
                @for source in &pair.sources { option value=(source.url) { (source.name()) } }
            }
        }
        label { "or another queue it shows (URL)" input type="text" name="to_other" placeholder="https://sqs…"; }
    }
}

/// `POST /dlq/act`: redrive or delete, a selection or everything matching; deletes ask first.
pub(crate) async fn act(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let form = match ActForm::parse(&fields, SystemTime::now()) {
        Ok(form) => form,
        Err(error) => return error.refusal("Dead letters"),
    };
    let pair = match resolve(&state, &fields).await {
        Ok(pair) => pair,
        Err(response) => return *response,
    };
    let action = form.action;
    let selected = &form.selected;
    let mut filter = form.filter.clone();
    let what = match action {
        "redrive_selected" | "delete_selected" => {
            if selected.is_empty() {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "Nothing selected",
                    "Tick the messages to act on first, or use \"Redrive all matching\".",
                );
            }
            // A selection is exact: the ids alone decide.
            filter = MoveFilter::default().with_message_ids(Some(selected.iter().cloned().collect()));
            format!("{} selected messages", selected.len())
        }
        "delete_filter" if form.spec.is_empty() => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Nothing deleted",
                "\"Delete all matching\" needs a filter (job type, reason, time of failure); to empty the \
                 whole DLQ, purge it from the queues page.",
            );
        }
        _ => "every message matching the filter".to_owned(),
    };
    let back = format!(
        "/dlq?queue={}",
        query_value(fields.get("queue").unwrap_or_default())
    );
    let rate = form.rate;
    let options = MoveOptions::default().with_filter(filter).with_rate(rate);
    let client = state.sqs.clone();
    let dlq = pair.dlq.clone();
    if action == "delete_selected" || action == "delete_filter" {
        if !form.confirmed {
            let question = html! {
                "Delete " strong { (what) } " from " code { (pair.dlq.name()) } " for good? They are not sent \
                 anywhere; this cannot be undone."
                @if action == "delete_filter" { " " (matching_in_peek(&state, &pair, &options.filter, "deletes")) }
            };
            return confirm(
                &state,
                &fields,
                "Delete dead letters?",
                question,
                "Yes, delete them",
            );
        }
        tracing::warn!(dlq = %dlq.url, count = selected.len(), "console: delete dead letters");
        state.peeks.forget(&dlq.url);
        let title = format!("Delete {what} from {}", dlq.name());
        let id = state
            .tasks
            .spawn(title, "Deleted", back, move |mut progress, stop| async move {
                let options = options.with_stop(Some(stop));
                delete_messages(&client, &dlq, &options, &mut *progress).await
            });
        return Redirect::to(&format!("/tasks/{id}")).into_response();
    }
    let destinations = match form.destination.as_deref() {
        // Confined before any AWS call for it: the same answer whether or not such a queue exists.
        Some(url) if !shown_here(&state, &pair, url).await => {
            tracing::warn!(dlq = %pair.dlq.url, "console: a redrive to a queue it does not show was refused");
            return problem(
                StatusCode::BAD_REQUEST,
                "Redrive",
                "Nothing was moved: this console redrives only to the queues it shows (by URL), and that is \
                 not one of them. Start it with --queue-url (or --queue-prefix) for that queue.",
            );
        }
        Some(url) => match describe(&state.sqs, url).await {
            Ok(queue) => Destinations::One(queue),
            Err(error) => return problem(StatusCode::BAD_GATEWAY, "Redrive", &display_chain(&error)),
        },
        None if pair.sources.len() == 1 => Destinations::One(pair.sources[0].clone()),
        None => Destinations::BySource(pair.sources.clone()),
    };
    let target = match &destinations {
        Destinations::One(queue) => queue.name().to_owned(),
        Destinations::BySource(_) => "their source queues".to_owned(),
    };
    if action == "redrive_filter" && !form.confirmed {
        let question = html! {
            "Redrive every message of " code { (pair.dlq.name()) } " matching the filter to " strong { (target) }
            @if let Some(rate) = rate { ", at most " (rate) " per second" }
            "? " (matching_in_peek(&state, &pair, &options.filter, "moves"))
        };
        return confirm(
            &state,
            &fields,
            "Redrive all matching?",
            question,
            "Yes, redrive them",
        );
    }
    tracing::warn!(dlq = %dlq.url, to = %target, "console: redrive dead letters");
    state.peeks.forget(&dlq.url);
    let title = format!("Redrive {what} of {} to {target}", dlq.name());
    let id = state
        .tasks
        .spawn(title, "Moved", back, move |mut progress, stop| async move {
            let options = options.with_stop(Some(stop));
            move_messages(&client, &dlq, &destinations, &options, &mut *progress).await
        });
    Redirect::to(&format!("/tasks/{id}")).into_response()
}

/// The page that asks before a delete or a "redrive all matching": `question` says what would happen.
fn confirm(state: &AppState, fields: &Fields, title: &str, question: Markup, yes: &str) -> Response {
    let cancel = format!(
        "/dlq?queue={}",
        query_value(fields.get("queue").unwrap_or_default())
    );
    let body = html! {
        p { (question) }
        form method="post" action="/dlq/act" {
            (csrf_field(state))
            @for (name, value) in fields.carried() { (hidden(name, value)) }
            (hidden("confirm", "yes"))
            button class="danger" type="submit" id="confirm" { (yes) }
            " "
            a href=(cancel) { "Cancel" }
        }
    };
    page(title, Nav::Queues, body).into_response()
}

/// What the kept peek says a "redrive all matching" would move: the count it saw, or that none was taken.
fn matching_in_peek(state: &AppState, pair: &DeadLetterPair, filter: &MoveFilter, verb: &str) -> Markup {
    match state.peeks.get(&pair.dlq.url) {
        Some(peek) => {
            let matching = peek
                .messages
                .iter()
                .filter(|received| filter.matches(received))
                .count();
            html! {
                "The last peek (" (format_time(peek.at)) ") saw " strong id="confirm-count" { (matching) }
                " matching of " (peek.messages.len()) " messages; it " (verb) " every matching message, \
                 including any the peek did not reach."
            }
        }
        None => {
            html! { "No peek was taken, so how many match is not known; it " (verb) " every matching message." }
        }
    }
}
