//! Looking up a job: its idempotency record, read with the store's own `get` (conveyor-dynamodb).
//!
//! The record is keyed `conveyor:<job type>#<producer key or message id>`
//! ([`idempotency_key`]), or by the exact record id for tables written with another key style
//! (Powertools-compatible keys). The stored output can carry personal data: it is shown only when asked
//! for. A flow's parent (`conveyor:<type>#flow:<flow id>`) also shows its flow: the counts, the parent's
//! state, and the failed, pending and succeeded children (20 of each at most), each a link to its own
//! record (a nested flow's parent shows its own flow there).

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use conveyor_core::port::idempotency_key;
use conveyor_core::port::{ChildEnd, FlowChild, FlowState, FlowStore as _, flow_of_parent_record};
use conveyor_core::runtime::format_epoch_millis;
use conveyor_core::runtime::{format_age, format_time};
use conveyor_core::{
    JobRecord,
    port::{IdempotencyRecord, IdempotencyStore, RecordStatus},
};
use conveyor_dynamodb::DynamoStore;
use maud::{Markup, html};

use crate::fields::Fields;
use crate::html::{Nav, page, query_value};
use crate::state::AppState;

/// The lookup form, then the record `fields` ask for (nothing more when they ask for none).
async fn lookup(state: &AppState, fields: &Fields) -> Markup {
    let form = form(state, fields);
    let Some(key) = requested_key(fields) else {
        return form;
    };
    let found = found(state, fields, &key).await;
    html! { (form) (found) }
}

/// The record id the form asks for: the record id itself, or the key a producer's job type and key (or
/// message id) make.
fn requested_key(fields: &Fields) -> Option<String> {
    match (fields.get("record_id"), fields.get("job_type")) {
        (Some(record_id), _) => Some(record_id.to_owned()),
        (None, Some(job_type)) => match (fields.get("key"), fields.get("message_id")) {
            (None, None) => None,
            (key, message_id) => Some(idempotency_key(job_type, key, message_id.unwrap_or_default())),
        },
        (None, None) => None,
    }
}

/// The record `key` and, for a tracked job, its tracking; or why there is none.
async fn found(state: &AppState, fields: &Fields, key: &str) -> Markup {
    let Some(store) = &state.store else {
        return html! {
            p class="note" {
                "Job lookup reads the idempotency table: start the console with --table NAME."
            }
        };
    };
    let flow = flow_section(store, key).await;
    match store.get(key).await {
        // A flow's parent has no record until it is sent: its flow is the answer then.
        Ok(None) if flow.is_some() => html! { (flow.unwrap_or_default()) },
        Ok(Some(record)) => {
            // A tracked job's status, attempts, last error and progress (the same item).
            let tracking = match store.job(key).await {
                Ok(Some(job)) => render_tracking(&job, SystemTime::now()),
                Ok(None) => html! {
                    p class="muted" {
                        "Attempts, the last error and progress are kept for job types whose handler sets "
                        code { "HandlerSettings::tracked" } "; a failed job's reason is on its dead letter \
                         (Queues → Dead letters)."
                    }
                },
                Err(error) => html! {
                    p class="bad" { "Reading the job's tracking failed: " (error) }
                },
            };
            html! { (render(&record, fields, SystemTime::now())) (tracking) (flow.unwrap_or_default()) }
        }
        Ok(None) => html! {
            p id="job-missing" {
                "No record " code { (key) } ": the job has not started yet, its record expired, or the key \
                 or type is not the one the producer used."
            }
        },
        Err(error) => html! {
            p class="bad" { "Reading " code { (key) } " failed: " (error) }
        },
    }
}

/// Children listed per state at most (the rest are counted), as `conveyor jobs show` does.
const LISTED_CHILDREN: usize = 20;

/// The flow whose parent is record `key`, when it is one (`None`: not a parent, or no such flow).
async fn flow_section(store: &DynamoStore, key: &str) -> Option<Markup> {
    let flow_id = flow_of_parent_record(key)?;
    let flow = match store.flow(flow_id).await {
        Ok(flow) => flow?,
        Err(error) => return Some(html! { p class="bad" { "Reading the job's flow failed: " (error) } }),
    };
    match store.children(flow_id).await {
        Ok(children) => Some(render_flow(&flow, &children)),
        Err(error) => Some(html! { p class="bad" { "Reading the flow's children failed: " (error) } }),
    }
}

