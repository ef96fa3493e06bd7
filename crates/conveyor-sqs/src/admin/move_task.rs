//! SQS's own DLQ redrive: `StartMessageMoveTask`, `ListMessageMoveTasks` and `CancelMessageMoveTask`.
//!
//! A move task moves every message of a DLQ, as it is (the `conveyor.failure` attribute stays on the
//! message), at an optional rate. Without a destination SQS moves each message back to the queue it was
//! redriven from, which works only for messages SQS's redrive put there (they carry
//! `DeadLetterQueueSourceArn`); messages a Conveyor worker dead-lettered were *sent* to the DLQ, so the
//! caller should name the destination whenever it knows it (LocalStack 4.8.1 fails such a task with
//! `AttributeError`, after moving the messages that do carry a source).

use std::time::Duration;

use aws_sdk_sqs::Client;

use super::error::{AdminError, admin_error};

/// SQS's limit on `MaxNumberOfMessagesPerSecond`.
pub const MAX_MOVE_RATE: u32 = 500;
/// How long [`wait_for_move_task`] waits for a started task to show up in `ListMessageMoveTasks`.
pub const TASK_LISTING_TIMEOUT: Duration = Duration::from_secs(30);

/// A started move task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveTaskHandle {
    /// SQS's task handle (needed to cancel it).
    pub handle: String,
    /// The DLQ's ARN.
    pub source_arn: String,
    /// The destination's ARN; `None` for "each message's original source".
    pub destination_arn: Option<String>,
    /// The start time (epoch ms) of the newest task listed before this one started: a listed task without
    /// a handle is this one only if it started later.
    pub started_after_ms: u64,
}

/// A move task's state as `ListMessageMoveTasks` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveTaskStatus {
    /// `RUNNING`, `COMPLETED`, `CANCELLING`, `CANCELLED` or `FAILED`.
    pub status: String,
    /// `ApproximateNumberOfMessagesMoved`.
    pub moved: u64,
    /// `ApproximateNumberOfMessagesToMove` (the DLQ's depth when the task started).
    pub to_move: Option<u64>,
    /// `FailureReason`, for a failed task.
    pub failure_reason: Option<String>,
    /// The task's handle (SQS reports it only while the task runs).
    pub handle: Option<String>,
    /// Where the task moves messages; `None` for each message's original source.
    pub destination_arn: Option<String>,
    /// `MaxNumberOfMessagesPerSecond`, when the task was started with one.
    pub rate: Option<u32>,
    /// When the task started, in epoch milliseconds.
    pub started_at_ms: u64,
}

impl MoveTaskStatus {
    /// The destination queue's name (the last part of its ARN); `None` for each message's original source.
    pub fn destination_name(&self) -> Option<&str> {
        let arn = self.destination_arn.as_deref()?;
        Some(arn.rsplit(':').next().unwrap_or(arn))
    }

    /// True once the task has stopped, successfully or not.
    pub fn is_finished(&self) -> bool {
        matches!(self.status.as_str(), "COMPLETED" | "FAILED" | "CANCELLED")
    }
}

/// Starts moving every message of the DLQ `source_arn` to `destination_arn` (or to each message's
/// original source when `None`), at most `rate` messages per second (1..=500; SQS picks when `None`).
///
/// An endpoint without the operation gives [`AdminError::Unsupported`]: the caller can fall back to
/// [`move_messages`](super::move_messages). One `ListMessageMoveTasks` comes first, to tell this task
/// from earlier ones later (see [`move_task_status`]).
pub async fn start_move_task(
    client: &Client,
    source_arn: &str,
    destination_arn: Option<&str>,
    rate: Option<u32>,
) -> Result<MoveTaskHandle, AdminError> {
    let started_after_ms = list_move_tasks(client, source_arn)
        .await?
        .iter()
        .map(|task| task.started_at_ms)
        .max()
        .unwrap_or(0);
    let rate = rate.map(|rate| i32::try_from(rate.clamp(1, MAX_MOVE_RATE)).unwrap_or(1));
    let output = client
        .start_message_move_task()
        .source_arn(source_arn)
        .set_destination_arn(destination_arn.map(str::to_owned))
        .set_max_number_of_messages_per_second(rate)
        .send()
        .await
        .map_err(|error| admin_error(&error, source_arn, "StartMessageMoveTask"))?;
    Ok(MoveTaskHandle {
        handle: output.task_handle().unwrap_or_default().to_owned(),
        source_arn: source_arn.to_owned(),
        destination_arn: destination_arn.map(str::to_owned),
        started_after_ms,
    })
}

/// The most recent move tasks of the DLQ `source_arn`, newest first (SQS keeps the last 10).
pub async fn list_move_tasks(client: &Client, source_arn: &str) -> Result<Vec<MoveTaskStatus>, AdminError> {
    let output = client
        .list_message_move_tasks()
        .source_arn(source_arn)
        .max_results(10)
        .send()
        .await
        .map_err(|error| admin_error(&error, source_arn, "ListMessageMoveTasks"))?;
    Ok(output
        .results()
        .iter()
        .map(|entry| MoveTaskStatus {
            status: entry.status().unwrap_or("UNKNOWN").to_owned(),
            moved: u64::try_from(entry.approximate_number_of_messages_moved()).unwrap_or(0),
            to_move: entry
                .approximate_number_of_messages_to_move()
                .and_then(|count| u64::try_from(count).ok()),
            failure_reason: entry.failure_reason().map(str::to_owned),
            handle: entry.task_handle().map(str::to_owned),
            destination_arn: entry.destination_arn().map(str::to_owned),
            rate: entry
                .max_number_of_messages_per_second()
                .and_then(|rate| u32::try_from(rate).ok()),
            started_at_ms: u64::try_from(entry.started_timestamp()).unwrap_or(0),
        })
        .collect())
}

