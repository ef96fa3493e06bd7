//! How failures reach the user: `error: ...` on stderr, a hint when there is an obvious next step, and
//! an exit code by class, as the AWS CLI v2 separates them (its "Command line return codes" page):
//!
//! | code | class | from |
//! |---|---|---|
//! | 2 | usage | clap's parse errors, [`UsageError`] |
//! | 130 | interrupted | [`Interrupted`] (Ctrl-C) |
//! | 253 | configuration | [`ConfigError`] (no region, no credentials) |
//! | 254 | the service answered with an error | a [`QueueError`] from SQS's answer (missing queue, access denied, a refused request, throttling, a 5xx), an [`AdminError`] SQS answered (no such move task, purge in progress, unsupported operation) |
//! | 255 | the request never got an answer | a [`QueueError`] whose request did not reach SQS, timed out, could not be built or whose answer could not be read |
//! | 1 | anything else | a failure the CLI found itself (a malformed file, a job over a limit), partial failures |
//!
//! Usage stays 2 (clap's code, and the AWS CLI's for a command line that does not parse) rather than
//! the AWS CLI's 252: the CLI refuses a bad value where clap does, so one code means "fix the command".

use std::process::ExitCode;

use conveyor_core::port::QueueError;
use conveyor_sqs::ProduceError;
use conveyor_sqs::admin::{AdminError, queue_url_region};

use crate::aws::{Aws, ConfigError};

/// A request the command refuses as given (exit code 2), such as `purge` without its confirmation flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub String);

/// A command stopped by Ctrl-C after saying what it had done (exit code 130, as a shell reports an
/// interrupted command).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Interrupted(pub String);

