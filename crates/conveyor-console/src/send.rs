//! Sending a job of a registered type (`--job-type`) with a JSON body, checked before anything is sent:
//! the JSON must parse (the error says where it breaks), the type must be registered, the queue shown
//! here, and the producer checks SQS's limits (size, attributes, FIFO group) before its one request.

use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use conveyor_sqs::{NewJob, Producer};
use serde_json::Value;

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::html::{Nav, csrf_field, esc, page};
use crate::state::AppState;

pub(crate) async fn form(State(state): State<Arc<AppState>>) -> Response {
    let body = render(&state, &Fields::default(), "").await;
    page("Send a job", Nav::Send, &body).into_response()
}

pub(crate) async fn submit(State(state): State<Arc<AppState>>, Form(fields): Form<Fields>) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let outcome = match send(&state, &fields).await {
        Ok(id) => format!(
            "<p class=\"ok\">Sent: message id <code id=\"sent-id\">{}</code></p>",
            esc(&id)
        ),
        Err(problem) => format!("<p class=\"bad\" id=\"send-error\">{}</p>", esc(&problem)),
    };
    let body = render(&state, &fields, &outcome).await;
    page("Send a job", Nav::Send, &body).into_response()
}

/// Checks the form, then sends; the error says what to fix (nothing was sent).
async fn send(state: &AppState, fields: &Fields) -> Result<String, String> {
    let job_type = fields.get("job_type").ok_or("choose a job type")?;
    if !state.config.job_types.iter().any(|known| known == job_type) {
        return Err(format!(
            "{job_type:?} is not a registered job type; the console was started with: {}",
            state.config.job_types.join(", ")
        ));
    }
    let url = fields.get("queue").ok_or("choose a queue")?;
    let known = state
        .queue_urls()
        .await
        .map_err(|error| conveyor_sqs::admin::display_chain(&error))?;
    if !known.iter().any(|known| known == url) {
        return Err("this console does not show that queue".to_owned());
    }
    let payload_text = fields.get("payload").ok_or("write the job's JSON body")?;
    let payload: Value = serde_json::from_str(payload_text)
        .map_err(|error| format!("the body is not valid JSON ({error}); nothing was sent"))?;
    let mut job = NewJob::new(job_type, payload);
    if let Some(key) = fields.get("key") {
        job = job.key(key);
    }
    if let Some(group) = fields.get("group_id") {
        job = job.group_id(group);
    }
    let producer = Producer::new(state.sqs.clone(), url);
    let id = producer
        .send(&job)
        .await
        .map_err(|error| format!("{error}; nothing was sent"))?;
    tracing::info!(queue = %url, job_type, message_id = %id, "console: job sent");
    Ok(id)
}

async fn render(state: &AppState, fields: &Fields, outcome: &str) -> String {
    if state.config.job_types.is_empty() {
        return "<p class=\"note\">No job types are registered: start the console with --job-type TYPE (as \
                often as needed) to send jobs from here.</p>"
            .to_owned();
    }
    let chosen_type = fields.get("job_type");
    let types: String = state
        .config
        .job_types
        .iter()
        .map(|job_type| {
            let selected = if chosen_type == Some(job_type.as_str()) {
                " selected"
            } else {
                ""
            };
            format!("<option{selected}>{}</option>", esc(job_type))
        })
        .collect();
    let chosen_queue = fields.get("queue");
    let queues: String = state
        .queue_urls()
        .await
        .unwrap_or_default()
        .iter()
        .map(|url| {
            let selected = if chosen_queue == Some(url.as_str()) {
                " selected"
            } else {
                ""
            };
            let name = url.rsplit('/').next().unwrap_or(url);
            format!("<option value=\"{}\"{selected}>{}</option>", esc(url), esc(name))
        })
        .collect();
    let value = |name: &str| esc(fields.get(name).unwrap_or_default());
    format!(
        "{outcome}<form class=\"stack\" method=\"post\" action=\"/send\" id=\"send\">{csrf}\
         <label>Queue<select name=\"queue\">{queues}</select></label>\
         <label>Job type<select name=\"job_type\">{types}</select></label>\
         <label>Body (JSON)<textarea name=\"payload\" spellcheck=\"false\">{payload}</textarea></label>\
         <label>Idempotency key (optional)<input name=\"key\" value=\"{key}\"></label>\
         <label>Message group (FIFO queues)<input name=\"group_id\" value=\"{group}\"></label>\
         <div><button type=\"submit\">Check and send</button></div></form>",
        csrf = csrf_field(state),
        payload = value("payload"),
        key = value("key"),
        group = value("group_id"),
    )
}