/// A flow: its counts, policy, deadline and parent, then its children by state (failed with their
/// reasons, pending, succeeded), each a link to its record (a nested flow's parent shows its own flow):
/// the flow's tree, one level per page.
fn render_flow(flow: &FlowState, children: &[FlowChild]) -> Markup {
    let parent = flow.parent_state();
    let failed: Vec<(&FlowChild, &str)> = children
        .iter()
        .filter_map(|child| match &child.end {
            Some(ChildEnd::Failed(reason)) => Some((child, reason.as_str())),
            _ => None,
        })
        .collect();
    let pending: Vec<&FlowChild> = children.iter().filter(|child| child.end.is_none()).collect();
    let succeeded: Vec<&FlowChild> = children
        .iter()
        .filter(|child| matches!(child.end, Some(ChildEnd::Succeeded { .. })))
        .collect();
    html! {
        h2 { "Flow" }
        div class="scroll" {
            table id="flow" {
                tbody {
                    tr { th { "Flow" } td { code { (flow.id) } } }
                    tr { th { "Children" } td id="flow-summary" { (flow.summary()) } }
                    tr { th { "On failure" } td { (flow.policy.as_str()) } }
                    tr { th { "Deadline" } td { (format_epoch_millis(flow.deadline)) } }
                    tr { th { "Parent" } td id="flow-parent" { (parent) } }
                }
            }
        }
        @if !failed.is_empty() {
            h3 { "Failed children" }
            ul id="flow-failed" {
                @for (child, reason) in failed.iter().take(LISTED_CHILDREN) {
                    li { a href=(child_link(child)) { (child.id) } ": " (reason) }
                }
                @if failed.len() > LISTED_CHILDREN { li class="muted" { "… and " (failed.len() - LISTED_CHILDREN) " more" } }
            }
        }
        (child_list("Pending children", "flow-pending", &pending))
        (child_list("Succeeded children", "flow-succeeded", &succeeded))
    }
}

/// Children of one state, each a link to its record: the first [`LISTED_CHILDREN`], the rest counted.
fn child_list(title: &str, id: &str, children: &[&FlowChild]) -> Markup {
    if children.is_empty() {
        return html! {};
    }
    html! {
        h3 { (title) }
        ul id=(id) {
            @for child in children.iter().take(LISTED_CHILDREN) {
                li { a href=(child_link(child)) { (child.id) } }
            }
            @if children.len() > LISTED_CHILDREN { li class="muted" { "… and " (children.len() - LISTED_CHILDREN) " more" } }
        }
    }
}

/// The address of a child's record.
fn child_link(child: &FlowChild) -> String {
    format!("/jobs?record_id={}", query_value(&child.key))
}

pub(crate) async fn show(State(state): State<Arc<AppState>>, Query(fields): Query<Fields>) -> Response {
    let body = lookup(&state, &fields).await;
    page("Jobs", Nav::Jobs, body).into_response()
}

fn form(state: &AppState, fields: &Fields) -> Markup {
    let value = |name: &str| fields.get(name).unwrap_or_default();
    html! {
        form class="filters" method="get" action="/jobs" id="lookup" {
            label { "Job type" input name="job_type" list="job-types" value=(value("job_type")); }
            datalist id="job-types" {
                @for job_type in &state.config.job_types { option value=(job_type); }
            }
            label { "Idempotency key" input name="key" value=(value("key")); }
            label { "or message id" input name="message_id" value=(value("message_id")); }
            label { "or record id" input name="record_id" value=(value("record_id")); }
            button type="submit" { "Look up" }
        }
    }
}

/// A tracked job's record (`conveyor jobs show` prints the same).
fn render_tracking(job: &JobRecord, now: SystemTime) -> Markup {
    let ago = |at: SystemTime| format_age(now.duration_since(at).unwrap_or_default());
    html! {
        div class="scroll" {
            table id="job-tracking" {
                tbody {
                    tr {
                        th { "Job status" }
                        td id="job-tracked-status" { (job.status.as_str()) " (" (ago(job.updated_at)) " ago)" }
                    }
                    tr { th { "Attempts" } td { (job.attempts) } }
                    tr { th { "Last error" } td { (job.last_error.as_deref().unwrap_or("–")) } }
                    tr {
                        th { "Progress" }
                        td {
                            @match &job.progress {
                                Some(progress) => {
                                    (progress.percent) "% " (progress.message) " (" (ago(progress.at)) " ago)"
                                },
                                None => "–",
                            }
                        }
                    }
                    tr {
                        th { "History" }
                        td { @for (status, at) in &job.history { (status.as_str()) " " (format_time(at.0)) br; } }
                    }
                }
            }
        }
    }
}