/// A future that resolves at Ctrl-C (SIGINT), with the handler installed when this is called rather than
/// when the future is first polled: a command that says "Ctrl-C stops" after calling it never loses
/// the signal to the default action (which kills the process with no word of what was left running).
pub(crate) fn ctrl_c() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        #[cfg(unix)]
        match &mut signal {
            Ok(signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot watch for Ctrl-C; the command runs to its end");
                std::future::pending::<()>().await;
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Prints `error` (with its causes) and a hint on stderr; returns the exit code. `aws` (absent when the
/// configuration itself failed to load) names the region and endpoint in the hints.
pub(crate) fn report(error: &anyhow::Error, aws: Option<&Aws>) -> ExitCode {
    match unreachable(error).zip(aws) {
        Some((reason, aws)) => crate::errln!(
            "error: cannot reach SQS at {} (region {}): {reason}",
            aws.sqs_endpoint(),
            aws.region
        ),
        None => crate::errln!("error: {error:#}"),
    }
    if let Some(hint) = hint(error, aws) {
        crate::errln!("hint: {hint}");
    }
    ExitCode::from(exit_code(error) as u8)
}

/// The class of a failure, which names its exit code (the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ExitClass {
    /// Anything the other classes do not name.
    Failure = 1,
    /// The command as given is refused.
    Usage = 2,
    /// Stopped by Ctrl-C.
    Interrupted = 130,
    /// The environment or configuration is invalid (no region, no credentials).
    Configuration = 253,
    /// The request reached AWS, which answered with an error.
    Service = 254,
    /// The request got no answer: not sent, not reached, timed out, unreadable.
    Client = 255,
}

/// The class of `error`, from the first cause in its chain that has one.
pub(crate) fn exit_code(error: &anyhow::Error) -> ExitClass {
    error.chain().find_map(class_of).unwrap_or(ExitClass::Failure)
}

/// The class of one cause, when its type says it.
fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<ExitClass> {
    if cause.is::<UsageError>() {
        return Some(ExitClass::Usage);
    }
    if cause.is::<Interrupted>() {
        return Some(ExitClass::Interrupted);
    }
    if cause.is::<ConfigError>() {
        return Some(ExitClass::Configuration);
    }
    if let Some(error) = cause.downcast_ref::<QueueError>() {
        return Some(queue_class(error));
    }
    if let Some(error) = cause.downcast_ref::<ProduceError>() {
        return match error {
            ProduceError::Queue(inner) => Some(queue_class(inner)),
            _ => None,
        };
    }
    match cause.downcast_ref::<AdminError>()? {
        AdminError::Queue(inner) => Some(queue_class(inner)),
        AdminError::BadQueueRef(_) => Some(ExitClass::Usage),
        AdminError::Unsupported { .. }
        | AdminError::MoveTaskNotRunning { .. }
        | AdminError::PurgeInProgress { .. } => Some(ExitClass::Service),
        _ => None,
    }
}

/// Whether SQS answered: `conveyor_sqs` classifies a call that got no answer (dispatch failure, timeout,
/// unreadable response, a request that could not be built) as `Unavailable` or `Invalid` with the
/// messages matched here, and everything SQS said with its own words.
fn queue_class(error: &QueueError) -> ExitClass {
    let message = match error {
        QueueError::QueueMissing { .. } | QueueError::AccessDenied { .. } => return ExitClass::Service,
        QueueError::Unavailable { message } | QueueError::Invalid { message } => message,
    };
    let unanswered = [
        DISPATCH_PREFIX,
        TIMEOUT_PREFIX,
        "request has timed out",
        "response error",
        "failed to construct request",
    ];
    if unanswered.iter().any(|prefix| message.starts_with(prefix)) {
        return ExitClass::Client;
    }
    ExitClass::Service
}

/// A next step for errors that have an obvious one.
fn hint(error: &anyhow::Error, aws: Option<&Aws>) -> Option<String> {
    if let Some(queue) = missing_queue(error) {
        return Some(missing_queue_hint(queue, aws));
    }
    let reason = unreachable(error)?;
    let aws = aws?;
    let endpoint = aws.sqs_endpoint();
    let fix = if aws.local_sqs_endpoint().is_some() {
        "check --endpoint-url / AWS_ENDPOINT_URL_SQS"
    } else {
        "check --region / AWS_REGION (it names AWS's endpoint) and your network or proxy"
    };
    let local = "for the local emulators, run ./localstack/start.sh and `source localstack/env.sh`";
    if reason.contains("dns error") {
        return Some(format!(
            "the host name of {endpoint} does not resolve (DNS), which is a configuration mistake rather than an \
             outage: {fix}; {local}"
        ));
    }
    if reason.contains("Connection refused") {
        return Some(format!("nothing listens at {endpoint}: {fix}; {local}"));
    }
    Some(format!("if this is not a network outage, {fix}; {local}"))
}

/// What a `cannot reach` error says: the reason when a request never reached SQS (DNS, refused
/// connection, TLS), from the classification's "the request did not reach SQS: ..." message.
fn unreachable(error: &anyhow::Error) -> Option<&str> {
    match queue_error(error)? {
        QueueError::Unavailable { message } => message.strip_prefix(DISPATCH_PREFIX),
        _ => None,
    }
}

/// How `conveyor_sqs` starts the message of a request that never reached SQS.
const DISPATCH_PREFIX: &str = "the request did not reach SQS: ";

/// How `conveyor_sqs` starts the message of a request SQS did not answer in time.
const TIMEOUT_PREFIX: &str = "no answer from SQS in time: ";

fn missing_queue_hint(queue: &str, aws: Option<&Aws>) -> String {
    let name = queue.trim_end_matches('/').rsplit('/').next().unwrap_or(queue);
    let mut hint = String::new();
    if let Some(aws) = aws
        && let Some(url_region) = queue_url_region(queue)
        && url_region != aws.region
    {
        let region = &aws.region;
        hint = format!(
            "the queue URL names region {url_region} but this command uses region {region}, and SQS answers \
             \"does not exist\" for a queue of another region: pass --region {url_region} or set \
             AWS_REGION={url_region}; otherwise "
        );
    }
    let fifo = if name.ends_with(".fifo") {
        " --attributes FifoQueue=true"
    } else {
        ""
    };
    match aws.and_then(Aws::local_sqs_endpoint) {
        Some(endpoint) => {
            let local_fifo = if fifo.is_empty() { "" } else { " --fifo" };
            let base = name.trim_end_matches(".fifo");
            hint.push_str(&format!(
                "create it on the local stack with `conveyor local init --queue {base}{local_fifo}` (queue, DLQ, \
                 redrive policy and idempotency table), or `aws sqs create-queue --queue-name {name}{fifo} \
                 --endpoint-url {endpoint}`; check the URL with `aws sqs list-queues --endpoint-url {endpoint}`"
            ));
        }
        None => hint.push_str(&format!(
            "create the queue with `aws sqs create-queue --queue-name {name}{fifo}`, or apply infra/modules/queue, \
             which also creates its DLQ and redrive policy; check the URL with `aws sqs list-queues`"
        )),
    }
    hint
}

/// The queue named by a "queue does not exist" error anywhere in the chain.
fn missing_queue(error: &anyhow::Error) -> Option<&str> {
    match queue_error(error)? {
        QueueError::QueueMissing { queue } => Some(queue.as_str()),
        _ => None,
    }
}

/// The first [`QueueError`] in the chain, directly or inside an admin or producer error.
fn queue_error(error: &anyhow::Error) -> Option<&QueueError> {
    error.chain().find_map(|cause| {
        cause
            .downcast_ref::<QueueError>()
            .or_else(|| match cause.downcast_ref::<AdminError>() {
                Some(AdminError::Queue(inner)) => Some(inner),
                _ => None,
            })
            .or_else(|| match cause.downcast_ref::<ProduceError>() {
                Some(ProduceError::Queue(inner)) => Some(inner),
                _ => None,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_queue_gets_a_create_hint_with_its_name() {
        let error = anyhow::Error::new(AdminError::Queue(QueueError::QueueMissing {
            queue: "http://127.0.0.1:4566/000000000000/orders.fifo".to_owned(),
        }));
        let text = hint(&error, None).unwrap();
        assert!(
            text.contains("--queue-name orders.fifo --attributes FifoQueue=true"),
            "{text}"
        );
        let wrapped = anyhow::Error::new(ProduceError::Queue(QueueError::QueueMissing {
            queue: "http://x/jobs".to_owned(),
        }))
        .context("sending");
        assert!(hint(&wrapped, None).unwrap().contains("--queue-name jobs`"));
        assert!(hint(&anyhow::anyhow!("other"), None).is_none());
    }

    #[test]
    fn the_missing_queue_hint_names_the_endpoint_in_use_and_a_region_mismatch() {
        let local = Aws::for_tests("us-east-1", Some("http://127.0.0.1:9999"));
        let error = anyhow::Error::new(QueueError::QueueMissing {
            queue: "http://127.0.0.1:9999/000000000000/jobs".to_owned(),
        });
        let text = hint(&error, Some(&local)).unwrap();
        assert!(text.contains("--endpoint-url http://127.0.0.1:9999"), "{text}");
        assert!(text.contains("conveyor local init --queue jobs"), "{text}");
        assert!(!text.contains("4566"), "no hard-coded port: {text}");
        assert!(
            !text.contains("region"),
            "no region in the URL, no mismatch: {text}"
        );

        let aws = Aws::for_tests("eu-west-1", Some("https://sqs.eu-west-1.amazonaws.com"));
        let error = anyhow::Error::new(AdminError::Queue(QueueError::QueueMissing {
            queue: "https://sqs.us-east-2.amazonaws.com/123456789012/jobs".to_owned(),
        }));
        let text = hint(&error, Some(&aws)).unwrap();
        assert!(
            text.contains("names region us-east-2 but this command uses region eu-west-1"),
            "{text}"
        );
        assert!(text.contains("--region us-east-2"), "{text}");
    }

    #[test]
    fn usage_errors_exit_with_2() {
        assert_eq!(
            report(&anyhow::Error::new(UsageError("no".to_owned())), None),
            ExitCode::from(2)
        );
        assert_eq!(report(&anyhow::anyhow!("failed"), None), ExitCode::FAILURE);
    }

    #[test]
    fn failures_are_classed_as_the_aws_cli_does() {
        let class = |error: anyhow::Error| exit_code(&error.context("running the command"));
        let queue = |error: QueueError| anyhow::Error::new(AdminError::Queue(error));
        assert_eq!(
            class(anyhow::Error::new(ConfigError::NoRegion)),
            ExitClass::Configuration
        );
        assert_eq!(
            class(anyhow::Error::new(Interrupted("stopped".to_owned()))),
            ExitClass::Interrupted
        );
        let missing = QueueError::QueueMissing {
            queue: "jobs".to_owned(),
        };
        assert_eq!(class(queue(missing.clone())), ExitClass::Service);
        assert_eq!(
            class(anyhow::Error::new(ProduceError::Queue(missing))),
            ExitClass::Service
        );
        let throttled = QueueError::Unavailable {
            message: "ThrottlingException: slow down".to_owned(),
        };
        assert_eq!(class(queue(throttled)), ExitClass::Service);
        let refused = QueueError::Unavailable {
            message: format!("{DISPATCH_PREFIX}io error: Connection refused"),
        };
        assert_eq!(class(anyhow::Error::new(refused)), ExitClass::Client);
        let slow = QueueError::Unavailable {
            message: format!("{TIMEOUT_PREFIX}operation timeout"),
        };
        assert_eq!(class(queue(slow)), ExitClass::Client);
        let purging = AdminError::PurgeInProgress {
            queue: "jobs".to_owned(),
        };
        assert_eq!(class(anyhow::Error::new(purging)), ExitClass::Service);
        assert_eq!(class(anyhow::anyhow!("a malformed file")), ExitClass::Failure);
        assert_eq!(ExitClass::Client as u8, 255);
    }
}
