//! Connecting a queue at start-up: a configuration error is fatal at once, with its fix; an outage is
//! retried with backoff, and the logs say it is one.
//!
//! | what failed | examples | what happens |
//! |---|---|---|
//! | configuration | no region, no credentials, the queue does not exist, access denied, a refused request | returns [`WorkerError::Connect`] at once: nothing will change until someone fixes it |
//! | outage | throttling, a 5xx, a timeout, a dropped connection | warns (`"... an outage, not a configuration error; retrying"`), waits, tries again, for up to `patience`; then returns [`WorkerError::Outage`] |
//!
//! The classification is [`QueueError::is_retryable`], with one correction: an SDK that has no region
//! or no credentials fails before sending anything, and `conveyor-sqs` reports that as unavailable
//! (the SDK calls it a dispatch failure); those are configuration errors, recognised by the SDK's
//! wording.

use std::future::Future;
use std::time::Duration;

use conveyor_core::port::QueueError;
use conveyor_core::runtime::{doubling, equal_jitter};

use crate::error::WorkerError;

/// How long [`connect_with_retry`] keeps retrying an outage by default before giving up.
pub const DEFAULT_CONNECT_PATIENCE: Duration = Duration::from_secs(5 * 60);
/// The first pause after an outage.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Calls `connect` until it succeeds; returns at once on a configuration error, and retries an
/// outage with exponential backoff (jittered, from 0.5 s up to 30 s) for up to `patience`.
///
/// `queue` names the queue in logs and errors (its URL or name).
///
/// ```no_run
/// # async fn example(client: aws_sdk_sqs::Client, url: &str) -> Result<(), conveyor_worker::WorkerError> {
/// use conveyor_worker::connect::{DEFAULT_CONNECT_PATIENCE, connect_with_retry};
///
/// let queue = connect_with_retry(url, DEFAULT_CONNECT_PATIENCE, || {
///     conveyor_sqs::SqsQueue::connect(client.clone(), url)
/// })
/// .await?;
/// # let _ = queue;
/// # Ok(()) }
/// ```
pub async fn connect_with_retry<T, F, Fut>(
    queue: &str,
    patience: Duration,
    mut connect: F,
) -> Result<T, WorkerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    let started = tokio::time::Instant::now();
    let mut attempts: u32 = 0;
    loop {
        let error = match connect().await {
            Ok(connected) => {
                if attempts > 0 {
                    tracing::info!(queue, attempts = attempts + 1, "connected after the outage");
                }
                return Ok(connected);
            }
            Err(error) => error,
        };
        attempts = attempts.saturating_add(1);
        if let Some(problem) = configuration_problem(&error) {
            return Err(WorkerError::Connect {
                queue: queue.to_owned(),
                problem,
            });
        }
        let pause = pause_after(attempts);
        let elapsed = started.elapsed();
        if elapsed + pause > patience {
            return Err(WorkerError::Outage {
                queue: queue.to_owned(),
                attempts,
                elapsed,
                last_error: match error {
                    QueueError::Unavailable { message } => message,
                    other => other.to_string(),
                },
            });
        }
        tracing::warn!(
            queue,
            %error,
            attempts,
            ?pause,
            "cannot reach SQS: an outage, not a configuration error; retrying"
        );
        tokio::time::sleep(pause).await;
    }
}

/// What to fix, when `error` is a configuration error rather than an outage.
fn configuration_problem(error: &QueueError) -> Option<String> {
    let message = match error {
        QueueError::QueueMissing { .. } => {
            return Some(
                "it does not exist: create it (infra/modules/queue) or fix the queue URL (CONVEYOR_QUEUE_URL)"
                    .to_owned(),
            );
        }
        QueueError::AccessDenied { message, .. } => {
            return Some(format!(
                "access denied ({message}): grant the worker's role the IAM actions listed in infra/README.md"
            ));
        }
        QueueError::Invalid { message } => return Some(format!("SQS refused the request: {message}")),
        QueueError::Unavailable { message } => message,
    };
    if let Some(problem) = set_endpoint_unreachable(message, |name| std::env::var(name).ok()) {
        return Some(problem);
    }
    let lower = message.to_ascii_lowercase();
    if lower.contains("missing signing region") || lower.contains("no region") {
        return Some(
            "no AWS region is configured: set AWS_REGION (e.g. AWS_REGION=us-east-1) or a region in the \
             AWS profile; for the local stack, `source localstack/env.sh`"
                .to_owned(),
        );
    }
    if lower.contains("credentialsnotloaded")
        || lower.contains("no providers in chain provided credentials")
        || lower.contains("credential provider was not enabled")
    {
        return Some(
            "no AWS credentials were found: give the task an IAM role (ECS task role), or set \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; for the local stack, \
             `source localstack/env.sh`"
                .to_owned(),
        );
    }
    None
}

/// When the request never reached an endpoint that a variable set (nothing listens there, or its host
/// does not resolve): a configuration error naming the address dialled and the variable, not an
/// outage (`conveyor_sqs::endpoint`, shared with the Lambda adapter and the producer). `var` reads the
/// environment.
fn set_endpoint_unreachable(message: &str, var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let reason = message.strip_prefix("the request did not reach SQS: ")?;
    let unreachable = conveyor_sqs::endpoint::UnreachableEndpoint::from_reason(reason, var)?;
    Some(format!(
        "{unreachable}, so the worker stops instead of retrying; {} (a container that starts before its \
         emulator: make it wait for the emulator's health check)",
        unreachable.fix()
    ))
}

