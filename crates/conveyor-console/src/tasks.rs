//! Long operations (redrive, delete) run in the background; their page shows progress until they end.
//!
//! The operation itself is the library's ([`move_messages`](conveyor_sqs::admin::move_messages),
//! [`delete_messages`](conveyor_sqs::admin::delete_messages)), the same code `conveyor dlq redrive`
//! runs; its progress callback writes the report here after every batch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use conveyor_sqs::admin::{AdminError, MoveReport};

use crate::html::{Nav, esc, page, problem};
use crate::state::AppState;

/// Tasks kept for their pages (the oldest go first).
const KEPT: usize = 100;

/// One task's state.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    /// What it does, e.g. "Redrive 3 selected messages of jobs-dlq to jobs".
    pub(crate) title: String,
    /// `Moved` or `Deleted`.
    pub(crate) verb: &'static str,
    /// Where to go back to.
    pub(crate) back: String,
    pub(crate) report: MoveReport,
    pub(crate) started: Instant,
    pub(crate) took: Option<Duration>,
    pub(crate) error: Option<String>,
}

/// Every task of this process.
#[derive(Default)]
pub(crate) struct Tasks {
    next: AtomicU64,
    tasks: Mutex<BTreeMap<u64, Arc<Mutex<Task>>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tasks {
    /// Registers a task and spawns `work`, which gets a progress callback; returns the task's id.
    pub(crate) fn spawn<F, Fut>(&self, title: String, verb: &'static str, back: String, work: F) -> u64
    where
        F: FnOnce(Box<dyn FnMut(&MoveReport) + Send>) -> Fut,
        Fut: Future<Output = Result<MoveReport, AdminError>> + Send + 'static,
    {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let task = Arc::new(Mutex::new(Task {
            title,
            verb,
            back,
            report: MoveReport::default(),
            started: Instant::now(),
            took: None,
            error: None,
        }));
        {
            let mut tasks = lock(&self.tasks);
            tasks.insert(id, Arc::clone(&task));
            while tasks.len() > KEPT {
                tasks.pop_first();
            }
        }
        let progress_task = Arc::clone(&task);
        let progress = Box::new(move |report: &MoveReport| {
            lock(&progress_task).report = report.clone();
        });
        let work = work(progress);
        tokio::spawn(async move {
            let result = work.await;
            let mut task = lock(&task);
            task.took = Some(task.started.elapsed());
            match result {
                Ok(report) => task.report = report,
                Err(error) => task.error = Some(conveyor_sqs::admin::display_chain(&error)),
            }
            tracing::info!(title = %task.title, moved = task.report.moved, failed = task.report.failed.len(), "console: task ended");
        });
        id
    }

    fn get(&self, id: u64) -> Option<Task> {
        let task = lock(&self.tasks).get(&id).cloned()?;
        let task = lock(&task).clone();
        Some(task)
    }
}

fn missing() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "No such task",
        "This task is not known: the console keeps the last 100 tasks of the running process.",
    )
}

pub(crate) async fn show(State(state): State<Arc<AppState>>, Path(id): Path<u64>) -> Response {
    let Some(task) = state.tasks.get(id) else {
        return missing();
    };
    let every = state.config.refresh.as_millis();
    let body = format!(
        "<div data-live=\"/tasks/{id}/live\" data-every=\"{every}\">{}</div>\
         <noscript><p class=\"muted\">Reload the page to see the progress.</p></noscript>\
         <p><a href=\"{}\">Back</a></p>",
        progress(&task),
        esc(&task.back)
    );
    page(&task.title, Nav::Other, &body).into_response()
}

pub(crate) async fn live(State(state): State<Arc<AppState>>, Path(id): Path<u64>) -> Response {
    match state.tasks.get(id) {
        Some(task) => Html(progress(&task)).into_response(),
        None => missing(),
    }
}

/// The numbers of a task; `data-finished` stops the live refresh.
fn progress(task: &Task) -> String {
    let report = &task.report;
    let (status, finished) = match (&task.error, task.took) {
        (Some(error), _) => (format!("<span class=\"bad\">failed: {}</span>", esc(error)), true),
        (None, Some(took)) => (
            format!("<span class=\"ok\">done</span> in {:.1} s", took.as_secs_f64()),
            true,
        ),
        (None, None) => (
            format!("running for {} s", task.started.elapsed().as_secs()),
            false,
        ),
    };
    let failures: String = report
        .failed
        .iter()
        .map(|failure| {
            format!(
                "<li><code>{}</code>: {}</li>",
                esc(&failure.message_id),
                esc(&failure.error)
            )
        })
        .collect();
    let failures = if failures.is_empty() {
        String::new()
    } else {
        format!("<h2>Not moved</h2><ul>{failures}</ul>")
    };
    format!(
        "<p id=\"task-status\" data-finished=\"{finished}\">{status}</p>\
         <div class=\"cards\">{moved}{examined}{skipped}{unroutable}{later}{failed}</div>{failures}",
        moved = crate::html::card(task.verb, &report.moved.to_string(), false, "task-moved"),
        examined = crate::html::card("Examined", &report.examined.to_string(), false, "task-examined"),
        skipped = crate::html::card(
            "Not matching (left)",
            &report.skipped.to_string(),
            false,
            "task-skipped"
        ),
        unroutable = crate::html::card(
            "Unknown source (left)",
            &report.unroutable.to_string(),
            report.unroutable > 0,
            "task-unroutable"
        ),
        later = crate::html::card(
            "Arrived after start (left)",
            &report.arrived_after_start.to_string(),
            false,
            "task-later"
        ),
        failed = crate::html::card(
            "Failed",
            &report.failed.len().to_string(),
            !report.failed.is_empty(),
            "task-failed"
        ),
    )
}
