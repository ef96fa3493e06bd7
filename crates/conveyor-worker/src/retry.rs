//! One retry policy for every AWS call the worker makes: tries until a deadline, each try cut at it.
//!
//! The deadline is what the call protects: for a visibility extension, the earliest visibility deadline
//! in the batch; for a delete, the time shortly before the receipt expires; for a release at shutdown,
//! the shutdown budget. Past it the call's result no longer matters (the message reappears on its own),
//! so the caller learns it failed and acts on that, instead of retrying into a lapsed receipt.
//!
//! Pauses between tries grow from 100 ms to 2 s with "equal jitter" (half fixed, half random), so a fleet
//! does not retry in step and no pause is near zero.

use std::future::Future;
use std::time::Duration;

use conveyor_core::port::{EntryError, EntryFailure, QueueError};
use conveyor_core::runtime::{doubling, equal_jitter};
use tokio::time::Instant;

/// The first pause between tries.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between tries.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// Less time than this left before the deadline: no further try.
const MIN_TRY: Duration = Duration::from_millis(50);

/// The tries of one call, until a deadline.
#[derive(Debug)]
pub(crate) struct Attempts {
    deadline: Instant,
    tries: u32,
}

impl Attempts {
    /// Tries until `deadline`.
    pub(crate) fn until(deadline: Instant) -> Self {
        Self { deadline, tries: 0 }
    }

    /// Moves the deadline (a heartbeat extended what the call protects).
    pub(crate) fn move_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Tries made so far.
    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }

    /// Waits for the next try (at once for the first) and returns the time it may take; `None` when
    /// the deadline leaves no room for another try.
    pub(crate) async fn next(&mut self) -> Option<Duration> {
        if self.tries > 0 {
            // Never pause past the deadline: the last tries come closer together, until too little
            // time is left for one.
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left < MIN_TRY {
                return None;
            }
            tokio::time::sleep(pause(self.tries).min(left / 2)).await;
        }
        self.tries += 1;
        let left = self.deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// Runs one try of `call`, cut at the deadline: a try that runs out of time is
    /// [`QueueError::Unavailable`], like any other transient failure.
    pub(crate) async fn run<T>(
        &self,
        left: Duration,
        call: impl Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        match tokio::time::timeout(left, call).await {
            Ok(result) => result,
            Err(_) => Err(QueueError::Unavailable {
                message: format!("no answer within {left:?}, the time left before the deadline it protects"),
            }),
        }
    }
}

/// A batch call's per-entry errors by position: `None` for the entries that succeeded.
pub(crate) fn errors_by_entry(len: usize, failures: Vec<EntryFailure>) -> Vec<Option<EntryError>> {
    let mut errors: Vec<Option<EntryError>> = vec![None; len];
    for failure in failures {
        if let Some(slot) = errors.get_mut(failure.index) {
            *slot = Some(failure.error);
        }
    }
    errors
}

/// The pause after the `tries`-th failed try.
fn pause(tries: u32) -> Duration {
    equal_jitter(doubling(FIRST_PAUSE, tries, MAX_PAUSE))
}

/// Runs `call` until it succeeds, fails for good, or `deadline` passes (each try cut at the deadline).
pub(crate) async fn until<T, F, Fut>(deadline: Instant, mut call: F) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    let mut attempts = Attempts::until(deadline);
    let mut last = QueueError::Unavailable {
        message: "the deadline had passed before the first try".to_owned(),
    };
    while let Some(left) = attempts.next().await {
        match attempts.run(left, call()).await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_retryable() => last = error,
            Err(error) => return Err(error),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn unavailable() -> QueueError {
        QueueError::Unavailable {
            message: "503".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_promptly_until_it_works() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let result = until(started + Duration::from_secs(10), || async {
            if calls.fetch_add(1, Ordering::Relaxed) < 3 {
                Err(unavailable())
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result, Ok(7));
        assert_eq!(calls.load(Ordering::Relaxed), 4);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_is_cut_at_the_deadline() {
        let started = Instant::now();
        let result: Result<(), _> = until(started + Duration::from_secs(3), std::future::pending).await;
        assert!(matches!(result, Err(QueueError::Unavailable { .. })));
        assert!(started.elapsed() <= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_before_the_deadline_and_on_permanent_errors() {
        let calls = AtomicU32::new(0);
        let started = Instant::now();
        let result: Result<(), _> = until(started + Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(unavailable())
        })
        .await;
        assert_eq!(result, Err(unavailable()));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(calls.load(Ordering::Relaxed) >= 4, "retried while time was left");

        let missing = QueueError::QueueMissing { queue: "q".into() };
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = until(Instant::now() + Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(missing.clone())
        })
        .await;
        assert_eq!(result, Err(missing.clone()));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
