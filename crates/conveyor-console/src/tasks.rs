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
use maud::{Markup, html};

use crate::html::{Nav, card, page, problem};
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
            tracing::warn!(title = %task.title, moved = task.report.moved, failed = task.report.failed.len(), "console: task ended");
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
    let body = html! {
        div data-live={ "/tasks/" (id) "/live" } data-every=(every) { (progress(&task)) }
        noscript { p class="muted" { "Reload the page to see the progress." } }
        p { a href=(task.back) { "Back" } }
    };
    page(&task.title, Nav::Other, body).into_response()
}

pub(crate) async fn live(State(state): State<Arc<AppState>>, Path(id): Path<u64>) -> Response {
    match state.tasks.get(id) {
        Some(task) => Html(progress(&task).into_string()).into_response(),
        None => missing(),
    }
}

/// The numbers of a task; `data-finished` stops the live refresh.
fn progress(task: &Task) -> Markup {
    let report = &task.report;
    let (status, finished) = match (&task.error, task.took) {
        (Some(error), _) => (html! { span class="bad" { "failed: " (error) } }, true),
        (None, Some(took)) => (
            html! { span class="ok" { "done" } " in " (format!("{:.1}", took.as_secs_f64())) " s" },
            true,
        ),
        (None, None) => (
            html! { "running for " (task.started.elapsed().as_secs()) " s" },
            false,
        ),
    };
    html! {
        p id="task-status" data-finished=(finished) { (status) }
        div class="cards" {
            (card(task.verb, report.moved, false, "task-moved"))
            (card("Examined", report.examined, false, "task-examined"))
            (card("Not matching (left)", report.skipped, false, "task-skipped"))
            (card("Unknown source (left)", report.unroutable, report.unroutable > 0, "task-unroutable"))
            (card("Arrived after start (left)", report.arrived_after_start, false, "task-later"))
            (card("Failed", report.failed.len(), !report.failed.is_empty(), "task-failed"))
        }
        @if !report.failed.is_empty() {
            h2 { "Not moved" }
            ul {
                @for failure in &report.failed {
                    li { code { (failure.message_id) } ": " (failure.error) }
                }
            }
        }
    }
}