/// The pause after the `attempts`-th failure in a row: doubling from [`FIRST_PAUSE`] up to
/// [`MAX_PAUSE`], half of it random so a fleet restarting together does not retry in step.
fn pause_after(attempts: u32) -> Duration {
    equal_jitter(doubling(FIRST_PAUSE, attempts, MAX_PAUSE))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::time::Instant;

    use super::*;

    fn unavailable(message: &str) -> QueueError {
        QueueError::Unavailable {
            message: message.to_owned(),
        }
    }

    /// A wrong port in AWS_ENDPOINT_URL_SQS is a configuration error naming the port dialled and the
    /// variable; without a variable (AWS's own endpoint) a refused connection stays an outage.
    #[test]
    fn a_refused_endpoint_that_a_variable_set_is_named_with_the_variable() {
        let refused = "the request did not reach SQS: dispatch failure: io error: client error (Connect): tcp \
                       connect error: Connection refused (os error 111)";
        let set = |name: &str| (name == "AWS_ENDPOINT_URL_SQS").then(|| "http://127.0.0.1:4567".to_owned());
        let problem = set_endpoint_unreachable(refused, set).expect("a configuration error");
        assert!(
            problem.contains("http://127.0.0.1:4567")
                && problem.contains("AWS_ENDPOINT_URL_SQS")
                && problem.contains("not an outage"),
            "{problem}"
        );
        assert_eq!(set_endpoint_unreachable(refused, |_| None), None);
        let throttled = "the request did not reach SQS: timeout";
        assert_eq!(set_endpoint_unreachable(throttled, set), None);
        let general = |name: &str| (name == "AWS_ENDPOINT_URL").then(|| "http://localstack:4566".to_owned());
        let dns = "the request did not reach SQS: dispatch failure: dns error: failed to lookup address information";
        let problem = set_endpoint_unreachable(dns, general).expect("a configuration error");
        assert!(
            problem.contains("AWS_ENDPOINT_URL)") && problem.contains("does not resolve"),
            "{problem}"
        );
    }

    /// A connect that fails with `errors` in turn, then succeeds; counts its calls.
    fn scripted(
        errors: Vec<QueueError>,
        calls: &AtomicU32,
    ) -> impl FnMut() -> std::future::Ready<Result<&'static str, QueueError>> + '_ {
        move || {
            let call = calls.fetch_add(1, Ordering::Relaxed) as usize;
            std::future::ready(match errors.get(call) {
                Some(error) => Err(error.clone()),
                None => Ok("connected"),
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_retried_with_backoff_until_it_ends() {
        let calls = AtomicU32::new(0);
        let errors = vec![
            unavailable("503 ServiceUnavailable"),
            unavailable("timeout"),
            unavailable("throttled"),
        ];
        let started = Instant::now();
        let connected = connect_with_retry("jobs", DEFAULT_CONNECT_PATIENCE, scripted(errors, &calls))
            .await
            .unwrap();
        assert_eq!(connected, "connected");
        assert_eq!(calls.load(Ordering::Relaxed), 4);
        // Pauses of 0.25–0.5 s, 0.5–1 s, 1–2 s: backoff, not a spin, not a long stall.
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(1_750)..=Duration::from_millis(3_500)).contains(&waited),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn configuration_errors_are_fatal_at_once_with_their_fix() {
        let cases = [
            (
                QueueError::QueueMissing { queue: "jobs".into() },
                "does not exist",
            ),
            (
                QueueError::AccessDenied {
                    queue: "jobs".into(),
                    message: "not authorized".into(),
                },
                "access denied",
            ),
            (
                unavailable(
                    "dispatch failure: other: missing signing region (DispatchFailure(DispatchFailure { \
                     source: ConnectorError { kind: Other(None), source: MissingSigningRegion } }))",
                ),
                "AWS_REGION",
            ),
            (
                unavailable(
                    "dispatch failure: other: the credential provider was not enabled: no providers in chain \
                     provided credentials (DispatchFailure(..CredentialsNotLoaded..))",
                ),
                "AWS_ACCESS_KEY_ID",
            ),
        ];
        for (error, fix) in cases {
            let calls = AtomicU32::new(0);
            let started = Instant::now();
            let result =
                connect_with_retry("jobs", DEFAULT_CONNECT_PATIENCE, scripted(vec![error], &calls)).await;
            let message = result.unwrap_err().to_string();
            assert_eq!(calls.load(Ordering::Relaxed), 1, "no retry: {message}");
            assert_eq!(started.elapsed(), Duration::ZERO, "no wait: {message}");
            assert!(message.contains(fix), "{message}");
            assert!(
                !message.contains("retrying"),
                "says retrying while exiting: {message}"
            );
            assert!(!message.contains("DispatchFailure"), "an SDK dump: {message}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_outage_gives_up_after_its_patience_and_says_it_was_an_outage() {
        let calls = AtomicU32::new(0);
        let errors = vec![unavailable("503"); 1_000];
        let started = Instant::now();
        let result = connect_with_retry("jobs", Duration::from_secs(120), scripted(errors, &calls)).await;
        let message = result.unwrap_err().to_string();
        assert!(
            started.elapsed() <= Duration::from_secs(120),
            "{:?}",
            started.elapsed()
        );
        let attempts = calls.load(Ordering::Relaxed);
        // 0.5 s doubling to 30 s: about a dozen attempts in two minutes.
        assert!((6..=20).contains(&attempts), "{attempts} attempts");
        assert!(
            message.contains("outage") && message.contains("jobs"),
            "{message}"
        );
    }
}
