//! How failures reach the user: `error: ...` on stderr, a hint when there is an obvious next step, and
//! the exit code (1 for a failure, 2 for a usage error, as clap does for bad arguments, 130 for a
//! command stopped by Ctrl-C).

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
    if error.downcast_ref::<UsageError>().is_some() || error.downcast_ref::<ConfigError>().is_some() {
        return ExitCode::from(2);
    }
    if error.downcast_ref::<Interrupted>().is_some() {
        return ExitCode::from(130);
    }
    ExitCode::FAILURE
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
}