/// Cancels the running move task with SQS's handle `handle` (as [`MoveTaskStatus::handle`] or
/// `StartMessageMoveTask` gave it); returns how many messages it had moved. Messages already moved stay
/// where they went; the rest stay in the DLQ. A task that is not running is refused by SQS
/// (`ResourceNotFoundException`), as is a handle that is not one (`InvalidParameterValue`):
/// [`AdminError::MoveTaskNotRunning`].
pub async fn cancel_move_task(client: &Client, handle: &str) -> Result<u64, AdminError> {
    let output = client
        .cancel_message_move_task()
        .task_handle(handle)
        .send()
        .await
        .map_err(|error| {
            use aws_sdk_sqs::error::ProvideErrorMetadata as _;
            // AWS: a task that is not running; LocalStack: a handle it cannot read.
            if matches!(
                error.code(),
                Some("ResourceNotFoundException" | "InvalidParameterValue")
            ) {
                return AdminError::MoveTaskNotRunning {
                    handle: handle.to_owned(),
                    message: super::display_chain(&error),
                };
            }
            admin_error(&error, handle, "CancelMessageMoveTask")
        })?;
    Ok(u64::try_from(output.approximate_number_of_messages_moved()).unwrap_or(0))
}

/// The status of the task `task`: the listed task with its handle, else the newest task that started after
/// the tasks listed before it (SQS reports the handle only while a task runs). `None` while the task does
/// not show up yet.
pub async fn move_task_status(
    client: &Client,
    task: &MoveTaskHandle,
) -> Result<Option<MoveTaskStatus>, AdminError> {
    let tasks = list_move_tasks(client, &task.source_arn).await?;
    Ok(pick_task(tasks, task))
}

/// The entry of `tasks` (newest first) that is `task`.
fn pick_task(tasks: Vec<MoveTaskStatus>, task: &MoveTaskHandle) -> Option<MoveTaskStatus> {
    if let Some(position) = tasks
        .iter()
        .position(|status| status.handle.as_deref() == Some(task.handle.as_str()))
    {
        return tasks.into_iter().nth(position);
    }
    tasks
        .into_iter()
        .filter(|status| status.handle.is_none() && status.started_at_ms > task.started_after_ms)
        .max_by_key(|status| status.started_at_ms)
}

/// Polls the task every `interval` until it finishes, calling `on_progress` with each status read. A
/// `FAILED` task is [`AdminError::MoveTaskFailed`]; `COMPLETED` and `CANCELLED` return their last status.
/// A task that does not show up in the listing within [`TASK_LISTING_TIMEOUT`] is
/// [`AdminError::MoveTaskNotListed`].
pub async fn wait_for_move_task(
    client: &Client,
    task: &MoveTaskHandle,
    interval: Duration,
    on_progress: &mut dyn FnMut(&MoveTaskStatus),
) -> Result<MoveTaskStatus, AdminError> {
    let listing_deadline = tokio::time::Instant::now() + TASK_LISTING_TIMEOUT;
    let mut seen = false;
    loop {
        let status = move_task_status(client, task).await?;
        if status.is_none() && !seen && tokio::time::Instant::now() >= listing_deadline {
            return Err(AdminError::MoveTaskNotListed {
                source_queue: task.source_arn.clone(),
                handle: task.handle.clone(),
            });
        }
        if let Some(status) = status {
            seen = true;
            on_progress(&status);
            if status.status == "FAILED" {
                return Err(AdminError::MoveTaskFailed {
                    source_queue: task.source_arn.clone(),
                    moved: status.moved,
                    reason: status
                        .failure_reason
                        .unwrap_or_else(|| "no reason given".to_owned()),
                });
            }
            if status.is_finished() {
                return Ok(status);
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(handle: Option<&str>, started_at_ms: u64, state: &str) -> MoveTaskStatus {
        MoveTaskStatus {
            status: state.to_owned(),
            moved: 0,
            to_move: None,
            failure_reason: None,
            handle: handle.map(str::to_owned),
            destination_arn: None,
            rate: None,
            started_at_ms,
        }
    }

    #[test]
    fn a_task_is_found_by_handle_or_by_starting_after_the_earlier_ones() {
        let task = MoveTaskHandle {
            handle: "h2".to_owned(),
            source_arn: "arn".to_owned(),
            destination_arn: None,
            started_after_ms: 100,
        };
        let running = vec![status(Some("h2"), 200, "RUNNING"), status(None, 100, "COMPLETED")];
        assert_eq!(
            pick_task(running, &task).map(|s| s.status),
            Some("RUNNING".to_owned())
        );
        let finished = vec![status(None, 200, "COMPLETED"), status(None, 100, "COMPLETED")];
        assert_eq!(pick_task(finished, &task).map(|s| s.started_at_ms), Some(200));
        // Not listed yet: the older task is not mistaken for it.
        let not_yet = vec![status(None, 100, "COMPLETED")];
        assert_eq!(pick_task(not_yet, &task), None);
    }
}
