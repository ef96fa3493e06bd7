//! Looking up a job: its idempotency record, read with the store's own `get` (conveyor-dynamodb).
//!
//! The record is keyed `conveyor:<job type>#<producer key or message id>`
//! ([`idempotency_key`]), or by the exact record id for tables written with another key style
//! (Powertools-compatible keys). The stored output can carry personal data: it is shown only when asked
//! for.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use conveyor_core::display::{format_age, format_time};
use conveyor_core::idempotency::idempotency_key;
use conveyor_core::{IdempotencyRecord, IdempotencyStore, JobRecord, RecordStatus};

use crate::fields::Fields;
use crate::html::{Nav, esc, query_value};
use crate::state::AppState;

async fn lookup(state: &AppState, fields: &Fields) -> String {
    let mut body = form(state, fields);
    let key = match (fields.get("record_id"), fields.get("job_type")) {
        (Some(record_id), _) => record_id.to_owned(),
        (None, Some(job_type)) => match (fields.get("key"), fields.get("message_id")) {
            (None, None) => return body,
            (key, message_id) => idempotency_key(job_type, key, message_id.unwrap_or_default()),
        },
        (None, None) => return body,
    };
    let Some(store) = &state.store else {
        body.push_str(
            "<p class=\"note\">Job lookup reads the idempotency table: start the console with --table \
             NAME.</p>",
        );
        return body;
    };
    match store.get(&key).await {
        Ok(Some(record)) => {
            body.push_str(&render(&record, fields, SystemTime::now()));
            // A tracked job's status, attempts, last error and progress (the same item).
            match store.job(&key).await {
                Ok(Some(job)) => body.push_str(&render_tracking(&job, SystemTime::now())),
                Ok(None) => body.push_str(
                    "<p class=\"muted\">Attempts, the last error and progress are kept for job types whose \
                     handler sets <code>HandlerSettings::tracked</code>; a failed job's reason is on its dead \
                     letter (Queues → Dead letters).</p>",
                ),
                Err(error) => body.push_str(&format!(
                    "<p class=\"bad\">Reading the job's tracking failed: {}</p>",
                    esc(&error.to_string())
                )),
            }
        }
        Ok(None) => body.push_str(&format!(
            "<p id=\"job-missing\">No record <code>{}</code>: the job has not started yet, its record \
             expired, or the key or type is not the one the producer used.</p>",
            esc(&key)
        )),
        Err(error) => body.push_str(&format!(
            "<p class=\"bad\">Reading <code>{}</code> failed: {}</p>",
            esc(&key),
            esc(&error.to_string())
        )),
    }
    body
}

pub(crate) async fn show(State(state): State<Arc<AppState>>, Query(fields): Query<Fields>) -> Response {
    let body = lookup(&state, &fields).await;
    crate::html::page("Jobs", Nav::Jobs, &body).into_response()
}

fn form(state: &AppState, fields: &Fields) -> String {
    let value = |name: &str| esc(fields.get(name).unwrap_or_default());
    let types: String = state
        .config
        .job_types
        .iter()
        .map(|job_type| format!("<option value=\"{}\">", esc(job_type)))
        .collect();
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/jobs\" id=\"lookup\">\
         <label>Job type<input name=\"job_type\" list=\"job-types\" value=\"{}\"></label>\
         <datalist id=\"job-types\">{types}</datalist>\
         <label>Idempotency key<input name=\"key\" value=\"{}\"></label>\
         <label>or message id<input name=\"message_id\" value=\"{}\"></label>\
         <label>or record id<input name=\"record_id\" value=\"{}\"></label>\
         <button type=\"submit\">Look up</button></form>",
        value("job_type"),
        value("key"),
        value("message_id"),
        value("record_id"),
    )
}