/// The idempotency claim. Its state is named apart from a tracked job's status (shown above it), so the
/// page never shows two statuses; the lease only while a run holds the claim.
fn render(record: &IdempotencyRecord, fields: &Fields, now: SystemTime) -> Markup {
    let status = match record.status {
        RecordStatus::Completed => {
            html! { span class="ok" { "settled" } " (the job completed; a redelivery is a duplicate)" }
        }
        RecordStatus::InProgress if record.is_free_at(now) => html! {
            span class="bad" { "in progress, lease lapsed" }
            " (its worker stopped; the next delivery takes it over)"
        },
        RecordStatus::InProgress => html! { "running" },
        RecordStatus::Expired => html! { "expired" },
    };
    let time = |at: Option<SystemTime>| at.map_or("–".to_owned(), format_time);
    let output = match (&record.output, fields.get("show_output")) {
        (None, _) => html! { span class="muted" { "none stored" } },
        (Some(output), Some(_)) => {
            tracing::warn!(key = %record.key, bytes = output.len(), "console: a job's output was shown");
            html! { pre id="job-output" { (output) } }
        }
        (Some(output), None) => {
            let mut url = String::from("/jobs?show_output=1");
            for name in ["job_type", "key", "message_id", "record_id"] {
                if let Some(value) = fields.get(name) {
                    url.push_str(&format!("&{name}={}", query_value(value)));
                }
            }
            html! {
                a href=(url) id="show-output" { "Show output" }
                " "
                span class="muted" { "(" (output.len()) " bytes)" }
            }
        }
    };
    html! {
        div class="scroll" {
            table id="job" {
                tbody {
                    tr { th { "Record" } td { code { (record.key) } } }
                    tr { th { "Claim" } td id="job-claim" { (status) } }
                    @if record.status == RecordStatus::InProgress {
                        tr { th { "Lease until" } td { (time(record.lease_until)) } }
                    }
                    tr { th { "Record expires" } td { (time(Some(record.expires_at))) } }
                    tr {
                        th { "Claim token" }
                        td {
                            @match record.token {
                                Some(token) => (token),
                                None => "–",
                            }
                        }
                    }
                    tr { th { "Output" } td { (output) } }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use conveyor_core::JobStatus;
    use conveyor_core::port::StatusTime;

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
        let html = render_tracking(&job, now).into_string();
        assert!(html.contains("running (1m 5s ago)"), "{html}");
        assert!(html.contains("<td>2</td>"), "{html}");
        assert!(
            html.contains("&lt;b&gt;503&lt;/b&gt; from the warehouse"),
            "{html}"
        );
        assert!(html.contains("40% chunk 4 of 10 (3s ago)"), "{html}");
    }

    #[test]
    fn a_flow_shows_its_counts_parent_and_failed_and_pending_children_with_links() {
        let flow = FlowState {
            id: "report:r-<1>".into(),
            parent_record: "conveyor:chunked_report#flow:report:r-<1>".into(),
            policy: conveyor_core::ChildFailurePolicy::Ignore,
            children: 25,
            succeeded: 1,
            failed: 1,
            first_failure: Some("chunk 1 has <no> queries".into()),
            deadline: 1_795_963_051_815,
            parent_sent_at: None,
            failure_sent_at: None,
            parent_ran_at: None,
            parent_refusals: 0,
            parent_error: None,
            parent_failed_at: None,
        };
        let child = |index: usize, end: Option<ChildEnd>| FlowChild {
            id: format!("{index:05}"),
            key: format!("conveyor:report_chunk#flow:report:r-1:{index:05}"),
            end,
        };
        let mut children = vec![
            child(0, Some(ChildEnd::Succeeded { output: None })),
            child(1, Some(ChildEnd::Failed("chunk 1 has <no> queries".into()))),
        ];
        children.extend((2..25).map(|index| child(index, None)));
        let html = render_flow(&flow, &children).into_string();
        assert!(html.contains("report:r-&lt;1&gt;"), "escaped: {html}");
        assert!(
            html.contains("25 children: 1 succeeded, 1 failed, 23 pending"),
            "{html}"
        );
        assert!(html.contains("waiting for its children"), "{html}");
        assert!(
            html.contains(r#"<a href="/jobs?record_id=conveyor%3Areport_chunk%23flow%3Areport%3Ar-1%3A00001">00001</a>: chunk 1 has &lt;no&gt; queries"#),
            "{html}"
        );
        assert!(
            html.contains("… and 3 more"),
            "20 pending listed, the rest counted: {html}"
        );
        assert!(
            html.contains(r#"<ul id="flow-succeeded"><li><a href="/jobs?record_id=conveyor%3Areport_chunk%23flow%3Areport%3Ar-1%3A00000">00000</a></li></ul>"#),
            "the succeeded child is listed after the failed and pending ones, linked: {html}"
        );
        let refused = FlowState {
            parent_refusals: 5,
            parent_error: Some("sending the parent to q was refused: queue q does not <exist>".into()),
            parent_failed_at: Some(1_795_963_051_815),
            ..flow
        };
        let html = render_flow(&refused, &children).into_string();
        assert!(
            html.contains("the parent could not be sent (5 tries): sending the parent to q was refused: queue q does not &lt;exist&gt;"),
            "a flow whose parent could not be sent says why: {html}"
        );
    }
}
