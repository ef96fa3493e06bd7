//! Long operations (redrive, delete) run in the background; their page shows progress until they end.
//!
//! The operation itself is the library's ([`move_messages`](conveyor_sqs::admin::move_messages),
//! [`delete_messages`](conveyor_sqs::admin::delete_messages)), the same code `conveyor dlq redrive`
//! runs; its progress callback writes the report here after every batch. A running task can be stopped
//! from its page (`POST /tasks/{id}/stop`): the loop finishes its batch, makes what it holds visible
//! again and ends, as `conveyor dlq redrive` does on Ctrl-C. `/tasks` lists this process's tasks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use conveyor_sqs::admin::{AdminError, MoveReport};
use maud::{Markup, html};

use crate::auth::refuse_without_csrf;
use crate::fields::Fields;
use crate::html::{Nav, card, csrf_field, page, problem};
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
    /// Set to stop the task after its current batch.
    pub(crate) stop: Arc<AtomicBool>,
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
    /// Registers a task and spawns `work`, which gets a progress callback and the flag that stops it;
    /// returns the task's id.
    pub(crate) fn spawn<F, Fut>(&self, title: String, verb: &'static str, back: String, work: F) -> u64
    where
        F: FnOnce(Box<dyn FnMut(&MoveReport) + Send>, Arc<AtomicBool>) -> Fut,
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
            stop: Arc::new(AtomicBool::new(false)),
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
        let stop = Arc::clone(&lock(&task).stop);
        let work = work(progress, stop);
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

    /// Every kept task with its id, newest first.
    fn all(&self) -> Vec<(u64, Task)> {
        let tasks: Vec<(u64, Arc<Mutex<Task>>)> = lock(&self.tasks)
            .iter()
            .rev()
            .map(|(id, task)| (*id, Arc::clone(task)))
            .collect();
        tasks
            .into_iter()
            .map(|(id, task)| (id, lock(&task).clone()))
            .collect()
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
        @if task.took.is_none() {
            form method="post" action={ "/tasks/" (id) "/stop" } class="inline" {
                (csrf_field(&state))
                button type="submit" class="danger" id="stop-task" { "Stop after this batch" }
            }
        }
        p { a href=(task.back) { "Back" } " · " a href="/tasks" { "All tasks" } }
    };
    page(&task.title, Nav::Other, body).into_response()
}

/// `POST /tasks/{id}/stop`: the task stops after its current batch; what it holds goes back.
pub(crate) async fn stop(
    State(state): State<Arc<AppState>>,
    Path(id): Path<u64>,
    Form(fields): Form<Fields>,
) -> Response {
    if let Some(refused) = refuse_without_csrf(&state, &fields) {
        return refused;
    }
    let Some(task) = state.tasks.get(id) else {
        return missing();
    };
    task.stop.store(true, Ordering::Relaxed);
    tracing::warn!(title = %task.title, "console: task stopped by the operator");
    Redirect::to(&format!("/tasks/{id}")).into_response()
}

/// `GET /tasks`: this process's tasks, newest first.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Response {
    let tasks = state.tasks.all();
    let body = html! {
        div class="scroll" {
            table id="tasks" {
                thead { tr { th { "Task" } th { "Status" } th class="n" { "Moved or deleted" } th class="n wide" { "Examined" } } }
                tbody {
                    @for (id, task) in &tasks {
                        tr {
                            td { a href={ "/tasks/" (id) } { (task.title) } }
                            td { (status_word(task)) }
                            td class="n" { (task.report.moved) }
                            td class="n wide" { (task.report.examined) }
                        }
                    }
                    @if tasks.is_empty() {
                        tr { td colspan="4" class="muted" { "No redrive or delete has run in this console yet." } }
                    }
                }
            }
        }
        p class="muted" { "SQS's own move tasks are listed on each dead-letter page." }
    };
    page("Tasks", Nav::Other, body).into_response()
}

/// A task's state in a word: running, stopped, done or failed.
fn status_word(task: &Task) -> &'static str {
    match (&task.error, task.took) {
        (Some(_), _) => "failed",
        (None, None) => "running",
        (None, Some(_)) if task.report.stopped => "stopped",
        (None, Some(_)) => "done",
    }
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
        (None, Some(took)) if report.stopped => (
            html! { span class="bad" { "stopped" } " by the operator after " (format!("{:.1}", took.as_secs_f64())) " s; what was not moved stays where it was" },
            true,
        ),
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