/// A tracked job's record (`conveyor jobs show` prints the same).
fn render_tracking(job: &JobRecord, now: SystemTime) -> String {
    let ago = |at: SystemTime| format_age(now.duration_since(at).unwrap_or_default());
    let progress = job.progress.as_ref().map_or("–".to_owned(), |progress| {
        format!(
            "{}% {} ({} ago)",
            progress.percent,
            esc(&progress.message),
            ago(progress.at)
        )
    });
    let history: String = job
        .history
        .iter()
        .map(|(status, at)| format!("{} {}<br>", status.as_str(), format_time(at.0)))
        .collect();
    format!(
        "<div class=\"scroll\"><table id=\"job-tracking\"><tbody>\
         <tr><th>Job status</th><td id=\"job-tracked-status\">{} ({} ago)</td></tr>\
         <tr><th>Attempts</th><td>{}</td></tr>\
         <tr><th>Last error</th><td>{}</td></tr>\
         <tr><th>Progress</th><td>{progress}</td></tr>\
         <tr><th>History</th><td>{history}</td></tr>\
         </tbody></table></div>",
        job.status.as_str(),
        ago(job.updated_at),
        job.attempts,
        job.last_error.as_deref().map_or("–".to_owned(), esc),
    )
}

fn render(record: &IdempotencyRecord, fields: &Fields, now: SystemTime) -> String {
    let status = match record.status {
        RecordStatus::Completed => "<span class=\"ok\">completed</span>".to_owned(),
        RecordStatus::InProgress if record.is_free_at(now) => {
            "<span class=\"bad\">in progress, lease lapsed</span> (its worker stopped; the next delivery takes it over)"
                .to_owned()
        }
        RecordStatus::InProgress => "running".to_owned(),
        RecordStatus::Expired => "expired".to_owned(),
    };
    let time = |at: Option<SystemTime>| at.map_or("–".to_owned(), format_time);
    let output = match (&record.output, fields.get("show_output")) {
        (None, _) => "<span class=\"muted\">none stored</span>".to_owned(),
        (Some(output), Some(_)) => format!("<pre id=\"job-output\">{}</pre>", esc(output)),
        (Some(output), None) => {
            let mut url = String::from("/jobs?show_output=1");
            for name in ["job_type", "key", "message_id", "record_id"] {
                if let Some(value) = fields.get(name) {
                    url.push_str(&format!("&{name}={}", query_value(value)));
                }
            }
            format!(
                "<a href=\"{}\" id=\"show-output\">Show output</a> <span class=\"muted\">({} bytes)</span>",
                esc(&url),
                output.len()
            )
        }
    };
    format!(
        "<div class=\"scroll\"><table id=\"job\"><tbody>\
         <tr><th>Record</th><td><code>{}</code></td></tr>\
         <tr><th>Status</th><td id=\"job-status\">{status}</td></tr>\
         <tr><th>Lease until</th><td>{}</td></tr>\
         <tr><th>Record expires</th><td>{}</td></tr>\
         <tr><th>Claim token</th><td>{}</td></tr>\
         <tr><th>Output</th><td>{output}</td></tr>\
         </tbody></table></div>",
        esc(&record.key),
        time(record.lease_until),
        time(Some(record.expires_at)),
        record.token.map_or("–".to_owned(), |token| token.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use conveyor_core::JobStatus;
    use conveyor_core::tracking::StatusTime;

    use super::*;

    #[test]
    fn a_tracked_jobs_status_attempts_error_and_progress_are_shown_escaped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_963_051);
        let job = JobRecord {
            key: "conveyor:report#r-1".into(),
            job_type: "report".into(),
            status: JobStatus::Running,
            attempts: 2,
            last_error: Some("<b>503</b> from the warehouse".into()),
            progress: Some(conveyor_core::Progress {
                percent: 40,
                message: "chunk 4 of 10".into(),
                at: now - Duration::from_secs(3),
            }),
            output: None,
            updated_at: now - Duration::from_secs(65),
            history: vec![(JobStatus::Running, StatusTime(now - Duration::from_secs(65)))],
            token: Some(7),
        };
        let html = render_tracking(&job, now);
        assert!(html.contains("running (1m 5s ago)"), "{html}");
        assert!(html.contains("<td>2</td>"), "{html}");
        assert!(
            html.contains("&lt;b&gt;503&lt;/b&gt; from the warehouse"),
            "{html}"
        );
        assert!(html.contains("40% chunk 4 of 10 (3s ago)"), "{html}");
    }
}
