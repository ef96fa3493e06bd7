//! Sending a job of a registered type (`--job-type`) with a JSON body, checked before anything is sent:
//! the JSON must parse (the error says where it breaks), the type must be registered, the queue shown
//! here and not the dead-letter queue of one shown here (nothing runs jobs sent there), and the
//! producer checks SQS's limits (size, attributes, FIFO group) and the tenant (with `NewJob::tenant`'s
//! words) before its one request.

use std::sync::Arc;
use std::time::Duration;

use axum::Form;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use conveyor_sqs::admin::{QueueInfo, describe, display_chain};
use conveyor_sqs::{NewJob, Producer};
use maud::{Markup, html};
use serde_json::Value;

use crate::auth::refuse_without_csrf;
use crate::fields::{FieldError, Fields};
use crate::html::{Nav, csrf_field, page};
use crate::state::AppState;

pub(crate) async fn form(State(state): State<Arc<AppState>>) -> Response {
    let body = render(&state, &Fields::default(), None).await;
    page("Send a job", Nav::Send, body).into_response()
}

pub(crate) async fn submit(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let delay = match delay(&fields) {
        Ok(delay) => delay,
        Err(error) => {
            let outcome = html! { p class="bad" id="send-error" { "Nothing was sent: " (error) "." } };
            let body = render(&state, &fields, Some(outcome)).await;
            return (StatusCode::BAD_REQUEST, page("Send a job", Nav::Send, body)).into_response();
        }
    };
    let outcome = match send(&state, &fields, delay).await {
        Ok(id) => html! { p class="ok" { "Sent: message id " code id="sent-id" { (id) } } },
        Err(problem) => html! { p class="bad" id="send-error" { (problem) } },
    };
    let body = render(&state, &fields, Some(outcome)).await;
    page("Send a job", Nav::Send, body).into_response()
}

/// The form's `delay_secs`: whole seconds up to SQS's longest retention (a longer delay could never be
/// delivered), `None` when not given.
pub(crate) fn delay(fields: &Fields) -> Result<Option<Duration>, FieldError> {
    let max = conveyor_core::runtime::MAX_TOTAL_DELAY.as_secs();
    Ok(fields
        .whole("delay_secs", 0, max, "seconds")?
        .map(Duration::from_secs))
}

/// Checks the form, then sends; the error says what to fix (nothing was sent).
async fn send(state: &AppState, fields: &Fields, delay: Option<Duration>) -> Result<String, String> {
    let job_type = fields.get("job_type").ok_or("choose a job type")?;
    if !state.config.job_types.iter().any(|known| known == job_type) {
        return Err(format!(
            "{job_type:?} is not a registered job type; the console was started with: {}",
            state.config.job_types.join(", ")
        ));
    }
    let url = fields.get("queue").ok_or("choose a queue")?;
    let targets = targets(state).await?;
    if let Some(source) = targets.dead_letter_sources.iter().find(|(dlq, _)| dlq == url) {
        return Err(format!(
            "that queue is the dead-letter queue of {}: nothing runs jobs sent there; choose {} (nothing was sent)",
            source.1, source.1
        ));
    }
    if !targets.queues.iter().any(|queue| queue.url == url) {
        return Err("this console does not show that queue".to_owned());
    }
    let payload_text = fields.get("payload").ok_or("write the job's JSON body")?;
    let payload: Value = serde_json::from_str(payload_text)
        .map_err(|error| format!("the body is not valid JSON ({error}); nothing was sent"))?;
    let mut job = NewJob::new(job_type, payload);
    if let Some(key) = fields.get("key") {
        job = job.key(key);
    }
    if let Some(tenant) = fields.get("tenant") {
        job = job.tenant(tenant);
    }
    if let Some(group) = fields.get("group_id") {
        job = job.group_id(group);
    }
    if let Some(delay) = delay {
        job = job.delay(delay);
    }
    let producer = Producer::new(state.sqs.clone(), url);
    let id = producer
        .send(&job)
        .await
        .map_err(|error| format!("{error}; nothing was sent"))?;
    let tenant = fields.get("tenant");
    tracing::warn!(queue = %url, job_type, tenant, message_id = %id, "console: job sent");
    Ok(id)
}

/// Where the form may send: the queues the console shows, minus the dead-letter queues of any of them.
struct Targets {
    /// The queues a job may be sent to.
    queues: Vec<QueueInfo>,
    /// Each shown DLQ's URL, with the name of a queue it is the DLQ of.
    dead_letter_sources: Vec<(String, String)>,
}

/// The console's queues, each described (one `GetQueueAttributes` per queue), split into [`Targets`].
async fn targets(state: &AppState) -> Result<Targets, String> {
    let urls = state.queue_urls().await.map_err(|error| display_chain(&error))?;
    let mut described = Vec::with_capacity(urls.len());
    for url in &urls {
        described.push(
            describe(&state.sqs, url)
                .await
                .map_err(|error| display_chain(&error))?,
        );
    }
    let mut dead_letter_sources = Vec::new();
    for source in &described {
        let Some(redrive) = &source.redrive else { continue };
        if let Some(dlq) = described
            .iter()
            .find(|queue| queue.arn.arn == redrive.dead_letter_arn.arn)
        {
            dead_letter_sources.push((dlq.url.clone(), source.name().to_owned()));
        }
    }
    let queues = described
        .into_iter()
        .filter(|queue| !dead_letter_sources.iter().any(|(dlq, _)| *dlq == queue.url))
        .collect();
    Ok(Targets {
        queues,
        dead_letter_sources,
    })
}

/// The send form, filled in from `fields`, after what the last submission did (`outcome`).
async fn render(state: &AppState, fields: &Fields, outcome: Option<Markup>) -> Markup {
    if state.config.job_types.is_empty() {
        return html! {
            p class="note" {
                "No job types are registered: start the console with --job-type TYPE (as often as needed) \
                 to send jobs from here."
            }
        };
    }
    let chosen_type = fields.get("job_type");
    let chosen_queue = fields.get("queue");
    let queues = match targets(state).await {
        Ok(targets) => targets.queues,
        Err(problem) => return html! { p class="bad" { "The queues could not be read: " (problem) } },
    };
    let value = |name: &str| fields.get(name).unwrap_or_default();
    html! {
        @if let Some(outcome) = outcome { (outcome) }
        form class="stack" method="post" action="/send" id="send" {
            (csrf_field(state))
            label {
                "Queue"
                select name="queue" {
                    @for queue in &queues {
                        option value=(queue.url) selected[chosen_queue == Some(queue.url.as_str())] {
                            (queue.name())
                        }
                    }
                }
            }
            label {
                "Job type"
                select name="job_type" {
                    @for job_type in &state.config.job_types {
                        option selected[chosen_type == Some(job_type.as_str())] { (job_type) }
                    }
                }
            }
            label {
                "Body (JSON)"
                textarea name="payload" spellcheck="false" { (value("payload")) }
            }
            label { "Idempotency key (optional)" input name="key" value=(value("key")); }
            label {
                "Tenant (optional; its MessageGroupId on a standard queue, for SQS fair queues)"
                input name="tenant" value=(value("tenant"));
            }
            label { "Message group (FIFO queues)" input name="group_id" value=(value("group_id")); }
            label {
                "Delay in seconds (optional; standard queues, longer than 15 minutes kept as a due time)"
                input name="delay_secs" inputmode="numeric" value=(value("delay_secs"));
            }
            div { button type="submit" { "Check and send" } }
        }
    }
}
